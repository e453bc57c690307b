"""Which tiny-action setting learns to follow its actions? Variants of the tiny preset through the real entry points.

    python tests/action_curves.py --variants base,abspos --steps 3000 --jobs 2 --out runs/act
    python tests/action_curves.py --variants abspos --set abspos:num_blocks=4 --out S   # one variant changed

Every variant is one `train.py --config tiny-action` run in its own folder OUT/<variant> (so its synthetic data is
its own: data/tiny_action_grid under it), then `evaluate.py --guidance 0 --draws 2` of each saved step: held-out
PSNR and action_gap_db (docs/actions.md). A variant changes the network (DiTConfig fields), the synthetic episodes
(the command set, how long a command holds, the square's size, how many episodes) or train.py flags; the worker
process applies the change before train.py / evaluate.py import it, in that process only. One JSON line at the end.
Every variant starts from the tiny-action preset as it was before issue 36's sweep (BASE: a 48-pixel square, commands
held 3-9 frames, 10 episodes, lr 2e-3, 2 held out), so the names reproduce docs/benchmarks-log.md's table; `combo`
is the preset shipped since.
"""
import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LONG = (112, 100, 120, 104, 116, 100, 108, 124, 104, 100)
BASE_DATA = {"square": 48, "hold": [3, 9], "episodes": 10}  # inclusive hold range
BASE_FLAGS = ["--lr", "2e-3", "--holdout", "2"]  # a variant's own flags come after, and win
# name -> {"net": DiTConfig fields, "data": square_commands' knobs / square / episodes, "flags": train.py flags}
VARIANTS = {
    "base": {},
    "abspos": {"net": {"extra_per_block_abs_pos_emb": True}},
    "many": {"data": {"episodes": 40}, "flags": ["--holdout", "4"]},
    "slow": {"data": {"dx": [-2, -1, 0, 1, 2], "dy": [-1, 0, 1]}},
    "steady": {"data": {"hold": [40, 60]}},
    "abspos_many": {"net": {"extra_per_block_abs_pos_emb": True}, "data": {"episodes": 40}, "flags": ["--holdout", "4"]},
    "abspos_slow": {"net": {"extra_per_block_abs_pos_emb": True}, "data": {"dx": [-2, -1, 0, 1, 2], "dy": [-1, 0, 1]}},
    "abspos_steady": {"net": {"extra_per_block_abs_pos_emb": True}, "data": {"hold": [40, 60]}},
    "wide_abspos": {"net": {"extra_per_block_abs_pos_emb": True, "model_channels": 128, "num_heads": 4}},
    "abspos_steady_many": {"net": {"extra_per_block_abs_pos_emb": True}, "data": {"hold": [40, 60], "episodes": 40},
                           "flags": ["--holdout", "4"]},
    "steady_many": {"data": {"hold": [40, 60], "episodes": 40}, "flags": ["--holdout", "4"]},
    "abspos_lr1e-3": {"net": {"extra_per_block_abs_pos_emb": True}, "flags": ["--lr", "1e-3"]},
    "abspos_steady_slow": {"net": {"extra_per_block_abs_pos_emb": True}, "data": {"hold": [40, 60], "dx": [-2, -1, 0, 1, 2],
                                                                                  "dy": [-1, 0, 1]}},
    "wide_abspos_steady": {"net": {"extra_per_block_abs_pos_emb": True, "model_channels": 128, "num_heads": 4},
                           "data": {"hold": [40, 60]}},
    "abspos_blocks4": {"net": {"extra_per_block_abs_pos_emb": True, "num_blocks": 4}},
    "steady_many_s1": {"data": {"hold": [40, 60], "episodes": 40}, "flags": ["--holdout", "4", "--seed", "1"]},
    "steady_many_s2": {"data": {"hold": [40, 60], "episodes": 40}, "flags": ["--holdout", "4", "--seed", "2"]},
    "steady_many_h8": {"data": {"hold": [40, 60], "episodes": 40}, "flags": ["--holdout", "8"]},
    "steady_many80": {"data": {"hold": [40, 60], "episodes": 80}, "flags": ["--holdout", "4"]},
    "steady_many80_h8": {"data": {"hold": [40, 60], "episodes": 80}, "flags": ["--holdout", "8"]},
    "steady_many160": {"data": {"hold": [40, 60], "episodes": 160}, "flags": ["--holdout", "8"]},
    "semi_many": {"data": {"hold": [20, 40], "episodes": 40}, "flags": ["--holdout", "4"]},
    "semi_many80": {"data": {"hold": [20, 40], "episodes": 80}, "flags": ["--holdout", "8"]},
    "steady_many_lr3e-3": {"data": {"hold": [40, 60], "episodes": 40}, "flags": ["--holdout", "4", "--lr", "3e-3"]},
    "steady_many_lr1e-3": {"data": {"hold": [40, 60], "episodes": 40}, "flags": ["--holdout", "4", "--lr", "1e-3"]},
    "abspos_steady_many80": {"net": {"extra_per_block_abs_pos_emb": True}, "data": {"hold": [40, 60], "episodes": 80},
                             "flags": ["--holdout", "8"]},
    "steady_many_sq64": {"data": {"hold": [40, 60], "episodes": 40, "square": 64}, "flags": ["--holdout", "4"]},
    "still_many": {"data": {"hold": [60, 100], "episodes": 40}, "flags": ["--holdout", "4"]},
}
COMBO = {"hold": [40, 60], "episodes": 40, "square": 64}
for seed in range(3):
    VARIANTS[f"combo_s{seed}"] = {"data": COMBO, "flags": ["--holdout", "4", "--lr", "3e-3", "--seed", str(seed)]}
    VARIANTS[f"noaction_combo_s{seed}"] = {"config": "tiny", "data": COMBO,
                                           "flags": ["--holdout", "4", "--lr", "3e-3", "--seed", str(seed)]}
    VARIANTS[f"steady_many_sq64_s{seed}"] = {"data": COMBO, "flags": ["--holdout", "4", "--seed", str(seed)]}
    VARIANTS[f"steady_many_lr3e-3_s{seed}"] = {"data": {"hold": [40, 60], "episodes": 40},
                                               "flags": ["--holdout", "4", "--lr", "3e-3", "--seed", str(seed)]}
VARIANTS["combo_h8"] = {"data": COMBO, "flags": ["--holdout", "8", "--lr", "3e-3"]}
VARIANTS["combo80"] = {"data": dict(COMBO, episodes=80), "flags": ["--holdout", "4", "--lr", "3e-3"]}


def patch(variant: dict):
    """Apply a variant's network and data changes to this process's modules (before train/evaluate read them)."""
    from base import inits, lerobot, squareworld
    from clips import tiny
    inits.CONFIGS["tiny-action"] = replace(inits.CONFIGS["tiny-action"], **variant.get("net", {}))
    knobs = dict(BASE_DATA, **variant.get("data", {}))
    lerobot.ACTION_SQUARE = squareworld.ACTION_SQUARE = knobs["square"]
    lerobot.SQUARE_RANGE = squareworld.SQUARE_RANGE = ((0, 320 - knobs["square"]), (0, 180 - knobs["square"]))
    tiny.TINY_ACTION_LENGTHS = tuple(LONG[i % len(LONG)] for i in range(knobs["episodes"])) + (8,)
    # the command range and hold of squareworld.square_commands (knobs: inclusive [low, high] frames). Since issue 51
    # the episodes are the behaviour mixture (squareworld.BEHAVIOURS): "hold" sets the held family's hold alone, so
    # these variants no longer rebuild issue 36's data (one discrete command held per stretch)
    dx, dy = knobs.get("dx", (-8, -4, 0, 4, 8)), knobs.get("dy", (-4, 0, 4))
    squareworld.RATE_MAX = squareworld.np.array([max(dx), max(dy)], float)
    squareworld.COMMAND_HOLD = (knobs["hold"][0], knobs["hold"][1] + 1)


def worker(name: str, spec: str, entry: str, argv: list):
    sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
    patch(json.loads(spec))
    import evaluate
    import train
    from base import inits
    from clips import tiny
    print(f"variant {name}: {spec}", flush=True)
    variant = json.loads(spec)
    if entry == "train" and variant.get("config", "tiny-action") != "tiny-action":  # the same episodes, no actions
        tiny.make_tiny_dataset(inits.tiny_data("tiny-action"), actions=True)
        argv += ["--data", inits.tiny_data("tiny-action")]
    (train if entry == "train" else evaluate).main(argv)


def run_variant(name, variant, args):
    out = os.path.join(args.out, name)
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    call = lambda entry, argv, log: subprocess.run(  # noqa: E731
        [sys.executable, os.path.abspath(__file__), "--worker", name, json.dumps(variant), entry, *argv], cwd=out,
        env=env, stdout=open(os.path.join(out, log), "w"), stderr=subprocess.STDOUT).returncode
    rc = call("train", ["--config", variant.get("config", "tiny-action"), "--out", "run", "--steps", str(args.steps), "--save-every",
                        str(args.save_every), "--sample-every", "0", "--device", "cpu", *BASE_FLAGS,
                        *variant.get("flags", [])],
              "train.log")
    rows = {}
    for step in sorted(d for d in os.listdir(os.path.join(out, "run")) if d.startswith("step_")) if rc == 0 else []:
        log = f"eval_{step}.log"
        call("evaluate", [os.path.join("run", step), "--guidance", "0", "--draws", "2", "--clips", "4"], log)
        lines = [ln for ln in open(os.path.join(out, log)) if ln.startswith("{")]
        if lines:
            metrics = json.loads(lines[-1])["runs"][0]["metrics"]
            rows[step] = {k: round(metrics[k], 3) for k in ("psnr", "psnr_other_actions", "action_gap_db")
                          if k in metrics}
        print(name, step, rows.get(step, "evaluate failed: " + log), flush=True)
    return name, {"train_rc": rc, **rows}


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return worker(*sys.argv[2:5], sys.argv[5:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default="base,abspos")
    p.add_argument("--set", default="", help="VARIANT:field=value,... (a JSON value) added to a variant's net")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--save-every", type=int, default=1000)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    for item in filter(None, args.set.split(";")):
        name, pairs = item.split(":", 1)
        for pair in pairs.split(","):
            key, value = pair.split("=")
            VARIANTS[name].setdefault("net", {})[key] = json.loads(value)
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; known: {sorted(VARIANTS)}")
    with ThreadPoolExecutor(args.jobs) as pool:
        results = dict(pool.map(lambda n: run_variant(n, VARIANTS[n], args), names))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
