"""What GRPO (grpo.py) and DiffusionNFT (nft.py) share: everything of an RL objective but its rollouts and update.

Both post-train the LoRA adapters from the same clips, rewards (reward.py) and run directory. This file holds the
rest: their flags checked (validate), the settings a resumed run keeps (resume_keys), the knobs both have (RLConfig),
scoring a group's samples (Scoring: decode, reward, the truth a world-model reward reads) into group-normalised
advantages over all ranks, DDRL's data term, the held-out evaluation every RL run logs (eval_reward_*, eval_psnr: the
deterministic sampler on fixed held-out clips and noise), the fidelity guard, the adaptive data weight, and
RLObjective: what train.py's loop calls of either (grpo.GRPO and nft.NFT subclass it and add `step`). Nothing here
calls back into grpo.py, nft.py or train.py.

Contents, top to bottom: flags and resume keys -> the shared knobs -> scoring (timing, checks, advantages) -> the
data term -> held-out evaluation -> the fidelity guard -> the data weight -> RLObjective.
"""
import dataclasses
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
from tqdm import tqdm

import condition
import reward
from base import camera, cli, collectives
from base.camera import split_views
from clips import data
from clips.fidelity import score_sample
from condition import Condition
from engine import resume
from engine.generate import from_first_frame
from engine.objective import held_out_slots, sample_seed
from engine.rollout import generated_mask
from nets.family import family_of

# -----------------------------------------------------------------------------
# Flags and resume keys

RL_ONLY = ("reward", "eval_steps", "max_psnr_drop", "stop_on_psnr_drop")  # TrainConfig flags only RL reads
# Flags that only shape the SFT optimizer or batch: with an RL objective they would be silently unused (the RL
# configs have their own: --grpo-lr, --nft-lr, ...)
SFT_ONLY = {"lr": "lr", "warmup": "warmup", "lr_min_ratio": "(constant after the warm-up)",
            "weight_decay": "weight_decay", "beta1": "betas", "beta2": "betas", "grad_clip": "max_grad_norm",
            "grad_accum": "(RL accumulates over samples and steps itself)", "text_dropout": "(rollouts keep the prompt)"}


def rl_fields(cfg):
    """The TrainConfig fields that hold an RL objective's own knobs (grpo, nft): RLConfig dataclasses."""
    return [f.name for f in dataclasses.fields(cfg) if isinstance(getattr(cfg, f.name), RLConfig)]


def unused_rl_flags(cfg, given, name, keep=""):
    """{flag: why it does nothing} for the RL flags given to an objective that does not read them: every RL config's
    knobs but `keep`'s, and (keep = "": SFT) the RL-only flags."""
    others = [f for f in rl_fields(cfg) if f != keep]
    return {k: f"with --objective {name}" for k in given
            if k.split(".")[0] in others or (not keep and k in RL_ONLY)}


def validate(cfg, given, name):
    """The checks every RL objective shares (its own: GRPO.validate in grpo.py); returns {flag: why it would do
    nothing} for the flags it leaves unused. Imports the reward plug-ins now: a typo fails before any model."""
    unused = unused_rl_flags(cfg, given, name, keep=name)
    if "guidance" in given:  # samples and evaluation use the policy's own CFG
        unused["guidance"] = f"with --objective {name} (its samples use {cli.flag(name)}-guidance)"
    if not cfg.lora:
        raise ValueError(f"--objective {name} trains LoRA adapters only: pass --lora RANK (e.g. 32)")
    unused.update({k: f"with --objective {name} (use " + (alt if alt.startswith("(") else cli.flag(f"{name}.{alt}"))
                   + ")" for k, alt in SFT_ONLY.items() if k in given})
    if cfg.eval_steps < 1:
        raise ValueError(f"--eval-steps {cfg.eval_steps}: the held-out evaluation needs >= 1 sampler step")
    own = getattr(cfg, name)
    if own.data_target > 0 and (own.data_coef <= 0 or not cfg.eval_every):
        raise ValueError(f"{cli.flag(name)}-data-target {own.data_target:g}: adapts {cli.flag(name)}-data-coef (> 0, "
                         f"its start: got {own.data_coef:g}) after each held-out evaluation (--eval-every N, got "
                         f"{cfg.eval_every})")
    if cfg.max_psnr_drop < 0 or (cfg.stop_on_psnr_drop and not cfg.max_psnr_drop):
        raise ValueError(f"--max-psnr-drop {cfg.max_psnr_drop:g}: >= 0 dB (0: no fidelity guard), and > 0 with "
                         "--stop-on-psnr-drop")
    reward.parse_rewards(cfg.reward)
    return unused


def resume_keys(cfg, name, may_change):
    """The reward and every knob of the objective's config (cfg.<name>) except may_change, as flattened TrainConfig
    keys."""
    fields = [f.name for f in dataclasses.fields(getattr(cfg, name))]
    return ["reward"] + [f"{name}.{k}" for k in fields if k not in may_change]


def reward_line(name, rl_cfg, spec, terms):
    """The start-up line of an RL run: its knobs and reward. A reward whose every weight is 0 is said to be what it
    is: a paired control (every group ties, no update trains, the policy stays its init)."""
    line = f"{name}: {rl_cfg}; reward {spec}" + (
        " (decoded videos)" if reward.needs_pixels(terms) else " (latents only: no decoding)")
    if sum(term.weight for term in terms) == 0:
        line += ("; every term has weight 0, so every sample scores 0, every group ties and no update trains: this "
                 "run is a paired control (the policy stays its init; its eval_reward_* terms are still scored)")
    return line


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
# Scoring a group's samples: decode (only when a reward needs pixels), the truth a world-model reward reads, reward


@dataclass
class Scoring:
    """What scoring an update's samples reads: the reward terms (reward.parse_rewards), the VAE that decodes a
    sample when a term needs pixels, the views of a multi-view latent (scored as Path B's 2x2 grid; 0 for a grid
    net) and the run's actions (FolderActions: their raw units, for world-model rewards; None without)."""
    terms: list
    vae: object = None
    views: int = 0
    actions: object = None

    @torch.no_grad()
    def decode(self, x0):
        """x0 [K, C, T, H, W] -> video [K, 3, F, H, W] float32, or None when no term needs pixels; one sample at a
        time (memory does not grow with K)."""
        if not reward.needs_pixels(self.terms):
            return None
        vae, dtype = self.vae, next(self.vae.parameters()).dtype
        if self.views:
            return torch.cat([camera.grid_from_views(vae.decode(split_views(x0[k: k + 1], self.views).to(dtype)),
                                                     data.VIEW_ORDER) for k in range(len(x0))]).float()
        return torch.cat([vae.decode(x0[k: k + 1].to(dtype)) for k in range(len(x0))]).float()

    def truth(self, cond):
        """What the world-model terms read of a group's true clip (reward.INPUTS), computed only for them: its latent
        (cond.gt_frames, the whole encoded clip), decoded as the samples are, its actions in raw units."""
        wanted = {name for term in self.terms for name in term.inputs}
        return {**({"truth_latent": cond.gt_frames} if "truth_latent" in wanted else {}),
                **({"truth": self.decode(cond.gt_frames)} if "truth" in wanted else {}),
                **({"action": self.actions.raw(cond.action)} if "action" in wanted and self.actions is not None
                   else {})}

    def score(self, video, x0, cond):
        """reward.score of a group's samples (video: decode(x0)) and its true clip: {"reward": [K], name: [K]}."""
        return reward.score(self.terms, video=video, latent=x0, **self.truth(cond))


# -----------------------------------------------------------------------------
# The phases of one RL update, between its rollouts and its update, that GRPO and NFT share


class PhaseTimer:
    """times[name]: the seconds spent in `with timer.phase(name):` blocks (CUDA synchronised around each)."""

    def __init__(self, device):
        self.device, self.times = device, {}

    @contextmanager
    def phase(self, name):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        yield
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - start


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


def score_all(x0s, conds, scoring: Scoring, timer: PhaseTimer):
    """Every group's scores (Scoring.score of its decoded samples), timed as "decode" and "reward"."""
    out = []
    for x0, cond in zip(x0s, conds, strict=True):
        with timer.phase("decode"):
            video = scoring.decode(x0)
        with timer.phase("reward"):
            out.append(scoring.score(video, x0, cond))
    return out


def score_groups(x0s, conds, scoring: Scoring, cfg, timer: PhaseTimer, agree=None, cp_size=1):
    """Check the samples (check_samples: a NaN sample is named as such, never fed to a reward), decode (only where a
    reward needs pixels) and score every group's K samples, gather all ranks' scores and turn the rewards into
    advantages over all ranks' groups (collective). x0s: per group a [K, C, T, H, W] latent; conds: the groups'
    records (the truth a world-model reward reads: its latent, its actions). cfg: any config with group_size,
    adv_eps, adv_clip, global_std, std_ddof (GRPO's, NFT's); agree: collectives.agree, so that a failure on one rank
    raises on every rank (None: one process). Returns (this rank's advantages [groups, K] on x0s' device, metrics:
    rewards, components, adv_std)."""
    device = x0s[0].device
    if agree is not None:
        agree("checking the rollouts", lambda: check_samples(x0s, conds))
        scores = agree("scoring the rollouts", lambda: score_all(x0s, conds, scoring, timer))
    else:
        check_samples(x0s, conds)
        scores = score_all(x0s, conds, scoring, timer)
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
# Held-out evaluation: the deterministic sampler on fixed held-out clips and noise, scored by the run's rewards and
# by its fidelity to the true clip (clips/fidelity.py), exactly as evaluate.py scores the run's checkpoint

EVAL_NOISE_DRAWS = 2  # initial-noise draws per held-out clip


def evaluate(net, vae, cfg, guidance, batches, truths, slots, neg_text, terms, actions=None):
    """The held-out evaluation of an RL run, collective: {"eval_reward": the weighted reward, "eval_reward_<name>":
    each term and component, "eval_psnr", "eval_ssim" and "eval_<psnr|ssim>_<camera>": fidelity to the true clip,
    "eval_sd" / "eval_sd_<name>" / "eval_sd_psnr": their spread (population sd) over the held-out samples,
    "eval_samples": their number}; means over every rank's held-out clips x EVAL_NOISE_DRAWS noise draws.
    batches, truths: train.held_out_batches' (latent, Condition) batches and true videos of this rank; slots:
    objective.held_out_slots' (its clips' global slots, of n_slots); clip slot s, draw d has the noise seed cfg.seed +
    s + d * n_slots, as evaluate.py --seed S --draws 2 draws them. Each sample is generate.from_first_frame of the
    clip's first frame with cfg.eval_steps deterministic steps of the family's sampler at `guidance` (the
    objective's rollout CFG), scored by fidelity.score_sample (frames 1..; the latent rewards on the sample's latent)."""
    (slots, n_slots), family = slots, family_of(net.cfg)
    grid, dtype = family.sampler_defaults(cfg.init, cfg.config)[0], next(vae.parameters()).dtype
    views = net.cfg.camera_channels > 0
    size = (cfg.height, cfg.width) if views else (cfg.height // 2, cfg.width // 2)
    sums, squares, count = {}, {}, 0  # squares: each quantity's spread over the held-out clips and draws
    for (latent, batch_cond), truth, slot in zip(batches, truths, slots):
        cond = condition.for_generation(batch_cond, neg_text.to(latent.device))  # an action net: the clip's own actions
        truth = truth.to(latent.device)
        for d in range(EVAL_NOISE_DRAWS):
            video, x0 = from_first_frame(net, vae, truth, cond, cfg.eval_steps, guidance, cfg.seed + slot + d * n_slots,
                                         grid, dtype)
            named = dataclasses.replace(batch_cond, key=("held-out", slot))
            collectives.agree("the held-out evaluation", lambda: check_samples([x0], [named], "held-out samples"))
            raw = actions.raw(batch_cond.action) if actions is not None and batch_cond.action is not None else None
            metrics, scores = score_sample(video, truth, x0, views, size, terms, latent, raw)  # checked: no NaN
            values = {("eval_reward" if k == "reward" else "eval_reward_" + k.replace("/", "_")): v
                      for k, v in scores.items()}
            for k, v in metrics.items():  # "psnr", "ext_1/psnr", ...
                camera, _, metric = k.rpartition("/")
                values[f"eval_{metric}" + (f"_{camera}" if camera else "")] = v
            for name, value in values.items():
                sums[name] = sums.get(name, 0.0) + float(value.double().sum())
                squares[name] = squares.get(name, 0.0) + float(value.double().square().sum())
            count += 1
    return spread_means(sums, squares, count, batches[0][0].device)


class FidelityStop(RuntimeError):
    """--stop-on-psnr-drop: the run stopped after the evaluation whose held-out PSNR crossed --max-psnr-drop."""


def fidelity_guard(cfg, say, master):
    """watch(row, history, agree): after each held-out evaluation, compare it with step 0's (the base's, which is the
    paired control's at every step: the control never moves). Says once when held-out PSNR fell more than
    --max-psnr-drop dB below step 0 (the reward is being gained by forgetting the world) and once when the held-out
    reward fell below step 0's by more than its spread (eval_sd: the policy cannot improve this reward); with
    --stop-on-psnr-drop the first PSNR warning raises FidelityStop naming the newest saved step whose own
    evaluation was within the bound. Decided on rank 0 (history: its metrics rows before this one); agree(bool) ->
    the decision on every rank (collective)."""
    said = {}  # what was said once: key -> its line

    def once(key, line):
        if key not in said and master:
            said[key] = line
            say(line)

    def watch(row, history, agree):
        base = next((r for r in history if r["step"] == 0 and "eval_psnr" in r), None) if master else None
        if master and base is None:
            once("base", "fidelity guard: no step-0 held-out evaluation with eval_psnr in metrics.jsonl (a run "
                         "started before it was logged): the guard is off for this run")
        drop = base["eval_psnr"] - row["eval_psnr"] if base else 0.0
        crossed = bool(cfg.max_psnr_drop) and drop > cfg.max_psnr_drop and "psnr" not in said
        if base and row["eval_reward"] < base["eval_reward"] - base["eval_sd"]:
            once("reward", f"WARNING step {row['step']}: held-out reward {row['eval_reward']:.4g} is below step 0's "
                           f"{base['eval_reward']:.4g} by more than its spread {base['eval_sd']:.3g}: the policy is "
                           "not learning this reward (a paired control keeps step 0's value); check the reward")
        if crossed:
            said["psnr"] = (f"step {row['step']}: held-out PSNR {row['eval_psnr']:.2f} dB is {drop:.2f} dB below "
                            f"step 0's {base['eval_psnr']:.2f} (--max-psnr-drop {cfg.max_psnr_drop:g}): the reward "
                            "is being gained by forgetting the world; the newest checkpoint within the bound: "
                            + best_within(cfg, base, history))
            say("WARNING " + said["psnr"] + ("" if cfg.stop_on_psnr_drop else " (--stop-on-psnr-drop stops here; a "
                                             "lower lr or a data term keeps the world: docs/rl.md)"))
        if cfg.stop_on_psnr_drop and agree(crossed):
            raise FidelityStop("--stop-on-psnr-drop: " + said.get("psnr", f"rank 0 stopped the run after step "
                                                                           f"{row['step']}'s held-out evaluation"))
    return watch


def best_within(cfg, base, history):
    """The fidelity guard's pick: the newest saved step whose held-out PSNR was within --max-psnr-drop of step 0's,
    marked so that --keep rotation never deletes it (resume.keep_checkpoint), or what is left when rotation already
    did; with none within the bound, the base."""
    within = [r["step"] for r in history if "s_checkpoint" in r and r.get("eval_psnr") is not None
              and base["eval_psnr"] - r["eval_psnr"] <= cfg.max_psnr_drop]
    there = [s for s in within if os.path.isfile(os.path.join(cfg.out, f"step_{s:08d}", "meta.json"))]
    if not there:
        return (f"step_{within[-1]:08d}, deleted by --keep rotation since; none is left: the base (--init {cfg.init})"
                if within else f"none saved: the base (--init {cfg.init})")
    best = f"{cfg.out}/step_{there[-1]:08d}"
    resume.keep_checkpoint(best, f"the newest step within --max-psnr-drop {cfg.max_psnr_drop:g} of step 0's PSNR")
    gone = f"; the newer step_{within[-1]:08d} within it was deleted by --keep rotation" if within[-1] != there[-1] \
        else ""
    return f"{best} (kept: --keep rotation never deletes it){gone}"


def spread_means(sums, squares, count, device):
    """The evaluation's means over every rank's samples (collective: the same names on every rank), with the spread
    (population sd) of the rewards, PSNR and SSIM: eval_reward_<x> -> eval_sd_<x>, eval_psnr -> eval_sd_psnr."""
    names = sorted(sums)
    totals = torch.tensor([sums[k] for k in names] + [squares[k] for k in names] + [count], dtype=torch.float64,
                          device=device)
    if dist.is_initialized():
        dist.all_reduce(totals)
    n, out = float(totals[-1]), {"eval_samples": int(totals[-1])}
    for j, k in enumerate(names):
        out[k] = mean = float(totals[j]) / n
        if k.startswith("eval_reward") or k in ("eval_psnr", "eval_ssim"):
            sd = "eval_sd" + k[len("eval_reward"):] if k.startswith("eval_reward") else "eval_sd_" + k[5:]
            out[sd] = max(float(totals[len(names) + j]) / n - mean ** 2, 0.0) ** 0.5
    return out


# -----------------------------------------------------------------------------
# The adaptive data weight


def adapted_coef(coef, drop, target, start):
    """The data weight held to a fidelity target as an adaptive KL controller holds a KL target: after a held-out
    evaluation whose PSNR fell `drop` dB below step 0's, doubled above 1.5 target (the world is being forgotten),
    halved below target / 1.5 (room to learn), kept between; within [start / 64, start * 64]."""
    coef = coef * 2 if drop > 1.5 * target else coef / 2 if drop < target / 1.5 else coef
    return min(max(coef, start / 64), start * 64)


def data_weight(rl_cfg):
    """(the adaptive rule's state: {"data_coef", "base_psnr"} tensors, saved and resumed with every checkpoint,
    after_eval: result -> result with the weight it set), or (None, identity) for a fixed data_coef."""
    if rl_cfg.data_target <= 0:
        return None, lambda result: result
    state = {"data_coef": torch.tensor([rl_cfg.data_coef], dtype=torch.float64),
             "base_psnr": torch.tensor([float("nan")], dtype=torch.float64)}

    def after_eval(result):  # every held-out evaluation, in order (a resumed step's from its marker)
        if result is None or "eval_psnr" not in result:
            return result
        if torch.isnan(state["base_psnr"]).item():  # step 0's: the control's value at every step
            state["base_psnr"].fill_(result["eval_psnr"])
        else:
            drop = float(state["base_psnr"]) - result["eval_psnr"]
            state["data_coef"].fill_(adapted_coef(float(state["data_coef"]), drop, rl_cfg.data_target,
                                                  rl_cfg.data_coef))
        return dict(result, data_coef=float(state["data_coef"]))
    return state, after_eval


# -----------------------------------------------------------------------------
# What train.py's loop calls of an RL objective; grpo.GRPO and nft.NFT add `step(step, batches) -> metrics row`


class RLObjective:
    """An RL objective for train.py's loop, built from the run (train.Run: cfg, optimizer, dp_rank, actions, say),
    the network and its trainable adapters, the VAE, the negative prompt and the reward terms. Its subclass adds
    NAME, CONFIG, MAY_CHANGE, TINY_RECIPES and step(step, batches) -> the update's metrics row (batches: [one (latent,
    Condition) of train.py's loader]; the optimizer step included)."""
    mfu = False  # RL's MFU: smoke.py (rollouts and updates differ too much for one number)
    reads_clips = True  # step's batches: train.py's clips, the rollouts' first frames
    eval_at_start = True  # a held-out evaluation before the first update: every curve's starting point

    @classmethod
    def validate(cls, cfg, given):
        """{flag: why it would do nothing}; imports the reward plug-ins (a typo fails before any model)."""
        return validate(cfg, given, cls.NAME)

    @classmethod
    def resume_keys(cls, cfg):
        return resume_keys(cfg, cls.NAME, cls.MAY_CHANGE)

    @staticmethod
    def rewards(cfg):
        """The run's reward terms (reward.parse_rewards of --reward), for its rollouts and evaluation."""
        return reward.parse_rewards(cfg.reward)

    def __init__(self, run, net, params, vae, neg_text, terms):
        cfg, knobs = run.cfg, getattr(run.cfg, self.NAME)
        self.run, self.net, self.params, self.vae, self.neg_text, self.terms, self.knobs = \
            run, net, params, vae, neg_text, terms, knobs
        run.say(reward_line(self.NAME, knobs, cfg.reward, terms))
        self.weight, self.adapt = data_weight(knobs)
        self.state = {"data_weight": self.weight} if self.weight else {}  # saved with every checkpoint, resumed
        self.guard = fidelity_guard(cfg, tqdm.write, run.master)
        self.betas, self.weight_decay, self.guidance = tuple(knobs.betas), knobs.weight_decay, knobs.guidance
        self.schedule = f"lr {knobs.lr:g} (warm-up {knobs.warmup}, then constant), clip {knobs.max_grad_norm}"
        self.name, self.max_psnr_drop = self.NAME, cfg.max_psnr_drop  # the bar's name; the bound drawn in loss.png
        self.lr_flag = f"{cli.flag(self.NAME)}-lr {knobs.lr:g}"  # named when a NaN/Inf skips an update

    def lr_at(self, step):
        return self.knobs.lr_at(step)

    def seed(self, *key):
        return sample_seed(self.run.cfg.seed, *key)

    def groups(self, batches):
        """(one Condition per clip (condition.per_clip), the latent's shape, the Scoring of its samples, the knobs
        with the data weight in force) of one update's batches: one (latent, Condition) (--grad-accum is SFT's)."""
        (latent, cond), = batches
        scoring = Scoring(self.terms, self.vae, len(data.VIEW_ORDER) if cond.camera is not None else 0,
                          self.run.actions)
        knobs = self.knobs if self.weight is None else \
            dataclasses.replace(self.knobs, data_coef=float(self.weight["data_coef"]))
        return condition.per_clip(cond, self.neg_text, self.run.dp_rank), tuple(latent.shape[1:]), scoring, knobs

    def evaluate(self, batches, truths):
        """The held-out evaluation (train.held_out_batches' clips, in held_out_slots' order), then evaluated."""
        slots = held_out_slots(self.run.dp_rank, self.run.dp_world, len(batches))
        return self.evaluated(evaluate(self.net, self.vae, self.run.cfg, self.knobs.guidance, batches, truths, slots,
                                       self.neg_text, self.terms, self.run.actions))

    def evaluated(self, result):
        """After every held-out evaluation, in order (a resumed step's from its marker): the adaptive data weight."""
        return self.adapt(result)

    def watch(self, row, history):
        """The fidelity guard after a held-out evaluation (history: rank 0's rows before this one); collective."""
        self.guard(row, history, partial(collectives.any_rank, device=self.run.device))

    def bar(self, row):
        return {"reward": f"{row['reward_mean']:.4g}", "std": f"{row['reward_std']:.2g}"}
