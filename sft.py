"""Supervised fine-tuning: one optimizer step on the net's family's video2world loss (edm.training_loss for
Predict2, flow.training_loss for Predict2.5), its learning-rate schedule and the held-out loss. train.py runs it as
the `sft` objective; grpo.py and nft.py are the RL ones.

Contents, top to bottom: the loss -> one step -> the schedule -> the held-out loss -> SFT, the objective train.py
calls (the same names as grpo.GRPO's and nft.NFT's).
"""
import math

import numpy as np
import torch

from base.collectives import all_mean, any_rank, ranks_any
from engine.objective import clip_and_step, sample_seed
from engine.rl import unused_rl_flags
from nets.family import family_of
from nets.vae import latent_frames


def training_loss(net, cfg, latent, cond, seeds):
    """The video2world training loss of the net's family (edm.training_loss: Predict2; flow.training_loss:
    Predict2.5), one seed per sample. cond: the batch's record (condition.from_batch); the family redraws its
    conditioning frames per sample."""
    return family_of(net.cfg).training_loss(net, latent, cond, seeds, cfg)


def sft_step(net, optimizer, trainable, cfg, batches, step, rank, world):
    """One SFT optimizer step over the grad_accum micro-batches `batches` ((latent, Condition) each); returns (mean
    loss on this rank, grad norm, None). A loss
    or gradient norm that is NaN/Inf on any rank skips the step on every rank (the gradients are dropped, the weights
    and the optimizer state stay as they were); the third value is then its likely cause (nonfinite_cause)."""
    loss_sum, bad_batch = 0.0, False
    for micro, (latent, cond) in enumerate(batches):
        inputs = (latent, cond.crossattn_emb, cond.camera)
        bad_batch |= not all(bool(torch.isfinite(x).all()) for x in inputs if x is not None)
        seeds = [sample_seed(cfg.seed, step, (micro * world + rank) * cfg.batch_size + b) for b in range(len(latent))]
        loss = training_loss(net, cfg, latent, cond, seeds) / cfg.grad_accum
        loss.backward()
        loss_sum += loss.item()
    device = trainable[0].device
    bad_loss, bad_batch = ranks_any([not math.isfinite(loss_sum), bad_batch], device)
    grad_norm, _ = clip_and_step(optimizer, trainable, cfg.grad_clip, skip=bad_loss)  # the global norm: every rank's
    bad_grad = not math.isfinite(grad_norm)
    return loss_sum, grad_norm, nonfinite_cause(cfg, net, trainable, bad_loss, bad_batch, device) \
        if bad_loss or bad_grad else None


def nonfinite_cause(cfg, net, trainable, bad_loss, bad_batch, device):
    """Collective: the likely cause of a skipped SFT step, from what was NaN/Inf on any rank."""
    scale = family_of(net.cfg).nonfinite_hint(cfg)
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
# The objective train.py's loop calls (train.OBJECTIVES lists it; grpo.GRPO and nft.NFT have the same names)


class SFT:
    """Supervised fine-tuning for train.py: SFT(run, net, params, vae, neg_text, terms) (run: train.Run: cfg,
    optimizer, device, dp_rank, dp_world; SFT reads neither the VAE, the negative prompt nor rewards);
    step(step, batches) -> the step's metrics row; evaluate(batches, truths) -> {"eval_loss"}."""
    NAME = "sft"
    CONFIG = None  # SFT's knobs are TrainConfig's own (--lr, --warmup, ...)
    MAY_CHANGE = ()  # of CONFIG's knobs, those a resumed run may change
    TINY_RECIPES = ()  # recipes/ files on top of tiny.py for this objective
    mfu = True
    reads_clips = True  # step's batches: train.py's clips
    eval_at_start = False  # its curve starts at the first save
    max_psnr_drop = 0.0  # no fidelity bound in loss.png

    @staticmethod
    def validate(cfg, given):
        """{flag: why it does nothing} for the RL flags given to an SFT run; --cond-frames checked (its loss reads it)."""
        if cfg.cond_frames not in (0, 1, 2) or (cfg.cond_frames and latent_frames(cfg.frames) <= cfg.cond_frames):
            raise ValueError(f"--cond-frames {cfg.cond_frames}: 0 (1 or 2 drawn), 1 or 2, fewer than the clip's latent "
                             "frames")
        return unused_rl_flags(cfg, given, SFT.NAME)

    @staticmethod
    def resume_keys(cfg):
        return []

    @staticmethod
    def rewards(cfg):
        return None  # SFT scores no samples

    def __init__(self, run, net, params, vae, neg_text, terms):
        cfg = run.cfg
        self.run, self.net, self.params, self.cfg = run, net, params, cfg
        self.betas, self.weight_decay, self.guidance, self.name = (cfg.beta1, cfg.beta2), cfg.weight_decay, \
            cfg.guidance, "train"
        self.schedule = f"lr {cfg.lr:g} (warm-up {cfg.warmup}, cosine to x{cfg.lr_min_ratio}), clip {cfg.grad_clip}"
        self.lr_flag, self.state = "--lr", {}  # named when a NaN/Inf skips a step; nothing to resume but the weights

    def lr_at(self, step):
        return lr_at(self.cfg, step)

    def step(self, step, batches):
        """One optimizer step over batches (cfg.grad_accum (latent, Condition) micro-batches); its metrics row."""
        loss, grad_norm, cause = sft_step(self.net, self.run.optimizer, self.params, self.cfg, batches, step,
                                          self.run.dp_rank, self.run.dp_world)
        return {"loss": all_mean(loss, self.run.device), "grad_norm": grad_norm, **nonfinite_fields(cause)}

    def evaluate(self, batches, truths):
        return evaluate(self.net, self.cfg, batches)

    def evaluated(self, result):
        return result

    def watch(self, row, history):
        return None  # no fidelity guard: SFT's held-out loss is its own measure

    def bar(self, row):
        return {"loss": f"{row['loss']:.4f}"}
