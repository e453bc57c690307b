"""Predict2's math: a rectified-flow network behind upstream's EDM-sigma interface (x_sigma = x0 + sigma eps).

This module and nets/flow.py (Predict2.5) are the two model families. They have the same functions under the same names
and signatures, and a caller never asks which one it has: family_of(cfg) picks the module once, from the DiT
config, and the caller uses what it returns. What Predict2 does (spec cosmos_dit, sampler; docs/predict2.md):

* the net: denoise() turns the velocity network into an x0 prediction with c_skip = c_in = 1 - t, c_out = -t,
  t = sigma / (1 + sigma); the clean conditioning frames are shown to the net at sigma 1e-4 and put back in x0;
* training: sigma log-normal x sqrt(latent frames) (5% log-uniform in [200, 1e5]), 1 or 2 conditioning latent
  frames, the velocity-form loss |v_hat - (eps - x0)|^2 on the generated frames, times upstream's loss_scale;
* sampling: 35 Karras sigmas from 80 to 0.002, Euler then 2-step Adams-Bashforth in x0 form, a final clean pass,
  CFG on x0 (x0_c + g (x0_c - x0_u)); the initial state is upstream's numpy noise times sigma_max = 80;
* RL: the stochastic first-order x0 step of GRPO (engine/rollout.py) and the forward process of DiffusionNFT (nft.py).

Contents, top to bottom: the family's facts -> denoise -> training draws and loss -> the sampler -> RL steps.
"""
import math
from dataclasses import replace

import numpy as np
import torch

from condition import Condition, condition_mask, has_uncond, uncond

NAME = "Predict2"
TEXT_ENCODER = "t5"  # the released configs' prompt embeddings (t5.py); the tiny configs read a stand-in
TRAIN_FLAGS = ("loss_scale", "high_sigma_ratio", "cond_frames")  # train.py settings only this family's loss reads
SAMPLER_FLAGS = ()  # sample.py settings only this family's sampler reads: none (its grid and conditioning are fixed)
GRIDS = ("karras",)
ROLLOUT_GRID = "karras"  # the grid of RL rollouts (GRPO, NFT)
SIGMA_MIN, SIGMA_MAX, RHO = 0.002, 80.0, 7.0
SIGMA_CONDITIONAL = 1e-4  # the "noise level" the net is told for clean conditioning frames


def sampler_defaults(init, config):
    """(grid, conditional_frame_timestep) for checkpoint `init`: Predict2's grid is always Karras, and it has no
    conditional-frame timestep (its conditioning frames sit at sigma 1e-4); -1 is TrainConfig's default, recorded
    as it is and never read."""
    return "karras", -1.0


def describe_sampler(grid, conditional_frame_timestep):
    return "Euler + AB2 on Karras sigmas"


def nonfinite_hint(cfg):
    """What else than the learning rate can overflow this family's SFT loss (sft.nonfinite_cause)."""
    return f", or --loss-scale {cfg.loss_scale:g} too large"


# -----------------------------------------------------------------------------
# The denoiser: the network's velocity as an x0 prediction at EDM sigma


def denoise(net, x_sigma, sigma, cond: Condition):
    """x0 prediction for video2world (conditioning frames replaced by the clean `cond.gt_frames`). fp32 throughout.

    sigma: [B] (or [B,T] per latent frame). cond.condition_mask: 1 on the conditioning latent frames, or None.
    Returns (x0_hat, velocity) in fp32.
    """
    x_sigma = x_sigma.float()
    sigma = sigma.float()
    sigma_B_1_T = sigma.view(sigma.shape[0], 1, -1, 1, 1)
    t = sigma_B_1_T / (sigma_B_1_T + 1)
    c_skip = c_in = 1 - t
    c_out = -t
    if cond.condition_mask is None:
        net_in, t_B_T, mask = c_in * x_sigma, t.view(t.shape[0], -1), None
    else:
        mask = cond.condition_mask.float()
        if cond.gt_frames is None:
            raise ValueError("condition_mask given without gt_frames (the clean conditioning latents)")
        gt_frames = cond.gt_frames.float()
        net_in = gt_frames * mask + c_in * x_sigma * (1 - mask)
        sigma_cond = torch.full_like(sigma_B_1_T, SIGMA_CONDITIONAL)
        t_cond = (sigma_cond / (sigma_cond + 1)).view(t.shape[0], -1)
        mask_t = mask.mean(dim=(1, 3, 4))  # [B, T]: 1 on conditioning frames
        t_B_T = t_cond * mask_t + t.view(t.shape[0], -1) * (1 - mask_t)
    velocity = net(net_in, t_B_T, replace(cond, condition_mask=mask)).float()
    x0 = c_skip * x_sigma + c_out * velocity
    if mask is not None:
        x0 = gt_frames * mask + x0 * (1 - mask)
    return x0, velocity


# -----------------------------------------------------------------------------
# Training: upstream Predict2Video2WorldModel's draws, the velocity-form loss


def draw_sample(latent_C_T_H_W, seed, cfg):
    """(sigma, eps, number of conditioning latent frames, text-drop flag) of one sample from its own seed
    (objective.sample_seed). cfg: high_sigma_ratio, text_dropout, cond_frames (0: upstream's 1 or 2, drawn; else
    that many, the draw still made so that the other draws stay the same)."""
    g = torch.Generator().manual_seed(seed)
    T = latent_C_T_H_W.shape[1]
    log_sigma = torch.randn((), generator=g, dtype=torch.float64)
    sigma = log_sigma.exp() * (math.sqrt(T) if T > 1 else 1.0)  # adjust_video_noise: x sqrt(latent frames)
    if torch.rand((), generator=g) < cfg.high_sigma_ratio:  # occasional very high noise, log-uniform in [200, 1e5]
        sigma = torch.exp(math.log(200) + torch.rand((), generator=g, dtype=torch.float64) * math.log(1e5 / 200))
    eps = torch.randn(latent_C_T_H_W.shape, generator=g)
    n_cond = int(torch.randint(1, 3, (), generator=g)) if T > 1 else 0  # 1 or 2 conditioning latent frames
    n_cond = (cfg.cond_frames or n_cond) if T > 1 else 0
    drop_text = bool(torch.rand((), generator=g) < cfg.text_dropout)
    return float(sigma), eps, n_cond, drop_text


def training_loss(net, latent, cond: Condition, seeds, cfg):
    """Batch loss with one seed per sample. (1+s)^2/s^2 |x0_hat - x0|^2 equals |v_hat - (eps - x0)|^2 exactly; we use
    the velocity form (no 1e8 weights at small sigma). Conditioning frames add 0 (replaced). cond: the batch's record
    (condition.from_batch); its conditioning frames are redrawn per sample here. cfg: high_sigma_ratio, text_dropout,
    loss_scale (train.TrainConfig)."""
    draws = [draw_sample(latent[b], s, cfg) for b, s in enumerate(seeds)]
    sigma = torch.tensor([d[0] for d in draws], device=latent.device)
    eps = torch.stack([d[1] for d in draws]).to(latent.device)
    n_cond = torch.tensor([d[2] for d in draws], device=latent.device)
    keep_text = torch.tensor([0.0 if d[3] else 1.0 for d in draws], device=latent.device).view(-1, 1, 1)
    x_sigma = latent + sigma.view(-1, 1, 1, 1, 1) * eps
    mask = condition_mask(latent, n_cond)
    drawn = replace(cond, crossattn_emb=cond.crossattn_emb * keep_text, gt_frames=latent, condition_mask=mask)
    _, velocity = denoise(net, x_sigma, sigma, drawn)
    err = (velocity - (eps - latent)).square() * (1 - mask)
    return err.mean() * cfg.loss_scale


# -----------------------------------------------------------------------------
# The sampler: Karras sigmas, Euler then 2-step Adams-Bashforth (upstream's res_x0_rk2_step), CFG on x0


def karras_sigmas(num_steps, sigma_min=SIGMA_MIN, sigma_max=SIGMA_MAX, rho=RHO):
    """num_steps + 1 noise levels from sigma_max down to sigma_min, float64 (the last one is the final clean pass)."""
    ramp = torch.arange(num_steps + 1, dtype=torch.float64) / num_steps
    lo, hi = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    return (hi + ramp * (lo - hi)) ** rho


def sampler_step(x0_pred, i, x, x0_prev, sigmas):
    """One step from sigmas[i] to sigmas[i+1] in float64; returns (x as float32, x0_pred as float32 for next step).

    Step 0 is Euler in x0 form. Later steps use the 2-step Adams-Bashforth exponential integrator on the x0
    predictions at sigma_i and sigma_{i-1} (upstream's res_x0_rk2_step).
    """
    s_prev, s, s_next = (float(sigmas[j]) if j >= 0 else None for j in (i - 1, i, i + 1))
    x, x0 = x.double(), x0_pred.double()
    if i == 0 or x0_prev is None:
        out = (s - s_next) / s * x0 + s_next / s * x
    else:
        h = math.log(s / s_next)
        c2 = math.log(s / s_prev) / h  # negative: the previous point lies behind
        phi1 = (math.exp(-h) - 1) / (-h)
        phi2 = (phi1 - 1) / (-h)
        b2 = phi2 / c2
        b1 = phi1 - b2
        out = math.exp(-h) * x + h * (b1 * x0 + b2 * x0_prev.double())
    return out.float(), x0_pred.float()


def initial_state(noise):
    """The sampler's first state from unit-variance noise: noise at sigma_max (karras_sigmas(N)[0] is exactly 80)."""
    return noise * SIGMA_MAX


def initial_noise(shape, seed, views=1):
    """Upstream's arch-invariant noise (numpy's RandomState normal, float32) as the sampler's first state."""
    if views > 1:
        raise ValueError(f"{views} views: a Predict2 net generates one video (its views are a 2x2 grid)")
    return initial_state(torch.from_numpy(np.random.RandomState(seed).standard_normal(shape).astype(np.float32)))


def guided_x0_fn(net, cond: Condition, guidance=7.0):
    """x0(x, sigma) with classifier-free guidance: x0_c + g * (x0_c - x0_u) (so g=7 is classic scale 8).

    The unconditional branch swaps in cond's negative-prompt embedding (or its neg_action: condition.uncond) and
    keeps the conditioning frames. With neither, or guidance 0, there is one network call per step.
    """

    def x0_fn(x, sigma):
        x0_cond, _ = denoise(net, x, sigma, cond)
        if not has_uncond(cond) or guidance == 0:
            return x0_cond
        x0_uncond, _ = denoise(net, x, sigma, uncond(cond))
        return x0_cond + guidance * (x0_cond - x0_uncond)

    return x0_fn


@torch.no_grad()
def sample_x0(x0_fn, noise, num_steps=35, callback=None):
    """Run the sampler from `noise` (already scaled by sigma_max) and return the final x0 prediction."""
    sigmas = karras_sigmas(num_steps)
    x, x0_prev = noise.float(), None
    batch = x.shape[0]
    for i in range(num_steps):
        sigma = torch.full((batch,), float(sigmas[i]), dtype=torch.float32, device=x.device)
        x0 = x0_fn(x, sigma)
        x, x0_prev = sampler_step(x0, i, x, x0_prev, sigmas)
        if callback is not None:
            callback(i, x, x0)
    sigma = torch.full((batch,), float(sigmas[-1]), dtype=torch.float32, device=x.device)
    return x0_fn(x, sigma)  # final clean pass at sigma_min


def sample(net, noise, cond: Condition, guidance, grid, num_steps, callback=None):
    """Video2world sampling from the first state `noise` (initial_state / initial_noise): num_steps Karras steps
    and a clean pass, CFG on x0 with cond's negative prompt (none, or g = 0: one call a step). Returns x0, fp32."""
    if grid not in GRIDS:
        raise ValueError(f"grid={grid!r}: Predict2 samples on its Karras sigmas only ({', '.join(GRIDS)})")
    return sample_x0(guided_x0_fn(net, cond, guidance), noise, num_steps, callback).float()


# -----------------------------------------------------------------------------
# RL: GRPO's stochastic step (engine/rollout.py, docs/grpo.md) and NFT's forward process (nft.py), in EDM sigma


def rollout_grid(num_steps):
    """(sigmas: num_steps + 1 floats, Karras from 80 to 0.002; timesteps: None per level, the net takes sigma)."""
    return [float(s) for s in karras_sigmas(num_steps)], [None] * (num_steps + 1)


def edm_sigma(sigma):
    """The EDM noise level of a grid sigma: itself."""
    return sigma


def check_step(sigma, sigma_next):
    if not sigma > sigma_next > 0:
        raise ValueError(f"need sigma > sigma_next > 0, got {sigma}, {sigma_next}")


def predict(net, x, sigma, timestep, cond: Condition, noise):
    """The net's raw prediction for states x [B, ...] at EDM sigma: x0_hat (one network call, fp32)."""
    sigma_B = torch.full((x.shape[0],), sigma, dtype=torch.float32, device=x.device)
    return denoise(net, x, sigma_B, cond)[0]


def step_mean(x, pred, sigma, sigma_next, alpha):
    """The Gaussian mean c x + (1 - c) x0_hat with c = alpha / sigma, pred the (guided) x0_hat (fp32; the same op
    order in rollout and training): x' = x0_hat + alpha eps_hat + beta z."""
    c = alpha / sigma
    return c * x + (1.0 - c) * pred


def final_x0(guided_at_last, x_last, cond: Condition):
    """The sample of a rollout: the clean pass at sigma_N (guided_at_last(x) runs it)."""
    return guided_at_last(x_last)


def step_sensitivity(sigma, sigma_next, alpha, beta):
    """|d logp / d v_hat| per element, in units of z: mean = c x + (1 - c) x0_hat with x0_hat = (1 - t) x - t v_hat,
    t = sigma / (1 + sigma), so (1 - c) t / beta."""
    return abs(1.0 - alpha / sigma) * sigma / (1.0 + sigma) / beta


def training_levels(num_steps):
    """NFT's noise levels: the rollout grid's first num_steps sigmas (the last, sigma_min, excluded)."""
    return [(float(s), None) for s in karras_sigmas(num_steps)[:num_steps]]


def forward_velocity(net, cond: Condition, x0, eps, level):
    """(v_theta, u = eps - x0, t) at level (sigma, None) of x0's forward process x = x0 + sigma eps, the net's RF
    state (1 - t) x with t = sigma / (1 + sigma): x0_hat - x0 = -t (v - u) on the generated frames."""
    sigma, _ = level
    sigma_B = torch.full((1,), sigma, dtype=torch.float32, device=x0.device)
    _, v = denoise(net, x0 + sigma * eps, sigma_B, cond)
    return v, eps - x0, sigma / (1 + sigma)
