"""GRPO post-training of the video DiT with LoRA: Flow-GRPO's objective on Cosmos-Predict2's (and 2.5's) sampler.

docs/grpo.md has the derivation (§10: Predict2.5). engine/rollout.py samples K trajectories of a group with a stochastic
step whose transitions are exact Gaussians and stores their log-densities; this file recomputes them with
gradients and maximises Flow-GRPO's clipped surrogate with group-normalised advantages, optionally with a KL to
the LoRA-disabled base.

By default rollout and training call the *same* function on the *same* stored tensors with B = 1 per network call
(cond and uncond as separate calls), so before the first optimizer step logp_new == logp_old bit for bit and the
ratio is exactly 1 (docs/grpo.md, "ratio == 1"). The fast path (docs/grpo.md §13) batches the rollout's calls
(rollout_batch) and compiles: it rounds differently, so recompute_old_logp takes logp_old from the training forward
itself, which at one optimizer step per update is the update's own forward (free); the ratio is again exactly 1
and `rollout_logp_gap` reports how far the sampler's log-probs were. Either way the update reuses what theta_old
already computed: the rollout's uncond predictions of the trained steps, and (same_latent) one forward for the
trajectories that share a step's state.

Contents, top to bottom: config -> loss -> update -> one update of a training run (train_step: rollouts, then
rl.score_groups (decode, rewards, advantages over all ranks, shared with nft.py), update) -> GRPO, the objective
train.py calls.
"""
from contextlib import nullcontext
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from base import collectives
from condition import uncond
from engine import rl
from engine.objective import clip_and_step
from engine.rl import PhaseTimer, RLConfig, Scoring, data_loss, score_groups
from engine.rollout import (
    ROLLOUT_BATCHES,
    SDE_TYPES,
    Rollout,
    branch_predictions,
    draw_window_start,
    gaussian_log_prob,
    generated_mask,
    guide,
    mean_of,
    predict,
    rollout_group,
    with_uncond,
)
from nets.family import family_of
from nets.lora import set_lora_enabled

# -----------------------------------------------------------------------------
# Config


@dataclass(frozen=True)
class GRPOConfig(RLConfig):
    """GRPO's knobs: rl.RLConfig's (K, steps, CFG, KL, advantages, AdamW; Flow-GRPO's Wan recipe values) and
    its own."""
    num_steps: int = 8  # N stochastic steps over Karras sigmas 80 -> 0.002, then one clean pass at sigma_min
    # (Predict2.5: N steps of the shift-5 grid 0.9998 -> 0)
    guidance: float = 7.0  # Predict2 CFG x0 = c + g (c - u), i.e. classic scale g + 1; 0 = one forward per step
    # (Predict2.5: the same convention on the velocity, v = v_c + g (v_c - v_u))
    kl_coef: float = 0.0  # beta_KL to the LoRA-disabled reference; 0.004 if reward hacking shows up
    sde_type: str = "ddim_eta"  # "ddim_eta" or "cps" (Flow-GRPO-Fast's step); both keep alpha^2 + beta^2 = sigma'^2
    eta: float = 0.5  # ddim_eta: eta in [0, 1] (= a / sqrt 2 for Flow-GRPO's noise_level a); cps: a in [0, 1]
    window_size: int = 0  # > 0: Flow-GRPO-Fast, noise (and training) only on this many consecutive steps
    window_range: tuple = ()  # (lo, hi): window start drawn in [lo, hi - window_size] per group; () = (0, N // 2)
    train_steps: tuple = ()  # steps to train; () = every stochastic step except the last one (never N - 1)
    same_latent: bool = False  # one initial noise draw per group (with a window, the deterministic prefix is shared)
    uncond_grad: bool = False  # False: the uncond branch is a separate no-grad forward (same value, half the memory)
    clip_range: float = 1e-3  # ratio clip epsilon (per-element-mean log-probs make ratios tiny)
    pg_step_weight: str = "unit"  # unit: step i by 1 / its sensitivity (even gradient noise); exact: 1; beta2: beta_i^2
    opt_steps_per_update: int = 1  # optimizer steps per batch of rollouts; > 1 makes the later ones off-policy
    drop_zero_advantage: bool = True  # skip trajectories with A == 0 (all-tie groups); under FSDP every rank must
    # then still run the same number of micro-steps: disable it, or equalise the counts in train.py
    recompute_old_logp: bool = False  # logp_old from the training forward (its layout and kernels), not the rollout:
    # free at opt_steps_per_update 1 (the update's own forward, theta == theta_old), else one no-update pass
    rollout_batch: str = "none"  # rollout network calls: none = B = 1 per state and branch (training's layout: ratio
    # 1 bit for bit); cfg = cond + uncond in one B = 2 call; group = a group's states and branches in one call
    # (B = 2K); cfg and group round unlike training, so they need recompute_old_logp
    data_coef: float = 0.005  # DDRL's data term as in NFT (--nft-data-coef): weight of the flow-matching loss on each
    # group's real clip, one more forward and backward per group and optimizer step. 0.005 keeps held-out PSNR within
    # 0.1 dB of the paired control on the tiny default while rewards rise (docs/rl.md "Regularised defaults"); 0: plain
    # Flow-GRPO
    probe_every: int = 1  # the after-step probe (clipfrac, approx_kl: a no-grad forward per trained step of trajectory
    # 0) on updates 0, N, 2N, ...; 0: never. A diagnostic: ~9 s of a ~256 s update at 14B (docs/grpo.md §13)
    offload_activations: bool = False  # keep the training forward's saved tensors in (pinned) host memory until
    # backward; with sac "block" these are the block inputs: ~11.9 GiB at 14B, 93x432x768, for ~5-10% time

    def __post_init__(self):
        super().__post_init__()
        N = self.num_steps
        if N < 2:
            raise ValueError(f"num_steps={N}: need >= 2 (the last step is never trained)")
        if self.sde_type not in SDE_TYPES:
            raise ValueError(f"sde_type={self.sde_type!r}; valid: {SDE_TYPES}")
        if not 0.0 <= self.eta <= 1.0:
            raise ValueError(f"eta={self.eta} outside [0, 1]")
        if self.data_coef < 0:
            raise ValueError(f"data_coef={self.data_coef}: need >= 0")
        if self.probe_every < 0:
            raise ValueError(f"probe_every={self.probe_every}: need >= 0 (0: never probe)")
        if self.rollout_batch not in ROLLOUT_BATCHES:
            raise ValueError(f"rollout_batch={self.rollout_batch!r}; valid: {', '.join(ROLLOUT_BATCHES)}")
        if self.pg_step_weight not in STEP_WEIGHTS:
            raise ValueError(f"pg_step_weight={self.pg_step_weight!r}; valid: {', '.join(STEP_WEIGHTS)}")
        if self.window_size:
            if self.train_steps:
                raise ValueError("train_steps and window_size are exclusive: a window trains exactly its steps")
            lo, hi = self.window
            if not 0 <= lo <= hi - self.window_size or hi > N - 1:
                raise ValueError(f"window_size={self.window_size} does not fit window_range=({lo}, {hi}) inside "
                                 f"steps 0..{N - 2} (the last step {N - 1} is never trained)")
        elif self.window_range:
            raise ValueError("window_range is set but window_size is 0")
        bad = [i for i in self.train_steps if not 0 <= i < N - 1]
        if bad:
            raise ValueError(f"train_steps {bad} outside 0..{N - 2}: the last step {N - 1} is never trained")
        if self.opt_steps_per_update < 1 or self.clip_range <= 0:
            raise ValueError("need opt_steps_per_update >= 1 and clip_range > 0")

    @property
    def window(self):
        return tuple(self.window_range) if self.window_range else (0, self.num_steps // 2)


STEP_WEIGHTS = ("unit", "exact", "beta2")


# -----------------------------------------------------------------------------
# Loss for one (trajectory, step), or for the trajectories of a group that share the step's state


def clipped_surrogate(log_prob, old_log_prob, advantage, clip_range):
    """Flow-GRPO / PPO: max(-A rho, -A clip(rho, 1 - eps, 1 + eps)), rho = exp(logp - logp_old). Returns (loss, rho)."""
    ratio = torch.exp(log_prob - old_log_prob)
    loss = torch.maximum(-advantage * ratio, -advantage * ratio.clamp(1.0 - clip_range, 1.0 + clip_range))
    return loss, ratio


def states_log_prob(net, rollout: Rollout, samples, step, cfg: GRPOConfig, reuse_uncond=False):
    """log pi_theta(x_{i+1} | x_i) of trajectories `samples` at `step`, which share x_i (one of them, or a shared
    state): one forward in the training layout (B = 1, with grad if enabled). reuse_uncond (theta == theta_old):
    the rollout's uncond prediction instead of a forward. Returns (logp [len(samples)], mean [1, ...])."""
    k0 = samples[0]
    x = rollout.states[k0, step: step + 1]
    noise = rollout.states[k0, :1]
    pred_c = predict(net, x, step, rollout.grid, rollout.cond, noise)
    pred_u = None
    if with_uncond(rollout.cond, cfg.guidance):
        pred_u = rollout.uncond.get((k0, step)) if reuse_uncond and not cfg.uncond_grad and rollout.uncond else None
        if pred_u is None:
            with torch.set_grad_enabled(cfg.uncond_grad and torch.is_grad_enabled()):
                pred_u = predict(net, x, step, rollout.grid, uncond(rollout.cond), noise)
    mean = mean_of(guide(pred_c, pred_u, cfg.guidance), x, step, rollout.grid)
    gen_mask = generated_mask(rollout.cond, tuple(x.shape[1:]), x.device)
    beta = rollout.betas[step]
    return torch.cat([gaussian_log_prob(rollout.states[k, step + 1: step + 2], mean, beta, gen_mask)
                      for k in samples]), mean


def step_log_prob(net, rollout: Rollout, sample, step, cfg: GRPOConfig):
    """Recompute log pi_theta(x_{i+1} | x_i) of a stored transition (with grad if enabled); returns (logp [1], mean)."""
    return states_log_prob(net, rollout, [sample], step, cfg)


def training_log_prob(net, rollout: Rollout, samples, step, cfg: GRPOConfig, reuse_uncond=False):
    """states_log_prob as the update runs it: grad enabled, saved tensors optionally offloaded to host memory."""
    device = rollout.states.device
    offload = torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda") if cfg.offload_activations \
        else nullcontext()
    with torch.enable_grad(), offload:  # checkpointed blocks save their inputs through these hooks too
        return states_log_prob(net, rollout, samples, step, cfg, reuse_uncond)


@torch.no_grad()
def reference_mean(net, rollout: Rollout, sample, step, cfg: GRPOConfig):
    """The step's mean under the reference (the same net with LoRA off), without autograd, in the rollout's layout
    (cfg.rollout_batch): theta-independent, so any layout serves; "none" is the training layout."""
    x = rollout.states[sample, step: step + 1]
    set_lora_enabled(net, False)
    try:
        pred_c, pred_u = branch_predictions(net, x, rollout.states[sample, :1], step, rollout.grid, rollout.cond, cfg)
    finally:
        set_lora_enabled(net, True)
    return mean_of(guide(pred_c, pred_u, cfg.guidance), x, step, rollout.grid)


def reference_kl(net, rollout: Rollout, sample, step, mean, cfg: GRPOConfig):
    """Exact per-element KL(pi_theta || pi_ref) of the step, averaged over generated elements (same std, so only
    the means differ)."""
    mean_ref = reference_mean(net, rollout, sample, step, cfg)
    gen_mask = generated_mask(rollout.cond, tuple(mean.shape[1:]), mean.device)
    squared = ((mean - mean_ref) ** 2 * gen_mask).sum(dim=(1, 2, 3, 4))
    count = gen_mask.sum(dim=(1, 2, 3, 4)) * mean.shape[1]
    return squared / count / (2.0 * rollout.betas[step] ** 2)


def old_log_prob(rollout: Rollout, sample, step, log_prob, cfg: GRPOConfig):
    """The ratio's logp_old of a pair: the training forward's own (detached) value when recompute_old_logp trains one
    optimizer step per update (theta == theta_old in every micro-step: the recompute costs nothing), kept for the
    probe; else the stored one (the rollout's, or recompute_old_log_probs')."""
    if cfg.recompute_old_logp and cfg.opt_steps_per_update == 1:
        rollout.old_log_probs[sample, step] = log_prob.detach()
        return log_prob.detach()
    old = rollout.old_log_probs[sample, step]
    if not torch.isfinite(old):
        raise ValueError(f"no stored log-prob for sample {sample} step {step} (a deterministic step?)")
    return old


def grpo_loss(net, rollout: Rollout, samples, step, advantages, cfg: GRPOConfig, step_weight=1.0,
              reuse_uncond=False):
    """Loss of trajectories `samples` (sharing the step's state; an int: one) at one trained step, one forward:
    sum over them of step_weight * surrogate + kl_coef * KL. advantages: one per sample. Returns (loss [1], infos):
    per sample the graph-carrying log_prob (for health checks), the rollout's and the ratio's old log-prob, and the
    detached ratio / kl."""
    single = isinstance(samples, int)
    samples, advantages = ([samples], [advantages]) if single else (samples, advantages)
    log_probs, mean = training_log_prob(net, rollout, samples, step, cfg, reuse_uncond)
    kl = reference_kl(net, rollout, samples[0], step, mean, cfg) if cfg.kl_coef > 0 else None
    loss, infos = 0.0, []
    for j, (k, advantage) in enumerate(zip(samples, advantages)):
        old = old_log_prob(rollout, k, step, log_probs[j: j + 1], cfg)
        surrogate, ratio = clipped_surrogate(log_probs[j: j + 1], old, float(advantage), cfg.clip_range)
        pair = step_weight * surrogate if kl is None else step_weight * surrogate + cfg.kl_coef * kl
        loss = loss + pair
        infos.append({"loss": pair.detach(), "log_prob": log_probs[j: j + 1],
                      "rollout_log_prob": rollout.log_probs[k, step],
                      "old_log_prob": old, "ratio": ratio.detach(), "kl": None if kl is None else kl.detach()})
    return loss, (infos[0] if single else infos)


# -----------------------------------------------------------------------------
# Update


def lora_optimizer(net, params, cfg: GRPOConfig):
    """AdamW over the LoRA parameters; refuses if anything else in the net is trainable."""
    trainable = {id(p) for p in net.parameters() if p.requires_grad}
    if trainable != {id(p) for p in params}:
        raise ValueError(f"{len(trainable)} trainable tensors in the net but {len(params)} given: GRPO trains the "
                         "LoRA adapters only (lora.add_lora freezes the rest)")
    return torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=1e-8, weight_decay=cfg.weight_decay)


def recompute_old_log_probs(net, rollout: Rollout, cfg: GRPOConfig):
    """Overwrite logp_old (rollout.old_log_probs) of the trained steps by the training forward itself (grad mode
    included: some attention kernels differ with and without autograd), discarding the graph: for rollouts run in
    another layout or other kernels when an update takes several optimizer steps (with one, old_log_prob takes it
    from the update's own forward for free). The ratio is then 1 up to the rounding of the sampling distribution."""
    for i in rollout.train_steps:
        for samples in share_state(rollout, range(rollout.states.shape[0]), i):
            rollout.old_log_probs[samples, i] = training_log_prob(net, rollout, samples, i, cfg, True)[0].detach()


def share_state(rollout: Rollout, samples, step):
    """samples grouped by the state they start `step` from: one group if the step's state is shared, else one each."""
    samples = list(samples)
    return ([samples] if samples else []) if rollout.shares(step) else [[k] for k in samples]


def micro_steps(items, rollouts, n_chunks):
    """Per chunk, its micro-steps (g, [k, ...], i) in trajectory order: one forward each; the chunk's trajectories of
    group g are merged into one at a trained step whose state they share (same_latent: the window's first step)."""
    chunks = []
    for c in range(n_chunks):
        mine, chunk, merged = items[c::n_chunks], [], set()
        for g, k in mine:
            for i in rollouts[g].train_steps:
                if not rollouts[g].shares(i):
                    chunk.append((g, [k], i))
                elif (g, i) not in merged:
                    merged.add((g, i))
                    chunk.append((g, [h for f, h in mine if f == g], i))
        chunks.append(chunk)
    return chunks


def step_sensitivity(rollout: Rollout, step):
    """|d logp / d v_hat| per element of step `step`, in units of z: |d mean / d v_hat| / beta (the family's
    step_sensitivity: nets/edm.py's, nets/flow.py's). It spans ~700x over Predict2's Karras-8 steps (docs/grpo.md §3), and so
    does each step's gradient."""
    return rollout.family.step_sensitivity(rollout.sigmas[step], rollout.sigmas[step + 1], rollout.alphas[step],
                                           rollout.betas[step])


def step_weights(rollout: Rollout, cfg: GRPOConfig):
    """w_i per trained step, mean 1 (docs/grpo.md §7): exact 1; beta2 beta_i^2; unit 1 / step_sensitivity."""
    steps = rollout.train_steps
    if cfg.pg_step_weight == "exact" or not steps:
        return {i: 1.0 for i in steps}
    raw = {i: rollout.betas[i] ** 2 if cfg.pg_step_weight == "beta2" else 1.0 / step_sensitivity(rollout, i)
           for i in steps}
    mean = sum(raw.values()) / len(raw)
    return {i: w / mean for i, w in raw.items()}


def grpo_update(net, optimizer, params, rollouts, advantages, cfg: GRPOConfig, generator=None, set_grad_sync=None,
                cp_size=1, data_generator=None, probe=True):
    """Train on a batch of rollouts: backward over every (trajectory, trained step) pair, accumulated, then step. A
    micro-step is one forward (micro_steps: the pairs sharing a state go together); "micro_steps" in the stats
    counts pairs, "forwards" micro-steps.

    rollouts: list of Rollout (one per group); advantages: per rollout a [K] tensor (advantages[g][k]).
    Trajectories with advantage exactly 0 are dropped (cfg.drop_zero_advantage). The rest (shuffled when a CPU
    generator is given) is split into cfg.opt_steps_per_update chunks, one optimizer step each. set_grad_sync:
    optional callable(bool), run before each backward with "is this the chunk's last micro-step" (FSDP2:
    net.set_requires_gradient_sync, one gradient reduction per step).

    Under torch.distributed (FSDP2: every forward is a collective) every rank runs the same number of micro-steps
    per chunk: a rank with fewer pads with zero-weight ones (they run, and add nothing). Each real pair's loss is
    scaled by dp / (real pairs of the chunk in all dp groups), so the mean over dp groups that FSDP reduces
    (collectives.shard_model: a sum over the cp_size ranks of a cp group, which hold the same rollouts and
    advantages, / dp) is the mean over real pairs. A chunk with no real pair on any rank is skipped on every rank
    alike: no forward, and no optimizer step (Adam's momentum and weight decay would still move the weights).

    Returns a dict of stats, including the health checks of the first chunk (theta == theta_old there):
    first_logp_equal (every logp_new == logp_old bitwise), first_max_abs_dlogp, first_ratio, and per optimizer
    step grad_norm (before clipping) and grads_outside_params (must be 0). A non-finite grad norm skips that
    optimizer step and is counted in nonfinite_steps. With cfg.data_coef > 0 every chunk that trains adds, on every
    rank, one forward + backward per group: rl.data_loss on its real clip (noise from data_generator), weighted
    data_coef / groups (FSDP's mean over dp groups makes it the mean over all groups).
    """
    if cfg.data_coef > 0 and data_generator is None:
        raise ValueError("grpo_update: data_coef > 0 draws the data term's noise from data_generator: pass one")
    dp = collectives.world_size() // cp_size
    items = [(g, k) for g, adv in enumerate(advantages) for k in range(len(adv))
             if float(adv[k]) != 0.0 or not cfg.drop_zero_advantage]
    stats = update_stats(len(items))
    if generator is not None:
        items = [items[j] for j in torch.randperm(len(items), generator=generator).tolist()]
    n_chunks = cfg.opt_steps_per_update
    micro = micro_steps(items, rollouts, n_chunks)
    device = rollouts[0].states.device
    longest = torch.tensor([len(m) for m in micro], dtype=torch.float64, device=device)  # forwards
    total = torch.tensor([sum(len(ks) for _, ks, _ in m) for m in micro], dtype=torch.float64, device=device)  # pairs
    if dist.is_initialized() and dist.get_world_size() > 1:  # before any forward: every rank decides the same
        dist.all_reduce(longest, op=dist.ReduceOp.MAX)
        collectives.sum_groups(total, cp_size)
    if cfg.recompute_old_logp and cfg.opt_steps_per_update > 1 and total.sum() > 0:
        for rollout in rollouts:  # all of them: the same number of forwards on every rank
            recompute_old_log_probs(net, rollout, cfg)
    weights = [step_weights(ro, cfg) for ro in rollouts]
    stats["first_logp_equal"], stats["first_max_abs_dlogp"] = True, 0.0

    for c, chunk in enumerate(micro):
        if total[c] == 0:  # nothing to train in this chunk on any rank
            stats["skipped_chunks"] += 1
            continue
        n_micro, scale = int(longest[c]), dp / float(total[c])
        padding = [(0, [0], rollouts[0].train_steps[0], 0.0)] * (n_micro - len(chunk)) \
            if rollouts[0].train_steps else []
        if len(chunk) + len(padding) != n_micro:
            raise RuntimeError(f"rank cannot pad its {len(chunk)} micro-steps to {n_micro}: no trainable step")
        n_backward = n_micro + (len(rollouts) if cfg.data_coef > 0 else 0)  # the last one reduces the gradients
        chunk_backward(net, rollouts, advantages, [m + (1.0,) for m in chunk] + padding, weights, scale, n_backward,
                       cfg, stats, set_grad_sync)
        if cfg.data_coef > 0:
            data_term(net, rollouts, cfg, data_generator, stats, set_grad_sync)
        optimizer_step(net, optimizer, params, cfg, stats, c)
    for key in ("loss", "clipfrac_in_update", "approx_kl_in_update", "kl"):  # means over this rank's real micro-steps
        stats[key] /= max(1, stats["micro_steps"])
    if stats["opt_steps"] and probe:  # same on every rank: the skip decisions above are global
        stats["clipfrac"], stats["approx_kl"] = probe_after_update(net, rollouts[0], cfg)
    return stats


def update_stats(trajectories):
    """grpo_update's stats before its first micro-step."""
    return {"trajectories": trajectories, "micro_steps": 0, "forwards": 0, "padded_steps": 0, "opt_steps": 0,
            "skipped_chunks": 0, "nonfinite_steps": 0, "grad_norm": [], "grads_outside_params": [], "loss": 0.0,
            "kl": 0.0, "clipfrac_in_update": 0.0, "approx_kl_in_update": 0.0, "clipfrac": None, "approx_kl": None,
            "first_logp_equal": None, "first_max_abs_dlogp": None, "first_ratio": None, "logp_requires_grad": None,
            "logp_has_grad_fn": None, "optimizer_s": 0.0, "data_loss": 0.0}


def chunk_backward(net, rollouts, advantages, micro, weights, scale, n_backward, cfg: GRPOConfig, stats,
                   set_grad_sync):
    """The backward of every micro-step of one chunk (micro: (group, samples, step, 1.0) real ones, then (..., 0.0)
    padding that runs and adds nothing), each real loss scaled by `scale`; the n_backward-th backward of the chunk
    reduces its gradients (set_grad_sync)."""
    for done, (g, ks, i, *dummy) in enumerate(micro, start=1):
        real = dummy[0] != 0.0
        advantage = [advantages[g][k] for k in ks] if real else [0.0]
        loss, infos = grpo_loss(net, rollouts[g], ks, i, advantage, cfg, weights[g][i],
                                reuse_uncond=stats["opt_steps"] == 0)  # theta == theta_old until a step
        if set_grad_sync is not None:
            set_grad_sync(done == n_backward)
        (loss * (scale if real else 0.0)).backward()
        stats["forwards"] += 1
        if not real:
            stats["padded_steps"] += 1
            continue
        for info in infos:
            record_micro_step(stats, info, cfg)


def data_term(net, rollouts, cfg: GRPOConfig, generator, stats, set_grad_sync):
    """DDRL's regulariser in a GRPO chunk: rl.data_loss (flow matching on each group's real clip, cond.gt_frames)
    at one noise level of the family's training levels, backward with weight data_coef / groups; the last backward
    reduces the chunk's gradients (set_grad_sync)."""
    levels = family_of(net.cfg).training_levels(cfg.num_steps)
    for g, rollout in enumerate(rollouts, start=1):
        loss = data_loss(net, rollout.cond, levels, generator)
        stats["data_loss"] += float(loss.detach()) / len(rollouts)
        if set_grad_sync is not None:
            set_grad_sync(g == len(rollouts))
        (cfg.data_coef * loss / len(rollouts)).backward()
        stats["forwards"] += 1


def record_micro_step(stats, info, cfg: GRPOConfig):
    """Add one real (trajectory, step) pair to grpo_update's stats, with the first chunk's health checks (theta ==
    theta_old): its log-prob against the rollout's, bit for bit, and the ratio."""
    ratio, dlogp = info["ratio"], (info["log_prob"].detach() - info["old_log_prob"])
    if stats["first_ratio"] is None:
        stats["first_ratio"] = float(ratio)
        stats["logp_requires_grad"] = bool(info["log_prob"].requires_grad)
        stats["logp_has_grad_fn"] = info["log_prob"].grad_fn is not None
    if stats["opt_steps"] + stats["nonfinite_steps"] == 0:  # the first chunk that trains: theta == theta_old
        log_prob, sampled = info["log_prob"].detach().reshape(()), info["rollout_log_prob"]
        stats["first_logp_equal"] &= bool(torch.equal(log_prob, sampled))
        stats["first_max_abs_dlogp"] = max(stats["first_max_abs_dlogp"], float((log_prob - sampled).abs()))
    stats["micro_steps"] += 1
    stats["loss"] += float(info["loss"])
    stats["clipfrac_in_update"] += float((ratio - 1).abs() > cfg.clip_range)
    stats["approx_kl_in_update"] += 0.5 * float(dlogp) ** 2
    if info["kl"] is not None:
        stats["kl"] += float(info["kl"])


def optimizer_step(net, optimizer, params, cfg: GRPOConfig, stats, chunk):
    """objective.clip_and_step (a NaN/Inf gradient norm skips the step, counted in nonfinite_steps), with GRPO's
    stats: the norm, the seconds, and any gradient outside params (there must be none)."""
    param_ids = {id(p) for p in params}
    stats["grads_outside_params"].append(sum(p.grad is not None for p in net.parameters() if id(p) not in param_ids))
    grad_norm, seconds = clip_and_step(optimizer, params, cfg.max_grad_norm)
    stats["grad_norm"].append(grad_norm)
    if seconds is not None:
        stats["optimizer_s"] += seconds
        stats["opt_steps"] += 1
    else:
        stats["nonfinite_steps"] += 1
        print(f"grpo_update: non-finite grad norm {grad_norm} in chunk {chunk}: optimizer step skipped", flush=True)


@torch.no_grad()
def probe_after_update(net, rollout: Rollout, cfg: GRPOConfig):
    """(clipfrac, approx_kl) of the updated policy on trajectory 0 of `rollout`, every trained step: the fraction with
    |ratio - 1| > clip_range and 1/2 E[(logp_new - logp_old)^2]. Measured after the optimizer step: within a one-step
    update every ratio is 1 by construction (they would always read 0). Costs one no-grad forward (and its uncond
    branch) per trained step; rollout 0 has the same trained steps on every rank (window_starts), so FSDP's
    collectives stay in step."""
    deltas = torch.stack([step_log_prob(net, rollout, 0, i, cfg)[0][0] - rollout.old_log_probs[0, i]
                          for i in rollout.train_steps]).double()
    return float(((deltas.exp() - 1).abs() > cfg.clip_range).double().mean()), float(0.5 * deltas.square().mean())


# -----------------------------------------------------------------------------
# One update of a training run (train.py): rollouts -> decode -> rewards -> advantages over all ranks -> update


def window_starts(cfg: GRPOConfig, n_groups, seed):
    """One Flow-GRPO-Fast window start per group, from a CPU generator seeded alike on every rank (None without a
    window): under FSDP every rank must run the same number of forwards, and same_latent makes that count depend
    on the start."""
    if not cfg.window_size:
        return [None] * n_groups
    generator = torch.Generator().manual_seed(seed)
    return [draw_window_start(cfg, generator) for _ in range(n_groups)]


def probes(cfg: GRPOConfig, update: int) -> bool:
    """Whether update `update` (0-based) runs the after-step probe (cfg.probe_every)."""
    return cfg.probe_every > 0 and update % cfg.probe_every == 0


def train_step(net, optimizer, params, conds, latent_shape, cfg: GRPOConfig, scoring: Scoring, seed, window_seed,
               agree=None, cp_size=1, probe=True):
    """One GRPO update over this rank's groups (collective under torch.distributed: call it on every rank).

    conds: one Condition per group (a clip and its prompt). scoring: rl.Scoring (the reward terms, and what decodes
    the samples for them). seed: this dp group's rollout noise; window_seed: the same on every rank. cp_size: ranks per cp
    group (--cp: they run the same rollouts, each forward split by base/cp.py; one copy of their rewards counts, so their
    advantages and micro-steps agree, or the all-to-alls would deadlock). agree(what, fn): runs the
    scoring so that a failure on one rank raises on every rank (collectives.agree) instead of leaving the others waiting.
    Returns (stats of grpo_update, metrics: rewards over all ranks, advantages, means over all ranks, s per phase).
    """
    device = conds[0].crossattn_emb.device
    timer, rollouts = PhaseTimer(device), []
    generator = torch.Generator(device=device).manual_seed(seed)
    starts = window_starts(cfg, len(conds), window_seed)
    for cond, start in zip(conds, starts):
        with timer.phase("rollout"):
            rollouts.append(rollout_group(net, cond, latent_shape, cfg, generator, window_start=start))
    x0s = [ro.x0_final for ro in rollouts]
    mine, reward_metrics = score_groups(x0s, conds, scoring, cfg, timer, agree, cp_size)
    with timer.phase("update"):
        stats = grpo_update(net, optimizer, params, rollouts, list(mine), cfg, cp_size=cp_size, probe=probe,
                            set_grad_sync=getattr(net, "set_requires_gradient_sync", None), data_generator=generator)
    times = timer.times
    times["optimizer"] = stats["optimizer_s"]
    times["update"] -= stats["optimizer_s"]
    dp = collectives.world_size() // cp_size
    # means over every dp group's real micro-steps (a rank may have none); a cp group's ranks hold copies
    sums = torch.tensor([stats[k] * stats["micro_steps"] for k in ("loss", "clipfrac_in_update", "approx_kl_in_update",
                                                                   "kl")]
                        + [stats["micro_steps"], stats["trajectories"], stats["padded_steps"]]
                        + [stats[k] or 0.0 for k in ("clipfrac", "approx_kl", "data_loss")], dtype=torch.float64,
                        device=device)
    collectives.sum_groups(sums, cp_size)
    n = max(1.0, float(sums[4]))
    probed, stepped = stats["clipfrac"] is not None, stats["opt_steps"] > 0  # the same on every rank
    metrics = {"loss": float(sums[0]) / n, **reward_metrics, "first_ratio": stats["first_ratio"],
               "clipfrac": float(sums[7]) / dp if probed else None,
               "approx_kl": float(sums[8]) / dp if probed else None,
               "clipfrac_in_update": float(sums[1]) / n, "approx_kl_in_update": float(sums[2]) / n,
               "kl_ref": float(sums[3]) / n if cfg.kl_coef > 0 else None,
               "data_loss": float(sums[9]) / dp if cfg.data_coef > 0 and stepped else None,
               "grad_norm": stats["grad_norm"][-1] if stats["grad_norm"] else None,
               "trajectories": int(sums[5]), "micro_steps": int(sums[4]), "padded_steps": int(sums[6]),
               "rollout_logp_gap": stats["first_max_abs_dlogp"] if stats["first_ratio"] is not None else None,
               "rollout_calls": sum(ro.calls for ro in rollouts), "rollout_forwards": sum(ro.forwards for ro in rollouts),
               "update_forwards": stats["forwards"],
               "window_start": sum(starts) / len(starts) if None not in starts else None,  # the same on every rank
               "opt_steps": stats["opt_steps"], "skipped_chunks": stats["skipped_chunks"]}
    metrics.update({f"s_{name}": times.get(name, 0.0) for name in ("rollout", "decode", "reward", "update",
                                                                    "optimizer")})
    # skipped optimizer steps (a NaN/Inf gradient norm, the same on every rank): train.py counts them, as SFT's
    metrics.update(nonfinite_steps=stats["nonfinite_steps"], **({"skipped": "nonfinite"} if stats["nonfinite_steps"]
                                                                 and not stats["opt_steps"] else {}))
    return stats, metrics


# -----------------------------------------------------------------------------
# The objective train.py's loop calls (train.OBJECTIVES lists it): rl.RLObjective's evaluation, guard and data
# weight, and GRPO's update


class GRPO(rl.RLObjective):
    """GRPO for train.py: GRPO(run, net, params, vae, neg_text, terms); step(step, batches) -> the update's metrics."""
    NAME = "grpo"
    CONFIG = GRPOConfig  # TrainConfig.grpo: the --grpo-* flags
    MAY_CHANGE = ("recompute_old_logp", "rollout_batch", "offload_activations", "probe_every", "lr", "warmup",
                  "weight_decay", "betas", "max_grad_norm")  # of CONFIG's knobs, those a resumed run may change
    TINY_RECIPES = ("tiny_rl", "tiny_grpo")  # recipes/ files on top of tiny.py for this objective

    @classmethod
    def validate(cls, cfg, given):
        """GRPO's checks on top of every RL objective's (rl.validate); returns {flag: why it would do nothing}."""
        unused = rl.validate(cfg, given, cls.NAME)
        if cfg.grpo.eta <= 0:
            raise ValueError(f"--grpo-eta {cfg.grpo.eta}: a noiseless rollout has no log-prob to train (use > 0)")
        # a compiled training graph, or batched rollout calls, round unlike the rollout's B = 1 eager calls
        why = [w for w, on in (("--compile", cfg.compile), (f"--grpo-rollout-batch {cfg.grpo.rollout_batch}",
                                                            cfg.grpo.rollout_batch != "none")) if on]
        if why and not cfg.grpo.recompute_old_logp:
            if "grpo.recompute_old_logp" in given:
                raise ValueError(f"{' and '.join(why)} with --no-grpo-recompute-old-logp: the rollout rounds unlike "
                                 "the training forward, so the ratio would not start at 1")
            cfg.grpo = replace(cfg.grpo, recompute_old_logp=True)
        return unused

    def step(self, step, batches):
        """One update (train_step) on this rank's groups of batches (one), the optimizer step included; its metrics
        row."""
        conds, latent_shape, scoring, knobs = self.groups(batches)
        rank = self.run.dp_rank
        return train_step(self.net, self.run.optimizer, self.params, conds, latent_shape, knobs, scoring,
                          seed=self.seed(step, "rollout", rank), window_seed=self.seed(step, "window"),
                          agree=collectives.agree, cp_size=self.run.cfg.cp, probe=probes(self.knobs, step))[1]
