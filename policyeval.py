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

A task module (tasks/square.py is the template to copy) has sample_tasks(n, seed), first_frames(tasks),
simulator(tasks) where a true simulator exists, judge and POLICIES. --task held-out starts from the first frames of
the run's held-out episodes instead (no simulator: the world model's success alone). Writes OUT/result.json (every
number), OUT/ranking.png (world vs simulator success), OUT/<policy>_ep<i>.mp4 (world model | simulator); prints a
table and one JSON line. engine/world.py holds the closed loop (docs/policyeval.md).

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
from nets import lora
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
    steps: int = 35  # sampler steps per chunk
    batch: int = 0  # episodes per network call (0 = all of them)
    seed: int = 0  # the tasks, the policies' draws, the noise (episode e, chunk k: seed + 1000 e + k)
    guidance: float = -1.0  # CFG; -1 = the run's own (an action run samples at 0, as upstream)
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
    if cfg.judge:
        judge = load_plugin(cfg.judge, "--judge")
    elif task is not None and callable(getattr(task, "judge", None)):
        judge = task.judge
    else:
        raise ValueError(f"--judge: none given, and --task {cfg.task} has no judge; pass module:function")
    return task, policies, judge


def start_states(cfg, task, run):
    """(tasks: per-episode arrays, first frames [N, 3, 1, H, W] in [-1, 1]): the task's, or with --task held-out the
    frame 0 of the run's held-out episodes, cycled."""
    if task is None:
        stems = sorted(run.held_out)
        index = [run.held_out[stems[e % len(stems)]] for e in range(cfg.episodes)]
        clips = {i: run.dataset[(i, 0)]["video"][:, :1] for i in set(index)}
        return {"episode": np.arange(cfg.episodes), "video": np.array(index)}, torch.stack([clips[i] for i in index])
    tasks = dict(task.sample_tasks(cfg.episodes, cfg.seed))
    tasks.setdefault("episode", np.arange(cfg.episodes))  # an episode's noise seeds come from its index
    first = torch.as_tensor(task.first_frames(tasks)).float()
    want = (cfg.episodes, 3, 1, run.cfg["height"], run.cfg["width"])
    if tuple(first.shape) != want:
        raise ValueError(f"--task {cfg.task}: first_frames gives {tuple(first.shape)}, the run's world is {list(want)} "
                         f"([episodes, 3, 1, height, width] of {run.directory}'s clips): a task of another world")
    return tasks, first


def rows(tasks: dict, batch) -> dict:
    """The tasks' arrays of these episodes (a policy's info["task"] holds its batch's rows only)."""
    return {k: np.asarray(v)[batch] for k, v in tasks.items()}


# -----------------------------------------------------------------------------
# The world model: the run's network, its codec, the prompt it samples with


def load_world(cfg, run, device, fold=True):
    """(net, vae, record, dtype, grid): the run rebuilt as trained (a LoRA run's adapters folded into its weights
    unless fold is False: it only samples), its prompt (its first held-out episode's), the negative prompt, the run's
    conditional_frame_timestep; a run of a net without actions is refused."""
    mcfg = get_config(run.cfg["config"])
    if not mcfg.action_dim:
        raise ValueError(f"{run.path}: --config {run.cfg['config']} takes no actions (action_dim 0): a policy cannot "
                         "steer it; evaluate an action run (--config tiny-action, v2w-2b-action)")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    net = runs.build_from_step(run.checkpoint, device, cfg.ema)
    net = (lora.fold_lora_(net) if fold else net).to(dtype).eval()  # a LoRA run's adapters folded in: it only samples
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


def rollouts(cfg, run, task, policies, judge, tasks, first, world):
    """({policy: {"world": frames, "sim": frames or None, "success_world": [N], "success_sim": [N] or None}}, the
    world model's seconds): every policy, batch by batch, in the world model and (where the task has one) the
    simulator, from the same start frames."""
    size, simulate = cfg.batch or cfg.episodes, (getattr(task, "simulator", None), getattr(task, "state_success", None))
    batches = [np.arange(i, min(i + size, cfg.episodes)) for i in range(0, cfg.episodes, size)]
    results, seconds = {}, 0.0
    with tqdm(total=len(policies) * cfg.episodes * cfg.chunks, desc="policyeval", unit="chunk") as bar:
        for name, policy in policies.items():
            parts = []
            for batch in batches:
                part, took = episodes(cfg, run, name, policy, judge, simulate, rows(tasks, batch), first[batch],
                                      world, lambda: bar.update(len(batch)))
                parts.append(part)
                seconds += took
            results[name] = {k: None if parts[0][k] is None else torch.cat([p[k] for p in parts]) for k in parts[0]}
            results[name]["family"] = getattr(policy, "family", "plug-in")
    return results, seconds


def episodes(cfg, run, name, policy, judge, simulate, tasks, first, world, progress):
    """One batch of episodes of one policy: its frames and success in the world model and the simulator (and, where
    the task reads it, the success from the simulator's own state), and the world model's seconds."""
    net, vae, record, dtype, grid = world
    actions, frames, B = run.dataset.actions, run.cfg["frames"], len(first)
    info = {"task": tasks, "steps": (frames - 1) * actions.stride, "action_dim": actions.action_width,
            "seed": cfg.seed}
    shape = (B, info["steps"], info["action_dim"])
    step = model_world(net, vae, condition.map_tensors(record, lambda v: v.expand(B, *v.shape[1:])),
                       actions.normalise, frames, cfg.steps, run.guidance,
                       [cfg.seed + 1000 * int(e) for e in tasks["episode"]], grid, dtype,
                       first.to(next(net.parameters()).device))
    t0 = time.perf_counter()
    dreamt = closed_loop(step, policy, name, first, info, cfg.chunks, shape, progress)["frames"]
    took, truth, state = time.perf_counter() - t0, None, None
    simulator, state_success = simulate
    if simulator is not None:
        true_world = simulator(tasks)
        truth = closed_loop(true_world, policy, name, first, info, cfg.chunks, shape)["frames"]
        state = None if state_success is None else torch.as_tensor(state_success(true_world, tasks)).float()
    return {"world": dreamt, "success_world": judged(judge, dreamt, info), "sim": truth,
            "success_sim": None if truth is None else judged(judge, truth, info), "state_sim": state}, took


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
    policies = {name: {"success_world": float(r["success_world"].mean()), "family": r.get("family", "plug-in")}
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
    return "\n".join(lines)


def plot(summary, path):
    """World vs simulator success, one point per policy coloured by its family, and the calibration line y = x;
    None (said once) without matplotlib."""
    if importlib.util.find_spec("matplotlib") is None or "spearman" not in summary:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 5))
    families = list(dict.fromkeys(p["family"] for p in summary["policies"].values()))
    colours = {family: plt.get_cmap("tab10")(i % 10) for i, family in enumerate(families)}
    for name, p in summary["policies"].items():
        ax.scatter(p["success_sim"], p["success_world"], color=colours[p["family"]])
        ax.annotate(name.split(":")[-1], (p["success_sim"], p["success_world"]), fontsize=8)
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


def write_videos(cfg, results):
    """OUT/<policy>_ep<i>.mp4: the world model's episode, beside the simulator's where there is one."""
    written = []
    for name, r in results.items():
        for e in range(min(cfg.videos, cfg.episodes)):
            video = r["world"][e] if r["sim"] is None else torch.cat([r["world"][e], r["sim"][e]], dim=-1)
            path = os.path.join(cfg.out, f"{name.split(':')[-1]}_ep{e}.mp4")
            write_mp4(path, video, fps=4)
            written.append(path)
    return written


def timing(cfg, run, seconds, device):
    """The world model's cost: seconds a chunk (batched) and per episode, peak memory, and MFU against the
    measured matmul peak (CUDA) from the formula's FLOPs: the sampler's forwards (two with CFG) a chunk."""
    mcfg, frames = get_config(run.cfg["config"]), run.cfg["frames"]
    batches = math.ceil(cfg.episodes / (cfg.batch or cfg.episodes))
    latent = (cfg.episodes, 16, (frames - 1) // 4 + 1, run.cfg["height"] // 8, run.cfg["width"] // 8)  # every episode
    calls = cfg.steps * (2 if run.guidance > 0 else 1)
    flops = model_flops(mcfg, latent, run.cfg["text_len"])[0] * calls * cfg.chunks  # forwards only
    out = {"world_seconds": seconds, "s_per_chunk": seconds / (batches * cfg.chunks),
           "s_per_episode_chunk": seconds / (cfg.episodes * cfg.chunks)}
    if device.type == "cuda":
        out.update(peak_gib=torch.cuda.max_memory_allocated() / 2 ** 30,
                   mfu=flops / seconds / matmul_peak(device, torch.bfloat16))
    return out


# -----------------------------------------------------------------------------
# Main


def main(argv=None):
    cfg = cli.parse(PolicyEvalConfig, sys.argv[1:] if argv is None else argv, description=__doc__,
                    positional=("run",), prog="policyeval.py")
    if not cfg.run:
        raise ValueError("give RUN, a train.py run of an action config (python policyeval.py RUN ...)")
    task, policies, judge = load_task(cfg)  # plug-ins first: a typo costs no model build
    run = open_run(cfg.run, cfg.ema, cfg.guidance)
    tasks, first = start_states(cfg, task, run)
    device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    os.makedirs(cfg.out, exist_ok=True)
    world = load_world(cfg, run, device)
    print(f"policyeval: {run.checkpoint}: {len(policies)} policies x {cfg.episodes} episodes x {cfg.chunks} chunks, "
          f"{cfg.steps} steps, guidance {run.guidance}, task {cfg.task}", flush=True)
    results, seconds = rollouts(cfg, run, task, policies, judge, tasks, first, world)
    summary = agreement(results, cfg.chunks, run.cfg["frames"])
    summary.update(run=run.checkpoint, step=run.step, task=cfg.task, episodes=cfg.episodes, chunks=cfg.chunks,
                   steps=cfg.steps, seed=cfg.seed, guidance=run.guidance, **timing(cfg, run, seconds, device))
    summary["videos"] = write_videos(cfg, results)
    summary["plot"] = plot(summary, os.path.join(cfg.out, "ranking.png"))
    with open(os.path.join(cfg.out, "result.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    print(table(summary), flush=True)
    if summary["plot"] is None and "spearman" in summary:
        print("policyeval: ranking.png: matplotlib is not installed (pip install matplotlib); result.json holds "
              "every number", flush=True)
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    cli.main(main, user_errors=(ValueError, OSError, ckpt.CheckpointError))
