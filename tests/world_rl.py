"""Does RL on the world model's own fidelity and action following beat more SFT for the same compute? Issue 46's
experiment on the tiny-action world, through the real entry points.

    python tests/world_rl.py --base runs/act/step_00006000 --seed 0 --out runs/world_rl/s0 [--updates 30]

From a tiny-action SFT checkpoint, three arms, each scored by `evaluate.py --chunks 3 --draws 2` on the run's 4
held-out episodes (held-out PSNR, action_gap_db, PSNR per chained chunk):
- rl: NFT (the tiny RL preset) with the world-model rewards --reward REWARD (default: fidelity to the true
  continuation, clips.fidelity:truth_psnr, and the square's position against the truth's, tasks.square:follows_actions);
- control: the same run with every reward weight 0 (no update trains: the base, scored the same way);
- sft: SFT continued from the base (the preset's lr schedule) for the rl arm's wall-clock of updates on this CPU.
Prints one JSON line: every arm's metrics, the rl arm's seconds, the sft arm's steps.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORLD = "clips.fidelity:truth_psnr,tasks.square:follows_actions=10"


def call(script, argv, log):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, os.path.join(ROOT, script), *argv], stdout=f, stderr=subprocess.STDOUT,
                              env=env)
    if proc.returncode:
        raise SystemExit(f"{script} {' '.join(argv)} failed ({proc.returncode}): see {log}")
    with open(log) as f:
        return f.read()


def scored(run, out, name):
    """evaluate.py's metrics of the run's newest checkpoint (4 held-out episodes x 2 draws, 3 chained chunks)."""
    text = call("evaluate.py", [run, "--chunks", "3", "--draws", "2", "--plot", os.path.join(out, name + ".png")],
                os.path.join(out, name + ".eval.log"))
    metrics = json.loads(text.strip().splitlines()[-1])["runs"][0]["metrics"]
    return {k: v for k, v in metrics.items() if k in ("psnr", "ssim", "action_gap_db") or k.startswith("chunk")}


def update_seconds(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return sum(json.loads(line).get("s_per_step") or 0.0 for line in f)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("--reward", default=WORLD)
    p.add_argument("--updates", type=int, default=30)
    p.add_argument("--extra", default="", help="more train.py flags for the rl and control arms")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rl = ["--config", "tiny-action", "--init", a.base, "--objective", "nft", "--lora", "4", "--seed", str(a.seed),
          "--steps", str(a.updates), "--sample-every", "0", *a.extra.split()]
    control_reward = ",".join(term.split("=")[0] + "=0" for term in a.reward.split(","))
    result = {"base": a.base, "seed": a.seed, "reward": a.reward, "updates": a.updates}
    for name, reward in (("rl", a.reward), ("control", control_reward)):
        run = os.path.join(a.out, name)
        call("train.py", rl + ["--reward", reward, "--out", run], os.path.join(a.out, name + ".log"))
        result[name] = scored(run, a.out, name)
        result[name + "_seconds"] = update_seconds(run)
    probe = os.path.join(a.out, "sft_probe")  # the SFT step's time on this CPU now
    call("train.py", ["--config", "tiny-action", "--init", a.base, "--steps", "50", "--sample-every", "0",
                      "--seed", str(a.seed), "--out", probe], os.path.join(a.out, "sft_probe.log"))
    steps = max(1, round(result["rl_seconds"] / (update_seconds(probe) / 50)))
    sft = os.path.join(a.out, "sft")
    call("train.py", ["--config", "tiny-action", "--init", a.base, "--steps", str(steps), "--sample-every", "0",
                      "--seed", str(a.seed), "--out", sft], os.path.join(a.out, "sft.log"))
    result.update(sft=scored(sft, a.out, "sft"), sft_steps=steps, sft_seconds=update_seconds(sft))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
