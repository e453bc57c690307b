"""Every number docs/policyeval.md quotes, re-run and printed (issue 51), as tests/readme_numbers.py does for README.md.

    OMP_NUM_THREADS=1 python tests/policyeval_numbers.py --only sim                     # seconds: the simulator's table
    python tests/policyeval_numbers.py --only sweep --out runs/sweep --seeds 0,1,2      # the sweep, one core a run
    python tests/policyeval_numbers.py --only runs --out runs/numbers --seeds 0         # the README's two commands

Parts:
  sim    each policy's success in the simulator (tasks/square.py's and tests/outside_policies.py's; 32 tasks, seed 0,
         3 chunks), and how often the judge from frames agrees with the simulator's own state (square.state_success)
  runs   the README's `python train.py --config tiny-action --seed S` then `python policyeval.py` with every policy
         above, per seed, one after the other: Spearman, MMRV, calibration over all, per family
  sweep  tests/family_sweep.py (leave-one-family-out, trainings side by side, one core each): its summary
  ceiling  tests/motion_gain.py --ceiling: every policy in the simulator seen through the tiny codec (a perfect world
         model on it) against the simulator; motion_gain.py RUN measures a trained run (docs: "Why ... under-moved")
The docs quote what the last run printed, with the command and the machine.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT]


def sim_numbers():
    """{policy: success in the simulator}, and the judge's agreement with the simulator's own state."""
    from tasks import square
    from tests import outside_policies
    tasks = square.sample_tasks(32, seed=0)
    rates, agree = {}, []
    for policy in list(square.POLICIES.values()) + [getattr(outside_policies, n) for n in
                                                    ("creep", "zigzag", "wander", "dawdle")]:
        run = square.run_in_simulator(policy, tasks, chunks=3, seed=0)
        rates[f"{policy.family}/{policy.__name__}"] = round(run["success"][-1].mean().item(), 3)
        world = type("World", (), {"path": run["positions"]})
        agree.append(square.state_success(world, tasks) == run["success"][-1].numpy())
    return {"success_sim": rates, "judge_vs_state": round(float(np.mean(agree)), 4)}


def runs_numbers(out, seeds, train_flags=()):
    """The README's two commands per seed, every policy evaluated: policyeval's summary, compacted."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import family_sweep
    rows = {}
    for seed in seeds:
        run = os.path.join(os.path.abspath(out), f"act_s{seed}")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--config", "tiny-action", "--seed", str(seed),
                        "--out", run, *train_flags],
                       cwd=out, check=True, env=env, stdout=subprocess.DEVNULL)
        subprocess.run([sys.executable, os.path.join(ROOT, "policyeval.py"), run, "--policies",
                        family_sweep.policies(), "--videos", "0", "--out", os.path.join(run, "policyeval")],
                       cwd=ROOT, check=True, env=env, stdout=subprocess.DEVNULL)
        with open(os.path.join(run, "policyeval", "result.json")) as f:
            result = json.load(f)
        rows[seed] = {k: result[k] for k in ("spearman", "mmrv", "calibration", "families", "judge_vs_state")}
        rows[seed]["go_to_target"] = result["policies"]["tasks.square:go_to_target"]
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="sim", help="sim, runs, sweep, ceiling (comma-separated)")
    p.add_argument("--config", default="tiny-action", help="sweep: train.py --config (tiny-action, tiny-action-wide)")
    p.add_argument("--out", default="runs/policyeval_numbers")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--train-flags", default="", help="runs: extra train.py flags (docs' 12000-step row: --steps 12000)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    parts = args.only.split(",")
    if set(parts) - {"sim", "runs", "sweep", "ceiling"}:
        raise SystemExit(f"--only {args.only}: parts are sim, runs, sweep, ceiling")
    if "sim" in parts:
        print(json.dumps({"sim": sim_numbers()}), flush=True)
    if "runs" in parts:
        os.makedirs(args.out, exist_ok=True)
        print(json.dumps({"runs": runs_numbers(args.out, [int(s) for s in args.seeds.split(",")],
                                                         args.train_flags.split())}), flush=True)
    if "sweep" in parts:
        subprocess.run([sys.executable, os.path.join(ROOT, "tests", "family_sweep.py"), "--out", args.out, "--seeds",
                        args.seeds, "--config", args.config, "--train-flags", args.train_flags], check=True)
    if "ceiling" in parts:
        from tests import motion_gain
        rows, agree = motion_gain.ceiling()
        print(json.dumps({"ceiling": agree, "policies": rows}), flush=True)


if __name__ == "__main__":
    main()
