"""Does training on the model's own rollouts make policyeval's verdicts truer? (issue 52, its last item; docs/actions.md
"Own-context SFT"). `python policyeval.py RUN --episodes 16` (tasks/square.py's 22 policies x 16 starts x 3 chunks,
20 steps, the simulator as the truth) on the runs tests/ownctx_numbers.py trained, one seed: the base, continued SFT,
own-context SFT and chained NFT from it at equal compute. Prints per run Spearman, MMRV, calibration (mean |world -
sim| success over the policies), false success and the world's PSNR per chunk against the simulator's, then each arm
minus the base; one JSON line.

    OMP_NUM_THREADS=1 python tests/ownctx_numbers.py --out runs/ownctx_numbers           # the runs, first
    OMP_NUM_THREADS=1 python tests/ownctx_policyeval.py --out runs/ownctx_numbers --seed 0   # ~4 x 3 min on one core

The tiny-action preset's data is the full mixture of behaviour families; runs trained with `ownctx_numbers.py
--without F` never saw family F, and --without F adds the ranking and calibration of tasks/square.py's policies of
that family (square.FAMILY_DATA, as tests/family_sweep.py scores its held-out families): `held_<metric>`.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import policyeval  # noqa: E402  (after the root is on the path: the script runs from tests/)
from tasks import square  # noqa: E402
KEYS = ("spearman", "mmrv", "calibration", "false_success")


def evaluate(out, run, episodes):
    """policyeval.py on OUT/run (one thread, no videos), its result.json: skipped when already there."""
    folder = os.path.join(out, f"policyeval_{run}")
    result = os.path.join(folder, "result.json")
    if not os.path.exists(result):
        with open(folder + ".log", "w") as f:
            proc = subprocess.run([sys.executable, os.path.join(ROOT, "policyeval.py"), run, "--episodes",
                                   str(episodes), "--videos", "0", "--out", f"policyeval_{run}"], cwd=out, stdout=f,
                                  stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1"))
        if proc.returncode != 0:
            raise SystemExit(f"ownctx_policyeval: policyeval.py {run} failed ({proc.returncode}); see {folder}.log")
    with open(result) as f:
        return json.load(f)


def held_out(summary, family):
    """{held_spearman, held_mmrv, held_calibration} of the policies whose family acts like data family `family`
    (policyeval.ranking, tests/family_sweep.py's held_out); {} without one."""
    if not family:
        return {}
    names = [n for n, p in summary["policies"].items() if square.FAMILY_DATA.get(p["family"]) == family]
    if len(names) < 2:
        raise SystemExit(f"ownctx_policyeval: --without {family}: {len(names)} policies of that family were evaluated")
    scores = policyeval.ranking([summary["policies"][n]["success_world"] for n in names],
                                [summary["policies"][n]["success_sim"] for n in names])
    return {f"held_{k}": v for k, v in scores.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="tests/ownctx_numbers.py's --out (its runs are read)")
    parser.add_argument("--seed", type=int, default=0, help="the train seed of the arms")
    parser.add_argument("--tag", default="t0.9_n1200", help="the own-context setting's tag (ownctx_numbers' default)")
    parser.add_argument("--chain", default="chain_n33", help="the chained NFT runs' prefix ('' : none)")
    parser.add_argument("--episodes", type=int, default=16, help="policyeval --episodes (starts a policy)")
    parser.add_argument("--without", default="", help="the behaviour family the runs' data left out: its policies' "
                        "ranking and calibration as held_*")
    args = parser.parse_args(argv)
    arms = {"base": "base", "sft": f"sft_{args.tag}_s{args.seed}", "own": f"own_{args.tag}_s{args.seed}",
            **({"chain": f"{args.chain}_s{args.seed}"} if args.chain else {})}
    missing = [run for run in arms.values() if not os.path.exists(os.path.join(args.out, run, "latest"))]
    if missing:
        raise SystemExit(f"ownctx_policyeval: {args.out} has no finished {missing}: run tests/ownctx_numbers.py first")
    found = {}
    for arm, run in arms.items():
        summary = evaluate(args.out, run, args.episodes)
        found[arm] = {**{k: float("nan") if summary[k] is None else summary[k] for k in KEYS},  # None: none fail
                      **{f"chunk{k + 1}_psnr": v for k, v in enumerate(summary["psnr_per_chunk"])},
                      **held_out(summary, args.without)}
        print(f"{arm:6s} {run:18s} " + "  ".join(f"{k} {v:.3f}" for k, v in found[arm].items()), flush=True)
    for arm in arms:
        if arm != "base":
            found[f"{arm} - base"] = {k: found[arm][k] - found["base"][k] for k in found["base"]}
            print(f"{arm} - base  " + "  ".join(f"{k} {v:+.3f}" for k, v in found[f"{arm} - base"].items()))
    print(json.dumps({"episodes": args.episodes, "seed": args.seed, "runs": arms, "metrics": found}), flush=True)


if __name__ == "__main__":
    main()
