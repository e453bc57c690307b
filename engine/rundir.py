"""The run directory around the checkpoints (engine/resume.py): one process per OUT, its settings, its metrics.

claim / claim_out: a POSIX lock that dies with its process (a second train.py on one --out is refused in one line);
check_resume_settings and config_hash: what a resumed run must keep; on_signal / count_nonfinite: how a run stops
(a signal: after the step, saved; divergence: one line naming the cause); MetricsLog: metrics.jsonl (a kill never loses
a row: load_history re-logs the one saved with the checkpoint), wandb, and the plot loss.png (matplotlib, optional).
"""
import dataclasses
import hashlib
import importlib.util
import json
import math
import os
import signal

import numpy as np

import ckpt
from base import cli, collectives
from base.files import claim
from base.formats import STEP_RE, CheckpointError, cut_short, read_meta
from engine.resume import (
    complete_checkpoints,
    delete_checkpoints,
    find_resume,
    leftovers,
    lora_base,
    read_eval_marker,
    write_atomic,
)


def claim_out(out):
    """Refuse a second train.py on the same --out (claim() on OUT/.lock), then delete what a kill while rotating left
    half-deleted (leftovers(): never a complete checkpoint)."""
    os.makedirs(out, exist_ok=True)
    lock = claim(os.path.join(out, ".lock"), f"--out {out} is in use by a running train.py ({{holder}}): wait for it, "
                 "or use another --out")
    half = leftovers(out, complete_checkpoints(out))
    if half:
        print(f"ckpt: deleting {[os.path.basename(p) for p in half]}, left half-deleted by a run killed while "
              "rotating checkpoints", flush=True)
        delete_checkpoints(half)
    return lock


def release_fresh_out(out, lock):
    """Undo claim_out of an --out that was absent or empty, when the start is refused before the run wrote anything
    of its own: with only .lock and config.json in it, both go, and the folder. Anything else there stays."""
    if lock is not None:
        lock.close()
    if os.path.isdir(out) and set(os.listdir(out)) <= {".lock", "config.json"}:
        for name in os.listdir(out):
            os.remove(os.path.join(out, name))
        os.rmdir(out)


RECORDED_ONLY = ("action_dim",)  # TrainConfig fields that are no flag: decided at start-up from others, recorded


def claim_run(run, keys, defaults, episodes=None):
    """train.py's run directory: claimed (one train.py per --out), settings checked against its checkpoint (keys:
    what a resumed run must keep; defaults: TrainConfig()), the --init resolved (hub names download now, before any
    model is built), then config.json. Sets run.resume_from; returns the lock."""
    cfg = run.cfg
    lock = collectives.agree(f"claiming --out {cfg.out}", lambda: claim_out(cfg.out) if run.master else None)
    resume_path, changed = collectives.agree("checking the run's saved settings",
                                      lambda: check_resume_settings(cfg.out, cfg, keys, defaults, episodes),
                                      share=True)
    run.resume_from = resume_path
    changed = {k: v for k, v in changed.items() if k not in RECORDED_ONLY}
    if changed:
        run.say(f"resume: settings changed since {resume_path}, applied from its step on: "
                + ", ".join(f"{cli.flag(k)} {old} -> {new}" for k, (old, new) in changed.items()))
    if cfg.init != "random":
        collectives.agree(f"resolving --init {cfg.init}", lambda: ckpt.resolve_source(cfg.init))
    if run.master:
        write_atomic(os.path.join(cfg.out, "config.json"), json.dumps(dataclasses.asdict(cfg), indent=1))
    return lock


def check_lora_base(run, net):
    """A resumed LoRA run's --init holds the base its adapters trained on, judged by content (the load's checksum,
    recorded with every step), not by path: the same file under another path is the same base."""
    if not run.cfg.lora or run.resume_from is None:
        return
    extra = read_meta(run.resume_from)["extra"]
    if "base_checksum" in extra and extra["base_checksum"] != net.init_checksum:
        what = lambda c: "a random base (--init random)" if c is None else f"content checksum {c}"  # noqa: E731
        raise ValueError(f"--init {run.cfg.init}: {what(net.init_checksum)}, but the LoRA adapters of "
                         f"{run.resume_from} were trained on {what(extra['base_checksum'])}: resume with the base they "
                         "were trained on (any path holding the same file), or use a new --out")


def episode_record(videos, n_train, actions=None):
    """What a run trains and evaluates on, saved with every step: the training and held-out episodes (stems, the
    held-out ones the last in name order) and a fingerprint of their content (the manifest's sha1 and size of every
    file), so a resume or evaluate.py on a changed data folder is refused instead of shifting silently. actions (an
    action run's FolderActions): the fingerprints of its action files and of action_stats.json too."""
    ident = lambda v: [v.stem, v.sha1, v.bytes, v.frames] if not v.views else [  # noqa: E731
        v.stem, v.frames, sorted([s, w.sha1, w.bytes] for s, w in v.views.items())]
    digest = hashlib.sha256(json.dumps([ident(v) for v in videos]).encode()).hexdigest()[:16]
    return {"train": [v.stem for v in videos[:n_train]], "held_out": [v.stem for v in videos[n_train:]],
            "fingerprint": digest, **(actions.fingerprint([v.stem for v in videos]) if actions is not None else {})}


def episode_change(saved, now, data_dir):
    """'' when the saved episode record (episode_record) matches now's, else what changed, in one clause."""
    shown = lambda stems: ", ".join(sorted(stems)[:3]) + (f" and {len(stems) - 3} more" if len(stems) > 3 else "")  # noqa: E731
    for part in ("held_out", "train"):
        gone, new = set(saved[part]) - set(now[part]), set(now[part]) - set(saved[part])
        if gone or new:
            name = "held-out" if part == "held_out" else "training"
            return (f"its {name} episodes changed in {data_dir}" + (f": {shown(gone)} no longer usable there (deleted "
                    "or skipped)" if gone else "") + (f"; {shown(new)} {name} now" if new else ""))
    if saved["fingerprint"] != now["fingerprint"]:
        return (f"the episodes of {data_dir} have the same names but other content (fingerprint "
                f"{saved['fingerprint']} -> {now['fingerprint']}: replaced or restitched)")
    for key, what in (("actions", (f"the actions of its episodes changed in {data_dir}/actions (the same names and "
                                   "sizes, other values: edited or restitched)")),
                      ("action_stats", (f"{data_dir}/action_stats.json changed (another normalisation: the same "
                                        "commands would reach the network as other numbers)"))):
        if key in saved and key in now and saved[key] != now[key]:  # (steps saved before actions were fingerprinted)
            return f"{what}, fingerprint {saved[key]} -> {now[key]}"
    return ""


def check_resume_settings(out, cfg, keys, defaults, episodes=None):
    """Before anything is built or written: the newest complete checkpoint's settings against this run's. Changed
    must-keep settings are refused, naming them; other changes are returned (applied from the resume point)."""
    path = find_resume(out)
    if path is None:
        return None, {}
    # a setting added since the save (e.g. --latents) is taken at its default, which is how that run was trained
    extra = read_meta(path)["extra"]
    saved = {**cli.flatten(dataclasses.asdict(defaults)), **cli.flatten(extra["config"])}
    now = cli.flatten(json.loads(json.dumps(dataclasses.asdict(cfg))))  # tuples as lists, like the saved JSON
    refused = {k: (saved.get(k), now[k]) for k in keys if saved.get(k) != now[k]}
    if "holdout" in refused and "data" not in refused:  # named as the flag it is, not as episodes gone from the data
        raise ValueError(f"{path}: --holdout {refused['holdout'][0]} -> {refused['holdout'][1]}: a resumed run keeps "
                         "its held-out episodes (another --holdout would train on episodes it held out, or evaluate "
                         f"on ones it trained on): resume with --holdout {refused['holdout'][0]}, or use a new --out")
    recorded = extra.get("episodes")
    change = episode_change(recorded, episodes, cfg.data) if recorded and episodes and "data" not in refused else ""
    if change:
        raise ValueError(f"{path}: {change}; a resumed run must keep its data (its held-out set above all): restore "
                         "the data folder, or use a new --out")
    if "init" in refused and now.get("lora") and "base_checksum" in extra:
        refused.pop("init")  # a LoRA run's base is judged by content once it is loaded (train.check_lora_base)
    if "objective" in refused:  # the knobs of the other objective were never used by the saved run: not a change
        raise ValueError(f"{out} was written by --objective {saved.get('objective')}, this run is --objective "
                         f"{now['objective']}: a run keeps its objective. Use a new --out (to start from that run's "
                         f"weights: --init {path})")
    if refused:
        why = " (LoRA checkpoints hold only adapters: the base comes from --init)" if "init" in refused and \
            (saved.get("lora") or now["lora"]) else ""
        raise ValueError(f"{out} was written with other settings, (saved, now): {refused}; a resumed run must keep "
                         f"them{why}. Use a new --out")
    return path, {k: (saved.get(k), v) for k, v in now.items() if saved.get(k) != v}


def config_hash(cfg, keys):
    """A short hash of the settings a resumed run must keep (`keys`): saved with every checkpoint."""
    flat = cli.flatten(dataclasses.asdict(cfg))
    return hashlib.sha256(json.dumps({k: flat[k] for k in keys}, sort_keys=True,
                                     default=list).encode()).hexdigest()[:16]


def load_history(path, start_step, step_dir=None):
    """The metrics rows up to the resume point. The file is rewritten without the rows after it (a killed run logged
    steps that the resumed run logs again) and without a torn last line (killed mid-write); the resumed checkpoint
    step_dir's own row (meta.json's, train.py saves it) is logged again, with its evaluation, if a kill lost it."""
    rows, lines = [], []
    if os.path.exists(path):
        with open(path) as f:
            lines = f.read().splitlines()
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(lines) - 1:  # only the last line can be torn by a kill: anything else is damage
                raise ValueError(f"{path}: line {i + 1} is not JSON ({line[:60]!r}): repair or remove the file")
            print(f"metrics: dropping the torn last line of {path} ({len(line)} bytes)", flush=True)
    kept = [r for r in rows if r["step"] <= start_step]
    if len(kept) < len(rows):
        print(f"metrics: dropping {len(rows) - len(kept)} rows after step {start_step} from {path} (logged by a run "
              "killed after its last checkpoint; they are logged again)", flush=True)
    saved = read_meta(step_dir)["extra"].get("metrics_row") if step_dir else None
    if saved is not None and saved["step"] == start_step and not any(r["step"] == start_step for r in kept):
        print(f"metrics: logging step {start_step} again from {step_dir}/meta.json (killed after its checkpoint, "
              "before its row was written)", flush=True)
        result = read_eval_marker(step_dir) or {}
        kept.append({**saved, **{k: v for k, v in result.items() if k != "step"}, "relogged": True})
    if rows or kept:
        write_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))
    return kept


class MetricsLog:
    """metrics.jsonl (and wandb, loss.png) on rank 0; the history every rank returns."""

    def __init__(self, cfg, run, start_step, has_holdout, run_id, max_drop):
        self.path, self.master, self.has_holdout = os.path.join(cfg.out, "metrics.jsonl"), run.master, has_holdout
        resumed_dir = os.path.join(cfg.out, f"step_{start_step:08d}") if start_step else None  # a row a kill lost
        self.history = load_history(self.path, start_step, resumed_dir) if run.master else []
        self.plots = importlib.util.find_spec("matplotlib") is not None  # optional: one plot is not worth a dep
        if not self.plots:
            run.say("loss.png: matplotlib is not installed (pip install matplotlib); metrics.jsonl holds every number")
        self.wandb = None
        if cfg.wandb and run.master:
            import wandb
            self.wandb = wandb.init(project=cfg.wandb, config=dataclasses.asdict(cfg), resume="allow",
                                    id=f"{os.path.basename(os.path.abspath(cfg.out))}-{run_id}")
        self.loss_png = os.path.join(cfg.out, "loss.png")
        self.max_drop = max_drop  # the fidelity guard's (RL's --max-psnr-drop; 0: none), drawn

    def write(self, row, first=False):
        if first and (not self.master or any(r.get("step") == row["step"] for r in self.history)):
            return
        self.history.append(row)
        if not self.master:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        if self.wandb is not None:
            self.wandb.log(row, step=row["step"])
        if self.plots and "s_checkpoint" in row:
            plot_metrics(self.loss_png, self.history, held_out=self.has_holdout,
                         max_drop=self.max_drop)


def plot_metrics(path, history, held_out=True, max_drop=0.0):
    """loss.png: training loss (log scale) with its running mean and the evaluation loss (held_out False: on fixed
    clips of training videos, --holdout 0); for an RL run a reward panel: the training reward (mean +- std over
    samples) and the held-out reward (rows with eval_reward), and beside it the held-out fidelity (eval_psnr per
    camera; max_drop: the fidelity guard's floor below step 0), so a reward gained by forgetting the world shows."""
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    grpo_run = any("reward_mean" in r for r in history)
    fidelity = [r for r in history if r.get("eval_psnr") is not None]  # an RL run's held-out PSNR
    panels = 1 + grpo_run + bool(fidelity)
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4), squeeze=False)
    ax = axes[0][0]
    updates = [r for r in history if "loss" in r]  # an RL run's step-0 row holds only its held-out evaluation
    steps = [r["step"] for r in updates]
    loss = np.array([r["loss"] for r in updates], dtype=np.float64)
    if grpo_run:
        nft_run = any("old_decay" in r for r in updates)  # NFT's loss is a flow-matching loss, GRPO's a surrogate
        ax.plot(steps, loss, lw=0.8, label="NFT loss" if nft_run else "surrogate loss")
        ax.set_ylabel("NFT loss (read the reward)" if nft_run else "surrogate loss (~0 at ratio 1)")
    else:
        ax.plot(steps, loss, lw=0.6, alpha=0.5, label="train loss")
        n = min(20, len(loss))
        if n > 1:
            ax.plot(steps[n - 1:], np.convolve(loss, np.ones(n) / n, mode="valid"), lw=1.5, label=f"mean of {n}")
        ax.set_yscale("log")
        ax.set_ylabel("loss (log scale)")
    evals = [(r["step"], r["eval_loss"]) for r in history if r.get("eval_loss") is not None]
    if evals and not grpo_run:
        ax.plot(*zip(*evals), "o-", label="eval loss (held out)" if held_out else "eval loss (training clips, "
                "--holdout 0)")
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    below(ax) if grpo_run else ax.legend()
    if grpo_run:
        ax = axes[0][1]
        mean = np.array([r["reward_mean"] for r in updates])
        std = np.array([r.get("reward_std") or 0.0 for r in updates])
        ax.plot(steps, mean, label="reward mean (rollouts)")
        ax.fill_between(steps, mean - std, mean + std, alpha=0.2, label="+- std over samples")
        held = [(r["step"], r["eval_reward"]) for r in history if r.get("eval_reward") is not None]
        if held:
            ax.plot(*zip(*held), "o-", label="held-out reward (deterministic sampler)" if held_out else
                    "eval reward (training clips, --holdout 0)")
        ax.set_xlabel("update")
        ax.set_ylabel("reward")
        ax.grid(alpha=0.3)
        below(ax)  # inside, the legend of a rising reward covers its curves
    if fidelity:
        plot_fidelity(axes[0][-1], fidelity, max_drop, held_out)
    fig.tight_layout()
    fig.savefig(path + ".tmp.png", dpi=100, bbox_inches="tight")  # tight: no axis label or outside legend cut
    plt.close(fig)
    os.replace(path + ".tmp.png", path)


def below(ax):
    """The panel's legend under its axes, out of the curves' way."""
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)


def plot_fidelity(ax, rows, max_drop, held_out):
    """The held-out PSNR panel of loss.png: the mean over cameras, each camera, and the guard's floor."""
    steps = [r["step"] for r in rows]
    ax.plot(steps, [r["eval_psnr"] for r in rows], "o-", lw=1.5, label="mean over cameras")
    for key in sorted(k for k in rows[0] if k.startswith("eval_psnr_")):  # each camera's (rl.evaluate)
        ax.plot(steps, [r[key] for r in rows], lw=0.8, alpha=0.7, label=key[len("eval_psnr_"):])
    if max_drop and rows[0]["step"] == 0:
        ax.axhline(rows[0]["eval_psnr"] - max_drop, ls="--", color="red", lw=1, label=f"step 0 - {max_drop:g} dB")
    ax.set_xlabel("update")
    ax.set_ylabel("PSNR (dB), frames 1..")
    ax.set_title(("held-out fidelity" if held_out else "fidelity (training clips, --holdout 0)") + ": PSNR vs the "
                 "true clip", fontsize=10)
    ax.grid(alpha=0.3)
    below(ax)


# -----------------------------------------------------------------------------
# How a run stops: a signal finishes the step and saves; divergence stops it naming the cause


STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)  # a scheduler's stop, its warning, Ctrl-C


def stop_on_signals(say):
    """{"signal": None}, set by SIGTERM / SIGUSR1 / SIGINT (on_signal): the loop finishes its step, saves, exits 0."""
    stop = {"signal": None}
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, frame: on_signal(stop, signum, say))
    return stop


def on_signal(stop, signum, say):
    """A stop request, acted on after the step (then saved, exit 0); a second Ctrl-C aborts at once (cli.main: one
    line, exit 130), losing the steps since the last save."""
    if signum == signal.SIGINT and stop["signal"] == signal.SIGINT:
        raise KeyboardInterrupt
    if signum == signal.SIGINT:
        say("\ntrain: Ctrl-C: finishing this step, then saving and exiting 0 (Ctrl-C again: abort now, losing the "
            "steps since the last save)")
    stop["signal"] = signum


def detach_worker(worker_id):
    """DataLoader workers leave the run's process group, which Ctrl-C, `timeout` and `kill -- -PGID` signal whole: a
    stop for the run reaches train.py alone, which finishes the step, saves and shuts its workers down. (A worker
    killed mid-step would make the loader raise inside train.py's step instead: a 14B GRPO update was lost that
    way.) Not ignoring SIGTERM: torch and multiprocessing stop their workers with it. A scheduler that signals
    every process of the job (Slurm's cgroup) still reaches them: give it a grace period (--signal) or --workers 0."""
    os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def nonfinite_eval(result, path):
    """'' for a finite held-out evaluation, else the WARNING that the save line ends with."""
    bad = [k for k, v in result.items() if isinstance(v, float) and not math.isfinite(v)]
    return f"; WARNING: a NaN/Inf held-out {', '.join(bad)}: {path} is `latest`, but rotation keeps the newest " \
        "checkpoint with a finite evaluation (resume.rotate)" if bad else ""


def count_nonfinite(row, streak, cfg, objective, say=print):
    """Steps in a row with skipped (NaN/Inf) updates, ending at row's: each skipped step is said in one line (say),
    and a FloatingPointError, one line naming the step and the likely cause, ends the run when they reach
    --max-nonfinite (the row is logged first)."""
    if not row.get("nonfinite_steps"):
        return 0
    streak += 1
    cause = row.get("nonfinite") or f"NaN/Inf {objective.name.upper()} gradients ({objective.lr_flag} too high?)"
    if streak < cfg.max_nonfinite:
        say(f"step {row['step']}: skipped, no update (a NaN/Inf loss or gradient norm: {cause}); {streak} in a row, "
            f"the run stops at --max-nonfinite {cfg.max_nonfinite}")
    else:
        raise FloatingPointError(
            f"step {row['step']}: {streak} steps in a row with a NaN/Inf loss or gradient norm (--max-nonfinite "
            f"{cfg.max_nonfinite}), each skipped: {cause}. The weights are those before step {row['step'] - streak + 1}"
            f" and every checkpoint in {cfg.out} holds finite weights: resume from it with a lower learning rate, or "
            "fix the data")
    return streak


# -----------------------------------------------------------------------------
# The step sample.py and evaluate.py read: chosen and checked in one line each, before any model is built


def objective_settings(saved):
    """An RL run's own knobs in its saved settings (config.json: the dict under its objective's name, {"grpo": {...}}),
    None for an SFT run, whose knobs are the top-level ones."""
    own = saved.get(saved.get("objective", ""))
    return own if isinstance(own, dict) else None


def run_config(run_dir):
    """A run directory's config.json (train.py writes it whole, atomically, at every start); a damaged one is a
    ValueError naming it, with the command that restores it from the newest step's copy of the same settings."""
    path = os.path.join(run_dir, "config.json")
    try:
        with open(path) as f:
            return json.load(f)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        done = complete_checkpoints(run_dir)
        meta = os.path.join(done[-1][1], "meta.json") if done else None
        fix = (f"every save records the run's settings: restore it from the newest with `python -c \"import json; "
               f"json.dump(json.load(open({meta!r}))['extra']['config'], open({path!r}, 'w'), indent=1)\"`" if done
               else "no checkpoint holds a copy of it yet: restore it from a backup")
        raise ValueError(f"{path}: truncated or damaged ({type(e).__name__}: {e}): train.py writes it whole at each "
                         f"start, so it was cut or edited since; {fix}") from e


def no_checkpoint_yet(run_dir):
    """One line: a run directory holds no complete checkpoint yet, and when its run saves one (its config.json)."""
    run = run_config(run_dir) if os.path.isfile(os.path.join(run_dir, "config.json")) else {}
    every, steps = run.get("save_every"), run.get("steps")
    when = (f"saves every {every} step{'s' if every != 1 else ''} (--save-every) and at its end (step {steps})"
            if every else
            f"saves only at its end (step {steps}; --save-every 0) and when stopped by SIGTERM/SIGUSR1" if every == 0
            else "saves every --save-every steps and at its end")
    pending = sorted(n for n in os.listdir(run_dir) if n.endswith(".tmp") and STEP_RE.match(n[:-4]))
    return (f"{run_dir}: no complete checkpoint yet (a step_XXXXXXXX/ with .metadata and meta.json)"
            f"{f' ({pending[-1]}: a save in flight, or a killed one)' if pending else ''}: this "
            f"{run.get('objective', 'train.py')} run {when}; come back once it has saved one")


def step_settings(path):
    """The train.py settings a step directory recorded (its meta.json), {} for anything else (a file, a named init)."""
    if not (os.path.isfile(os.path.join(path, "meta.json")) and os.path.isfile(os.path.join(path, ".metadata"))):
        return {}
    extra = read_meta(path)["extra"]
    return extra["config"] if isinstance(extra, dict) and isinstance(extra.get("config"), dict) else {}


def missing_step(path, flag):
    """'' unless `path` names a step directory (RUN/step_N) that is not there; then one line with the run's complete
    steps to pass instead (or that the run has none, or is not there): `flag` is the flag that named it."""
    run, name = os.path.split(os.path.normpath(path))
    if os.path.exists(path) or not STEP_RE.match(name):
        return ""
    if not os.path.isdir(run or "."):
        return (f"{flag} {path}: no such step, and no run {run}/ here: train it first (`python train.py --out {run}`; "
                "relative paths are from the folder you run in)")
    steps = [os.path.join(run, os.path.basename(p)) for _, p in complete_checkpoints(run or ".")]
    return (f"{flag} {path}: no such step in {run}; " + (f"its complete steps: {', '.join(steps[-4:])}" if steps else
            "it holds no complete step yet (a run saves at --save-every and at its end)")
            + " (a run's --steps N saves step_<N, 8 digits>)")


def checked_step(path, flag):
    """The step directory sample.py / evaluate.py read for `path`: a run directory's newest complete checkpoint, or a
    step directory itself. Refused in one line: a run with none yet (said: when it saves), a step whose files are cut
    short (with the newest earlier step whose files are whole, to pass explicitly as `flag` + its path: an older step
    is never read in its place silently), a LoRA step whose base is gone."""
    absent = [n for n in (".metadata", "meta.json") if not os.path.isfile(os.path.join(path, n))]
    if absent and STEP_RE.match(os.path.basename(os.path.normpath(path))):
        raise CheckpointError(f"{path}: an incomplete step directory (no {' and no '.join(absent)}); pass its run "
                              "directory (its newest complete step) or a complete step")
    step = find_resume(path) if absent else path
    if step is None:
        raise CheckpointError(no_checkpoint_yet(path))
    short = cut_short(step)
    if short:
        run, name = os.path.split(os.path.normpath(step))
        n = int(STEP_RE.match(name).group(1)) if STEP_RE.match(name) else -1
        whole = [p for s, p in complete_checkpoints(run) if s < n and cut_short(p) is None]
        then = (f"the newest earlier step with whole files is {whole[-1]}: pass it explicitly: {flag}{whole[-1]}"
                if whole else "no earlier step of the run has whole files: restore the file from a copy")
        raise CheckpointError(f"{short}: step {n} of {run} is damaged (a copy or a full disk cut it short); {then} "
                              "(an older step is never read in its place silently)")
    lora_base(step)
    return step
