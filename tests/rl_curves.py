"""Does RL learn on the tiny default, and what does it cost the world? Paired runs through the real entry point.

    python tests/rl_curves.py --seeds 0,1,2 --out runs/rl_curves                     # the shipped defaults, ~15 min
    python tests/rl_curves.py --rewards red --settings nft.data_coef=0,0.3,1 --objectives nft --jobs 16 --out S

From the tiny SFT checkpoint (trained first with `python train.py` into OUT/base if OUT/base has none), every arm is
one train.py run with the tiny RL preset (docs/rl.md) and one of --rewards (reward.py's wrist brightness, or
tests/reward_plugins.py's red top-left view and motion energy), for each objective, seed and --settings value.

The paired control of a run is its own step-0 held-out evaluation: a control (the same reward with weight 0: every
group ties, no update trains) keeps the base's weights, and the evaluation's clips and noise depend on the seed only,
so the control's held-out numbers at every step are the learned run's step-0 numbers bit for bit (tests/test_rl.py
checks this; `--controls` runs them anyway and says whether they match). Printed per arm, over the seeds:
- gain: (held-out reward at the last update - the control's) / the control's held-out spread (eval_sd: the sd over
  the held-out clips x noise draws, eval_samples of them); beside it, labelled, the same difference in units of the
  within-group sd at update 1 (the spread among one group's rollouts: what BENCHMARKS.md once reported);
- dPSNR / dSSIM: held-out PSNR (dB) and SSIM at the last update minus the control's (fidelity to the true clip);
- s/update: the mean seconds of an update.
One JSON line at the end holds every number.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REWARDS = {"brightness": "reward:wrist_brightness", "red": "reward_plugins:red_top_left",
           "motion": "reward_plugins:motion_energy"}


def run(argv, log):
    # a port of its own: on a GPU each run is a 1-rank NCCL group, and runs side by side must not share one
    port = str(20000 + int.from_bytes(log.encode()[-8:], "little") % 20000)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.path.join(ROOT, "tests"), MASTER_PORT=port)
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *argv], cwd=ROOT, stdout=f,
                              stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"rl_curves: {' '.join(argv)} failed ({proc.returncode}); see {log}")


def summary(out):
    """One run's numbers: its control (step 0) and last evaluation, the within-group sd at update 1, s/update."""
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    evals = [r for r in rows if "eval_reward" in r]
    start, last = evals[0], evals[-1]
    assert start["step"] == 0, f"{out}: no step-0 evaluation"
    first = next(r for r in rows if r.get("step") == 1)
    updates = [r["s_per_step"] for r in rows if "s_per_step" in r]
    return {"step": last["step"], "reward": last["eval_reward"], "control": start["eval_reward"],
            "control_sd": start["eval_sd"], "samples": start["eval_samples"],
            "gain_sd": (last["eval_reward"] - start["eval_reward"]) / start["eval_sd"],
            "gain_group_sd": (last["eval_reward"] - start["eval_reward"]) / first["reward_group_std"]
            if first.get("reward_group_std") else None,
            "dpsnr": last["eval_psnr"] - start["eval_psnr"], "dssim": last["eval_ssim"] - start["eval_ssim"],
            "dpsnr_cameras": {c: last[f"eval_psnr_{c}"] - start[f"eval_psnr_{c}"] for c in ("ext_1", "ext_2", "wrist")},
            "curve": {r["step"]: r["eval_reward"] for r in evals}, "psnr": {r["step"]: r["eval_psnr"] for r in evals},
            "s_per_update": statistics.mean(updates) if updates else None}


def arms(args):
    """[(name, train.py flags)] of every run asked for; --settings "grpo.kl_coef=0,0.1;nft.data_coef=0,1": each
    objective's runs sweep its own flag (an objective without one runs once per reward and seed)."""
    settings = dict(s.split("=", 1) for s in args.settings.split(";") if s)
    out = []
    for objective in args.objectives.split(","):
        key = next((k for k in settings if k.startswith(objective + ".")), None)
        values = settings[key].split(",") if key else [None]
        for reward in args.rewards.split(","):
            for value in values:
                for seed in args.seeds.split(","):
                    setting = [] if key is None else [f"--{key.replace('.', '-').replace('_', '-')}", value]
                    name = f"{objective}-{reward}" + (f"-{key.split('.')[1]}{value}" if key else "") + f"-s{seed}"
                    out.append((name, ["--objective", objective, "--lora", "4", "--reward", REWARDS[reward],
                                       "--seed", seed, "--steps", str(args.updates), "--eval-every", "5", *setting,
                                       *args.extra.split()]))
                    if args.controls and value == values[0]:
                        control = ["--reward", REWARDS[reward] + "=0"]
                        out.append((name.replace(f"-s{seed}", f"-control-s{seed}"), out[-1][1] + control))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("--updates", type=int, default=30, help="updates per run")
    parser.add_argument("--objectives", default="grpo,nft", help="comma-separated: grpo, nft")
    parser.add_argument("--rewards", default="brightness,red", help=f"comma-separated: {', '.join(REWARDS)}")
    parser.add_argument("--settings", default="", help="a flag swept per objective, OBJECTIVE.FIELD=V1,V2, ';' between "
                        "objectives (e.g. 'nft.data_coef=0,1;grpo.kl_coef=0,0.1')")
    parser.add_argument("--extra", default="", help="more train.py flags for every run (e.g. '--device cpu')")
    parser.add_argument("--controls", action="store_true", help="also run each weight-0 control (a check)")
    parser.add_argument("--out", default="runs/rl_curves", help="a folder for the runs")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    args = parser.parse_args()
    unknown = set(args.rewards.split(",")) - set(REWARDS)
    if unknown:
        raise SystemExit(f"rl_curves: --rewards {sorted(unknown)}: choose from {', '.join(REWARDS)}")
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, "base")
    if not os.path.isdir(os.path.join(base, "step_00001000")):
        run(["--out", base, *args.extra.split()], os.path.join(args.out, "base.log"))
    todo = [(name, [*flags, "--init", os.path.join(base, "step_00001000"), "--out", os.path.join(args.out, name)])
            for name, flags in arms(args)]
    todo = [(n, f) for n, f in todo if not os.path.isfile(os.path.join(args.out, n, "metrics.jsonl"))
            or not os.path.isdir(os.path.join(args.out, n, f"step_{args.updates:08d}"))]
    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(lambda a: run(a[1], os.path.join(args.out, a[0] + ".log")), todo))
    results = {name: summary(os.path.join(args.out, name)) for name, _ in arms(args)}
    report(results)
    print(json.dumps(results))


def report(results):
    """The table: per arm (the name without its seed), the mean and range over seeds."""
    groups = {}
    for name, r in results.items():
        groups.setdefault(name.rsplit("-s", 1)[0], []).append(r)
    print(f"{'arm':34} {'seeds':>5} {'gain (control sd)':>22} {'[within-group sd]':>18} {'dPSNR dB':>16} "
          f"{'dSSIM':>8} {'s/update':>8}")
    for arm, rs in groups.items():
        gains, psnr = [r["gain_sd"] for r in rs], [r["dpsnr"] for r in rs]
        group = [r["gain_group_sd"] for r in rs if r["gain_group_sd"] is not None]
        print(f"{arm:34} {len(rs):>5} {statistics.mean(gains):+8.2f} [{min(gains):+.1f}, {max(gains):+.1f}] "
              f"{'[' + format(statistics.mean(group), '+.1f') + ']' if group else '':>18} "
              f"{statistics.mean(psnr):+7.3f} [{min(psnr):+.2f}, {max(psnr):+.2f}] "
              f"{statistics.mean(r['dssim'] for r in rs):+8.4f} "
              f"{statistics.mean(r['s_per_update'] or 0 for r in rs):8.2f}")


if __name__ == "__main__":
    main()
