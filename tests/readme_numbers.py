"""Every tiny-default number README.md and BENCHMARKS.md quote, re-run through the real commands and printed (issue 45),
so that the docs quote what the code gives today and not what an older version gave.

    OMP_NUM_THREADS=1 python tests/readme_numbers.py --out runs/numbers          # all of it, ~15 min on one core
    OMP_NUM_THREADS=1 python tests/readme_numbers.py --out runs/numbers --only sft,nft

Each part is the Quickstart's own command, run in OUT (its data/ folder is built there, the checkout is not written):
  sft     `python train.py`: eval_loss at steps 500 and 1000, and the training loss of the first PREFIX steps
  nft     `python train.py --objective nft --init out/step_00001000 --lora 4`: held-out reward at update 0 and 30, and
          the init guard's loss ratio of that 1000-step base
  guard   the init guard's ratio of a 100-step base (`python train.py --steps 100`), which it refuses
  grpo    the same with --objective grpo
  action  `python train.py --config tiny-action` (its 6000 steps): eval_loss at its end, and `evaluate.py` on it
          (action_gap_db over its 4 held-out episodes x 2 draws; and docs/actions.md's `--chunks 3`, 1 draw: PSNR,
          action_gap_db, PSNR per chained chunk)
Wall times are printed too (they are this machine's: the docs say which machine theirs came from). With one thread
(OMP_NUM_THREADS=1) every number but the times is deterministic; RECORDED holds what the last full run printed, the
numbers the docs quote, and tests/test_numbers.py holds the docs to them and re-runs the cheap prefix of `sft`.
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFIX = 30  # the steps of the default run a CI test re-runs (tests/test_numbers.py): past the warm-up, so its
# learning rate is the 1000-step cosine's
# What the last full run printed (OMP_NUM_THREADS=1, torch 2.13.0+cpu, 2026-12-07 on the 2-core box): the docs quote
# these, rounded as shown; sft/loss and sft/lr of step PREFIX are read from the full run's metrics.jsonl
RECORDED = {
    "sft/eval_loss@500": 1.6474838256835938, "sft/eval_loss@1000": 1.2227400541305542,
    f"sft/loss@{PREFIX}": 4.75388240814209, f"sft/lr@{PREFIX}": 0.0019996254455158006,
    "nft/eval_reward@0": 0.3802160993218422, "nft/eval_reward@30": 0.40406081825494766,
    "grpo/eval_reward@0": 0.37484224885702133, "grpo/eval_reward@30": 0.38809211552143097,
    "guard/ratio@1000": 0.174, "guard/ratio@100": 0.753,
    "action/steps": 6000, "action/eval_loss@6000": 0.5806399583816528, "action/action_gap_db": 1.4175615061991498,
    # the action part re-run 2026-12-07 on issue 51's behaviour mixture (the data changed: before it, 0.765 / +1.98
    # and --chunks 3 16.43 / +2.07 / 16.43, 14.79, 13.77 on the 15 held commands)
    "action/chunks3/psnr": 16.198410104486282, "action/chunks3/action_gap_db": 1.306483338518464,
    "action/chunks3/chunk1/psnr": 16.198410104486282, "action/chunks3/chunk2/psnr": 14.780356310339977,
    "action/chunks3/chunk3/psnr": 14.244951171317279,
}
# and the wall times of that run (a busy machine: the other numbers do not depend on it): sft 92 s, nft 49 s, grpo
# 164 s, action 381 s with the --chunks 3 evaluation (the mixture, a box shared with the test suite)


def command(script, argv, cwd, log):
    """`python script argv` in cwd with one thread; (seconds it took). A failure stops the script, naming its log."""
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, os.path.join(ROOT, script), *argv], cwd=cwd, stdout=f,
                              stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if proc.returncode != 0:
        raise SystemExit(f"readme_numbers: {script} {' '.join(argv)} failed ({proc.returncode}); see {log}")
    return time.perf_counter() - t0


def metrics(run):
    """{step: the last metrics.jsonl row of that step} of a run directory."""
    rows = {}
    with open(os.path.join(run, "metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            rows.setdefault(row["step"], {}).update(row)
    return rows


def sft(out):
    seconds = command("train.py", [], out, os.path.join(out, "sft.log"))  # --out out: the Quickstart's own
    rows = metrics(os.path.join(out, "out"))
    return {"sft/eval_loss@500": rows[500]["eval_loss"], "sft/eval_loss@1000": rows[1000]["eval_loss"],
            f"sft/loss@{PREFIX}": rows[PREFIX]["loss"], f"sft/lr@{PREFIX}": rows[PREFIX]["lr"],
            "sft/seconds": seconds}


def rl(out, name):
    init = os.path.join("out", "step_00001000")
    if not os.path.isdir(os.path.join(out, init)):
        raise SystemExit(f"readme_numbers: {name} needs {os.path.join(out, init)}: run the sft part first")
    seconds = command("train.py", ["--objective", name, "--init", init, "--lora", "4", "--out", f"runs/tiny-{name}"],
                      out, os.path.join(out, f"{name}.log"))
    rows = metrics(os.path.join(out, "runs", f"tiny-{name}"))
    return {f"{name}/eval_reward@0": rows[0]["eval_reward"], f"{name}/eval_reward@30": rows[30]["eval_reward"],
            f"{name}/seconds": seconds, **({"guard/ratio@1000": guard_ratio(os.path.join(out, f"{name}.log"))}
                                           if name == "nft" else {})}


def guard_ratio(log):
    """The init guard's loss ratio, from a train.py log's `init guard: ... ratio R` line."""
    with open(log) as f:
        line = next(line for line in f if line.startswith("init guard: iteration-0 loss"))
    return float(line.split("ratio ")[1].split(",")[0])


def guard(out):
    """The Quickstart's RL command from a 100-step base: the init guard refuses it (exit 2), its ratio printed."""
    command("train.py", ["--steps", "100", "--out", "out100"], out, os.path.join(out, "sft100.log"))
    log = os.path.join(out, "guard.log")
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--objective", "nft", "--init",
                               os.path.join("out100", "step_00000100"), "--lora", "4", "--out", "runs/guard100"],
                              cwd=out, stdout=f, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if proc.returncode != 2:
        raise SystemExit(f"readme_numbers: the init guard let a 100-step base through (exit {proc.returncode}); see "
                         f"{log}")
    return {"guard/ratio@100": guard_ratio(log)}


def action(out):
    seconds = command("train.py", ["--config", "tiny-action", "--out", "runs/act"], out, os.path.join(out, "act.log"))
    rows = metrics(os.path.join(out, "runs", "act"))
    steps = max(s for s, r in rows.items() if "eval_loss" in r)
    command("evaluate.py", ["runs/act", "--draws", "2", "--plot", "act.png"], out, os.path.join(out, "act_eval.log"))
    with open(os.path.join(out, "act_eval.log")) as f:
        result = [json.loads(line) for line in f if line.startswith("{")][-1]
    # docs/actions.md's: the README's `evaluate.py runs/act --chunks 3` (1 draw)
    command("evaluate.py", ["runs/act", "--chunks", "3", "--plot", "act3.png"], out, os.path.join(out, "act3.log"))
    with open(os.path.join(out, "act3.log")) as f:
        chained = [json.loads(line) for line in f if line.startswith("{")][-1]["runs"][0]["metrics"]
    return {"action/steps": steps, f"action/eval_loss@{steps}": rows[steps]["eval_loss"],
            "action/action_gap_db": result["runs"][0]["metrics"]["action_gap_db"], "action/seconds": seconds,
            "action/chunks3/psnr": chained["psnr"], "action/chunks3/action_gap_db": chained["action_gap_db"],
            **{f"action/chunks3/chunk{k}/psnr": chained[f"chunk{k}/psnr"] for k in (1, 2, 3)}}


PARTS = {"sft": sft, "nft": lambda out: rl(out, "nft"), "grpo": lambda out: rl(out, "grpo"), "guard": guard,
         "action": action}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="a folder to run in (created; its data/ and runs are kept)")
    parser.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts of {', '.join(PARTS)}")
    args = parser.parse_args(argv)
    parts = args.only.split(",")
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"--only: unknown part(s) {unknown}; valid: {', '.join(PARTS)}")
    if os.environ.get("OMP_NUM_THREADS") != "1":
        print("readme_numbers: OMP_NUM_THREADS is not 1: the runs use one thread anyway (set below), the timing "
              "of this process's own work may differ", flush=True)
    os.makedirs(args.out, exist_ok=True)
    found = {}
    for part in parts:
        found.update(PARTS[part](args.out))
        print(json.dumps({k: v for k, v in found.items() if k.startswith(part + "/")}), flush=True)
    for key, value in found.items():
        was = RECORDED.get(key)
        same = "" if was is None or key.endswith("seconds") else "  (recorded: same)" if round(value, 4) == round(
            was, 4) else f"  (recorded: {was}: UPDATE RECORDED and the docs)"
        print(f"{key:28s} {value:.4f}{same}" if isinstance(value, float) else f"{key:28s} {value}{same}")
    print(json.dumps(found), flush=True)


if __name__ == "__main__":
    main()
