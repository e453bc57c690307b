"""Policy evaluation inside a world model: which of my policies is better, without running the robot.

Each policy (a plug-in, `module:function`) acts in closed loop from the same start states in the world model (a
train.py run of an action config) and, where the task has one, in its true simulator; a judge plug-in scores each
episode after its last chunk. The world model's success rates are then held against the simulator's: Pearson and
Spearman correlation, MMRV (mean maximum rank violation), calibration (mean |world - sim| success), each also per
policy family, the false-success rate of the policies that truly fail, the PSNR of the world's frames against the
simulator's, chunk by chunk (drift), and the judge's agreement with the simulator's own state where the task reads it.

    python policyeval.py runs/act                      # tasks.square's 22 policies (5 families), 32 starts, 3 chunks
    python policyeval.py runs/act --policies mine:policy,tasks.square:go_to_target --judge mine:judge
    python policyeval.py runs/act --task held-out --policies mine:policy --judge mine:judge   # your robot's episodes
    POLICY_RUN=runs/pusht-policy python policyeval.py runs/pusht --task tasks.pusht --policies agent:act  # a policy run

A task module (tasks/square.py is the template to copy) has sample_tasks(n, seed), first_frames(tasks),
simulator(tasks) where a true simulator exists, judge and POLICIES; a plug-in with a .prepare() has it called before
any model is built (agent.py's act loads its run there). --task held-out starts from the first frames of
the run's held-out episodes instead, frame 0 of each (no simulator: the world model's success alone, no ranking.png;
info["task"] holds {"episode", "video", "stem"}, no target: a judge must judge from the frames). Writes
OUT/result.json (every number; partial, with the error, when a plug-in fails), OUT/ranking.png (world vs simulator
success), OUT/<policy>_ep<i>.mp4 (world model | simulator; held-out: <policy>_ep<i>_world.mp4, the world model alone);
prints a table, warnings (a world model collapsed to noise, actions far outside the data's range) and one JSON line.
engine/world.py holds the closed loop (docs/policyeval.md).

Contents, top to bottom: config -> the task and the plug-ins -> the world model -> rollouts -> agreement -> outputs ->
main.
"""
import importlib
import importlib.util
import json
import math
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

import cache
import ckpt
import condition
from base import cli
from base.inits import get_config
from base.video import write_mp4
from clips import text as text_lib
from clips.fidelity import psnr
from engine import build, runs
from engine.runs import open_run, text_settings
from engine.world import closed_loop, load_plugin, model_world
from nets.family import family_of
from nets.flops import matmul_peak, model_flops


@dataclass
class PolicyEvalConfig:
    run: str = ""  # a train.py run of an action config (its newest checkpoint), or one of its step directories
    task: str = "tasks.square"  # the task module (sample_tasks, first_frames, simulator, judge, POLICIES) or held-out
    policies: str = ""  # module:function,... ("" = the task's POLICIES, from most to least skilled)
    judge: str = ""  # module:function: frames, info -> [B] success in [0, 1] ("" = the task's judge)
    episodes: int = 32  # start states, the same for every policy and both worlds
    chunks: int = 3  # chained chunks per episode
    steps: int = 20  # sampler steps per chunk: 20 ranks as 35 does at 0.57x the time (docs/policyeval.md "Steps")
    compile: str = "auto"  # torch.compile the world model's blocks: auto (on a GPU), on, off; the first chunk compiles
    fp8: bool = False  # the world model's block GEMMs in fp8 (H100/H200; base/fp8.py)
    batch: int = 0  # episodes per network call (0 = all of them)
    seed: int = 0  # the tasks, the policies' draws, the noise (episode e, chunk k: seed + 1000 e + k)
    guidance: float = -1.0  # CFG; -1 = the run's own (an action run samples at 0, as upstream)
    action_guidance: float = 0.0  # CFG along the action alone: x0 + G (x0 - x0 under the still command, raw 0), the
    # prompt kept; 0 = off (the tiny world under-moves its square: docs/policyeval.md "Action guidance")
    ema: bool = False  # the run's EMA weights (train.py --ema)
    out: str = "policyeval"  # folder for result.json, ranking.png and the side-by-side mp4s
    videos: int = 2  # episodes of each policy written as mp4s (world model | simulator); 0 = none
    device: str = ""  # cuda | cpu (default: cuda when available)

    def __post_init__(self):
        if min(self.episodes, self.chunks, self.steps) < 1 or self.batch < 0 or self.videos < 0:
            raise ValueError(f"--episodes {self.episodes}, --chunks {self.chunks}, --steps {self.steps}: >= 1; "
                             f"--batch {self.batch}, --videos {self.videos}: >= 0")
        if self.guidance < 0 and self.guidance != -1:
            raise ValueError(f"--guidance {self.guidance}: >= 0, or -1 for the run's own")
        if self.action_guidance < 0 or (self.action_guidance and self.guidance > 0):
            raise ValueError(f"--action-guidance {self.action_guidance}: >= 0, and not with --guidance > 0 (one CFG "
                             "a call: the prompt's or the action's)")
        if self.device not in ("", "cuda", "cpu"):
            raise ValueError(f"--device {self.device!r}: cuda or cpu")
        if os.path.exists(self.out) and not os.path.isdir(self.out):
            raise ValueError(f"--out {self.out} is a file: pass a folder (created if missing)")


# -----------------------------------------------------------------------------
# The task and the plug-ins: all loaded and checked before any model is built

HELD_OUT = "held-out"


def load_task(cfg):
    """(task module or None for --task held-out, {name: policy}, judge): one line for a missing piece."""
    task = None
    if cfg.task != HELD_OUT:
        try:
            task = importlib.import_module(cfg.task)
        except ImportError as e:
            raise ValueError(f"--task {cfg.task!r}: cannot be imported ({e}): a task module (tasks/square.py is one) "
                             f"or {HELD_OUT}") from None
        lacking = [n for n in ("sample_tasks", "first_frames") if not callable(getattr(task, n, None))]
        if lacking:
            raise ValueError(f"--task {cfg.task}: has no {' or '.join(lacking)} (tasks/square.py shows what a task "
                             "module has)")
    if cfg.policies:
        policies = {spec: load_plugin(spec, "--policies") for spec in cfg.policies.split(",")}
    elif task is not None and getattr(task, "POLICIES", None):
        policies = {f"{cfg.task}:{name}": fn for name, fn in task.POLICIES.items()}
    else:
        raise ValueError(f"--policies: none given, and --task {cfg.task} has no POLICIES; pass module:function,...")
    for fn in policies.values():  # a plug-in's own set-up (agent:act loads its policy run): refused before any model
        if callable(getattr(fn, "prepare", None)):
            fn.prepare()
    if cfg.judge:
        judge = load_plugin(cfg.judge, "--judge")
    elif task is not None and callable(getattr(task, "judge", None)):
        judge = task.judge
    else:
        raise ValueError(f"--judge: none given, and --task {cfg.task} has no judge; pass module:function")
    return task, policies, judge


def start_states(cfg, task, run):
    """(tasks: per-episode arrays, first frames [N, 3, 1, H, W] in [-1, 1]): the task's, or with --task held-out frame 0
    of the run's held-out episodes, cycled (info["task"]: {"episode", "video" (its dataset index), "stem"}), said when
    episodes repeat a start frame."""
    if task is None:
        stems = sorted(run.held_out)
        index = [run.held_out[stems[e % len(stems)]] for e in range(cfg.episodes)]
        clips = {i: held_out_first_frame(run, i) for i in set(index)}
        if cfg.episodes > len(stems):
            print(f"policyeval: --task held-out: {cfg.episodes} episodes start from the {len(stems)} held-out episodes'"
                  f" frame 0, each repeated ~{cfg.episodes / len(stems):.0f}x (only the noise differs): "
                  f"{len(stems)} distinct start states; hold out more episodes (train.py --holdout N) for more",
                  flush=True)
        tasks = {"episode": np.arange(cfg.episodes), "video": np.array(index),
                 "stem": np.array([run.dataset.videos[i].stem for i in index])}
        return tasks, torch.stack([clips[i] for i in index])
    tasks = dict(task.sample_tasks(cfg.episodes, cfg.seed))
    tasks.setdefault("episode", np.arange(cfg.episodes))  # an episode's noise seeds come from its index
    first = torch.as_tensor(task.first_frames(tasks)).float()
    want = (cfg.episodes, 3, 1, run.cfg["height"], run.cfg["width"])
    if tuple(first.shape) != want:
        raise ValueError(f"--task {cfg.task}: first_frames gives {tuple(first.shape)}, the run's world is {list(want)} "
                         f"([episodes, 3, 1, height, width] of {run.directory}'s clips): a task of another world")
    return tasks, first


def held_out_first_frame(run, index):
    """Frame 0 [3, 1, H, W] of the run's video `index` (cache.Windows at start 0: evaluate.py's and sample.py's start,
    not a random window)."""
    item = cache.Windows(run.dataset, [(index, 0)])[0]
    if "error" in item:
        raise ValueError(f"{run.path}: held-out video {run.dataset.videos[index].stem}: {item['error']}")
    return item["video"][:, :1]


def rows(tasks: dict, batch) -> dict:
    """The tasks' arrays of these episodes (a policy's info["task"] holds its batch's rows only)."""
    return {k: np.asarray(v)[batch] for k, v in tasks.items()}


# -----------------------------------------------------------------------------
# The world model: the run's network, its codec, the prompt it samples with


def load_world(cfg, run, device, fold=True):
    """(net, vae, record, dtype, grid): the run rebuilt as trained, made ready to sample (runs.for_sampling: adapters
    folded, --fp8, --compile; fold False: as trained, nothing of it), its prompt (its first held-out episode's), the negative prompt, the run's
    conditional_frame_timestep; a run of a net without actions is refused."""
    mcfg = get_config(run.cfg["config"])
    if not mcfg.action_dim:
        raise ValueError(f"{run.path}: --config {run.cfg['config']} takes no actions (action_dim 0): a policy cannot "
                         "steer it; evaluate an action run (--config tiny-action, v2w-2b-action)")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    net = runs.build_from_step(run.checkpoint, device, cfg.ema)
    net = runs.for_sampling(net, dtype, device, cfg.compile, cfg.fp8) if fold else net.to(dtype).eval()
    vae = build.build_vae(run.cfg["vae"], run.cfg["vae_ckpt"], device, dtype)
    settings = text_settings(run.cfg)
    neg, _ = text_lib.negative_embedding(run.cfg["data"], run.cfg["text_len"], mcfg.crossattn_proj_in_channels,
                                         standin=settings["text"] == "standin", text_encoder=settings["text_encoder"])
    first = run.held_out[sorted(run.held_out)[0]]
    text, _ = text_lib.clip_text(run.dataset, run.dataset.videos[first])
    record = condition.from_batch({"text_emb": text[None]}, device, run.cfg["height"], run.cfg["width"], dtype,
                                  run.cfg["conditional_frame_timestep"], neg_crossattn_emb=neg[None].to(device))
    grid = family_of(mcfg).sampler_defaults(run.cfg["init"], run.cfg["config"])[0]
    return net, vae, record, dtype, grid


# -----------------------------------------------------------------------------
# Rollouts: every policy in the world model and in the simulator, batch by batch


class PluginError(ValueError):
    """A policy or judge plug-in failed (raised, or returned the wrong thing): one line naming it and the cause."""


def guarded(fn, name, role):
    """fn, whose exceptions become a PluginError naming the plug-in, its role and the cause (a KeyError of a policy
    copied from tasks/square.py under --task held-out: its info["task"] has no "target")."""
    def call(frames, info):
        try:
            return fn(frames, info)
        except Exception as e:  # the plug-in's own code: any error is its, said with its name, then raised
            keys = f"; info['task'] holds {sorted(info['task'])}" if isinstance(e, KeyError) else ""
            raise PluginError(f"{role} {name} raised {type(e).__name__}: {e}{keys}") from e
    return call


def rollouts(cfg, run, task, policies, judge, tasks, first, world, partial=None):
    """({policy: {"world": frames, "sim": frames or None, "success_world": [N], "success_sim": [N] or None,
    "max_action_sd": float}}, the world model's seconds, each chunk's seconds): every policy, batch by batch, in the world model and (where
    the task has one) the simulator, from the same start frames. A plug-in that fails: partial(results so far, the
    error) is called (it writes them), then the error is raised naming the policy."""
    size, simulate = cfg.batch or cfg.episodes, (getattr(task, "simulator", None), getattr(task, "state_success", None))
    batches = [np.arange(i, min(i + size, cfg.episodes)) for i in range(0, cfg.episodes, size)]
    results, seconds, clock = {}, 0.0, []  # clock: each world-model chunk's seconds, in order (timing)
    with tqdm(total=len(policies) * cfg.episodes * cfg.chunks, desc="policyeval", unit="chunk") as bar:
        for name, policy in policies.items():
            parts, reach = [], [0.0, 0, 0]  # max sd, raw values outside the data's range, raw values
            try:
                for batch in batches:
                    part, took = episodes(cfg, run, name, guarded(policy, name, "policy"),
                                          guarded(judge, cfg.judge or f"{cfg.task}:judge", "judge"), simulate,
                                          rows(tasks, batch), first[batch], world, lambda: bar.update(len(batch)),
                                          reach, clock)
                    parts.append(part)
                    seconds += took
            except ValueError as e:  # a plug-in's (PluginError, or a wrong return): the policies done are kept
                if partial is not None:
                    partial(results, f"{name}: {e}")
                kept = f"; the {len(results)} policies evaluated before it are in {cfg.out}/result.json (partial)" \
                    if results and partial is not None else ""
                raise ValueError(f"policy {name}: {e}{kept}") from e
            results[name] = {k: None if parts[0][k] is None else torch.cat([p[k] for p in parts]) for k in parts[0]}
            results[name]["max_action_sd"] = reach[0]
            results[name]["share_outside_range"] = reach[1] / max(reach[2], 1)
            results[name]["family"] = getattr(policy, "family", "plug-in")
    return results, seconds, clock


def episodes(cfg, run, name, policy, judge, simulate, tasks, first, world, progress, reach, clock):
    """One batch of episodes of one policy: its frames and success in the world model and the simulator, and the
    world model's seconds (and, where the task reads it, the success from the simulator's own
    state); reach: the largest |action - mean| / sd the policy commanded, how many of its raw values
    fell outside the data's [min, max] widened by a tenth of the range (action_stats.json), how many it gave;
    clock: each world-model chunk's seconds appended."""
    net, vae, record, dtype, grid = world
    actions, frames, B = run.dataset.actions, run.cfg["frames"], len(first)
    info = {"task": tasks, "steps": (frames - 1) * actions.stride, "action_dim": actions.action_width,
            "seed": cfg.seed}
    shape = (B, info["steps"], info["action_dim"])

    low, high = data_range(actions)

    def normalise(raw):  # the net's chunk; how far outside the data's commands the policy went, kept
        chunk = actions.normalise(raw)
        reach[0] = max(reach[0], float(np.abs(chunk).max()) if chunk.size else 0.0)
        raw = np.asarray(raw)
        reach[1] += int(((raw < low) | (raw > high)).sum())
        reach[2] += raw.size
        return chunk

    def timed(raw, k):  # each chunk's seconds (the first compiles under --compile): timing's warm figure
        synchronize()
        t0 = time.perf_counter()
        out = world_step(raw, k)
        synchronize()
        clock.append(time.perf_counter() - t0)
        return out
    synchronize = torch.cuda.synchronize if next(net.parameters()).is_cuda else (lambda: None)
    still = torch.from_numpy(actions.normalise(np.zeros((1, *shape[1:]), np.float32)))  # action guidance's uncond
    world_step = model_world(net, vae, condition.map_tensors(record, lambda v: v.expand(B, *v.shape[1:])),
                       normalise, frames, cfg.steps, cfg.action_guidance or run.guidance,
                       [cfg.seed + 1000 * int(e) for e in tasks["episode"]], grid, dtype,
                       first.to(next(net.parameters()).device), still if cfg.action_guidance else None)
    t0 = time.perf_counter()
    dreamt = closed_loop(timed, policy, name, first, info, cfg.chunks, shape, progress)["frames"]
    took, truth, state = time.perf_counter() - t0, None, None
    simulator, state_success = simulate
    if simulator is not None:
        true_world = simulator(tasks)
        truth = closed_loop(true_world, policy, name, first, info, cfg.chunks, shape)["frames"]
        state = None if state_success is None else torch.as_tensor(state_success(true_world, tasks)).float()
    return {"world": dreamt, "success_world": judged(judge, dreamt, info), "sim": truth,
            "success_sim": None if truth is None else judged(judge, truth, info), "state_sim": state}, took


def data_range(actions):
    """The data's per-dim action [min, max] (action_stats.json) widened by a tenth of the range each side."""
    with open(os.path.join(actions.root, "action_stats.json"), encoding="utf-8") as f:
        stats = json.load(f)["action"]
    low, high = np.asarray(stats["min"], np.float32), np.asarray(stats["max"], np.float32)
    return low - 0.1 * (high - low), high + 0.1 * (high - low)


def judged(judge, frames, info):
    """The judge's [B] success in [0, 1], or one line naming it."""
    got = judge(frames, dict(info, chunk=None))
    value = torch.as_tensor(np.asarray(got) if not isinstance(got, torch.Tensor) else got).float().cpu()
    if tuple(value.shape) != (len(frames),) or not bool(((value >= 0) & (value <= 1)).all()):
        raise ValueError(f"--judge returned {tuple(value.shape)} values (in [0, 1]: "
                         f"{bool(((value >= 0) & (value <= 1)).all()) if value.numel() else 'none'}); expected "
                         f"[{len(frames)}] successes in [0, 1]")
    return value


# -----------------------------------------------------------------------------
# Agreement between the worlds


def ranks(values):
    """Average ranks (ties share their mean rank), for Spearman."""
    order = np.argsort(values, kind="stable")
    out = np.empty(len(values))
    out[order] = np.arange(len(values), dtype=float)
    for v in np.unique(values):
        out[values == v] = out[values == v].mean()
    return out


def pearson(a, b):
    a, b = np.asarray(a, float) - np.mean(a), np.asarray(b, float) - np.mean(b)
    denominator = math.sqrt((a * a).sum() * (b * b).sum())
    return float((a * b).sum() / denominator) if denominator > 0 else float("nan")


def mmrv(world, sim):
    """Mean maximum rank violation (SIMPLER's): for each policy, the largest true-success gap |sim_i - sim_j| over
    the policies j the world model orders the other way round; the mean over policies. 0: no pair misordered."""
    world, sim = np.asarray(world, float), np.asarray(sim, float)
    violated = ((world[:, None] - world[None]) * (sim[:, None] - sim[None])) < 0
    return float((np.abs(sim[:, None] - sim[None]) * violated).max(1).mean())


def ranking(world, sim):
    """Spearman, MMRV and calibration (mean |world - sim| success) of these policies' success rates."""
    world, sim = np.asarray(world, float), np.asarray(sim, float)
    return {"spearman": pearson(ranks(world), ranks(sim)), "mmrv": mmrv(world, sim),
            "calibration": float(np.abs(world - sim).mean())}


def agreement(results, chunks, frames):
    """The world model against the simulator: per policy its success in both, per chunk the PSNR of the world's
    frames against the simulator's (frames 1.. of each chunk); over the policies Pearson, Spearman, MMRV,
    calibration (mean |world - sim|) and the false-success rate (the world's success of the policies whose true
    success is 0); the same per family of 2+ policies; the judge's agreement with the simulator's own state."""
    policies = {name: {"success_world": float(r["success_world"].mean()), "max_action_sd": r.get("max_action_sd"),
                       "share_outside_range": r.get("share_outside_range"), "frame_change": frame_change(r["world"]),
                       "family": r.get("family", "plug-in")}
                for name, r in results.items()}
    sims = [r["success_sim"] for r in results.values()]
    if any(s is None for s in sims):
        return {"policies": policies}
    drift = []
    for name, r in results.items():
        policies[name]["success_sim"] = float(r["success_sim"].mean())
        per = [float(psnr(r["world"][:, :, 1 + k * (frames - 1): 1 + (k + 1) * (frames - 1)],
                          r["sim"][:, :, 1 + k * (frames - 1): 1 + (k + 1) * (frames - 1)]).mean())
               for k in range(chunks)]
        policies[name]["psnr_per_chunk"] = per
        drift.append(per)
    world = [p["success_world"] for p in policies.values()]
    sim = [p["success_sim"] for p in policies.values()]
    failing = [w for w, s in zip(world, sim) if s == 0]
    families = {}
    for family in dict.fromkeys(p["family"] for p in policies.values()):
        members = [p for p in policies.values() if p["family"] == family]
        if len(members) > 1:
            families[family] = dict(ranking([p["success_world"] for p in members],
                                            [p["success_sim"] for p in members]), policies=len(members))
    states = [(r["success_sim"], r["state_sim"]) for r in results.values() if r.get("state_sim") is not None]
    return {"policies": policies, "pearson": pearson(world, sim), **ranking(world, sim),
            "false_success": float(np.mean(failing)) if failing else None,
            "false_success_max": float(np.max(failing)) if failing else None,
            "psnr_per_chunk": np.mean(drift, 0).tolist(), "families": families,
            "judge_vs_state": float(torch.cat([(j == t).float() for j, t in states]).mean()) if states else None}


OUT_OF_RANGE_SHARE = 0.01  # more raw action values than this outside the data's range (+-10%): extrapolation
OUT_OF_RANGE_SD = 10.0  # or one this many sd from the data's mean
NOISE_CHANGE = 3.0  # frames changing this many times the data's own per-frame change (+0.02): noise, not motion


def frame_change(frames_B_3_T_H_W):
    """The mean |frame t - frame t-1| of a world's frames in [-1, 1]: a few hundredths for the data's motion, ~0.5 or
    more for frames of noise (a collapsed world model)."""
    return float((frames_B_3_T_H_W[:, :, 1:] - frames_B_3_T_H_W[:, :, :-1]).abs().mean())


def warnings(summary, data_change):
    """Lines for results that must not be read as a ranking: a policy whose world frames change like noise against the
    data's per-frame change `data_change` (a world model collapsed under its actions, scored anyway), and actions
    outside the data's range (OUT_OF_RANGE_SHARE, OUT_OF_RANGE_SD: extrapolation)."""
    lines = []
    for name, p in summary["policies"].items():
        if p["frame_change"] > NOISE_CHANGE * data_change + 0.02:
            lines.append(f"{name}: the world model's frames change {p['frame_change']:.3f} a frame, the data's "
                         f"{data_change:.3f}: noise, not motion (a world model collapsed under these actions); its "
                         "success is not a measurement (see the mp4s; train longer or check the actions' range)")
        share, sd = p.get("share_outside_range") or 0.0, p.get("max_action_sd") or 0.0
        if share > OUT_OF_RANGE_SHARE or sd > OUT_OF_RANGE_SD:
            lines.append(f"{name}: {100 * share:.1f}% of its action values outside the data's range (action_stats.json "
                         f"min-max +-10%), up to {sd:.1f} sd from its mean: the world model never saw such commands; "
                         "its frames there are extrapolation (policy outputs in the dataset's units?)")
    return lines


def data_frame_change(run):
    """The data's own mean per-frame change: frame_change of the run's first held-out episode's clip at frame 0."""
    item = cache.Windows(run.dataset, [(run.held_out[sorted(run.held_out)[0]], 0)])[0]
    return frame_change(item["video"][None]) if "video" in item else float("nan")


# -----------------------------------------------------------------------------
# Outputs: the table, result.json, ranking.png, the side-by-side videos


def table(summary):
    names = list(summary["policies"])
    width = max(len(n) for n in names) + 2
    lines = [f"{'policy':<{width}}{'world':>8}{'sim':>8}   PSNR per chunk (world vs sim, dB)"]
    for name, p in summary["policies"].items():
        sim = f"{p['success_sim']:8.3f}" if "success_sim" in p else f"{'-':>8}"
        drift = " / ".join(f"{x:.2f}" for x in p.get("psnr_per_chunk", []))
        lines.append(f"{name:<{width}}{p['success_world']:8.3f}{sim}   {drift}")
    if "spearman" in summary:
        lines.append(f"Spearman {summary['spearman']:.3f}, Pearson {summary['pearson']:.3f}, MMRV "
                     f"{summary['mmrv']:.3f}, calibration |world - sim| {summary['calibration']:.3f}, false success "
                     "(policies that truly fail) " + ("none fail" if summary["false_success"] is None else
                                                      f"{summary['false_success']:.3f} (max "
                                                      f"{summary['false_success_max']:.3f})"))
        lines += [f"  family {family} ({f['policies']} policies): Spearman {f['spearman']:.3f}, MMRV {f['mmrv']:.3f}, "
                  f"calibration {f['calibration']:.3f}" for family, f in summary["families"].items()]
        if summary["judge_vs_state"] is not None:
            lines.append(f"the judge agrees with the simulator's own state in {summary['judge_vs_state']:.3f} of "
                         "its episodes")
        if len(names) < 2:
            lines.append("(Spearman/Pearson nan: one policy; a ranking needs two or more)")
        elif math.isnan(summary["spearman"]) or math.isnan(summary["pearson"]):
            lines.append("(Spearman/Pearson nan: every policy has the same success in one of the worlds: no order to "
                         "correlate)")
    return "\n".join(lines)


def plot(summary, path):
    """World vs simulator success, one point per policy coloured by its family, with binomial error bars and labels
    that do not pile up, and the calibration line y = x; None without matplotlib or a simulator (said by main)."""
    if importlib.util.find_spec("matplotlib") is None or "spearman" not in summary:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 5))
    names = list(summary["policies"])
    families = list(dict.fromkeys(summary["policies"][n]["family"] for n in names))
    colours = {family: plt.get_cmap("tab10")(i % 10) for i, family in enumerate(families)}
    xs = [summary["policies"][n]["success_sim"] for n in names]
    ys = [summary["policies"][n]["success_world"] for n in names]
    draw_points(ax, xs, ys, [n.split(":")[-1] for n in names], summary["episodes"],
                [colours[summary["policies"][n]["family"]] for n in names])
    for family, colour in colours.items():
        ax.scatter([], [], color=colour, label=family)
    ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--", label="calibrated (y = x)")
    ax.legend(fontsize=7, loc="upper left")
    ax.set(xlabel="success in the simulator", ylabel="success in the world model", xlim=(-0.05, 1.05),
           ylim=(-0.05, 1.05), title=f"Spearman {summary['spearman']:.2f}, MMRV {summary['mmrv']:.2f}, "
                                     f"|world - sim| {summary['calibration']:.2f}")
    fig.savefig(path, dpi=120, bbox_inches="tight", metadata={"Creator": "nanocosmos policyeval.py"})
    plt.close(fig)
    return path


def draw_points(ax, xs, ys, labels, n, colours):
    """The policies' points with binomial standard errors sqrt(p (1 - p) / n) on both axes (n episodes each), and
    their labels stacked upward where points sit within a label's height of each other (ties pile up otherwise)."""
    for x, y, colour in zip(xs, ys, colours):
        ax.errorbar(x, y, xerr=math.sqrt(x * (1 - x) / n), yerr=math.sqrt(y * (1 - y) / n), fmt="o", ms=4,
                    capsize=2, lw=0.8, color=colour)
    placed = []  # (x, y of the label in data units)
    for i in sorted(range(len(xs)), key=lambda i: (ys[i], xs[i])):
        y = ys[i]
        while any(abs(px - xs[i]) < 0.25 and abs(py - y) < 0.04 for px, py in placed):
            y += 0.04
        placed.append((xs[i], y))
        ax.annotate(labels[i], (xs[i], ys[i]), xytext=(xs[i] + 0.02, y + 0.01), fontsize=8,
                    arrowprops=dict(arrowstyle="-", lw=0.3, color="grey") if y != ys[i] else None)


def write_videos(cfg, results, task=None, tasks=None):
    """OUT/<policy>_ep<i>.mp4: the world model's episode | the simulator's; under --task held-out (no simulator)
    OUT/<policy>_ep<i>_world.mp4, the world model alone (the held-out truth followed its recorded actions, not the
    policy's: nothing to set beside it). A task with mark(frames, tasks) draws its goal on both halves (the videos
    only: the judge and the policies saw the frames unmarked), so success can be seen."""
    written, shown = [], min(cfg.videos, cfg.episodes)
    mark = getattr(task, "mark", None) if task is not None else None
    for name, r in results.items():
        for e in range(shown):
            world, sim = r["world"][e: e + 1], None if r["sim"] is None else r["sim"][e: e + 1]
            if mark is not None:
                world, sim = mark(world, rows(tasks, [e])), None if sim is None else mark(sim, rows(tasks, [e]))
            video = world[0] if sim is None else torch.cat([world[0], sim[0]], dim=-1)
            alone = "_world" if r["sim"] is None else ""
            path = os.path.join(cfg.out, f"{name.split(':')[-1]}_ep{e}{alone}.mp4")
            write_mp4(path, video, fps=4)
            written.append(path)
    return written


def timing(cfg, run, seconds, clock, device):
    """The world model's cost: seconds a chunk (batched) and per episode, peak memory, and MFU against the
    measured matmul peak (CUDA) from the formula's FLOPs: the sampler's forwards (two with CFG) a chunk."""
    mcfg, frames = get_config(run.cfg["config"]), run.cfg["frames"]
    batches = math.ceil(cfg.episodes / (cfg.batch or cfg.episodes))
    latent = (cfg.episodes, 16, (frames - 1) // 4 + 1, run.cfg["height"] // 8, run.cfg["width"] // 8)  # every episode
    calls = cfg.steps * (2 if run.guidance > 0 or cfg.action_guidance > 0 else 1)
    flops = model_flops(mcfg, latent, run.cfg["text_len"])[0] * calls * cfg.chunks  # forwards only
    out = {"world_seconds": seconds, "s_per_chunk": seconds / (batches * cfg.chunks),
           "s_per_episode_chunk": seconds / (cfg.episodes * cfg.chunks),
           "s_first_chunk": clock[0] if clock else None,  # with --compile: the compile too
           "s_per_chunk_warm": float(np.median(clock[1:])) if len(clock) > 1 else None}  # every later chunk
    if device.type == "cuda":
        peak, size = matmul_peak(device, torch.bfloat16), cfg.batch or cfg.episodes
        out.update(peak_gib=torch.cuda.max_memory_allocated() / 2 ** 30, mfu=flops / seconds / peak)
        if out["s_per_chunk_warm"]:  # a full batch's chunk (the figure to compare: no compile in it)
            one = model_flops(mcfg, (min(size, cfg.episodes),) + latent[1:], run.cfg["text_len"])[0] * calls
            out["mfu_warm"] = one / out["s_per_chunk_warm"] / peak
    return out


# -----------------------------------------------------------------------------
# Main


def write_result(cfg, summary):
    with open(os.path.join(cfg.out, "result.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)


def main(argv=None):
    cfg = cli.parse(PolicyEvalConfig, sys.argv[1:] if argv is None else argv, description=__doc__,
                    positional=("run",), prog="policyeval.py")
    if not cfg.run:
        raise ValueError("give RUN, a train.py run of an action config (python policyeval.py RUN ...)")
    task, policies, judge = load_task(cfg)  # plug-ins first: a typo costs no model build
    run = open_run(cfg.run, cfg.ema, cfg.guidance)
    if cfg.action_guidance and run.guidance > 0:
        raise ValueError(f"--action-guidance: {cfg.run} samples at guidance {run.guidance} (the prompt's CFG); pass "
                         "--guidance 0 with it (one CFG a call)")
    tasks, first = start_states(cfg, task, run)
    device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    runs.check_fast_flags(cfg.compile, cfg.fp8, device)
    os.makedirs(cfg.out, exist_ok=True)
    world = load_world(cfg, run, device)
    print(f"policyeval: {run.checkpoint}: {len(policies)} policies x {cfg.episodes} episodes x {cfg.chunks} chunks, "
          f"{cfg.steps} steps, guidance {run.guidance}, action guidance {cfg.action_guidance}, task {cfg.task}",
          flush=True)
    settings = dict(run=run.checkpoint, step=run.step, task=cfg.task, episodes=cfg.episodes, chunks=cfg.chunks,
                    steps=cfg.steps, seed=cfg.seed, guidance=run.guidance, action_guidance=cfg.action_guidance)

    def partial(done, error):  # a plug-in failed: the policies done so far are kept
        write_result(cfg, {**agreement(done, cfg.chunks, run.cfg["frames"]), **settings, "partial": True,
                           "error": error} if done else {**settings, "partial": True, "error": error, "policies": {}})
    results, seconds, clock = rollouts(cfg, run, task, policies, judge, tasks, first, world, partial)
    summary = agreement(results, cfg.chunks, run.cfg["frames"])
    summary.update(**settings, **timing(cfg, run, seconds, clock, device))
    summary["warnings"] = warnings(summary, data_frame_change(run))
    summary["videos"] = write_videos(cfg, results, task, tasks)
    summary["plot"] = plot(summary, os.path.join(cfg.out, "ranking.png"))
    write_result(cfg, summary)
    print(table(summary), flush=True)
    for line in summary["warnings"]:
        print("policyeval: WARNING: " + line, flush=True)
    if task is None:
        print(f"policyeval: --task held-out: no simulator, so no ranking against the truth and no ranking.png; the "
              f"mp4s ({cfg.out}/*_world.mp4) show the world model alone", flush=True)
    elif summary["plot"] is None and "spearman" in summary:
        print("policyeval: ranking.png: matplotlib is not installed (pip install matplotlib); result.json holds "
              "every number", flush=True)
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    cli.main(main, user_errors=(ValueError, OSError, ckpt.CheckpointError))
