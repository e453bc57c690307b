"""Predict2.5's rectified flow: training-time draws, loss, UniPC sampler (and the RF step GRPO uses).

Cosmos-Predict2.5 trains the same rectified-flow network as Predict2 (x_sigma = (1 - sigma) x0 + sigma eps, the net
predicts the velocity eps - x0), but drops the EDM-sigma interface of model.denoise: sigma lives in (0, 1) and the
network is told upstream's "timesteps" = 1000 sigma, which it scales back by 0.001 (we keep t in (0, 1) in our API and
compute it exactly as upstream does, `timesteps.float() * 0.001`). What is new here (spec predict25 §4):

* training: sigma from a logit-normal u with shift 5, sigma = 5u / (1 + 4u); 0, 1 or 2 conditional latent frames with
  probabilities 0.5 / 0.25 / 0.25; uniform weight, no x10 scale; conditional frames either share the noisy frames'
  timestep (conditional_frame_timestep = -1, pre-training) or get timestep 0.1, i.e. t = 1e-4 (0.1: 2B post-trained,
  agibot), and the prediction on them is replaced by the exact velocity (they add exact zeros to the mean).
* sampling: UniPC-bh2 of order 2 (predictor + corrector, lower order at the last step) on the shift-5 grid or a
  Karras grid, the net fed int64 floor(1000 sigma) from the float64 grid, the solver the float32 sigmas; CFG in
  velocity v = v_c + g (v_c - v_u); conditional frames replaced, in the net's output, by `noise - gt` with the run's
  INITIAL noise (so the last x0 holds (1 - sigma_0) noise + sigma_0 gt there: `sample` puts gt back).
* multi-view (robot/multiview-agibot): views stacked on the latent time axis; the frame-init condition mask.

This module and nets/edm.py (Predict2) are the two model families: the same functions under the same names and
signatures (nets/family.family_of picks one from the DiT config; callers never ask which).

Contents, top to bottom: the family's facts -> training draws -> the RF velocity (upstream's denoise) -> loss ->
sampler grids -> UniPC -> sampling loop -> multi-view mask and noise -> RL: the RF GRPO step (docs/grpo.md §10) and
NFT's forward process.
"""
import math
from dataclasses import replace

import numpy as np
import torch

from base import inits
from base.camera import VIEW_ORDER
from condition import Condition, frame_mask, has_uncond, uncond

NAME = "Predict2.5"
TEXT_ENCODER = "reason1"  # the released configs' prompt embeddings (t5.py --encoder reason1); p25-tiny*: a stand-in
TRAIN_FLAGS = ("conditional_frame_timestep",)  # train.py settings only this family reads
SAMPLER_FLAGS = ("grid", "conditional_frame_timestep")  # sample.py settings only this family's sampler reads
ROLLOUT_GRID = "shift"  # the grid of RL rollouts (GRPO, NFT)
SHIFT = 5.0  # every released 2.5 experiment
CONDITIONAL_FRAMES_PROBS = (0.5, 0.25, 0.25)  # P(n conditional latent frames = 0, 1, 2) in training
TIMESTEP_SCALE = 0.001  # upstream's net input is 1000 sigma, scaled back inside the net


def sampler_defaults(init, config):
    """(grid, conditional_frame_timestep) upstream samples checkpoint `init` with (inits.checkpoint_defaults)."""
    return inits.checkpoint_defaults(init, config)


def describe_sampler(grid, conditional_frame_timestep):
    return f"UniPC {grid} grid, conditional-frame timestep {conditional_frame_timestep}"


def nonfinite_hint(cfg):
    """What else than the learning rate can overflow this family's SFT loss: nothing (no loss scale)."""
    return ""


# -----------------------------------------------------------------------------
# Training-time draws (our own seeded generator; the formulas are upstream's, in the same fp32 ops)


def shifted_timesteps(normal, shift=SHIFT):
    """Upstream's training times from standard normals: u = 1 / (1 + exp(-n)), timesteps = 1000 * shift u /
    (1 + (shift - 1) u), sigma = timesteps / 1000; fp32 in these exact ops (bit-equal to upstream's draws)."""
    u = 1 / (1 + torch.exp(-normal.float()))
    timesteps = shift * u / (1 + (shift - 1) * u) * 1000
    return timesteps, timesteps / 1000


def num_conditional_frames(uniform, num_latent_frames, probs=CONDITIONAL_FRAMES_PROBS):
    """n in {0, 1, 2} from one uniform draw in [0, 1) (inverse CDF of probs); an image batch (T = 1) has none."""
    if num_latent_frames <= 1:
        return 0
    cumulative = np.cumsum(probs)
    return int(min(np.searchsorted(cumulative, float(uniform), side="right"), len(probs) - 1))


def draw_sample(latent_C_T_H_W, seed, text_dropout):
    """(normal, eps, n_cond, drop_text) of one training sample from its own seed (objective.sample_seed)."""
    g = torch.Generator().manual_seed(seed)
    normal = torch.randn((), generator=g)
    eps = torch.randn(latent_C_T_H_W.shape, generator=g)
    n_cond = num_conditional_frames(torch.rand((), generator=g), latent_C_T_H_W.shape[1])
    drop_text = bool(torch.rand((), generator=g) < text_dropout)
    return normal, eps, n_cond, drop_text


# -----------------------------------------------------------------------------
# The RF velocity with conditional frames (upstream Video2WorldModelRectifiedFlow.denoise)


def net_time(timesteps_B, mask_B_1_T_H_W=None, conditional_frame_timestep=-1.0):
    """t for our net ([B,1] or per frame [B,T]) from upstream timesteps [B] (int64 at inference, fp32 in training).

    conditional_frame_timestep >= 0 gives conditional frames that timestep (per frame: c m + t (1 - m), m the frame's
    mask mean, per sample; upstream's version of this only works for B = 1); -1 (or None) keeps one timestep for all
    frames."""
    timesteps = timesteps_B.reshape(-1, 1).float()
    if mask_B_1_T_H_W is not None and conditional_frame_timestep is not None and conditional_frame_timestep >= 0:
        m = mask_B_1_T_H_W.float().mean(dim=(1, 3, 4))  # [B, T]
        timesteps = conditional_frame_timestep * m + timesteps * (1 - m)
    return timesteps * TIMESTEP_SCALE


def with_conditional_frames(x, gt_frames, condition_mask_B_1_T_H_W):
    """x with its conditional frames replaced by the clean latent (fp32); x itself without a mask."""
    if condition_mask_B_1_T_H_W is None:
        return x.float()
    mask = condition_mask_B_1_T_H_W.float()
    return gt_frames.float() * mask + x.float() * (1 - mask)


def velocity(net, x_B_C_T_H_W, timesteps_B, cond: Condition, noise=None):
    """The velocity prediction at upstream timesteps [B] (1000 sigma), fp32.

    With cond.condition_mask: the net sees the clean cond.gt_frames on the conditional frames (and the mask
    channel), at cond.conditional_frame_timestep there (None or -1: the same timestep as the others), and its
    output there is replaced by the exact velocity noise - gt, `noise` being the training eps or the sampling
    run's initial noise."""
    mask = None if cond.condition_mask is None else cond.condition_mask.float()
    if mask is not None and (cond.gt_frames is None or noise is None):
        raise ValueError("flow.velocity: a condition mask needs gt_frames (clean latent) and noise (its eps)")
    x = with_conditional_frames(x_B_C_T_H_W, cond.gt_frames, mask)
    t = net_time(timesteps_B, mask, cond.conditional_frame_timestep)
    v = net(x, t, replace(cond, condition_mask=mask)).float()
    if mask is not None:
        v = (noise.float() - cond.gt_frames.float()) * mask + v * (1 - mask)
    return v


def guided_velocity(net, x, timesteps_B, cond: Condition, guidance=7.0, uncond_grad=False, noise=None):
    """CFG in velocity space, v_c + g (v_c - v_u) (video2world/agibot convention; g = 7 is classic scale 8), as two
    separate calls; the uncond branch uses the negative prompt and the same conditional frames, without autograd
    unless uncond_grad (same value); with cond.neg_action, that action and the same prompt (condition.uncond). No
    uncond branch (condition.has_uncond) or g = 0: one call."""
    v_cond = velocity(net, x, timesteps_B, cond, noise)
    if not has_uncond(cond) or guidance == 0:
        return v_cond
    with torch.set_grad_enabled(uncond_grad and torch.is_grad_enabled()):
        v_uncond = velocity(net, x, timesteps_B, uncond(cond), noise)
    return v_cond + guidance * (v_cond - v_uncond)


# -----------------------------------------------------------------------------
# Training loss (upstream Text2WorldModelRectifiedFlow.forward, uniform weight)


def loss_given_draws(net, x0, cond: Condition, eps, timesteps_B):
    """Per-sample loss [B]: mean over (C, T, H, W) of (v_hat - (eps - x0))^2 at x_sigma = eps sigma + x0 (1 - sigma).
    cond: its crossattn_emb after text dropout, its condition_mask the drawn one (x0 is its gt_frames); conditional
    frames add exact zeros but stay in the mean."""
    sigma = (timesteps_B.float() / 1000).view(-1, 1, 1, 1, 1)
    x0, eps = x0.float(), eps.float()
    x_sigma = eps * sigma + x0 * (1 - sigma)
    v_hat = velocity(net, x_sigma, timesteps_B, replace(cond, gt_frames=x0), noise=eps)
    return (v_hat - (eps - x0)).square().mean(dim=(1, 2, 3, 4))


def training_loss(net, latent, cond: Condition, seeds, cfg):
    """Batch loss with one seed per sample (draw_sample); cond: the batch's record (its condition_mask is replaced
    by the drawn one: the first n latent frames, or for a camera net (cond.camera) agibot's frame-init mask over its
    views stacked on time). cfg: text_dropout (train.TrainConfig)."""
    draws = [draw_sample(latent[b], s, cfg.text_dropout) for b, s in enumerate(seeds)]
    timesteps, _ = shifted_timesteps(torch.stack([d[0] for d in draws]))
    eps = torch.stack([d[1] for d in draws]).to(latent.device)
    n_cond = torch.tensor([d[2] for d in draws], device=latent.device)
    text_emb = cond.crossattn_emb
    keep_text = torch.tensor([0.0 if d[3] else 1.0 for d in draws], device=latent.device,  # 0/1: exact in bf16,
                             dtype=text_emb.dtype).view(-1, 1, 1)  # so a bf16 Reason1 batch stays bf16 (98 MiB each)
    mask = frame_mask(latent, len(VIEW_ORDER) if cond.camera is not None else 1, n_cond)
    drawn = replace(cond, crossattn_emb=text_emb * keep_text, condition_mask=mask)
    return loss_given_draws(net, latent, drawn, eps, timesteps.to(latent.device)).mean()


# -----------------------------------------------------------------------------
# Sampler grids (upstream FlowUniPCMultistepScheduler.set_timesteps, shift 1 at construction)

SIGMA_MAX_INIT = float(np.float32(0.999))  # the scheduler's init grid top, 0.9990000128746033
KARRAS_SIGMA_MAX, KARRAS_SIGMA_MIN, KARRAS_RHO = 200.0, 0.01, 7.0
GRIDS = ("shift", "karras")


def time_grid(grid, num_steps, shift=SHIFT):
    """(sigmas fp32 [E + 1] ending in 0, timesteps int64 [E]) for E network evaluations.

    shift: E = num_steps, sigma_i = shift u / (1 + (shift - 1) u) over u = linspace(0.999, 0, N + 1)[:-1];
    karras: E = num_steps + 1 (N + 1 Karras points from 200 to 0.01 in EDM sigma, mapped by s / (1 + s)).
    The timesteps are floor(1000 sigma) of the float64 sigmas; the solver uses their float32 rounding."""
    if num_steps < 1:
        raise ValueError(f"num_steps={num_steps}: need >= 1")
    if grid == "shift":
        u = np.linspace(SIGMA_MAX_INIT, 0.0, num_steps + 1)[:-1]
        sigmas = shift * u / (1 + (shift - 1) * u)
    elif grid == "karras":
        ramp = np.arange(num_steps + 1, dtype=np.float64) / num_steps
        hi, lo = KARRAS_SIGMA_MAX ** (1 / KARRAS_RHO), KARRAS_SIGMA_MIN ** (1 / KARRAS_RHO)
        edm = (hi + ramp * (lo - hi)) ** KARRAS_RHO
        sigmas = edm / (1 + edm)
    else:
        raise ValueError(f"grid={grid!r}: valid are {', '.join(GRIDS)}")
    timesteps = torch.from_numpy((sigmas * 1000).astype(np.int64))
    sigmas_fp32 = torch.from_numpy(np.append(sigmas, 0.0).astype(np.float32))
    return sigmas_fp32, timesteps


# -----------------------------------------------------------------------------
# UniPC-bh2, order 2, x0 prediction, lower_order_final (fm_solvers_unipc.py; spec §4.2). Coefficients in float64
# from the float32 sigmas, applied to fp32 tensors.


def _lam(sigma):
    return math.log(1 - sigma) - math.log(sigma)  # log(alpha / sigma), alpha = 1 - sigma


def unipc_predict(x, x0, x0_prev, sigma, sigma_next, lam_prev, order):
    """x at the next sigma from the (corrected) x and x0 = x0_i; order 2 also uses x0_prev = x0_{i-1}."""
    if sigma_next == 0:  # lambda = inf: the step lands on x0 (the last step, order 1)
        return x0.clone()
    lam, lam_next = _lam(sigma), _lam(sigma_next)
    h = lam_next - lam
    coef = (1 - sigma_next) * math.expm1(-h)  # alpha' (e^{-h} - 1)
    out = (sigma_next / sigma) * x - coef * x0
    if order == 2:
        r = (lam_prev - lam) / h
        out = out - coef * 0.5 / r * (x0_prev - x0)
    return out


def unipc_correct(x_prev, x0, x0_prev, x0_prev2, sigma, sigma_prev, lam_prev2, order):
    """The corrector: x_i recomputed from the previous (corrected) x_{i-1} with the new x0_i."""
    lam, lam_prev = _lam(sigma), _lam(sigma_prev)
    h = lam - lam_prev
    B = math.expm1(-h)
    coef = (1 - sigma) * B
    out = (sigma / sigma_prev) * x_prev - coef * x0_prev
    if order == 1:
        return out - coef * 0.5 * (x0 - x0_prev)
    r = (lam_prev2 - lam_prev) / h
    g1 = B / (-h) - 1
    b1, b2 = g1 / B, 2 * (g1 / (-h) - 0.5) / B
    rho_1 = (b1 - b2) / (1 - r)  # [[1, 1], [r, 1]] (rho_1, rho_c) = (b1, b2)
    rho_c = b1 - rho_1
    return out - coef * (rho_1 / r * (x0_prev2 - x0_prev) + rho_c * (x0 - x0_prev))


def unipc(velocity_fn, noise, sigmas, callback=None):
    """Run the solver over len(sigmas) - 1 evaluations; velocity_fn(x, i) -> v at sigmas[i]. Returns the final x0.

    Orders (solver order 2, lower_order_final): step 0 predictor 1; step 1 corrector 1 + predictor 2; then corrector 2
    + predictor 2; the last step corrector 2 + predictor 1, which returns x0 (sigma_N = 0). callback(i, x_next, x0)."""
    s = [float(v) for v in sigmas]
    n = len(s) - 1
    x = noise.float()
    x_prev = x0_prev = x0_prev2 = None
    order_prev = 0
    for i in range(n):
        x0 = x - s[i] * velocity_fn(x, i)  # from the uncorrected x the net saw
        if i > 0:
            x = unipc_correct(x_prev, x0, x0_prev, x0_prev2, s[i], s[i - 1], _lam(s[i - 2]) if i > 1 else None,
                              order_prev)
        order = 1 if i == 0 or i == n - 1 else 2
        x_next = unipc_predict(x, x0, x0_prev, s[i], s[i + 1], _lam(s[i - 1]) if i > 0 else None, order)
        x_prev, x0_prev2, x0_prev, order_prev = x, x0_prev, x0, order
        x = x_next
        if callback is not None:
            callback(i, x, x0)
    return x


# -----------------------------------------------------------------------------
# The sampling loop: noise -> UniPC with CFG in velocity space and frame replacement


def initial_state(noise):
    """The sampler's first state from unit-variance noise: the noise itself (sigma_0 ~ 1)."""
    return noise


def initial_noise(shape, seed, views=1):
    """Upstream's arch-invariant noise: numpy RandomState(seed).standard_normal, float32, unit variance (no x80);
    views > 1 (a camera net's views stacked on time): multiview_initial_noise."""
    if views > 1:
        return multiview_initial_noise(shape, views, seed)
    return torch.from_numpy(np.random.RandomState(seed).standard_normal(shape).astype(np.float32))


@torch.no_grad()
def sample(net, noise, cond: Condition, guidance=7.0, grid="shift", num_steps=35, callback=None):
    """Video2world sampling (upstream generate_samples_from_batch): v = v_c + g (v_c - v_u), the uncond branch with
    cond's negative prompt and the same conditional frames; no negative embedding or g = 0: one call per step.
    Returns the final latent with gt put back on the conditional frames."""
    sigmas, timesteps = time_grid(grid, num_steps)
    batch = noise.shape[0]

    def velocity_fn(x, i):
        return guided_velocity(net, x, timesteps[i].expand(batch).to(x.device), cond, guidance, noise=noise)

    return with_conditional_frames(unipc(velocity_fn, noise, sigmas, callback), cond.gt_frames, cond.condition_mask)


# -----------------------------------------------------------------------------
# Multi-view: views stacked on the latent time axis, [B, C, V*T, H, W]


def multiview_initial_noise(shape_B_C_VT_H_W, num_views, seed):
    """agibot's frame-init sampler starts every view from the SAME noise: one initial_noise draw of one view's shape,
    repeated over the views on the time axis (spec §1.1)."""
    B, C, VT, H, W = shape_B_C_VT_H_W
    if num_views < 1 or VT % num_views:
        raise ValueError(f"{VT} latent frames are not {num_views} views stacked on time (need a multiple)")
    return initial_noise((B, C, VT // num_views, H, W), seed).repeat(1, 1, num_views, 1, 1)


# -----------------------------------------------------------------------------
# RL: GRPO's stochastic step in RF coordinates (docs/grpo.md §10): x' = (1 - sigma') x0_hat + alpha eps_hat + beta z,
# alpha^2 + beta^2 = sigma'^2, eps_hat = (x - (1 - sigma) x0_hat) / sigma; and NFT's forward process (nft.py)


def rollout_grid(num_steps):
    """(sigmas: num_steps + 1 floats, the shift-5 grid ending in 0; timesteps: the net's int floor(1000 sigma))."""
    sigmas, timesteps = time_grid(ROLLOUT_GRID, num_steps)
    return [float(s) for s in sigmas], timesteps.tolist()


def edm_sigma(sigma):
    """The EDM noise level of an RF sigma: x / (1 - sigma) = x0 + sigma / (1 - sigma) eps."""
    return sigma / (1 - sigma)


def check_step(sigma, sigma_next):
    if not 1 > sigma > sigma_next >= 0:
        raise ValueError(f"need sigma > sigma_next >= 0, sigma < 1, got {sigma}, {sigma_next}")


def predict(net, x, sigma, timestep, cond: Condition, noise):
    """The net's raw prediction for states x [B, ...] at the int timestep: the velocity (one network call, fp32);
    noise: [B, ...] initial states, for the conditional frames' exact velocity."""
    timestep_B = torch.full((x.shape[0],), timestep, dtype=torch.int64, device=x.device)
    return velocity(net, x, timestep_B, cond, noise=noise)


def mean_from_x0(x, x0, sigma, sigma_next, alpha):
    """The Gaussian mean (1 - sigma') x0 + alpha eps_hat = c x + (1 - sigma' - c (1 - sigma)) x0, c = alpha / sigma
    (fp32; the same op order in rollout and training)."""
    c = alpha / sigma
    return c * x + (1.0 - sigma_next - c * (1.0 - sigma)) * x0


def step_mean(x, pred, sigma, sigma_next, alpha):
    """The Gaussian mean of a step from states x and pred, the (guided) velocity: x0_hat = x - sigma v."""
    return mean_from_x0(x, x - sigma * pred, sigma, sigma_next, alpha)


def final_x0(guided_at_last, x_last, cond: Condition):
    """The sample of a rollout: x_N is x0_hat already (sigma_N = 0, no network call); the conditional frames get
    their clean latent back (as sample)."""
    return with_conditional_frames(x_last, cond.gt_frames, cond.condition_mask)


def step_sensitivity(sigma, sigma_next, alpha, beta):
    """|d logp / d v_hat| per element, in units of z: mean = c x + (1 - sigma' - c (1 - sigma)) x0_hat with x0_hat
    = x - sigma v_hat, so sigma |1 - sigma' - c (1 - sigma)| / beta."""
    c = alpha / sigma
    return sigma * abs(1.0 - sigma_next - c * (1.0 - sigma)) / beta


def training_levels(num_steps):
    """NFT's noise levels: the shift grid's first num_steps, as (sigma = timestep / 1000, timestep) pairs of the
    net's own integer timesteps."""
    _, timesteps = time_grid(ROLLOUT_GRID, num_steps)
    return [(float(t) / 1000, int(t)) for t in timesteps[:num_steps]]


def forward_velocity(net, cond: Condition, x0, eps, level):
    """(v_theta, u = eps - x0, t = sigma) at level (sigma, timestep) of x0's forward process (1 - sigma) x0 +
    sigma eps: x0_hat - x0 = -t (v - u) on the generated frames."""
    sigma, timestep = level
    v = velocity(net, (1 - sigma) * x0 + sigma * eps, torch.full((1,), timestep, device=x0.device), cond, eps)
    return v, eps - x0, sigma
