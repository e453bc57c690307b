"""What every training objective shares (SFT: sft.py; GRPO: grpo.py; DiffusionNFT: nft.py): the record train.py's
loop runs an objective through, the seeds every random draw comes from, the one guarded optimizer step (clip, skip
on NaN/Inf), and the phases of an RL update between its rollouts and its update (timing, refusing NaN/Inf samples
before any reward sees them, scoring every group into group-normalised advantages over all ranks).

Below every objective: sft, grpo, nft and rl import it, it imports none of them.
Contents, top to bottom: seeds -> the Objective record -> the RL knobs both RL objectives share -> the guarded
optimizer step -> RL phases and scoring -> DDRL's data term.
"""
import hashlib
import math
import time
from dataclasses import dataclass

import torch

from base import collectives
from condition import Condition
from engine.rollout import generated_mask
from nets.family import family_of


def sample_seed(*keys):
    """A 63-bit seed from a tuple of counters: every random draw depends only on (seed, step, sample, purpose),
    so a resumed or re-sharded run draws exactly the same numbers as an uninterrupted one."""
    digest = hashlib.blake2b(repr(keys).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def held_out_slots(dp_rank, dp_world, per_rank=2):
    """The global slots of this rank's held-out clips (slot s: the s-th held-out video, cycling; s also picks its
    evaluation noise), the same number on every rank, and their total over ranks."""
    return [i * dp_world + dp_rank for i in range(per_rank)], per_rank * dp_world


# -----------------------------------------------------------------------------
# The record of an objective for train.py's loop (sft.make, grpo.make, nft.make; train.objective_of picks the module)


@dataclass(kw_only=True)
class Objective:
    """What differs between SFT and the RL objectives in train.py's loop (it has no other objective branch). Built
    by keyword by each objective module's make(run, net, params, vae, neg_text, terms)."""
    lr_at: object  # step -> learning rate
    betas: tuple  # AdamW's, with:
    weight_decay: float
    schedule: str  # the optimizer line's learning-rate part
    step: object  # (step, next_batch) -> the step's metrics row (runs the optimizer step)
    held_out: object  # (batches, truths) -> {"eval_loss"} or {"eval_reward", "eval_psnr", ...}
    watch: object  # (row, history, agree) after each held-out evaluation: RL's fidelity guard (rl.fidelity_guard;
    # raises rl.FidelityStop to stop the run), or None
    bar: object  # row -> the progress bar's fields
    guidance: float  # the sample videos' CFG (RL: the rollouts' own)
    name: str  # the progress bar's
    mfu: bool  # RL's MFU: smoke.py (rollouts and updates differ too much for one number)
    extra_state: dict  # saved with every checkpoint and resumed (NFT: its old policy), {} else
    eval_at_start: bool  # RL: a held-out evaluation before the first update, every curve's starting point
    max_psnr_drop: float  # RL's fidelity bound, drawn in loss.png (0: none)
    lr_flag: str  # the flag and value of its learning rate, named when a NaN/Inf skips a step
    after_eval: object  # result -> result, after every held-out evaluation (the one a resumed step's marker holds
    # too): RL's adaptive data weight reads it (rl.objective); SFT: the result as it is


# -----------------------------------------------------------------------------
# The knobs both RL objectives have (grpo.GRPOConfig, nft.NFTConfig: each its own defaults and knobs on top)


@dataclass(frozen=True)
class RLConfig:
    group_size: int = 2  # K samples per group (one conditioning frame + instruction)
    num_steps: int = 8  # steps of the rollout sampler
    guidance: float = 0.0  # CFG of the rollouts, upstream's convention c + g (c - u); 0: one call a step
    kl_coef: float = 0.0  # weight of the KL term to the LoRA-disabled base (one more forward)
    adv_eps: float = 1e-4  # added to the std, outside the sqrt
    adv_clip: float = 5.0  # advantages are clipped to +-adv_clip
    global_std: bool = True  # normalise by the std of all rewards in the update (advised for K <= 4), else per group
    std_ddof: int = 0  # 0: population std (K = 2 gives |A| ~ 1); 1: unbiased (|A| ~ 0.7071 at K = 2)
    lr: float = 1e-4  # AdamW learning rate over the LoRA adapters, constant after the warm-up
    warmup: int = 0  # updates of linear learning-rate warm-up before the constant lr (0 = none)
    weight_decay: float = 1e-4  # AdamW weight decay
    betas: tuple = (0.9, 0.999)  # AdamW betas
    max_grad_norm: float = 1.0  # gradient clipping per optimizer step
    data_target: float = 0.0  # > 0: data_coef adapts to hold held-out PSNR within this many dB of step 0's: after
    # each held-out evaluation x2 when it fell more than 1.5 target, /2 when less than target / 1.5 (docs/rl.md)

    def __post_init__(self):
        if self.group_size < 2:
            raise ValueError(f"group_size={self.group_size}: a group baseline needs K >= 2")
        if self.guidance < 0 or self.kl_coef < 0 or self.adv_clip <= 0:
            raise ValueError(f"need guidance >= 0, kl_coef >= 0 and adv_clip > 0: guidance={self.guidance} "
                             f"kl_coef={self.kl_coef} adv_clip={self.adv_clip}")
        if self.data_target < 0:
            raise ValueError(f"data_target={self.data_target}: >= 0 dB (0: a fixed data_coef)")
        if self.std_ddof not in (0, 1):
            raise ValueError(f"std_ddof={self.std_ddof}; valid: 0 (population), 1 (unbiased)")
        if self.lr <= 0 or self.warmup < 0 or self.weight_decay < 0 or self.max_grad_norm <= 0 \
                or len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"need lr > 0, warmup >= 0, weight_decay >= 0, max_grad_norm > 0 and two betas in [0, 1):"
                             f" lr={self.lr} warmup={self.warmup} weight_decay={self.weight_decay} "
                             f"max_grad_norm={self.max_grad_norm} betas={self.betas}")

    def lr_at(self, update):
        """The learning rate of update `update` (0-based): linear warm-up over warmup updates, then constant."""
        return self.lr * min(1.0, (update + 1) / self.warmup) if self.warmup else self.lr


# -----------------------------------------------------------------------------
# The guarded optimizer step


def clip_and_step(optimizer, params, max_norm, skip=False):
    """Clip params' gradients to max_norm, step the optimizer unless the gradient norm is NaN/Inf or `skip` (e.g. a
    NaN/Inf loss on some rank), then zero the gradients: the one optimizer step of SFT, GRPO and NFT. A skipped step
    leaves the weights and the optimizer state as they were. Returns (gradient norm as a float, the seconds the
    optimizer step took, CUDA synchronised, or None when skipped)."""
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
    seconds = None
    if math.isfinite(grad_norm) and not skip:
        device = params[0].device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, seconds


# -----------------------------------------------------------------------------
# The phases of one RL update, between its rollouts and its update, that GRPO and NFT share


def phase_timer(device):
    """(times, timed): timed(name, fn) runs fn and adds its seconds to times[name] (CUDA synchronised around it)."""
    times = {}

    def timed(name, fn):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        result = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times[name] = times.get(name, 0.0) + time.perf_counter() - start
        return result
    return times, timed


MAX_SAMPLE_ABS = 1e6  # latents are unit-scale (the sampler starts at sigma 80): a sample beyond this is no video


def check_samples(x0s, conds, what="RL rollouts"):
    """FloatingPointError naming the groups whose samples to reward (x0s: per group [K, C, T, H, W]) hold NaN/Inf, and
    why: NaN/Inf inputs (the conditioning frames, prompt or camera of its Condition) or, from finite inputs, a diverged
    policy; finite samples beyond MAX_SAMPLE_ABS are a diverged policy too (a reward would overflow on them and be
    blamed). Called before scoring, so a reward is never blamed for (or fed) a broken sample."""
    huge = [g for g, x0 in enumerate(x0s) if bool(torch.isfinite(x0).all()) and float(x0.abs().max()) > MAX_SAMPLE_ABS]
    if huge:
        peak = max(float(x0s[g].abs().max()) for g in huge)
        raise FloatingPointError(f"{what} of {len(huge)} of {len(x0s)} groups reach |x| = {peak:.3g} (latents "
                                 f"are unit-scale; > {MAX_SAMPLE_ABS:g} is no video) before scoring (the rewards were "
                                 "not called): the policy diverged; lower the --grpo-lr / --nft-lr and resume from an "
                                 "earlier checkpoint")
    bad = [g for g, x0 in enumerate(x0s) if not bool(torch.isfinite(x0).all())]
    if not bad:
        return
    cond = conds[bad[0]]
    frames = cond.gt_frames if cond.gt_frames is None or cond.condition_mask is None else \
        torch.where(cond.condition_mask.bool(), cond.gt_frames, 0.0)  # only the conditioning frames are read
    inputs = [name for name, t in (("conditioning frames", frames), ("prompt embedding", cond.crossattn_emb),
                                   ("negative prompt embedding", cond.neg_crossattn_emb), ("camera", cond.camera))
              if t is not None and not bool(torch.isfinite(t).all())]
    cause = (f"its {', '.join(inputs)} hold NaN/Inf: the clip or its text embedding is damaged" if inputs else
             "its inputs are finite: the policy diverged (lower the --grpo-lr / --nft-lr, resume from an earlier "
             "checkpoint)")
    raise FloatingPointError(f"{what} of {len(bad)} of {len(x0s)} groups are NaN/Inf before scoring (the "
                             f"rewards were not called); group {bad[0]} (key {cond.key}): {cause}")


def agreed_names(scores):
    """The reward component names, the same for every group on every rank (collective), or a ValueError listing them:
    the rewards are gathered by position, so differing names would mix components or hang the gather."""
    mine = sorted({tuple(sorted(s)) for s in scores})  # one entry when every group has the same names
    everyone = collectives.gather(mine)
    if len(everyone[0]) != 1 or any(e != everyone[0] for e in everyone):
        raise ValueError("reward components differ between clips or ranks (" + "; ".join(
            f"rank {r}: {' / '.join(map(str, map(list, e)))}" for r, e in enumerate(everyone)) + "): every reward "
            "term must return the same components for every batch")
    return list(everyone[0][0])


def score_groups(x0s, conds, score, decode, cfg, timed, agree=None, cp_size=1):
    """Decode (only if a reward needs pixels) and score every group's K samples, gather all ranks' scores and turn
    the rewards into advantages over all ranks' groups (collective). x0s: per group a [K, C, T, H, W] latent; conds:
    the groups' records (score reads what a world-model reward needs of the true clip: its latent, its actions).
    cfg: any config with group_size, adv_eps, adv_clip, global_std, std_ddof (GRPO's, NFT's).
    Returns (this rank's advantages [groups, K] on x0s' device, metrics: rewards, components, adv_std)."""
    device = x0s[0].device

    def score_all():
        out = []
        for x0, cond in zip(x0s, conds, strict=True):
            video = timed("decode", lambda: decode(x0))
            out.append(timed("reward", lambda: score(video, x0, cond)))
        return out
    scores = agree("scoring the rollouts", score_all) if agree is not None else score_all()
    names = agreed_names(scores)
    local = torch.stack([torch.cat([s[n].float().reshape(-1) for s in scores]).to(device) for n in names])
    everyone = collectives.gather_groups(local, cp_size).double().cpu()  # [names, dp * groups * K], dp-rank-major
    rank, world = collectives.dp_coords(cp_size)  # --cp: a cp group's ranks scored the same rollouts; one copy counts
    keys = [(r, g) for r in range(world) for g in range(len(x0s)) for _ in range(cfg.group_size)]
    rewards = everyone[names.index("reward")]
    advantages = group_advantages(rewards, keys, eps=cfg.adv_eps, clip=cfg.adv_clip, global_std=cfg.global_std,
                                  ddof=cfg.std_ddof)
    metrics = {"reward_mean": float(rewards.mean()), "reward_std": float(rewards.std(correction=0)),
               "reward_group_std": float(rewards.view(-1, cfg.group_size).std(dim=1, correction=0).mean()),
               "adv_std": float(advantages.std(correction=0))}
    metrics.update({f"reward_{name.replace('/', '_')}": float(everyone[i].mean())
                    for i, name in enumerate(names) if name != "reward"})
    return advantages.view(world, len(x0s), cfg.group_size)[rank].to(device), metrics


# -----------------------------------------------------------------------------
# DDRL's data term, the regulariser GRPO and NFT share (--grpo-data-coef, --nft-data-coef)


def masked_mean(x, gen_mask):
    """Mean over the generated elements of x [1, C, T, H, W] (gen_mask [1, 1, T, H, W])."""
    return (x * gen_mask).sum() / (gen_mask.sum() * x.shape[1])


def data_loss(net, cond: Condition, grid, generator):
    """DDRL's regulariser: flow matching on the group's real clip (cond.gt_frames, the whole encoded clip) at one
    noise level of the grid, the generated frames only: mean |v - (eps - x_data)|^2."""
    i = int(torch.randint(len(grid), (1,), generator=generator, device=generator.device))
    eps = torch.randn(cond.gt_frames.shape, generator=generator, device=generator.device)
    v, u, _ = family_of(net.cfg).forward_velocity(net, cond, cond.gt_frames.float(), eps, grid[i])
    return masked_mean((v - u).square(), generated_mask(cond, tuple(v.shape[1:]), v.device))


# -----------------------------------------------------------------------------
# Advantages: a group's rewards -> group-relative advantages (score_groups, smoke.py)


def group_advantages(rewards, keys, eps=1e-4, clip=5.0, global_std=True, ddof=0):
    """(r - mean_group) / (std + eps), clipped to +-clip: [n] float64 advantages for [n] rewards.

    keys: one hashable group key per reward, (episode id, instruction); interleaved keys are fine. std is the
    population std (ddof 0, Flow-GRPO) or unbiased (ddof 1), of the group or, with global_std, of all valid
    rewards. A non-finite reward (failed scoring) gets advantage 0; a group whose valid rewards are all equal
    (or has fewer than 2) gets exactly 0, so the zero-advantage filter drops it.
    """
    r = torch.as_tensor(rewards, dtype=torch.float64).reshape(-1).cpu()
    if len(keys) != r.numel():
        raise ValueError(f"{r.numel()} rewards but {len(keys)} group keys")
    valid = torch.isfinite(r)
    advantages = torch.zeros_like(r)
    if global_std:
        pooled = r[valid]
        global_sd = pooled.std(correction=ddof) if pooled.numel() > ddof else torch.tensor(0.0, dtype=r.dtype)
    for key in dict.fromkeys(keys):
        idx = torch.tensor([j for j, k in enumerate(keys) if k == key and valid[j]], dtype=torch.long)
        group = r[idx]
        if group.numel() < 2 or bool((group == group[0]).all()):
            continue
        sd = global_sd if global_std else group.std(correction=ddof)
        advantages[idx] = (group - group.mean()) / (sd + eps)
    return advantages.clamp(-clip, clip)
