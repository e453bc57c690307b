"""DiffusionNFT (Zheng et al., arXiv 2509.16117) for the video DiT with LoRA: RL on the forward process.

docs/nft.md has the derivation for Predict2 (EDM sigma behind a rectified-flow net) and Predict2.5 (rectified flow).
In short, one update: the *old* policy (a lagging copy of the LoRA adapters) samples K clips per group with the
ordinary deterministic sampler (Predict2's Adams-Bashforth on Karras sigmas, 2.5's UniPC; CFG-free by default), the
clips are scored, group-normalised advantages A become optimality probabilities r = clip(A / A_max, -1, 1) / 2 + 1/2,
and the trained velocity v is fitted on the forward process of every clean sample x0 at a few noise levels:

    v+ = (1 - beta) v_old + beta v,   v- = (1 + beta) v_old - beta v,   u = eps - x0 (the flow-matching target)
    loss = A_max / beta * [ r |v+ - u|^2 / w+  +  (1 - r) |v- - u|^2 / w- ]          (means over generated elements)

w+- = mean |v+- - u| (detached) is NVlabs' adaptive weight (1 / mean |x0_hat - x0| up to the factor t). No
log-probabilities, no trajectories: only the clean samples, their rewards and fresh noise, so any sampler works and
a rollout is one network call per step. With old == current (decay 0, one optimizer step) the gradient is exactly
2 A grad |v - u|^2 / w: advantage-weighted flow matching. After the step, old <- d old + (1 - d) theta.

Contents, top to bottom: config -> the old policy -> rollout -> loss -> update -> one update of a training run
(train_step), which train.py calls; --nft-chain-chunks K (issue 52) makes each group's first frame the model's own: the
last frame of K - 1 chunks it rolls out first, without gradient (engine/chain.py, own-context SFT's sampler and
windows), from an episode's true frame under its true actions, and the group, chunk K, is rewarded against that
episode's true continuation.
"""
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

from base import collectives
from condition import Condition, map_tensors
from engine import rl
from engine.chain import check_chain, encode, sample_item
from engine.objective import clip_and_step, sample_seed
from engine.rl import PhaseTimer, RLConfig, Scoring, data_loss, masked_mean, score_groups
from engine.rollout import generated_mask, with_uncond
from nets.family import family_of
from nets.lora import set_lora_enabled

# -----------------------------------------------------------------------------
# Config


@dataclass(frozen=True)
class NFTConfig(RLConfig):
    """DiffusionNFT's knobs: rl.RLConfig's (K, steps, CFG, KL, advantages, AdamW; NVlabs' / cosmos-rl's
    values) and its own."""
    group_size: int = 4  # K samples per group (one conditioning frame + instruction)
    num_steps: int = 10  # steps of the rollout sampler (deterministic: Predict2's AB2, Predict2.5's UniPC)
    guidance: float = 0.0  # CFG of the rollouts (Predict2's x0_c + g (x0_c - x0_u)); 0: CFG-free, one call a step
    kl_coef: float = 0.0  # weight of mean |v - v_ref|^2, v_ref the LoRA-disabled base (one more forward)
    lr: float = 3e-4  # AdamW learning rate over the LoRA adapters, constant after the warm-up (NVlabs, cosmos-rl)
    beta: float = 1.0  # NFT's beta: how far the implicit positive/negative policies sit from the old one
    timesteps: int = 1  # noise levels per sample and update, drawn from the rollout grid (fresh noise each)
    data_coef: float = 0.5  # DDRL (arXiv 2512.04332): weight of the flow-matching loss on the group's real clip (one
    # more forward and backward per group); keeps held-out PSNR while the reward rises (docs/rl.md "Regularised defaults")
    adaptive_weight: bool = True  # divide each squared error by its own (detached) mean absolute error
    decay_rate: float = 0.001  # old <- d old + (1 - d) theta after update u, d = min(decay_rate * u, decay_max)
    decay_max: float = 0.5  # (NVlabs' schedule 1: d ramps from 0, on-policy at the start, to 0.5)
    rollout_batch: int = 0  # samples of a group per rollout network call: 0 = all K in one call; n (a divisor of K)
    # = K / n calls a step, the same noise, rounded differently (each call's peak memory grows with its batch)
    chain_chunks: int = 1  # > 1: each group starts from the last frame of chain_chunks - 1 chunks the old policy
    # rolls out first (no gradient) and is rewarded as chunk chain_chunks against the truth (docs/rl.md, issue 52)
    chain_true_share: float = 0.0  # with chain_chunks > 1: this fraction of the groups start from a true frame
    # (unchained, chunk 1), the rest from the chain's; drawn without the rank (every rank generates as many chunks)

    def __post_init__(self):
        super().__post_init__()
        if self.num_steps < 2 or not 1 <= self.timesteps <= self.num_steps:
            raise ValueError(f"num_steps={self.num_steps}, timesteps={self.timesteps}: need num_steps >= 2 and "
                             f"1 <= timesteps <= num_steps (the noise levels come from the rollout grid)")
        if not 0 < self.beta <= 1:
            raise ValueError(f"beta={self.beta}: in (0, 1] (NVlabs 1.0; 0.1 for a more conservative update)")
        if self.data_coef < 0:
            raise ValueError(f"data_coef={self.data_coef}: need >= 0")
        if self.rollout_batch < 0 or (self.rollout_batch and self.group_size % self.rollout_batch):
            raise ValueError(f"rollout_batch={self.rollout_batch}: 0 (the whole group in one call) or a divisor of "
                             f"group_size={self.group_size} (an uneven last call would be another compiled variant)")
        if self.chain_chunks < 1:
            raise ValueError(f"chain_chunks={self.chain_chunks}: >= 1 (1: groups start from a true frame, unchained)")
        if not 0 <= self.chain_true_share < 1 or (self.chain_true_share and self.chain_chunks == 1):
            raise ValueError(f"chain_true_share={self.chain_true_share:g}: in [0, 1), and > 0 only with chain_chunks "
                             f"> 1 (got {self.chain_chunks}: every group already starts from a true frame)")
        if self.decay_rate < 0 or not 0 <= self.decay_max < 1:
            raise ValueError(f"decay_rate={self.decay_rate}, decay_max={self.decay_max}: need decay_rate >= 0 and "
                             "0 <= decay_max < 1")


def decay_at(cfg: NFTConfig, update):
    """The old policy's EMA decay after update `update` (0-based)."""
    return min(cfg.decay_rate * update, cfg.decay_max)


def old_is_current(cfg: NFTConfig, update):
    """Whether the old policy equals the net at update `update`: the last refresh copied theta exactly."""
    return update == 0 or decay_at(cfg, update - 1) == 0


# -----------------------------------------------------------------------------
# The old policy: a copy of the adapter values, swapped into the net for its (no-grad) forwards


def reshard(net):
    """FSDP2 keeps the last block, final layer and root unsharded after a no-grad forward (reshard_after_forward
    False): reshard them, so the next forward all-gathers the values we are about to write into the shards."""
    from torch.distributed.fsdp import FSDPModule
    for module in net.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


@torch.no_grad()
def copy_values(params, values):
    """params <- values in place, one copy_ each (DTensor has no sharding rule for _foreach_copy_)."""
    for p, v in zip(params, values):
        p.detach().copy_(v)


@contextmanager
def adapters(net, params, values):
    """Run the net with the adapter `values` (the old policy) in place of `params`' own, then put them back."""
    reshard(net)
    current = [p.detach().clone() for p in params]
    copy_values(params, values)
    try:
        yield
    finally:
        reshard(net)
        copy_values(params, current)


@torch.no_grad()
def update_old(old, params, decay):
    """old <- decay * old + (1 - decay) * theta, in place (each rank its own shards)."""
    torch._foreach_lerp_(old, [p.detach() for p in params], 1.0 - decay)


# -----------------------------------------------------------------------------
# Rollout: K clean samples of one group from the deterministic sampler


@torch.no_grad()
def sample_group(net, cond: Condition, latent_shape, cfg: NFTConfig, generator):
    """[K, C, T, H, W] fp32 clean latents (conditional frames = the clean latent), cfg.rollout_batch samples a
    network call (0: the K samples as one batch): NFT keeps no log-probabilities, so nothing needs the training
    layout. The net's family's deterministic sampler (Predict2: Karras AB2 from sigma_max noise; Predict2.5: UniPC on
    the shift grid) on its ROLLOUT_GRID. The noise is drawn for the whole group first, so every layout samples from
    the same noise (and at rollout_batch K exactly as 0)."""
    K, family = cfg.group_size, family_of(net.cfg)
    noise = torch.randn(K, *latent_shape, generator=generator, device=generator.device)
    with_uncond(cond, cfg.guidance)  # refuses guidance without a negative prompt, before any forward
    n = cfg.rollout_batch or K
    group = map_tensors(cond, lambda t: t.expand(n, *t.shape[1:]))  # expanded, not copied
    chunks = [family.sample(net, family.initial_state(noise[i: i + n]), group, cfg.guidance, family.ROLLOUT_GRID,
                            cfg.num_steps).float() for i in range(0, K, n)]
    return chunks[0] if n == K else torch.cat(chunks)


# -----------------------------------------------------------------------------
# The loss of one (sample, noise level) on the forward process


def forward_velocity(net, cond: Condition, x0, eps, level):
    """(v_theta, u = eps - x0, t) at noise level `level` = (sigma, timestep) of the forward process of x0 [1, ...]
    (the family's training_levels): x0_hat - x0 = -t (v - u) on the generated frames in both families (t = sigma /
    (1 + sigma) for Predict2's EDM sigma, t = sigma for rectified flow), so the loss is written in velocity units
    with the factor t."""
    return family_of(net.cfg).forward_velocity(net, cond, x0, eps, level)


def nft_loss(v, v_old, u, t, r, gen_mask, cfg: NFTConfig):
    """A_max / beta * [r |x0+ - x0|^2 / w+ + (1 - r) |x0- - x0|^2 / w-] with x0+- - x0 = -t (v+- - u) (module
    docstring); w = mean |x0+- - x0| detached when cfg.adaptive_weight. Returns a scalar with grad through v."""
    def term(v_implicit):
        err = t * (v_implicit - u)
        squared = masked_mean(err.square(), gen_mask)
        return squared / masked_mean(err.abs(), gen_mask).detach().clamp(min=1e-5) if cfg.adaptive_weight \
            else squared
    positive = (1 - cfg.beta) * v_old + cfg.beta * v
    negative = (1 + cfg.beta) * v_old - cfg.beta * v
    return cfg.adv_clip / cfg.beta * (r * term(positive) + (1 - r) * term(negative))


def optimality(advantages, cfg: NFTConfig):
    """r = clip(A / A_max, -1, 1) / 2 + 1/2 in [0, 1]: 1 for the best samples, 0 for the worst, 1/2 for a tie."""
    return (advantages / cfg.adv_clip).clamp(-1, 1) / 2 + 0.5


# -----------------------------------------------------------------------------
# Update


def draw_levels(cfg: NFTConfig, grid, x0, generator):
    """For each of a group's samples x0 [K, ...]: cfg.timesteps distinct grid indices, with a fresh eps
    [1, C, T, H, W] each."""
    return [[(int(i), torch.randn(1, *x0.shape[1:], generator=generator, device=generator.device))
             for i in torch.randperm(len(grid), generator=generator, device=generator.device)[:cfg.timesteps]]
            for _ in range(len(x0))]


@torch.no_grad()
def frozen_velocities(net, conds, grids, x0s, draws):
    """v at every draw without autograd (the old policy's or the base's, as the caller has set the net)."""
    return [[[forward_velocity(net, cond, x0[k: k + 1], eps, grid[i])[0] for i, eps in sample_draws]
             for k, sample_draws in enumerate(group)] for cond, grid, x0, group in zip(conds, grids, x0s, draws)]


def nft_update(net, optimizer, params, old, conds, x0s, advantages, cfg: NFTConfig, generator, old_is_current,
               set_grad_sync=None):
    """One optimizer step on every (group, sample, noise level). old: the old policy's adapter values (ignored when
    old_is_current: then v_old is the trained forward's own value, detached, saving a forward). Every rank runs the
    same number of forwards (groups x K x timesteps, + one data forward per group): FSDP's collectives stay in step.
    Returns stats; a non-finite gradient norm skips the step (counted in nonfinite_steps)."""
    levels = family_of(net.cfg).training_levels(cfg.num_steps)  # the rollout grid's, the last excluded
    grids = [levels for _ in conds]
    draws = [draw_levels(cfg, grid, x0, generator) for grid, x0 in zip(grids, x0s)]
    v_old = None
    if not old_is_current:
        with adapters(net, params, old):
            v_old = frozen_velocities(net, conds, grids, x0s, draws)
    v_ref = None
    if cfg.kl_coef > 0:
        set_lora_enabled(net, False)
        try:
            v_ref = frozen_velocities(net, conds, grids, x0s, draws)
        finally:
            set_lora_enabled(net, True)
    micro = [(g, k, j) for g, group in enumerate(draws) for k, sample_draws in enumerate(group)
             for j in range(len(sample_draws))]
    n_micro = len(micro) + (len(conds) if cfg.data_coef > 0 else 0)
    stats = {"loss": 0.0, "kl": 0.0, "data_loss": 0.0, "old_deviation": 0.0, "micro_steps": n_micro, "skipped": 0,
             "nonfinite_steps": 0, "grad_norm": None, "optimizer_s": 0.0}
    done = 0
    for g, k, j in micro:
        cond, (i, eps) = conds[g], draws[g][k][j]
        v, u, t = forward_velocity(net, cond, x0s[g][k: k + 1].detach(), eps, grids[g][i])
        old_v = v.detach() if v_old is None else v_old[g][k][j]
        gen_mask = generated_mask(cond, tuple(v.shape[1:]), v.device)
        loss = nft_loss(v, old_v, u, t, optimality(advantages[g][k], cfg), gen_mask, cfg)
        stats["loss"] += float(loss.detach()) / len(micro)
        stats["old_deviation"] += float(masked_mean((v.detach() - old_v).square(), gen_mask)) / len(micro)
        if v_ref is not None:
            kl = masked_mean((v - v_ref[g][k][j]).square(), gen_mask)
            loss = loss + cfg.kl_coef * kl
            stats["kl"] += float(kl.detach()) / len(micro)
        done += 1
        if set_grad_sync is not None:
            set_grad_sync(done == n_micro)
        (loss / n_micro).backward()
    if cfg.data_coef > 0:
        for cond, grid in zip(conds, grids):
            loss = data_loss(net, cond, grid, generator)
            stats["data_loss"] += float(loss.detach()) / len(conds)
            done += 1
            if set_grad_sync is not None:
                set_grad_sync(done == n_micro)
            (cfg.data_coef * loss / n_micro).backward()
    stats["grad_norm"], seconds = clip_and_step(optimizer, params, cfg.max_grad_norm)
    if seconds is not None:
        stats["optimizer_s"] = seconds
    else:
        stats["nonfinite_steps"] = 1
        print(f"nft_update: non-finite grad norm {stats['grad_norm']}: optimizer step skipped", flush=True)
    return stats


# -----------------------------------------------------------------------------
# One update of a training run (train.py): old-policy rollouts -> decode -> rewards -> advantages -> update


def train_step(net, optimizer, params, old, conds, latent_shape, cfg: NFTConfig, scoring: Scoring, seed, update,
               agree=None, cp_size=1):
    """One NFT update over this rank's groups (collective under torch.distributed: call it on every rank), then the
    old policy moves towards the new weights. old: the old adapter values (updated in place); update: 0-based
    (update 0 starts from old == theta). scoring, agree, seed: as grpo.train_step (seed: this dp group's).
    cp_size: ranks per cp group (--cp): they sample the same groups from the same seed, each forward split by base/cp.py,
    and compute the same loss from the gathered output; one copy of their rewards enters the advantages and one of
    their losses the metrics. Every rank runs the same forwards (groups x K x timesteps), so the loss scale needs no
    count: FSDP's reduce (collectives.shard_model: a sum over a cp group, a mean over dp groups) averages the dp
    groups' per-rank means, as it averages the ranks' without CP.
    Returns (stats of nft_update, metrics averaged over all dp groups, s per phase)."""
    device = conds[0].crossattn_emb.device
    timer, x0s = PhaseTimer(device), []
    generator = torch.Generator(device=device).manual_seed(seed)
    current = old_is_current(cfg, update)
    with adapters(net, params, old) if not current else nullcontext():
        for cond in conds:
            with timer.phase("rollout"):
                x0s.append(sample_group(net, cond, latent_shape, cfg, generator))
    mine, reward_metrics = score_groups(x0s, conds, scoring, cfg, timer, agree, cp_size)
    if reward_metrics["adv_std"] == 0:  # every advantage on every rank is 0 (all-tie groups): nothing to learn, and
        # the same on every rank (gathered); no forward and no optimizer step (AdamW's decay would still move weights)
        stats = {"loss": 0.0, "kl": 0.0, "data_loss": 0.0, "old_deviation": 0.0, "micro_steps": 0, "skipped": 1,
                 "nonfinite_steps": 0, "grad_norm": None, "optimizer_s": 0.0}
    else:
        with timer.phase("update"):
            stats = nft_update(net, optimizer, params, old, conds, x0s, list(mine), cfg, generator, current,
                               getattr(net, "set_requires_gradient_sync", None))
    decay = decay_at(cfg, update)
    if decay == 0:  # exact copy (a lerp by 1 rounds): the next update may skip the old forward
        copy_values(old, params)
    else:
        update_old(old, params, decay)
    dp = collectives.world_size() // cp_size
    sums = torch.tensor([stats[k] for k in ("loss", "kl", "data_loss", "old_deviation")], dtype=torch.float64,
                        device=device)
    collectives.sum_groups(sums, cp_size)  # over dp groups: a cp group's ranks computed the same loss
    sums /= dp
    metrics = {"loss": float(sums[0]), **reward_metrics, "kl_ref": float(sums[1]) if cfg.kl_coef > 0 else None,
               "data_loss": float(sums[2]) if cfg.data_coef > 0 else None, "old_deviation": float(sums[3]),
               "old_decay": decay, "grad_norm": stats["grad_norm"], "micro_steps": stats["micro_steps"] * dp,
               "skipped_updates": stats["skipped"], "nonfinite_steps": stats["nonfinite_steps"],
               **({"skipped": "nonfinite"} if stats["nonfinite_steps"] else {})}  # train.py counts them, as SFT's
    times = timer.times
    times["optimizer"] = stats["optimizer_s"]
    times["update"] = times.get("update", 0.0) - stats["optimizer_s"]
    metrics.update({f"s_{name}": times.get(name, 0.0) for name in ("rollout", "decode", "reward", "update",
                                                                    "optimizer")})
    return stats, metrics


# -----------------------------------------------------------------------------
# Chained groups (--nft-chain-chunks K): the group's first frame is the last of K - 1 chunks the old policy generates


class ForwardCounter:
    """The network's compute inside the with-block in sample-forward equivalents: a forward of a batch of n counts n
    without autograd and 3n with it (its backward ~2 forwards); what tests/ownctx_numbers.py matches the arms by."""

    def __init__(self, net):
        self.net, self.forwards = net, 0

    def __enter__(self):
        self.handle = self.net.register_forward_pre_hook(lambda module, args: self.count(args))
        return self

    def count(self, args):
        self.forwards += (args[0].shape[0] if args else 1) * (3 if torch.is_grad_enabled() else 1)

    def __exit__(self, *exc):
        self.handle.remove()


def chain_draw(cfg, lengths, step, rank, row):
    """(training video index, the rewarded chunk k: 1 for a --nft-chain-true-share of the groups, else
    --nft-chain-chunks, start of chunk 1's window, the context's noise seed) of group `row` of update `step` on dp
    rank `rank`: (seed, step, rank, row) only, so a resumed run draws the same chains; k without the rank, so every
    rank generates as many context chunks (FSDP's collectives stay in step)."""
    g = torch.Generator().manual_seed(sample_seed(cfg.seed, step, row, "chain k"))
    k = 1 if float(torch.rand((), generator=g)) < cfg.nft.chain_true_share else cfg.nft.chain_chunks
    g = torch.Generator().manual_seed(sample_seed(cfg.seed, step, rank, row, "chain"))
    index = int(torch.randint(len(lengths), (), generator=g))
    span = 1 + cfg.nft.chain_chunks * (cfg.frames - 1)
    start = int(torch.randint(lengths[index] - span + 1, (), generator=g))
    return index, k, start, sample_seed(cfg.seed, step, rank, row, "chain context") % 2 ** 31


@torch.no_grad()
def chained_batch(net, vae, run, lengths, step, knobs: NFTConfig):
    """(one (latent, Condition) batch of run.cfg.batch_size groups, the context chunks generated): each group chunk k
    (chain_draw: K = knobs.chain_chunks, or 1 for a chain_true_share of them) of a training episode, its true window
    and actions with frame 0, for k > 1, replaced by the last frame of the k - 1 chunks the net (as the caller has set
    it: the old policy) rolls out from the episode's true frame under its true actions (chain.sample_item:
    generate.rollout, guidance 0, knobs.num_steps steps a chunk), encoded now. Its gt_frames, the truth a world-model
    reward reads and the data term fits, are that window: frames 1.. the episode's own."""
    draws = [chain_draw(run.cfg, lengths, step, run.dp_rank, row) for row in range(run.cfg.batch_size)]
    items = [sample_item(net, vae, run, run.clips, index, k, start, seed, knobs.num_steps)
             for index, k, start, seed in draws]
    return [encode(vae, run, items)], sum(k - 1 for _, k, _, _ in draws)


# -----------------------------------------------------------------------------
# The objective train.py's loop calls (train.OBJECTIVES lists it): rl.RLObjective's evaluation, guard and data
# weight, NFT's old policy and update


class NFT(rl.RLObjective):
    """DiffusionNFT for train.py: NFT(run, net, params, vae, neg_text, terms); step(index, batch) -> the update's
    metrics. Its old policy (the sampler), copies of the trainable adapters, is saved with every checkpoint as state
    "nft_old" and restored on resume."""
    NAME = "nft"
    CONFIG = NFTConfig  # TrainConfig.nft: the --nft-* flags
    MAY_CHANGE = ("rollout_batch", "lr", "warmup", "weight_decay", "betas", "max_grad_norm")  # a resume may change these
    TINY_RECIPES = ("tiny_rl", "tiny_nft")  # recipes/ files on top of tiny.py for this objective

    @classmethod
    def validate(cls, cfg, given):
        """rl.validate's checks; with --nft-chain-chunks K > 1 also a grid net, no --latents, no rollout CFG and
        episodes that hold K chained chunks (chain.check_chain)."""
        unused = super().validate(cfg, given)
        if cfg.nft.chain_chunks > 1:
            if cfg.nft.guidance != 0:
                raise ValueError(f"--nft-chain-chunks {cfg.nft.chain_chunks} with --nft-guidance {cfg.nft.guidance:g}:"
                                 " the chain's context is generated without CFG, as the action nets sample: pass "
                                 "--nft-guidance 0")
            check_chain(cfg, cfg.nft.chain_chunks, "--nft-chain-chunks", f"--nft-chain-chunks {cfg.nft.chain_chunks}")
        return unused

    def __init__(self, run, net, params, vae, neg_text, terms):
        super().__init__(run, net, params, vae, neg_text, terms)
        self.old = {n: p.detach().clone() for n, p in net.named_parameters() if p.requires_grad}
        self.state = {"nft_old": self.old, **self.state}
        self.reads_clips = self.knobs.chain_chunks == 1  # chained: the groups are drawn here (chained_batch)
        if not self.reads_clips:
            self.lengths = [v.frames for v in run.clips.videos[:run.n_train]]
            run.say(f"nft: each group is chunk {self.knobs.chain_chunks} of a chain from a true frame of one of "
                    f"{run.n_train} training episodes, its first {self.knobs.chain_chunks - 1} chunks generated by "
                    f"the old policy ({self.knobs.num_steps} sampler steps each, no gradient); "
                    f"{self.knobs.chain_true_share:g} of the groups unchained (chunk 1, a true frame)")

    def step(self, step, batches):
        """One update (train_step) on this rank's groups of batches (one; chained: drawn here, the chain's context
        by the old policy, as the rollouts), the optimizer step included; its metrics row (chained: and ctx_chunks,
        the chunks generated for context, s_chain their seconds, forwards the update's compute in sample-forward
        equivalents, context included)."""
        chained, t0 = {}, time.perf_counter()
        with ForwardCounter(self.net) as counter:
            if not self.reads_clips:
                as_old = not old_is_current(self.knobs, step)  # the old policy draws the context, as the rollouts
                with adapters(self.net, self.params, list(self.old.values())) if as_old else nullcontext():
                    batches, generated = chained_batch(self.net, self.vae, self.run, self.lengths, step, self.knobs)
                chained = {"ctx_chunks": generated, "s_chain": time.perf_counter() - t0}
            conds, latent_shape, scoring, knobs = self.groups(batches)
            metrics = train_step(self.net, self.run.optimizer, self.params, list(self.old.values()), conds,
                                 latent_shape, knobs, scoring, seed=self.seed(step, "rollout", self.run.dp_rank),
                                 update=step, agree=collectives.agree, cp_size=self.run.cfg.cp)[1]
        return {**metrics, **({**chained, "forwards": counter.forwards} if chained else {})}
