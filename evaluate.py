"""Compare train.py runs on held-out episodes: per-camera PSNR / SSIM of the generated frames against the ground
truth and the reward terms, in one table (then one JSON line), and one plot of the runs' curves from metrics.jsonl.
A Path A run (Predict2.5 views) and a Path B run (Predict2 grid) of the same LeRobot episodes are compared camera by
camera: the grid is cut into its views, and every view is brought to the smallest view size of the compared runs.

    python evaluate.py runs/b14 runs/a2b                                  # 4 held-out clips, 35 steps, compare.png
    python evaluate.py RUN_A RUN_B RUN_C --clips 8 --guidance 3 --reward default,my_rewards:grasp=0.5 --plot cmp.png
    python evaluate.py RUN_A/step_00000500 RUN_B                         # that step of RUN_A, RUN_B's newest

Before any clip is sampled, every run's checkpoint is checked (its files whole, a LoRA run's base there) and so is
--plot (its folder writable; a file there is replaced only if evaluate.py wrote it); a plot that still fails at the end
comes after the table and the JSON line, so no result is lost.

Held-out episodes are each run's own (train.py --holdout: the last videos of its data folder in name order),
matched by stem: a grid folder and a views folder stitched from one LeRobot source name an episode alike
(videos/<src>__ep<index>.mp4, videos/<src>__ep<index>.<view>.mp4). The runs are compared on the first --clips stems
that every run holds out. Each clip is the window at frame 0 of the run's frames x height x width, generated from its
first frame alone the way the run samples (generate.from_first_frame: its sampler, prompt, negative prompt and
cameras; noise seed --seed + clip index, + draw x clips with --draws), scored on frames 1.. only (frame 0
conditions). Weight-free metrics only: PSNR, SSIM (clips/fidelity.py) and reward.py's terms (on the 2x2 grid; a views run's
views are put into one with camera.grid_from_views). An RL run logs the same numbers for its held-out clips at every
evaluation (eval_psnr, eval_ssim, eval_reward): `--steps` its --eval-steps, `--draws 2` give them again.
"""
import dataclasses
import importlib.util
import json
import os
import sys

import torch

import cache
import ckpt
import condition
import reward
from base import cli
from clips import text as text_lib
from clips.actionclips import episode_chunks, other_actions
from clips.fidelity import CAMERAS, score_sample, view_metrics
from engine import build, rundir, runs
from engine.generate import from_first_frame, rollout
from engine.runs import open_run, run_directory, run_guidance, text_settings
from nets.family import family_of

CURVES = {"eval_reward": "held-out reward (eval_reward)", "eval_psnr": "held-out PSNR, dB (eval_psnr)",
          "reward_mean": "training reward (reward_mean)",
          "eval_loss": "held-out loss (eval_loss; each family's own loss)"}  # metrics.jsonl keys -> plot panels
PLOT_FORMATS = (".png", ".pdf", ".svg")
PLOT_MARK = "nanocosmos evaluate.py"  # the plot's Creator: a file without it is never overwritten

# -----------------------------------------------------------------------------
# Runs: what train.py trained, on which held-out episodes


def common_stems(runs):
    """The stems every run holds out, in name order; a ValueError naming each run's when there is none."""
    common = sorted(set.intersection(*(set(r.held_out) for r in runs)))
    if not common:
        held = "; ".join(f"{r.path} holds out {shown(sorted(r.held_out))}" for r in runs)
        raise ValueError(f"the runs hold out no common episode ({held}): compare runs of one LeRobot source (a grid "
                         "and a views folder stitched from it share stems)")
    return common


def differences(runs, common):
    """The lines that say, once each, what differs between the compared runs and is scored anyway: their held-out
    sets (scored on the episodes they share) and their guidance (each samples as it was trained to)."""
    lines = []
    if any(set(r.held_out) != set(common) for r in runs):
        held = "; ".join(f"{r.path}: {len(r.held_out)} ({shown(sorted(r.held_out), 2)})" for r in runs)
        lines.append(f"the runs hold out different episodes ({held}): scored on the {len(common)} they all hold out")
    if len({r.guidance for r in runs}) > 1:
        lines.append("the runs sample at different guidance (" + ", ".join(f"{r.path} {r.guidance:g}" for r in runs)
                     + "): each its own (an RL run's rollouts', an SFT run's samples'); --guidance G compares them at "
                     "one")
    return lines


def shown(items, most=4):
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")


def held_out_clip(run, stem, device, start=0):
    """(video, batch) of a held-out episode's window at frame `start`: video [1, 3, T, H, W] or views [V, 3, T, H, W]
    float32 in [-1, 1] as training reads them (cache.Windows: GridClips' / ViewClips' own code and checks), and the
    window as a batch of one (its prompt embedding, a views run's cameras, an action run's chunk) for
    condition.from_batch."""
    index = run.held_out[stem]
    item = cache.Windows(run.dataset, [(index, start)])[0]
    if "error" in item:
        raise ValueError(f"{run.path}: held-out video {stem} of {run.cfg['data']} at frame {start}: {item['error']}")
    text, _ = text_lib.clip_text(run.dataset, run.dataset.videos[index])
    video = item["video"].to(device)  # float32: the truth is not rounded to the compute dtype
    return (video if run.views else video[None]), condition.as_batch(dict(item, text_emb=text))


@torch.no_grad()
def evaluate_run(run, stems, cfg, terms, device, size):
    """The run's newest checkpoint on each held-out stem: {"clips": [per clip: stem, seed, metrics, rewards],
    "metrics", "rewards" (their means over clips)}."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    net = runs.build_from_step(run.checkpoint, device, cfg.ema)  # adapters unfolded: rl.evaluate's numbers, bitwise
    net = runs.for_sampling(net, dtype, device, cfg.compile, cfg.fp8, fold=False)
    vae = build.build_vae(run.cfg["vae"], run.cfg["vae_ckpt"], device, dtype)
    mcfg, settings = net.cfg, text_settings(run.cfg)
    neg, neg_source = text_lib.negative_embedding(run.cfg["data"], run.cfg["text_len"], mcfg.crossattn_proj_in_channels,
                                              standin=settings["text"] == "standin",
                                              text_encoder=settings["text_encoder"])
    math = family_of(mcfg)
    grid, timestep = math.sampler_defaults(run.cfg["init"], run.cfg["config"])[0], run.cfg["conditional_frame_timestep"]
    print(f"evaluate: {run.checkpoint}{' (EMA)' if cfg.ema else ''}: {run.family}, guidance {run.guidance}, "
          f"negative prompt {neg_source}, {math.describe_sampler(grid, timestep)}", flush=True)

    def record(batch):  # a held-out window's conditioning (condition.from_batch), with the negative prompt for CFG
        return condition.from_batch(batch, device, run.cfg["height"], run.cfg["width"], dtype, timestep,
                                    neg_crossattn_emb=neg[None].to(device))
    clips, held = [], [held_out_clip(run, stem, device) for stem in stems]
    chains = chained_other_actions(run, stems, cfg.chunks) if cfg.chunks > 1 and mcfg.action_dim else None
    conds = [record(batch) for _, batch in held]
    wrong, what = other_actions([c.action for c in conds], stems) if mcfg.action_dim else ([None] * len(held), None)
    for stem, label in zip(stems, what or []):
        if not label.endswith("'s actions"):  # no other held-out clip's commands differ from its own: said
            same = "" if "reversed" in label else "; reversed in time they are the same: one command held throughout"
            print(f"evaluate: action_gap_db of {stem}: against {label} (no other held-out clip's actions differ from "
                  f"its own{same}); the JSON's other_actions says so per clip", flush=True)
    for i, (stem, (truth, _), cond) in enumerate(zip(stems, held, conds)):
        for d in range(cfg.draws):  # rl.evaluate's rule: clip i, draw d has the noise seed + i + d * clips
            seed = cfg.seed + i + d * len(stems)
            generated, x0 = from_first_frame(net, vae, truth, cond, cfg.steps, run.guidance, seed, grid, dtype)
            raw = None if cond.action is None else run.dataset.actions.raw(cond.action)  # world-model rewards
            metrics, rewards = score_sample(generated, truth, x0, run.views, size, terms, action=raw)  # as rl.evaluate
            metrics = {k: v.item() for k, v in metrics.items()}
            if cond.action is not None:  # the same frame and noise under another episode's commands (or these reversed)
                other = from_first_frame(net, vae, truth, dataclasses.replace(cond, action=wrong[i]), cfg.steps,
                                         run.guidance, seed, grid, dtype)
                pair = (other[0][None], truth[None]) if run.views else (other[0], truth)  # score_sample's layout
                metrics["psnr_other_actions"] = view_metrics(*pair, "views" if run.views else "grid", size)[
                    "psnr"].item()
                metrics["action_gap_db"] = metrics["psnr"] - metrics["psnr_other_actions"]
            if cfg.chunks > 1:  # drift over the horizon: PSNR of each chained chunk against the episode's truth
                metrics.update(chunk_psnr(net, vae, run, stem, record, cfg, seed, grid, dtype, size,
                                          chains[i] if chains else None))
            clips.append({"stem": stem, "seed": seed, "metrics": metrics,
                          "rewards": {k: v.item() for k, v in rewards.items()},
                          **({"other_actions": what[i]} if what else {})})  # action_gap_db's substitute
    del net, vae
    if device.type == "cuda":
        torch.cuda.empty_cache()
    mean = lambda part: {k: sum(c[part][k] for c in clips) / len(clips) for k in clips[0][part]}  # noqa: E731
    return {"clips": clips, "metrics": mean("metrics"), "rewards": mean("rewards")}


def chained_other_actions(run, stems, chunks):
    """Per held-out stem, per chained chunk, commands that did not happen in that window: other_actions over the
    held-out episodes' chunks of that window (clips/actionclips.episode_chunks), as action_gap_db's for chunk 1."""
    chains = [episode_chunks(run.dataset, run.held_out[stem], chunks) for stem in stems]
    per_chunk = [other_actions([chain[k] for chain in chains], stems)[0] for k in range(chunks)]
    return [[per_chunk[k][i] for k in range(chunks)] for i in range(len(stems))]


def chunk_psnr(net, vae, run, stem, record, cfg, seed, grid, dtype, size, wrong=None):
    """{"chunk<k>/psnr"}: a cfg.chunks-chunk rollout (generate.rollout) from the held-out episode's frame 0, chunk k
    conditioned on the last frame generated and record(its window) (an action run: the episode's actions of that
    window), scored on frames 1.. against the true window at frame k*(T-1); a ValueError when the episode is too short
    for it. wrong (an action run: chained_other_actions' list for this episode): also {"chunk<k>/action_gap_db"}, the
    chunk's PSNR minus that of the same rollout (frame, noise) under the substitute commands, chained on its own."""
    T = run.cfg["frames"]
    need, have = 1 + cfg.chunks * (T - 1), run.dataset.videos[run.held_out[stem]].frames
    if have < need:
        raise ValueError(f"--chunks {cfg.chunks}: held-out episode {stem} of {run.cfg['data']} has {have} frames, "
                         f"{cfg.chunks} chunks of {T} need {need}; pass fewer --chunks")
    windows = [held_out_clip(run, stem, next(net.parameters()).device, k * (T - 1)) for k in range(cfg.chunks)]
    conds = [record(batch) for _, batch in windows]
    chunks = rollout(net, vae, windows[0][0][:, :, :1], conds, T, cfg.steps, run.guidance, seed, grid, dtype)
    found = {f"chunk{k + 1}/psnr": view_metrics(c, w[0], "grid", size)["psnr"].item()
             for k, (c, w) in enumerate(zip(chunks, windows))}
    if wrong is not None:
        others = rollout(net, vae, windows[0][0][:, :, :1], [dataclasses.replace(c, action=a.to(c.action))
                                                             for c, a in zip(conds, wrong)],
                         T, cfg.steps, run.guidance, seed, grid, dtype)
        found.update({f"chunk{k + 1}/action_gap_db": found[f"chunk{k + 1}/psnr"]
                      - view_metrics(o, w[0], "grid", size)["psnr"].item() for k, (o, w) in enumerate(zip(others,
                                                                                                       windows))})
    return found


# -----------------------------------------------------------------------------
# Output: the table, the curves of metrics.jsonl, the plot


def table(rows, terms):
    """One row per run: name, family, step, CFG, PSNR / SSIM per camera and their means, the total reward and each
    term's, then action_gap_db (action runs) and each chunk's PSNR (--chunks); fixed-width columns."""
    rewards = ["reward"] + [t.name for t in terms]
    chunks = sorted({k for row in rows for k in row["metrics"] if k.startswith("chunk")},
                    key=lambda k: (int(k[5:k.index("/")]), k))  # chunk<k>/action_gap_db, chunk<k>/psnr
    extra = [k for k in ("action_gap_db",) if any(k in row["metrics"] for row in rows)] + chunks
    head = ["run", "family", "step", "cfg"] + [f"{c} {m}" for c in CAMERAS for m in ("psnr", "ssim")] + \
        ["psnr", "ssim"] + rewards + extra
    lines = [head]
    for row in rows:
        m, r = row["metrics"], row["rewards"]
        lines.append([row["run"], row["family"], str(row["step"]), f"{row['guidance']:g}"]
                     + [f"{m[f'{c}/{k}']:.{2 if k == 'psnr' else 4}f}" for c in CAMERAS for k in ("psnr", "ssim")]
                     + [f"{m['psnr']:.2f}", f"{m['ssim']:.4f}"] + [f"{r[k]:.4g}" for k in rewards]
                     + [f"{m[k]:.2f}" if k in m else "-" for k in extra])  # "-": a run without actions
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in
                               enumerate(zip(line, widths))).rstrip() for line in lines)


def read_curves(path):
    """{metrics.jsonl key in CURVES: [(step, value)]} of a run (the last row per step: a killed run's rows past its
    checkpoint are logged again after the resume); a torn last line (a run still writing) is left out."""
    file = os.path.join(path, "metrics.jsonl")
    if not os.path.exists(file):
        return {}
    with open(file) as f:
        lines = f.read().splitlines()
    rows = {}
    for n, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines):
                continue
            raise ValueError(f"{file}:{n}: not valid JSON (only a last line torn by a kill may be): the file is "
                             "damaged") from None
        rows[row["step"]] = row
    curves = {key: [(s, row[key]) for s, row in sorted(rows.items()) if row.get(key) is not None] for key in CURVES}
    return {key: points for key, points in curves.items() if points}


def plot_curves(path, curves, note=""):
    """One figure at path, a panel per CURVES quantity that some run logged, a line per run; curves [(label,
    read_curves(run))]; note: a warning drawn above the panels (the runs' curves sampled at different guidance).
    Returns the panels' keys (none: nothing is written)."""
    keys = [key for key in CURVES if any(key in c for _, c in curves)]
    if not keys:
        return keys
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(keys), figsize=(5.5 * len(keys), 4), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for label, c in curves:
            if key in c:
                ax.plot(*zip(*c[key]), "o-" if len(c[key]) < 30 else "-", lw=1.2, ms=3, label=label)
        ax.set_title(CURVES[key], fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if note:
        fig.suptitle(note, color="firebrick", fontsize=9, wrap=True)
    fig.tight_layout()
    tmp = path + ".tmp" + os.path.splitext(path)[1]
    fig.savefig(tmp, dpi=100, metadata={"Creator": PLOT_MARK})
    plt.close(fig)
    os.replace(tmp, path)  # a reader never sees a half-written plot
    return keys


# -----------------------------------------------------------------------------
# CLI


@dataclasses.dataclass
class EvalConfig:
    runs: tuple = ()  # train.py run directories (config.json + a complete checkpoint; RUN/step_XXXXXXXX: that step),
    # one or more
    clips: int = 4  # held-out clips per run: the first N of the episodes every run holds out
    steps: int = 35  # sampler steps (Predict2: Euler + AB2; Predict2.5: UniPC)
    compile: str = "auto"  # torch.compile each run's blocks: auto (on a GPU), on, off; its first clip compiles them
    fp8: bool = False  # block GEMMs in fp8 (H100/H200; base/fp8.py)
    guidance: float = -1.0  # CFG for every run; default -1: each run's own (GRPO --grpo-guidance, NFT --nft-guidance,
    # SFT its sample videos' --guidance, 7.0 unless set)
    seed: int = 0  # initial noise of clip i (draw d): seed + i (+ d * clips), the same for every run
    draws: int = 1  # noise draws per clip (an RL run's held-out evaluation: 2, rl.EVAL_NOISE_DRAWS)
    chunks: int = 1  # > 1: also a long rollout of N chained chunks per clip (grid runs), its PSNR per chunk (drift)
    reward: str = ""  # reward terms scored on the grid video (reward.parse_rewards: default, module:fn=WEIGHT); "": the
    # runs' own --reward when every RL run among them shares one, else default
    plot: str = "compare.png"  # the plot of the runs' curves (.png, .pdf or .svg; needs matplotlib); replaces only a
    # plot evaluate.py wrote
    device: str = ""  # cuda | cpu (default: cuda when available)
    ema: bool = False  # each run's EMA weights (train.py --ema) instead of its raw ones


def parse_config(argv):
    """The flags, checked before any run is read."""
    cfg = cli.parse(EvalConfig, argv, description=__doc__, positional=("runs",), prog="evaluate.py")
    if min(cfg.clips, cfg.steps, cfg.draws, cfg.chunks) < 1:
        raise ValueError(f"--clips {cfg.clips}, --steps {cfg.steps}, --draws {cfg.draws} and --chunks {cfg.chunks} "
                         "must be >= 1")
    if cfg.guidance < 0 and cfg.guidance != -1:
        raise ValueError(f"--guidance {cfg.guidance}: >= 0, or -1 for each run's own")
    if cfg.device not in ("", "cuda", "cpu"):
        raise ValueError(f"--device {cfg.device!r}: cuda or cpu")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is visible (torch.cuda.is_available() is False)")
    runs.check_fast_flags(cfg.compile, cfg.fp8, torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else
                                                                            "cpu")))
    if os.path.splitext(cfg.plot)[1].lower() not in PLOT_FORMATS:
        raise ValueError(f"--plot {cfg.plot}: end it in {', '.join(PLOT_FORMATS)}")
    plot = os.path.abspath(cfg.plot)
    for run in map(run_directory, cfg.runs):  # evaluate.py writes nothing into a run
        if os.path.commonpath([plot, os.path.abspath(run)]) == os.path.abspath(run):
            raise ValueError(f"--plot {cfg.plot} is inside the run {run}: evaluate.py never writes into a run; put it "
                             "elsewhere")
    return cfg


def check_plot_path(path):
    """--plot can be written, checked before any work (a plot that fails after the sampling cost the results): its
    folder exists and is writable, and a file already there is a plot evaluate.py wrote (PLOT_MARK), nothing else.
    Returns True when one is there (it will be replaced)."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(folder):
        raise ValueError(f"--plot {path}: its folder {folder} does not exist: create it (mkdir -p {folder}) or pass "
                         "another --plot")
    if not os.path.isdir(folder):
        raise ValueError(f"--plot {path}: {folder} is not a folder; pass another --plot")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"--plot {path}: its folder {folder} is not writable by this user (uid {os.geteuid()}); pass "
                         "another --plot")
    if not os.path.lexists(path):
        return False
    mark = False
    if os.path.isfile(path):
        with open(path, "rb") as f:
            mark = PLOT_MARK.encode() in f.read(64 << 20)
    if not mark:
        raise ValueError(f"--plot {path}: {os.path.abspath(path)} exists and is not a plot evaluate.py wrote (no "
                         f"{PLOT_MARK!r} mark in it): move it away, or pass another --plot")
    return True


def pixel_terms(spec):
    """reward.parse_rewards(spec), refusing terms that read the latent: a grid run's and a views run's latents have
    nothing in common, so evaluate.py scores decoded frames only."""
    terms = reward.parse_rewards(spec)
    latent = [t.name for t in terms if "latent" in t.inputs]
    if latent:
        raise ValueError(f"--reward {spec}: {latent} read the latent; evaluate.py scores the decoded grid video only "
                         "(a Path A and a Path B run share no latent): drop them or give a video version")
    return terms


def runs_reward(runs):
    """The --reward of the RL runs among `runs` (their config.json) when they all share one, else "default" (the grid
    reward)."""
    specs = {run["reward"] for run in runs if rundir.objective_settings(run) is not None}
    return specs.pop() if len(specs) == 1 else "default"


def curve_labels(runs):
    """([(label, curves)], note) for plot_curves: each run's metrics.jsonl curves labelled with the guidance they were
    sampled at during training (its own, whatever --guidance says), and a note when those differ."""
    own = [run_guidance(r.path, r.cfg, -1) for r in runs]
    note = "" if len(set(own)) < 2 else ("NOT COMPARABLE: the curves sample at different guidance (" + ", ".join(
        f"{r.path} {g:g}" for r, g in zip(runs, own)) + "); the table at one: evaluate.py --guidance G")
    return [(f"{r.path} (guidance {g:g})", read_curves(r.directory)) for r, g in zip(runs, own)], note


def main(argv=None):
    cfg = parse_config(sys.argv[1:] if argv is None else argv)
    plot, replacing = os.path.abspath(cfg.plot), check_plot_path(cfg.plot)  # before any work
    if cfg.reward:
        pixel_terms(cfg.reward)  # a bad spec fails before any run is read
    plots = importlib.util.find_spec("matplotlib") is not None  # optional, as for train.py's loss.png
    replaced = " (replacing the earlier evaluate.py plot there)" if replacing else ""
    print(f"evaluate: the plot goes to {plot}{replaced}" if plots else
          f"evaluate: {cfg.plot}: matplotlib is not installed (pip install matplotlib): no plot", flush=True)
    runs = [open_run(path, cfg.ema, cfg.guidance) for path in cfg.runs]
    if cfg.chunks > 1 and any(run.views for run in runs):
        raise ValueError(f"--chunks {cfg.chunks}: chained rollouts take grid runs; {[r.path for r in runs if r.views]}"
                         " are views runs: evaluate them without --chunks")
    cfg.reward = cfg.reward or runs_reward([run.cfg for run in runs])
    print(f"evaluate: reward {cfg.reward}", flush=True)
    terms = pixel_terms(cfg.reward)
    common = common_stems(runs)
    stems = common[: cfg.clips]
    size = (min(r.view_size[0] for r in runs), min(r.view_size[1] for r in runs))
    print(f"evaluate: {len(stems)} held-out clip(s) {shown(stems)} of {len(common)} every run holds out"
          + (f" (--clips {cfg.clips})" if len(stems) < cfg.clips else "")
          + f"; cameras {', '.join(CAMERAS)} compared at {size[0]}x{size[1]}", flush=True)
    for line in differences(runs, common):
        print("evaluate: " + line, flush=True)
    device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    rows = []
    for run in runs:
        result = evaluate_run(run, stems, cfg, terms, device, size)
        rows.append({"run": run.path, "family": run.family, "config": run.cfg["config"],
                     "objective": run.cfg["objective"], "step": run.step, "guidance": run.guidance,
                     "ema": cfg.ema, **result})

    def results():  # the table, then one JSON line
        print(table(rows, terms), flush=True)
        print(json.dumps({"stems": stems, "view_size": list(size), "steps": cfg.steps, "seed": cfg.seed,
                          "reward": cfg.reward, "runs": rows}), flush=True)
    try:
        keys = plot_curves(cfg.plot, *curve_labels(runs)) if plots else None
    except OSError as e:  # checked at the start, failed now (a full disk, a folder gone): the results first
        results()
        raise OSError(f"--plot {cfg.plot}: not written ({e.strerror or e}); the table and JSON above hold every "
                      "result") from e
    if keys:
        print(f"evaluate: wrote {plot} ({', '.join(keys)}"
              + ("; overwrote the earlier evaluate.py plot)" if replacing else ")"), flush=True)
    elif plots:
        print(f"evaluate: no curves ({', '.join(CURVES)}) in the runs' metrics.jsonl: no plot", flush=True)
    results()


if __name__ == "__main__":
    cli.main(main, user_errors=(ValueError, OSError, ckpt.CheckpointError))
