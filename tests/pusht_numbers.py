"""Re-runs the PushT numbers of docs/policyeval.md ("PushT"): the data, the tiny action net from each train seed (the
README's command, one thread, one run at a time), policyeval.py against gym-pusht's own simulator, and the judge's
agreement with the env's coverage on the simulator's frames. Prints one table and one JSON line.

    python tests/pusht_numbers.py                       # 60 episodes, seeds 0 1 2, 6000 steps, 32 tasks (~40 min)
    python tests/pusht_numbers.py --seeds 0 --steps 200 --episodes 8 --data-episodes 12 --work /tmp/pt   # a quick look

Runs already trained (WORK/runs/pusht-s<seed>/step_<steps>) are reused; the policies' plans are made once for all
seeds (one process).
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import policyeval  # noqa: E402
from tasks import pusht, pushtworld  # noqa: E402


def train(work, seed, steps, log, extra=(), name="pusht",
          flags=("--config", "tiny-action", "--data", "data/pusht_grid")):
    """The README's training command for one seed (one thread; `flags`: train.py's, another run's in
    tests/policy_pusht_numbers.py); (the run WORK/runs/NAME-s<seed>, its seconds, or 0 when the run was there)."""
    run = os.path.join(work, "runs", f"{name}-s{seed}")
    os.makedirs(os.path.dirname(run), exist_ok=True)
    if os.path.isdir(os.path.join(run, f"step_{steps:08d}")):
        return run, 0.0
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as f:
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *flags, "--out", run, "--seed",
                               str(seed), "--steps", str(steps), *extra],
                              cwd=work, stdout=f, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if proc.returncode:
        raise SystemExit(f"pusht_numbers: train.py seed {seed} failed ({proc.returncode}); see {log}")
    return run, time.perf_counter() - t0


def judge_agreement(episodes: int) -> dict:
    """Per policy over the evaluation's tasks (seed 0) in the simulator: the judge's max coverage against the env's
    own max of info["coverage"] at the same frames; per frame, |judge's coverage - env's|."""
    tasks = pusht.sample_tasks(episodes, 0)
    episode_errors, frame_errors = [], []
    for policy in pusht.POLICIES.values():
        run = pusht.run_in_simulator(policy, tasks)
        truth = run["coverage"][:, ::pusht.STRIDE]
        episode_errors.append(np.abs(run["success"].numpy() - truth[:, 1:].max(1)))
        frame_errors.append(np.abs(pusht.coverage(run["frames"]).numpy() - truth).ravel())
    episode, frame = np.concatenate(episode_errors), np.concatenate(frame_errors)
    return {"episode_mean": float(episode.mean()), "episode_max": float(episode.max()),
            "episode_within_005": float((episode <= 0.05).mean()), "frame_mean": float(frame.mean()),
            "frame_max": float(frame.max()), "frame_within_005": float((frame <= 0.05).mean())}


def report(args, rows, agreement, data_seconds):
    """The table: the data's coverage per behaviour family, each seed's agreement, the judge's."""
    with open(os.path.join(args.work, "data", "pusht_lerobot", "meta", "episodes.jsonl"), encoding="utf-8") as f:
        episodes = [json.loads(line) for line in f]
    families = {e["behaviour"]: [] for e in episodes}
    for e in episodes:
        families[e["behaviour"]].append(e["max_coverage"])
    print(f"data: {args.data_episodes} episodes in {data_seconds:.0f} s; mean max coverage "
          + ", ".join(f"{k} {np.mean(v):.2f} ({len(v)})" for k, v in families.items()))
    for r in rows:
        print(f"seed {r['seed']}: Spearman {r['spearman']:.3f}, Pearson {r['pearson']:.3f}, MMRV {r['mmrv']:.3f}, "
              f"mean |world - sim| max coverage {r['calibration']:.3f}, PSNR per chunk {r['psnr_per_chunk']}, "
              f"held-out loss {r['eval_loss']:.3f}, "
              f"train {r['train_seconds']:.0f} s")
        print("  world / sim: " + ", ".join(f"{k} {w:.2f} / {s:.2f}" for k, (w, s) in r["policies"].items()))
    print("judge vs env coverage (simulator frames): per episode mean {episode_mean:.3f}, max {episode_max:.3f}, "
          "{episode_within_005:.0%} within 0.05; per frame mean {frame_mean:.3f}, max {frame_max:.3f}, "
          "{frame_within_005:.0%} within 0.05".format(**agreement))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--episodes", type=int, default=32, help="policyeval's tasks")
    parser.add_argument("--data-episodes", type=int, default=60)
    parser.add_argument("--work", default=ROOT, help="folder holding data/ and runs/ (the repo's by default)")
    parser.add_argument("--workers", type=int, default=1, help="processes playing the data's episodes and the "
                        "policies' plans (the same numbers, any count)")
    parser.add_argument("--train-args", default="", help="more train.py flags (the GPU run's batch size, lr)")
    args = parser.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    t0 = time.perf_counter()
    pushtworld.generate(os.path.join(args.work, "data", "pusht"), args.data_episodes, workers=args.workers,
                        progress=lambda line: None)
    data_seconds, rows = time.perf_counter() - t0, []
    if args.workers > 1:  # policyeval's tasks (seed 0): their plans made in parallel, once for every seed
        pusht.prefetch(pusht.sample_tasks(args.episodes, 0), pusht.CHUNKS * pusht.STEPS, args.workers)
    for seed in args.seeds:
        log = os.path.join(args.work, "runs", f"pusht-s{seed}.log")
        run, seconds = train(args.work, seed, args.steps, log, args.train_args.split())
        out = os.path.join(args.work, "policyeval", f"pusht-s{seed}")
        policyeval.main([run, "--task", "tasks.pusht", "--episodes", str(args.episodes), "--out", out])
        with open(os.path.join(out, "result.json"), encoding="utf-8") as f:
            result = json.load(f)
        per = result["policies"]
        with open(os.path.join(run, "metrics.jsonl"), encoding="utf-8") as f:
            eval_loss = [json.loads(line)["eval_loss"] for line in f if '"eval_loss"' in line][-1]
        calibration = float(np.mean([abs(p["success_world"] - p["success_sim"]) for p in per.values()]))
        rows.append({"seed": seed, "train_seconds": seconds, "spearman": result["spearman"],
                     "pearson": result["pearson"], "mmrv": result["mmrv"], "calibration": calibration,
                     "psnr_per_chunk": [round(x, 1) for x in result["psnr_per_chunk"]], "eval_loss": eval_loss,
                     "policies": {k.split(":")[-1]: (round(p["success_world"], 3), round(p["success_sim"], 3))
                                  for k, p in per.items()}})
    agreement = judge_agreement(args.episodes)
    report(args, rows, agreement, data_seconds)
    print(json.dumps({"rows": rows, "judge": agreement, "data_seconds": data_seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
