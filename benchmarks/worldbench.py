"""A world model's cost as a policy's environment (policyeval.py's inner loop, engine/world.py): seconds per chunk
at each batch of episodes and sampler step count, peak memory, MFU against the measured matmul peak, and what fewer
steps cost in PSNR against the same chunk at the most steps (the same start frames, actions and noise).

    python benchmarks/worldbench.py RUN [--batches 1,4,8] [--steps 35,10] [--compile] [--repeats 2]

RUN: a train.py run of an action config (its newest checkpoint). Start frames: its held-out episodes' frame 0; actions:
tasks.standin.random_actions. One JSON line per (batch, steps), then one with the PSNR of fewer steps.
"""
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository's modules
import condition  # noqa: E402
import policyeval  # noqa: E402
from base import cli  # noqa: E402
from base.inits import get_config  # noqa: E402
from clips.fidelity import psnr  # noqa: E402
from engine.runs import open_run  # noqa: E402
from engine.world import model_world  # noqa: E402
from nets.flops import matmul_peak, model_flops  # noqa: E402
from tasks.standin import random_actions  # noqa: E402


@dataclass
class WorldBenchConfig:
    run: str = ""  # a train.py run of an action config
    batches: str = "1,4,8"  # episodes per network call
    steps: str = "35,10"  # sampler steps per chunk (the first is the PSNR reference)
    compile: bool = False  # torch.compile each block in place (policyeval.py --compile on)
    fp8: bool = False  # fp8 block GEMMs (policyeval.py --fp8)
    repeats: int = 2  # timed chunks after one warm-up, the median reported
    unfolded: bool = False  # a LoRA run's adapters kept apart (policyeval.py folds them in): what folding saves
    seed: int = 0


def main(argv=None):
    b = cli.parse(WorldBenchConfig, sys.argv[1:] if argv is None else argv, description=__doc__, positional=("run",),
                  prog="worldbench.py")
    run = open_run(b.run)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = policyeval.PolicyEvalConfig(run=b.run, task=policyeval.HELD_OUT, episodes=max(map(int, b.batches.split(","))),
                                      videos=0, compile="on" if b.compile else "off", fp8=b.fp8)
    if b.unfolded and b.fp8:
        raise ValueError("--unfolded with --fp8: the fp8 path folds the adapters first; drop one")
    net, vae, record, dtype, grid = policyeval.load_world(cfg, run, device, fold=not b.unfolded)  # compiled there
    if b.compile and b.unfolded:
        for block in net.blocks:
            block.compile()
    _, first = policyeval.start_states(cfg, None, run)
    actions, frames, mcfg = run.dataset.actions, run.cfg["frames"], get_config(run.cfg["config"])
    peak = matmul_peak(device, torch.bfloat16) if device.type == "cuda" else None
    reference = {}
    for B in map(int, b.batches.split(",")):
        for steps in map(int, b.steps.split(",")):
            info = {"chunk": 0, "steps": (frames - 1) * actions.stride, "action_dim": actions.action_width,
                    "seed": b.seed}
            raw = random_actions(first[:B], info)
            cond = condition.map_tensors(record, lambda v: v.expand(B, *v.shape[1:]))
            times, out = [], None
            for r in range(b.repeats + 1):
                step = model_world(net, vae, cond, actions.normalise, frames, steps, run.guidance,
                                   [b.seed + 1000 * e for e in range(B)], grid, dtype, first[:B].to(device))
                if device.type == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                t0 = time.perf_counter()
                out = step(raw, 0)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            seconds = statistics.median(times[1:])  # the first call warms up (and compiles)
            latent = (B, 16, (frames - 1) // 4 + 1, run.cfg["height"] // 8, run.cfg["width"] // 8)
            flops = model_flops(mcfg, latent, run.cfg["text_len"])[0] * steps * (2 if run.guidance > 0 else 1)
            reference.setdefault(B, {})[steps] = out.float().cpu()
            print(json.dumps({"bench": "world", "device": torch.cuda.get_device_name() if peak else "cpu",
                              "config": run.cfg["config"], "frames": frames, "size": [run.cfg["height"],
                              run.cfg["width"]], "batch": B, "steps": steps, "compile": b.compile, "fp8": b.fp8,
                              "lora_folded": bool(run.cfg.get("lora")) and not b.unfolded,
                              "s_per_chunk": round(seconds, 4), "s_per_episode": round(seconds / B, 4),
                              "s_first_call": round(times[0], 2),
                              "peak_gib": round(torch.cuda.max_memory_allocated() / 2 ** 30, 2) if peak else None,
                              "mfu_sampler": round(flops / seconds / peak, 4) if peak else None}), flush=True)
    most = int(b.steps.split(",")[0])
    for B, by_steps in reference.items():
        print(json.dumps({"bench": "world_psnr", "batch": B, "reference_steps": most,
                          **{f"psnr_{s}_steps": round(float(psnr(x[:, :, 1:], by_steps[most][:, :, 1:]).mean()), 2)
                             for s, x in by_steps.items() if s != most},
                          "batch_vs_batch1_max_abs": round(float((by_steps[most][:1] - reference[min(reference)][most][:1])
                                                                 .abs().max()), 5)}), flush=True)
    return 0


if __name__ == "__main__":
    cli.main(main, user_errors=(ValueError, OSError))
