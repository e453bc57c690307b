"""Profile train.py's own step (one step after the warm-up ones) and write torch.profiler's tables: where the step's
time goes (issue 54: p25-2b-action at 13x256x320 ran 0.62 s a step at 3.1% MFU). train.py runs as given, in this
process; its step PROFILED_STEP is wrapped in torch.profiler with labelled ranges (the batch: data loading and the
VAE's online encoding; the objective's step: forward, backward, gradient clipping, AdamW), and the tables are written
to OUT_PREFIX.{cuda,cpu}.txt, the ranges' totals to OUT_PREFIX.ranges.txt.

    python -m torch.distributed.run --standalone --nproc_per_node=1 recipes/gpu/profile_train_step.py OUT_PREFIX \
        --config p25-2b-action --init random ... --steps 4     # train.py's flags after OUT_PREFIX
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

import train  # noqa: E402

PROFILED_STEP = 2  # steps 0 and 1 warm up (allocator, cuDNN plans, the optimizer's state)


def labelled(fn, label):
    def call(*args, **kwargs):
        with record_function(label):
            return fn(*args, **kwargs)
    return call


def main(prefix, argv):
    original, optimizer_step = train.one_step, torch.optim.AdamW.step

    def one_step(loop, step, start_step, peak):
        if step != start_step + PROFILED_STEP:
            return original(loop, step, start_step, peak)
        to_latent = loop.to_latent
        loop.to_latent = labelled(to_latent, "range: to_latent (VAE encode, conditioning)")
        torch.optim.AdamW.step = labelled(optimizer_step, "range: AdamW.step")
        torch.nn.utils.clip_grad_norm_ = labelled(clip, "range: clip_grad_norm_")
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        try:
            with profile(activities=activities) as prof:
                with record_function("range: one_step"):
                    row = original(loop, step, start_step, peak)
        finally:
            loop.to_latent, torch.optim.AdamW.step = to_latent, optimizer_step
            torch.nn.utils.clip_grad_norm_ = clip
        averages = prof.key_averages()
        cuda = torch.cuda.is_available()
        with open(prefix + ".cuda.txt", "w") as f:
            f.write(averages.table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total", row_limit=45))
        with open(prefix + ".cpu.txt", "w") as f:
            f.write(averages.table(sort_by="cpu_time_total", row_limit=45))
        with open(prefix + ".ranges.txt", "w") as f:
            f.write(f"step {step}: s_per_step {row['s_per_step']:.4f}, mfu {row.get('mfu')}\n")
            for e in averages:
                if e.key.startswith("range: "):
                    f.write(f"{e.key:45s} cpu {e.cpu_time_total / 1e3:9.1f} ms   cuda "
                            f"{getattr(e, 'device_time_total', 0) / 1e3:9.1f} ms   x{e.count}\n")
        print(open(prefix + ".ranges.txt").read(), flush=True)
        return row
    clip = torch.nn.utils.clip_grad_norm_
    train.one_step = one_step
    return train.main(argv)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
