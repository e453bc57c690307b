"""Leave-one-family-out on the tiny action world (issue 51): the README's `python train.py --config tiny-action`, run
on the full mixture of behaviour families and on the mixture without each family in turn, train seeds in parallel
(one CPU core each: OMP_NUM_THREADS=1, `taskset`), then `python policyeval.py` on every run with the task's policies
and the plug-ins of tests/outside_policies.py; a compact JSON summary per run and over the seeds.

    python tests/family_sweep.py --out runs/sweep                          # 5 data variants x 3 seeds = 15 runs
    python tests/family_sweep.py --out runs/sweep --without none,goal --seeds 0 --jobs 2   # a smaller one
    python tests/family_sweep.py --out runs/sweep --stage summary          # re-read what the runs wrote
    python tests/family_sweep.py --out runs/wide --config tiny-action-wide --without none,goal --seeds 0 --episodes 16

Variants: "none" (the full mixture, the README's data) and each family name of lerobot.BEHAVIOURS left out of the
data (make_tiny_dataset(without=...)). For a variant without family F, "held_out" reports the ranking and calibration
of tasks/square.py's policies of family F (square.FAMILY_DATA maps policy families to data families), which that
world model never saw; "outside" those of tests/outside_policies.py; "reference" the 7 reference policies; "all" every
policy; "families" each family's Spearman (in a "none" run: the same family seen in training, the gap's baseline). Writes OUT/summary.json, and $OUT/family_sweep.json too when $OUT names a folder (the device's).
Stages (--stage): data, train, eval, summary, or all; a finished step (its checkpoint or result.json) is not redone.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
OUTSIDE = ("creep", "zigzag", "wander", "dawdle")  # tests/outside_policies.py's plug-ins


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for the data, runs and evaluations")
    p.add_argument("--without", default="none,goal,pause,noisy,switch", help="variants: none or a family each")
    p.add_argument("--seeds", default="0,1,2", help="train seeds")
    p.add_argument("--jobs", type=int, default=os.cpu_count(), help="processes at a time, one core each")
    p.add_argument("--stage", default="all", choices=("all", "data", "train", "eval", "summary"))
    p.add_argument("--config", default="tiny-action", help="train.py --config: tiny-action (the README's) or "
                   "tiny-action-wide")
    p.add_argument("--train-flags", default="", help="extra train.py flags, e.g. '--steps 8000 --lr 2e-3'")
    p.add_argument("--episodes", type=int, default=32, help="policyeval --episodes")
    p.add_argument("--data-repeat", type=int, default=1, help="the action episodes this many times over (each its "
                   "own commands): make_tiny_dataset(repeat=N)")
    p.add_argument("--eval-flags", default="", help="extra policyeval.py flags, e.g. '--ema' (a run of --train-flags "
                   "'--ema 0.1': its EMA weights)")
    args = p.parse_args(argv)
    from base.lerobot import check_behaviours
    args.variants = args.without.split(",")
    for v in args.variants:
        if v != "none":
            check_behaviours((v,))  # an unknown family: one line naming the families
    args.seeds = [int(s) for s in args.seeds.split(",")]
    if args.data_repeat < 1:
        raise SystemExit(f"family_sweep: --data-repeat {args.data_repeat}: >= 1")
    return args


def launch(jobs, cmds):
    """Run (name, argv, log) commands, `jobs` at a time, each pinned to its own core with one thread and no GPU (the
    README's CPU runs, also on a GPU host); a failure names its log."""
    cores = sorted(os.sched_getaffinity(0))
    free = list(cores[:jobs])

    def one(cmd):
        name, argv, log = cmd
        core = free.pop()
        try:
            t0 = time.perf_counter()
            with open(log, "w") as f:
                rc = subprocess.run(["taskset", "-c", str(core), sys.executable, *argv], cwd=ROOT, stdout=f,
                                    stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1",
                                                                       CUDA_VISIBLE_DEVICES="")).returncode
            print(f"family_sweep: {name} rc {rc} in {time.perf_counter() - t0:.0f} s (core {core})", flush=True)
            return name, rc, log
        finally:
            free.append(core)

    with ThreadPoolExecutor(min(jobs, len(cores))) as pool:
        failed = [(n, log) for n, rc, log in pool.map(one, cmds) if rc != 0]
    if failed:
        raise SystemExit(f"family_sweep: {len(failed)} failed: " + ", ".join(f"{n} (see {log})" for n, log in failed))


def data_dir(args, variant):
    return os.path.join(os.path.abspath(args.out), f"data_{variant}", "tiny_action_grid")


def run_dir(args, variant, seed):
    return os.path.join(os.path.abspath(args.out), "runs", f"{variant}_s{seed}")


def eval_dir(args, variant, seed):
    """RUN/policyeval, or RUN/policyeval_ema etc. under --eval-flags: one run's evaluations side by side."""
    flags = "".join(c if c.isalnum() else "_" for c in args.eval_flags.replace("-", " ").strip())
    return os.path.join(run_dir(args, variant, seed), "policyeval" + (f"_{flags}" if flags else ""))


def policies():
    from tasks import square
    return ",".join([f"tasks.square:{n}" for n in square.POLICIES] + [f"tests.outside_policies:{n}" for n in OUTSIDE])


def stages(args):
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    log = lambda name: os.path.join(os.path.abspath(args.out), "logs", name + ".log")  # noqa: E731
    if args.stage in ("all", "data"):
        build = ("from clips import tiny; import sys; tiny.make_tiny_dataset(sys.argv[1], actions=True, "
                 "repeat=int(sys.argv[2]), without=tuple(w for w in sys.argv[3:] if w != 'none'))")
        launch(args.jobs, [(f"data {v}", ["-c", build, data_dir(args, v), str(args.data_repeat), v], log(f"data_{v}"))
                           for v in args.variants])
    if args.stage in ("all", "train"):
        launch(args.jobs, [(f"train {v} s{s}", ["train.py", "--config", args.config, "--data", data_dir(args, v),
                                                 "--seed", str(s), "--out", run_dir(args, v, s),
                                                 *args.train_flags.split()], log(f"train_{v}_s{s}"))
                           for v in args.variants for s in args.seeds])
    if args.stage in ("all", "eval"):
        todo = [(v, s) for v in args.variants for s in args.seeds
                if not os.path.exists(os.path.join(eval_dir(args, v, s), "result.json"))]
        launch(args.jobs, [(f"eval {v} s{s}", ["policyeval.py", run_dir(args, v, s), "--policies", policies(),
                                                "--episodes", str(args.episodes), "--videos", "0", "--out",
                                                eval_dir(args, v, s),
                                                *args.eval_flags.split()], log(f"eval_{v}_s{s}"))
                           for v, s in todo])


def score(result, names):
    """Spearman, MMRV and calibration of these policies (policyeval's own arithmetic)."""
    import policyeval
    world = [result["policies"][n]["success_world"] for n in names]
    sim = [result["policies"][n]["success_sim"] for n in names]
    return {k: round(v, 3) for k, v in policyeval.ranking(world, sim).items()}


def summary(args):
    from tasks import square
    rows, names = [], None
    for v in args.variants:
        for s in args.seeds:
            with open(os.path.join(eval_dir(args, v, s), "result.json")) as f:
                result = json.load(f)
            names = list(result["policies"])
            family = {n: result["policies"][n]["family"] for n in names}
            held = [n for n in names if square.FAMILY_DATA.get(family[n]) == v]
            row = {"variant": v, "seed": s, "all": score(result, names),
                   "reference": score(result, [n for n in names if family[n] == "reference"]),
                   "outside": score(result, [n for n in names if family[n] == "outside"]),
                   "judge_vs_state": result["judge_vs_state"],
                   "go_to_target": [round(result["policies"]["tasks.square:go_to_target"][k], 3)
                                    for k in ("success_world", "success_sim")]}
            if held:
                row["held_out"] = score(result, held)
            row["families"] = {f: score(result, [n for n in names if family[n] == f])["spearman"]
                               for f in dict.fromkeys(family.values()) if list(family.values()).count(f) > 1}
            rows.append(row)
            print(json.dumps(row), flush=True)
    means = {}
    for key in ("all", "reference", "outside", "held_out"):
        for metric in ("spearman", "mmrv", "calibration"):
            values = [r[key][metric] for r in rows if key in r]
            means[f"{key}/{metric}"] = [round(float(np.mean(values)), 3), round(float(np.min(values)), 3),
                                        round(float(np.max(values)), 3)] if values else None
    out = {"config": args.config, "variants": args.variants, "seeds": args.seeds, "train_flags": args.train_flags,
           "runs": rows, "mean_min_max": means}
    for folder in (args.out, os.environ.get("OUT")):
        if folder and os.path.isdir(folder):
            with open(os.path.join(folder, "family_sweep.json"), "w") as f:
                json.dump(out, f, indent=1)
    print(json.dumps(means), flush=True)
    return out


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    t0 = time.perf_counter()
    stages(args)
    if args.stage in ("all", "eval", "summary"):
        summary(args)
    print(f"family_sweep: {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
