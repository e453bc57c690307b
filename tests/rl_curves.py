"""Does RL learn on the tiny default? Paired runs through the real entry point (docs/benchmarks-log.md, "RL learns").

    python tests/rl_curves.py --seeds 0,1,2 --updates 30 --out runs/rl_curves      # ~30 min on 2 CPU cores

For each seed and objective (GRPO, NFT), from the tiny SFT checkpoint (trained first with `python train.py` into
OUT/base if OUT/base has none), with everything else the tiny RL preset's:
- learned: the preset's reward (`reward:wrist_brightness`, the wrist view's brightness);
- control: the same reward with weight 0 (every group ties, no update trains: the policy stays the base);
- noise: a reward with nothing to learn (`reward_plugins:noise`, from each sample's bytes) as the training signal,
  the brightness scored with weight 0 beside it.
Every run logs the held-out brightness (eval_reward_wrist_brightness: the deterministic sampler on the held-out
episodes with fixed noise) every 5 updates. Printed: that curve per arm, and the learned run's final margin over its
control and over its noise arm in units of the control's held-out spread (eval_sd_wrist_brightness: the sd of the brightness over the
held-out clips x noise draws the evaluation scores, eval_samples of them; the control is the base, so it is the
base's), and, labelled beside it, in units of the within-group sd (the spread of the brightness among one group's
samples at update 1). One JSON line at the end holds every number.
"""
import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BRIGHTNESS = "eval_reward_wrist_brightness"
ARMS = {"learned": "reward:wrist_brightness", "control": "reward:wrist_brightness=0",
        "noise": "reward:wrist_brightness=0,reward_plugins:noise"}


def run(argv, log):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.path.join(ROOT, "tests"))  # reward_plugins
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *argv], cwd=ROOT, stdout=f,
                              stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"rl_curves: {' '.join(argv)} failed ({proc.returncode}); see {log}")


def curve(out):
    """({step: held-out brightness}, the within-group sd at update 1, (held-out sd, samples) at step 0)."""
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    held = {r["step"]: r[BRIGHTNESS] for r in rows if BRIGHTNESS in r}
    first = next(r for r in rows if r.get("step") == 1)
    start = next(r for r in rows if r.get("step") == 0)
    return held, first.get("reward_group_std"), (start.get("eval_sd_wrist_brightness"), start.get("eval_samples"))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("--updates", type=int, default=30, help="updates per run")
    parser.add_argument("--objectives", default="grpo,nft", help="comma-separated: grpo, nft")
    parser.add_argument("--out", default="runs/rl_curves", help="a folder for the runs")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    objectives = args.objectives.split(",")
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, "base")
    if not os.path.isfile(os.path.join(base, "latest")):
        run(["--out", base], base + ".log")
    with open(os.path.join(base, "latest")) as f:
        init = os.path.join(base, f.read().strip())
    jobs = [(o, s, arm) for o in objectives for s in seeds for arm in ARMS]

    def launch(job):
        objective, seed, arm = job
        out = os.path.join(args.out, f"{objective}-s{seed}-{arm}")
        if not os.path.isfile(os.path.join(out, "latest")):
            run(["--objective", objective, "--init", init, "--lora", "4", "--seed", str(seed), "--reward", ARMS[arm],
                 "--steps", str(args.updates), "--save-every", str(args.updates), "--sample-every", "0",
                 "--out", out], out + ".log")
        return job, curve(out)
    with ThreadPoolExecutor(args.jobs) as pool:
        results = dict(pool.map(launch, jobs))
    summary = []
    for objective in objectives:
        for seed in seeds:
            (learned, sd, _), (control, _, (spread, n)), (noise, _, _) = (results[(objective, seed, a)] for a in ARMS)
            steps = sorted(learned)
            print(f"{objective} seed {seed}: held-out wrist brightness at updates {steps}")
            for arm, held in (("learned", learned), ("control", control), ("noise", noise)):
                print(f"  {arm:8s} " + " ".join(f"{held[s]:.4f}" for s in steps))
            last = steps[-1]
            margin = {"control": (learned[last] - control[last]) / sd, "noise": (learned[last] - noise[last]) / sd}
            held_margin = {"control": (learned[last] - control[last]) / spread,
                           "noise": (learned[last] - noise[last]) / spread} if spread else None
            if held_margin:
                print(f"  final margin, in the control's held-out sd ({spread:.4f} over {n} held-out samples): over "
                      f"control {held_margin['control']:+.2f}, over noise {held_margin['noise']:+.2f}")
            print(f"  (within-group units, sd {sd:.4f} of one group at update 1: over control "
                  f"{margin['control']:+.1f}, over noise {margin['noise']:+.1f}); control == base at every "
                  f"evaluation: {all(control[s] == control[0] for s in steps)}")
            summary.append({"objective": objective, "seed": seed, "within_group_sd": sd, "steps": steps,
                            **{arm: [h[s] for s in steps] for arm, h in (("learned", learned), ("control", control),
                                                                          ("noise", noise))},
                            "margin_within_group_sd": margin, "margin_held_out_sd": held_margin,
                            "control_held_out_sd": spread, "held_out_samples": n})
    print(json.dumps({"rl_curves": summary}))


if __name__ == "__main__":
    main()
