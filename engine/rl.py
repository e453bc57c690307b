"""What GRPO (grpo.py) and DiffusionNFT (nft.py) share between train.py's loop and their math.

Both post-train the LoRA adapters from the same clips, rewards (reward.py) and run directory; they differ only in
their update. This file holds the rest: their flags checked (validate), the settings a resumed run keeps
(resume_keys), the start-up line, the decoder, the held-out evaluation every RL run logs (eval_reward_*, eval_psnr:
the deterministic sampler on fixed held-out clips and noise), the fidelity guard, and `objective`, which makes either
one's record for train.py's loop (engine/objective.Objective) around its update.

Contents, top to bottom: flags and resume keys -> decoding -> held-out evaluation -> the fidelity guard -> the record.
"""
import dataclasses
import os

import torch
import torch.distributed as dist
from tqdm import tqdm

import condition
import reward
from base import camera, cli, collectives
from base.camera import split_views
from clips import data
from clips.fidelity import score_sample
from engine import resume
from engine.generate import from_first_frame
from engine.objective import Objective, RLConfig, check_samples, held_out_slots, sample_seed
from nets.family import family_of

# -----------------------------------------------------------------------------
# Flags and resume keys

# The tiny default's RL settings (train.py's preset for a tiny config, docs/grpo.md "The tiny default"): 8 samples a
# group (each objective's own TINY), 4 groups an update, a held-out evaluation every 5 updates
TINY = dict(steps=30, save_every=15, sample_every=15, eval_every=5, eval_steps=20, batch_size=4,
            reward="reward:wrist_brightness")
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
    """The checks every RL objective shares (its own: grpo.validate / nft.validate); returns {flag: why it would do
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


def rewards(cfg):
    """The run's reward terms (reward.parse_rewards of --reward), for an RL objective's rollouts and evaluation."""
    return reward.parse_rewards(cfg.reward)


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
# Decoding


def truth_of(terms, cond, decode, actions):
    """What the world-model reward terms read of a group's true clip (reward.INPUTS), computed only for them: its
    latent (cond.gt_frames, the whole encoded clip), decoded as the samples are, its actions in raw units."""
    wanted = {name for term in terms for name in term.inputs}
    return {**({"truth_latent": cond.gt_frames} if "truth_latent" in wanted else {}),
            **({"truth": decode(cond.gt_frames)} if "truth" in wanted else {}),
            **({"action": actions.raw(cond.action)} if "action" in wanted and actions is not None else {})}


def decoder(vae, terms, views):
    """decode(x0 [K, C, T, H, W]) -> video [K, 3, F, H, W] float32, or None when no reward term needs pixels; one
    sample at a time (memory does not grow with K); a multi-view latent is scored as Path B's 2x2 grid."""
    vae_dtype = next(vae.parameters()).dtype

    @torch.no_grad()
    def decode(x0):
        if not reward.needs_pixels(terms):
            return None
        if views:
            return torch.cat([camera.grid_from_views(vae.decode(split_views(x0[k: k + 1], views).to(vae_dtype)),
                                                     data.VIEW_ORDER) for k in range(len(x0))]).float()
        return torch.cat([vae.decode(x0[k: k + 1].to(vae_dtype)) for k in range(len(x0))]).float()
    return decode


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
# The record of an RL objective for train.py's loop


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


def objective(run, net, vae, neg_text, terms, name, update, extra_state=None):
    """The record of RL objective `name` (grpo.make, nft.make). run: train.Run (cfg, optimizer, dp_rank, say).
    update(conds, latent_shape, decode, score, update_index, seed, rank, rl_cfg) -> its metrics row: one update on
    this rank's groups (collective), conds one Condition per clip (condition.per_clip), rl_cfg the objective's knobs
    with the data weight in force (data_weight)."""
    cfg, rl_cfg = run.cfg, getattr(run.cfg, name)
    run.say(reward_line(name, rl_cfg, cfg.reward, terms))
    seed = lambda *key: sample_seed(cfg.seed, *key)  # noqa: E731
    weight, after_eval = data_weight(rl_cfg)
    extra_state = {**(extra_state or {}), **({"data_weight": weight} if weight else {})}

    def step(index, next_batch):
        latent, cond = next_batch()
        decode = decoder(vae, terms, len(data.VIEW_ORDER) if cond.camera is not None else 0)

        def score(video, x0, group):  # a group's samples, and what world-model rewards read of its true clip
            return reward.score(terms, video=video, latent=x0, **truth_of(terms, group, decode, run.actions))
        now = rl_cfg if weight is None else dataclasses.replace(rl_cfg, data_coef=float(weight["data_coef"]))
        return update(condition.per_clip(cond, neg_text, run.dp_rank), tuple(latent.shape[1:]), decode, score,
                      index, seed, run.dp_rank, now)

    def held_out(batches, truths):  # train.held_out_batches' clips, in held_out_slots' order
        slots = held_out_slots(run.dp_rank, run.dp_world, len(batches))
        return evaluate(net, vae, cfg, rl_cfg.guidance, batches, truths, slots, neg_text, terms, run.actions)
    return Objective(lr_at=rl_cfg.lr_at, betas=tuple(rl_cfg.betas), weight_decay=rl_cfg.weight_decay,
                     schedule=f"lr {rl_cfg.lr:g} (warm-up {rl_cfg.warmup}, then constant), clip "
                              f"{rl_cfg.max_grad_norm}",
                     step=step, held_out=held_out,
                     bar=lambda row: {"reward": f"{row['reward_mean']:.4g}", "std": f"{row['reward_std']:.2g}"},
                     guidance=rl_cfg.guidance, name=name, mfu=False, extra_state=extra_state, eval_at_start=True,
                     watch=fidelity_guard(cfg, tqdm.write, run.master), max_psnr_drop=cfg.max_psnr_drop,
                     lr_flag=f"{cli.flag(name)}-lr {rl_cfg.lr:g}", after_eval=after_eval)
