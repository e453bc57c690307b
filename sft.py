"""Supervised fine-tuning: the video2world training loss of both model families, one optimizer step, its learning
rate schedule and the held-out loss. train.py runs it as the `sft` objective; grpo.py and nft.py are the RL ones.

Predict2 (EDM): sigma log-normal x sqrt(latent frames), 1-2 conditioning frames, a velocity-form loss (draws as
upstream's Predict2Video2WorldModel). Predict2.5: the rectified-flow loss of flow.py (flow.training_loss).
Contents, top to bottom: seeds -> the loss -> one step -> the schedule -> the held-out loss -> the objective.
"""
import dataclasses
import hashlib
import math
from dataclasses import dataclass

import numpy as np
import torch

import data
import flow
from collectives import all_mean, any_rank, ranks_any
from inits import get_config, is_p25
from model import condition_mask, denoise

def sample_seed(*keys):
    """A 63-bit seed from a tuple of counters: every random draw depends only on (seed, step, sample, purpose),
    so a resumed or re-sharded run draws exactly the same numbers as an uninterrupted one."""
    digest = hashlib.blake2b(repr(keys).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def draw_sample_noise(cfg, latent_C_T_H_W, seed):
    """sigma, eps, number of conditioning latent frames and text-drop flag for one sample."""
    g = torch.Generator().manual_seed(seed)
    T = latent_C_T_H_W.shape[1]
    log_sigma = torch.randn((), generator=g, dtype=torch.float64)
    sigma = log_sigma.exp() * (math.sqrt(T) if T > 1 else 1.0)  # adjust_video_noise: x sqrt(latent frames)
    if torch.rand((), generator=g) < cfg.high_sigma_ratio:  # occasional very high noise, log-uniform in [200, 1e5]
        sigma = torch.exp(math.log(200) + torch.rand((), generator=g, dtype=torch.float64) * math.log(1e5 / 200))
    eps = torch.randn(latent_C_T_H_W.shape, generator=g)
    n_cond = int(torch.randint(1, 3, (), generator=g)) if T > 1 else 0  # 1 or 2 conditioning latent frames
    drop_text = bool(torch.rand((), generator=g) < cfg.text_dropout)
    return float(sigma), eps, n_cond, drop_text


def training_loss(net, cfg, latent, cond, seeds):
    """Predict2.5 configs: flow.training_loss. Predict2: (1+s)^2/s^2 |x0_hat - x0|^2 equals |v_hat - (eps - x0)|^2
    exactly; we use the velocity form (no 1e8 weights at small sigma). Conditioning frames add 0 (replaced).
    cond: the batch's record (train.condition_of); its conditioning frames are redrawn per sample here."""
    if is_p25(get_config(cfg.config)):  # a camera net: views stacked on time, agibot's frame-init mask
        views = len(data.VIEW_ORDER)
        mask_fn = None if cond.camera is None else lambda x, n: flow.multiview_condition_mask(x, views, n)
        return flow.training_loss(net, latent, cond, seeds, cfg.text_dropout, mask_fn)
    draws = [draw_sample_noise(cfg, latent[b], s) for b, s in enumerate(seeds)]
    sigma = torch.tensor([d[0] for d in draws], device=latent.device)
    eps = torch.stack([d[1] for d in draws]).to(latent.device)
    n_cond = torch.tensor([d[2] for d in draws], device=latent.device)
    keep_text = torch.tensor([0.0 if d[3] else 1.0 for d in draws], device=latent.device).view(-1, 1, 1)
    x_sigma = latent + sigma.view(-1, 1, 1, 1, 1) * eps
    mask = condition_mask(latent, n_cond)
    drawn = dataclasses.replace(cond, crossattn_emb=cond.crossattn_emb * keep_text, gt_frames=latent,
                                condition_mask=mask)
    _, velocity = denoise(net, x_sigma, sigma, drawn)
    err = (velocity - (eps - latent)).square() * (1 - mask)
    return err.mean() * cfg.loss_scale


def sft_step(net, optimizer, trainable, cfg, next_batch, step, rank, world):
    """One SFT optimizer step over grad_accum micro-batches; returns (mean loss on this rank, grad norm, None). A loss
    or gradient norm that is NaN/Inf on any rank skips the step on every rank (the gradients are dropped, the weights
    and the optimizer state stay as they were); the third value is then its likely cause (nonfinite_cause)."""
    loss_sum, bad_batch = 0.0, False
    for micro in range(cfg.grad_accum):
        latent, cond = next_batch()
        inputs = (latent, cond.crossattn_emb, cond.camera)
        bad_batch |= not all(bool(torch.isfinite(x).all()) for x in inputs if x is not None)
        seeds = [sample_seed(cfg.seed, step, (micro * world + rank) * cfg.batch_size + b) for b in range(len(latent))]
        loss = training_loss(net, cfg, latent, cond, seeds) / cfg.grad_accum
        loss.backward()
        loss_sum += loss.item()
    grad_norm = torch.nn.utils.clip_grad_norm_(trainable, cfg.grad_clip)
    grad_norm = (grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm).item()
    device = trainable[0].device
    bad_loss, bad_batch, bad_grad = ranks_any([not math.isfinite(loss_sum), bad_batch, not math.isfinite(grad_norm)],
                                              device)
    if not (bad_loss or bad_grad):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norm, nonfinite_cause(cfg, trainable, bad_loss, bad_batch, device) if bad_loss or bad_grad \
        else None


def nonfinite_cause(cfg, trainable, bad_loss, bad_batch, device):
    """Collective: the likely cause of a skipped SFT step, from what was NaN/Inf on any rank."""
    scale = "" if is_p25(get_config(cfg.config)) else f", or --loss-scale {cfg.loss_scale:g} too large"
    if bad_batch:
        return "a NaN/Inf in the batch (the clips' latents, text embeddings or cameras): check the data"
    weights = [p.to_local() if hasattr(p, "to_local") else p for p in trainable]
    if any_rank(not all(bool(torch.isfinite(w).all()) for w in weights), device):
        return f"NaN/Inf weights: an earlier update overflowed (--lr {cfg.lr:g} too high{scale})"
    return (f"the loss overflowed from finite inputs and weights (--lr {cfg.lr:g} too high{scale})" if bad_loss else
            f"the gradients overflowed from a finite loss (--lr {cfg.lr:g} too high{scale})")


def nonfinite_fields(cause):
    """The metrics fields of an SFT step: nonfinite_steps (as GRPO's), and for a skipped step why."""
    return {"nonfinite_steps": 0} if cause is None else {"nonfinite_steps": 1, "skipped": "nonfinite",
                                                          "nonfinite": cause}


def lr_at(cfg, step):
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.lr_min_ratio + (1 - cfg.lr_min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def ema_beta(step, rate):
    """Upstream's power EMA: beta = (1 - 1/(step+1))^(gamma+1), gamma the largest real root of
    x^3 + 7x^2 + (16 - s^-2) x + (12 - s^-2)."""
    roots = np.roots([1, 7, 16 - rate ** -2, 12 - rate ** -2])
    gamma = max(r.real for r in roots if abs(r.imag) < 1e-9)
    return (1 - 1 / (step + 1)) ** (gamma + 1)


@torch.no_grad()
def evaluate(net, cfg, batches):
    """Held-out loss on fixed clips with fixed noise: comparable across checkpoints and runs."""
    losses = [training_loss(net, cfg, latent, cond, [sample_seed(cfg.seed, "eval", i, b) for b in range(len(latent))])
              for i, (latent, cond) in enumerate(batches)]
    return {"eval_loss": all_mean(torch.stack(losses).mean().item(), batches[0][0].device)}


# -----------------------------------------------------------------------------
# The objective table's record (train.py's OBJECTIVE: sft here, grpo and nft in rl.py)


@dataclass
class Objective:
    """What differs between SFT and the RL objectives in train.py's loop (it has no other objective branch)."""
    lr_at: object  # step -> learning rate
    betas: tuple  # AdamW's, with:
    weight_decay: float
    schedule: str  # the optimizer line's learning-rate part
    step: object  # (step, next_batch) -> the step's metrics row (runs the optimizer step)
    held_out: object  # (batches) -> {"eval_loss"} or {"eval_reward", "eval_reward_<term>", ...}
    bar: object  # row -> the progress bar's fields
    guidance: float  # the sample videos' CFG (RL: the rollouts' own)
    name: str  # the progress bar's
    mfu: bool  # RL's MFU: smoke.py (rollouts and updates differ too much for one number)
    extra_state: dict  # saved with every checkpoint and resumed (NFT: its old policy), {} else
    eval_at_start: bool  # RL: a held-out evaluation before the first update, every curve's starting point


def objective(run, net, optimizer_params, vae, neg_text, terms):
    """The sft row of train.py's objective table. run: train.Run (cfg, optimizer, device, dp_rank, dp_world)."""
    cfg = run.cfg

    def step(step, next_batch):
        loss, grad_norm, cause = sft_step(net, run.optimizer, optimizer_params, cfg, next_batch, step,
                                              run.dp_rank, run.dp_world)
        return {"loss": all_mean(loss, run.device), "grad_norm": grad_norm, **nonfinite_fields(cause)}
    return Objective(lambda s: lr_at(cfg, s), (cfg.beta1, cfg.beta2), cfg.weight_decay,
                     f"lr {cfg.lr:g} (warm-up {cfg.warmup}, cosine to x{cfg.lr_min_ratio}), clip {cfg.grad_clip}",
                     step, lambda batches: evaluate(net, cfg, batches), lambda row: {"loss": f"{row['loss']:.4f}"},
                     cfg.guidance, "train", True, {}, False)
