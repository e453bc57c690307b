"""The measured step shared by bench.py and peer.py: the latent shape, a timer, our model built for a step, its batch,
the forward + backward timed (no optimizer step), and one JSON line out.

bench.py times it on our DiT; peer.py drives diffusers' network through the same batch and step (PeerNet), so each
side of `python benchmarks/bench.py --vs diffusers` measures the same thing. `b` is a bench.BenchConfig.
"""
import contextlib
import json
import time

import torch

import condition
from engine import build
from nets.edm import denoise
from nets.vae import latent_frames


def latent_shape(b):
    if (b.frames - 1) % 4 or b.height % 8 or b.width % 8:
        raise ValueError(f"frames-1 must be divisible by 4 and height/width by 8, got {b.frames}x{b.height}x{b.width}")
    if b.views < 1:
        raise ValueError(f"--views must be >= 1, got {b.views}")
    return (1, 16, b.views * latent_frames(b.frames), b.height // 8, b.width // 8)


def timer(device):
    """Start a timer; calling the result returns seconds elapsed (CUDA events on the GPU)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()

        def stop():
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        return stop
    t0 = time.perf_counter()
    return lambda: time.perf_counter() - t0


def timed_steps(step, warmup, steps, device):
    """step() -> loss: `warmup` untimed calls, then (CUDA synchronised, its peak memory reset) `steps` timed ones;
    (their seconds, the last loss). bench.py's and peer.py's timing, so both sides of a ratio are timed alike."""
    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times, loss = [], None
    for _ in range(steps):
        t = timer(device)
        loss = step()
        times.append(t())
    return times, loss


def build_net(b, device, dtype, modes):
    """The network (engine/build.py) in `dtype` throughout (no fp32 masters: a step without an optimizer), its random
    init, checkpointing `modes` per block, compiled with --compile. Returns model and trainables."""
    net = build.build(build.NetSpec(config=b.config, lora=b.lora, fp8=b.fp8, sac_modes=tuple(modes), compile=b.compile,
                                    dtype=dtype, seed=b.seed), device)
    return net, build.trainable(net)


def make_batch(b, cfg, device, dtype):
    g = torch.Generator(device=device).manual_seed(b.seed + 1)
    shape = latent_shape(b)
    x0 = torch.randn(shape, device=device, generator=g)
    eps = torch.randn(shape, device=device, generator=g)
    text = torch.randn(1, b.text_len, cfg.crossattn_proj_in_channels, device=device, generator=g).to(dtype)
    sigma = torch.ones(1, device=device)
    # agibot's frame-init mask and a map of the fallback rig for a camera net (its cost is the shape's, not the values')
    cond = condition.standin(cfg, x0, text, views=b.views, cond_frames=b.cond_frames, pixels=(b.height, b.width),
                             camera_dtype=dtype, generator=g)
    batch = dict(x0=x0, eps=eps, sigma=sigma, cond=cond, offload=b.offload)
    return batch


def train_step(model, batch, trainable, measure=None):
    """Rectified-flow loss on the generated frames, backward; no optimizer step (as in the anchor's numbers). Both
    families through edm.denoise at EDM sigma 1 (t = 0.5): the same network calls and cost as either family's own
    loss (build.guard_loss does the same), so a bench row never depends on which family it measures."""
    for p in trainable:
        p.grad = None
    x0, eps, cond = batch["x0"], batch["eps"], batch["cond"]
    offload = torch.autograd.graph.save_on_cpu(pin_memory=True) if batch.get("offload") else contextlib.nullcontext()
    with offload:
        x_sigma = x0 + batch["sigma"].view(-1, 1, 1, 1, 1) * eps
        _, velocity = denoise(model, x_sigma, batch["sigma"], cond)
        loss = ((velocity - (eps - x0)) ** 2 * (1 - cond.condition_mask)).mean()
    if measure is not None:  # bytes held between forward and backward: the saved activations (+ loss graph)
        measure["act_bytes"] = torch.cuda.memory_allocated() - measure["before"]
    loss.backward()
    return loss


def emit(res, out):
    line = json.dumps(res)
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")
