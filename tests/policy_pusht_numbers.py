"""Re-runs the PushT policy numbers of docs/policy.md ("PushT"): the data (tasks/pushtworld.py, with each episode's
success flag), the tiny policy from each train seed (recipes/pusht_policy.py, one thread, one run at a time), then
each policy in closed loop in gym-pusht's own simulator (tasks/pusht.run_in_simulator) from the same start states,
with 1 and N candidate chunks a step (agent.Agent: best-of-N by its own value), beside tasks/pusht's scripted
policies over the same horizon. Score: the mean over episodes of the env's max info["coverage"] (and the judge's
reading of the frames). Prints one table and one JSON line.

    python tests/policy_pusht_numbers.py                    # 60 episodes, seeds 0 1 2, the recipe's steps, 32 tasks
    python tests/policy_pusht_numbers.py --seeds 0 --steps 50 --episodes 4 --work /tmp/pp   # a quick look

A variant (docs/policy.md "Levers"), by its own --name: --layout one (the camera over the whole frame), other data
(--data-name X --data-episodes N --data-families expert), more train.py flags (--train-flags='--policy-imitate all'),
best-of-N's candidates shifted (--explore SD), --no-references (skip the scripted policies). Runs already trained
(WORK/runs/NAME-s<seed>/step_<steps>) are reused, so an --explore look at a trained variant only evaluates.
"""
import argparse
import json
import os
import shlex
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import agent  # noqa: E402
import pusht_numbers  # noqa: E402  (tests/: this script's own folder)
from base.cli import read_recipe  # noqa: E402
from tasks import pusht, pushtworld  # noqa: E402

RECIPE = os.path.join(ROOT, "recipes", "pusht_policy.py")
HORIZON = pusht.CHUNKS * pusht.STEPS  # 96 actions: the scripted policies' 3 chunks of 32 (docs/policyeval.md)
REFERENCES = ("random_play", "expert_60", "expert_25", "expert")  # tasks/pusht.POLICIES, least to most skilled


def closed_loop(policy, tasks, steps, layout="grid"):
    """The policy in gym-pusht for HORIZON actions in chunks of `steps`, seeing frames of `layout` (the policy's
    data folder's: pusht.LAYOUTS): (env max coverage [B], judge's [B])."""
    out = pusht.run_in_simulator(policy, tasks, chunks=HORIZON // steps, steps=steps, layout=layout)
    return out["coverage"][:, 1:].max(1), out["success"].numpy()


def evaluate(run, tasks, best_of, explore=0.0):
    """{best_of: (env, judge) mean max coverage, seconds, mean value spread of the candidates}."""
    row = {}
    for n in (1, best_of):
        policy = agent.Agent(run, n, device="cpu", explore=explore if n > 1 else 0.0)
        t0 = time.perf_counter()
        env, judged = closed_loop(policy, tasks, policy.chunk, policy.frame_layout)
        row[n] = {"coverage": float(env.mean()), "judge": float(judged.mean()), "seconds": time.perf_counter() - t0,
                  "per_episode": [round(float(c), 3) for c in env]}
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=read_recipe(RECIPE)["steps"])
    parser.add_argument("--episodes", type=int, default=32, help="start states (tasks/pusht.sample_tasks, seed 0)")
    parser.add_argument("--best-of", type=int, default=4, help="candidate chunks a step, against 1")
    parser.add_argument("--explore", type=float, default=0.0, help="best-of-N's candidates 1..N-1 shifted by an "
                        "offset of this sd (agent.Agent's explore, POLICY_EXPLORE)")
    parser.add_argument("--data-episodes", type=int, default=60)
    parser.add_argument("--data-families", default=",".join(pushtworld.BEHAVIOURS),
                        help="the data's behaviour families in turn (pushtworld.BEHAVIOURS), comma-separated")
    parser.add_argument("--data-name", default="pusht", help="the data: WORK/data/NAME_lerobot, stitched as NAME_grid "
                        "and NAME_one (another --data-episodes or --data-families: give it its own name)")
    parser.add_argument("--layout", choices=pusht.LAYOUTS, default="grid", help="the frames the policy trains on "
                        "and sees: the grid (NAME_grid) or the camera alone filling them (NAME_one, stitch.py --layout one)")
    parser.add_argument("--work", default=ROOT, help="folder holding data/ and runs/ (the repo's by default)")
    parser.add_argument("--name", default="pusht-policy", help="the runs' name: WORK/runs/NAME-s<seed>")
    parser.add_argument("--train-flags", default="", help="more train.py flags after the recipe's, one string "
                        "(--train-flags='--policy-chunk 16'; a variant: give it its own --name)")
    parser.add_argument("--no-references", action="store_true", help="skip the scripted policies (a variant's look)")
    args = parser.parse_args(argv)
    if args.best_of < 2 or args.explore < 0:
        parser.error(f"--best-of {args.best_of}, --explore {args.explore}: >= 2 (it is compared with 1) and >= 0")
    families = tuple(args.data_families.split(","))
    if not set(families) <= set(pushtworld.BEHAVIOURS):
        parser.error(f"--data-families {args.data_families}: a comma list of {', '.join(pushtworld.BEHAVIOURS)}")
    os.makedirs(args.work, exist_ok=True)
    os.chdir(args.work)  # the runs record data/pusht_grid relative to it
    pushtworld.generate(os.path.join("data", args.data_name), args.data_episodes, families=families,
                        progress=lambda line: None)
    tasks = pusht.sample_tasks(args.episodes, 0)
    t0 = time.perf_counter()
    references = {name: float(pusht.run_in_simulator(pusht.POLICIES[name], tasks)["coverage"][:, 1:].max(1).mean())
                  for name in (() if args.no_references else REFERENCES)}
    print(f"scripted policies, {args.episodes} starts, {HORIZON} actions ({time.perf_counter() - t0:.0f} s): "
          + ", ".join(f"{k} {v:.3f}" for k, v in references.items()), flush=True)
    rows = []
    for seed in args.seeds:
        run, seconds = pusht_numbers.train(args.work, seed, args.steps, os.path.join(args.work, "runs",
                                           f"{args.name}-s{seed}.log"), ["--save-every", str(args.steps), "--data",
                                                                         f"data/{args.data_name}_{args.layout}",
                                                                         *shlex.split(args.train_flags)],
                                           args.name, ("--objective", "policy", "--recipe", RECIPE))
        with open(os.path.join(run, "metrics.jsonl"), encoding="utf-8") as f:
            last = [json.loads(line) for line in f if '"eval_action_l1"' in line][-1]
        result = evaluate(run, tasks, args.best_of, args.explore)
        rows.append({"seed": seed, "train_seconds": round(seconds), **{f"n{n}": r for n, r in result.items()},
                     **{k: round(last[k], 3) for k in ("eval_action_l1", "eval_action_l1_zero", "eval_value_error",
                                                       "eval_wm_value_error", "eval_psnr")}})
        print(f"seed {seed}: max coverage N=1 {result[1]['coverage']:.3f} (judge {result[1]['judge']:.3f}), "
              f"N={args.best_of} {result[args.best_of]['coverage']:.3f} (judge {result[args.best_of]['judge']:.3f}); "
              f"held-out action L1 {last['eval_action_l1']:.3f} (zero {last['eval_action_l1_zero']:.3f}), value "
              f"error {last['eval_value_error']:.3f} (world-model samples {last['eval_wm_value_error']:.3f}); train {seconds:.0f} s, closed loop "
              f"{result[1]['seconds']:.0f} / {result[args.best_of]['seconds']:.0f} s", flush=True)
    mean = {n: float(np.mean([r[f"n{n}"]["coverage"] for r in rows])) for n in (1, args.best_of)}
    print(f"mean over seeds: N=1 {mean[1]:.3f}, N={args.best_of} {mean[args.best_of]:.3f} (best-of-N gain "
          f"{mean[args.best_of] - mean[1]:+.3f}); target >= 0.4 and +0.05")
    print(json.dumps({"references": references, "rows": rows, "mean": mean, "episodes": args.episodes,
                      "horizon": HORIZON}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
