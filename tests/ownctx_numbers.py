"""Own-context SFT and chained NFT against continued SFT at equal compute on the tiny-action world (issue 52;
docs/actions.md "Own-context SFT", docs/rl.md "World-model rewards"), re-run through the real commands and printed:

    OMP_NUM_THREADS=1 python tests/ownctx_numbers.py --out runs/ownctx_numbers       # ~25 min on one core
    OMP_NUM_THREADS=1 python tests/ownctx_numbers.py --out runs/ownctx_numbers --true-share 0.5 --own-steps 300

1. a base: `train.py --config tiny-action --steps BASE` (the preset's data, lr 3e-3, 4 held-out episodes);
2. per seed: `--objective ownctx` from the base for --own-steps (1200) steps at --true-share (0.9), then `--objective
   sft` from the same base for as many steps as cost the same compute, counted in network forwards (a training
   sample: 1 forward + its backward = 3 forward-equivalents; a context generation call: 1 forward at the same latent
   shape; the tiny VAE's encode/decode left out, in both); both at the same --lr / --warmup, each with its own cosine
   over its own steps;
   and (--chain-updates U > 0, default 33) chained NFT from the same base: `--objective nft --lora 4
   --nft-chain-chunks 3` for U updates of 2 groups of 4 (the tiny NFT preset's lr 3e-3 and data term 0.5), each
   group chunk 3 of a chain whose first 2 chunks the old policy generated (10 steps each), rewarded by the world-model
   rewards (--reward clips.fidelity:truth_psnr,tasks.square:follows_actions=10) against chunk 3's true frames; its
   compute is the `forwards` its metrics rows count in the same unit (a sample's forward 1, with autograd 3, context
   included). U is fixed, not fitted: the printed forwards say how close it came to the own-context run's.
   --chain-share S: --nft-chain-true-share S (that share of the groups unchained, from a true frame; runs
   chain_n<U>_t<S>_s<seed>; fewer context chunks an update, so pass more updates for the same forwards);
3. `evaluate.py BASE SFT_s OWN_s [CHAIN_s] ... --chunks 3 --draws 2`: PSNR per chained chunk and action_gap_db per chunk on
   the 4 held-out episodes. Chunk 6 is not measurable here: the tiny world's episodes hold 25-31 frames, 3 chunks of
   9 (6 need 49): evaluate.py refuses it.
--without F trains every run on the preset's data without behaviour family F (make_tiny_dataset(without=(F,)),
the leave-one-family-out data of tests/family_sweep.py), in OUT/without_F/; --seeds picks the seeds (default 0,1,2).
The seconds each run took (summed s_per_step) are printed beside the forward counts: equal compute means equal
forwards, not equal seconds (the CPU is shared). With OMP_NUM_THREADS=1 every number but the seconds is deterministic.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE, OWN, LR, WARMUP = 3000, 1200, 1e-3, 10
OWN_FLAGS = ["--ownctx-chunks", "3", "--ownctx-context-steps", "10"]
WORLD = "clips.fidelity:truth_psnr,tasks.square:follows_actions=10"  # tests/world_rl.py's world-model rewards
CHAIN_FLAGS = ["--objective", "nft", "--lora", "4", "--nft-chain-chunks", "3", "--batch-size", "2", "--nft-group-size",
               "4", "--reward", WORLD, "--eval-every", "0"]


def command(script, argv, cwd, log):
    """`python script argv` in cwd with one thread; a failure stops the script, naming its log."""
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, *([script] if script == "-c" else [os.path.join(ROOT, script)]), *argv],
                              cwd=cwd, stdout=f,
                              stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if proc.returncode != 0:
        raise SystemExit(f"ownctx_numbers: {script} {' '.join(argv)} failed ({proc.returncode}); see {log}")


def rows(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def cost(run):
    """(forward-equivalents, seconds) of a run's training steps: 3 per trained sample, 1 per context call; a chained
    NFT update: the forwards it counted (nft.ForwardCounter, the same unit)."""
    steps = [r for r in rows(run) if "s_per_step" in r]
    return (sum(r["forwards"] if "forwards" in r else 3 + r.get("ctx_calls", 0) for r in steps),
            sum(r["s_per_step"] for r in steps))


def train(out, name, argv, data=()):
    """train.py from the base (unless it is the base); skipped when the run already finished its steps. data: the
    --data flag of a --without run (none: the preset's folder)."""
    run = os.path.join(out, name)
    if not os.path.exists(os.path.join(run, "latest")):
        command("train.py", ["--config", "tiny-action", "--sample-every", "0", "--out", name, *data, *argv], out,
                os.path.join(out, f"{name}.log"))
    return run


def data_without(out, family):
    """(--data, its folder) of the preset's data without behaviour family `family`, built once in OUT/without_F/."""
    root = os.path.abspath(os.path.join(out, f"without_{family}", "tiny_action_grid"))
    if not os.path.isdir(root):
        build = ("import sys; from clips import tiny; "
                 "tiny.make_tiny_dataset(sys.argv[1], actions=True, without=(sys.argv[2],))")
        command("-c", [build, root, family], ROOT, os.path.join(out, f"data_without_{family}.log"))
    return ["--data", root]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="a folder to run in (created; its data/ and runs are kept)")
    parser.add_argument("--true-share", type=float, default=0.9, help="--ownctx-true-share of the own-context runs")
    parser.add_argument("--own-steps", type=int, default=OWN, help="the own-context runs' steps (SFT: its compute)")
    parser.add_argument("--chain-updates", type=int, default=33, help="the chained NFT runs' updates (0: no such arm)")
    parser.add_argument("--chain-share", type=float, default=0.0, help="--nft-chain-true-share of the chained runs")
    parser.add_argument("--without", default="", help="a behaviour family left out of every run's data ('': none)")
    parser.add_argument("--seeds", default="0,1,2", help="train seeds of the arms")
    args = parser.parse_args(argv)
    seeds = [int(seed) for seed in args.seeds.split(",")]
    if args.chain_updates < 0:
        raise SystemExit(f"ownctx_numbers: --chain-updates {args.chain_updates}: >= 0 (0: no chained NFT arm)")
    tag = f"t{args.true_share:g}_n{args.own_steps}"  # one setting's runs: own_t0.9_n1200_s0 and its SFT sft_t0.9_n1200_s0
    chained = f"chain_n{args.chain_updates}" + (f"_t{args.chain_share:g}" if args.chain_share else "")
    os.makedirs(args.out, exist_ok=True)
    data = data_without(args.out, args.without) if args.without else []
    train(args.out, "base", ["--steps", str(BASE), "--save-every", str(BASE)], data)
    init, common = os.path.join("base", f"step_{BASE:08d}"), ["--lr", str(LR), "--warmup", str(WARMUP)]
    runs, budget = ["base"], {}
    for seed in seeds:
        own = train(args.out, f"own_{tag}_s{seed}", ["--objective", "ownctx", "--init", init, "--steps",
                                                      str(args.own_steps), "--seed", str(seed), *common, *OWN_FLAGS,
                                                      "--ownctx-true-share", str(args.true_share)], data)
        forwards, seconds = cost(own)
        steps = round(forwards / 3)  # SFT's steps of the same forwards
        sft = train(args.out, f"sft_{tag}_s{seed}", ["--init", init, "--steps", str(steps), "--seed", str(seed),
                                                      *common], data)
        budget[seed] = {"own": (args.own_steps, forwards, seconds), "sft": (steps, *cost(sft))}
        runs += [f"sft_{tag}_s{seed}", f"own_{tag}_s{seed}"]
        if args.chain_updates:
            u, share = args.chain_updates, ["--nft-chain-true-share", str(args.chain_share)] if args.chain_share else []
            chain = train(args.out, f"{chained}_s{seed}", ["--init", init, "--steps", str(u), "--save-every", str(u),
                                                           "--seed", str(seed), *CHAIN_FLAGS, *share], data)
            budget[seed]["chain"] = (u, *cost(chain))
            runs.append(f"{chained}_s{seed}")
        print(json.dumps({f"seed{seed}": budget[seed]}), flush=True)
    log = os.path.join(args.out, f"evaluate_{tag}_{chained}.log")
    command("evaluate.py", [*runs, "--chunks", "3", "--draws", "2", "--plot", f"ownctx_{tag}_{chained}.png"], args.out,
            log)
    with open(log) as f:
        text = f.read()
    result = [json.loads(line) for line in text.splitlines() if line.startswith("{")][-1]
    lines = [line for line in text.splitlines() if not line.startswith("{")]
    head = next(i for i, line in enumerate(lines) if line.startswith("run ") and " family " in line)
    print("\n".join(lines[head:]), flush=True)  # evaluate.py's table
    keys = ["psnr", "action_gap_db"] + [f"chunk{k}/{m}" for k in (1, 2, 3) for m in ("psnr", "action_gap_db")]
    found = {os.path.basename(r["run"].rstrip("/")): {k: r["metrics"][k] for k in keys} for r in result["runs"]}
    arms = {"sft": f"sft_{tag}", "own": f"own_{tag}", **({"chain": chained}
                                                        if args.chain_updates else {})}
    for arm, prefix in arms.items():
        found[f"{arm} mean"] = {k: sum(found[f"{prefix}_s{s}"][k] for s in seeds) / len(seeds) for k in keys}
    for arm, than in (("own", "sft"), ("chain", "sft"), ("chain", "own")):
        if arm in arms:
            found[f"{arm} - {than}"] = {k: found[f"{arm} mean"][k] - found[f"{than} mean"][k] for k in keys}
    for name, metrics in found.items():
        print(f"{name:14s} " + "  ".join(f"{k} {v:+.2f}" if "gap" in k or " - " in name else f"{k} {v:.2f}"
                                          for k, v in metrics.items()), flush=True)
    print(json.dumps({"budget": budget, "metrics": found}), flush=True)


if __name__ == "__main__":
    main()
