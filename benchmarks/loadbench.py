"""Checkpoint load speed (`bench.py --load`): ckpt.load of a synthetic bf16 checkpoint (14B block shapes) against
`cat file > /dev/null`, from a cold page cache and again warm."""
import os
import subprocess
import time

import torch

import ckpt
from base.inits import get_config
from model import DiT


def _drop_cache(path):
    """Evict the file from the page cache (clean pages, no root needed) so both timings read the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def load_speed(size_gb, directory, fmt="pt", device=None, threads=8):
    """Time ckpt.load of a synthetic bf16 checkpoint (14B block shapes) against `cat file > /dev/null`."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    name = "v2w-14b" if size_gb >= 1 else "tiny"  # tiny shapes keep the CPU test small
    with torch.device("meta"):
        block_bytes = 2 * sum(p.numel() for p in DiT(get_config(name)).blocks[0].parameters())
        net = DiT(get_config(name, num_blocks=max(1, round(size_gb * 1e9 / block_bytes)))).to(torch.bfloat16)
    path = os.path.join(directory, f"bench_{net.cfg.model_channels}x{net.cfg.num_blocks}.{fmt}")
    if not os.path.exists(path):  # .pt release-style (net. keys), .safetensors with our keys; random bf16 values
        from safetensors.torch import save_file
        os.makedirs(directory, exist_ok=True)
        gen = "cuda" if torch.cuda.is_available() else "cpu"
        sd = {("net." if fmt == "pt" else "") + k: torch.randn(v.shape, device=gen).to(v.dtype).cpu()
              for k, v in net.state_dict().items()}
        torch.save(sd, path + ".tmp") if fmt == "pt" else save_file(sd, path + ".tmp")
        os.replace(path + ".tmp", path)
        del sd
    net = net.to_empty(device=device)
    gb, times = os.path.getsize(path) / 1e9, {}
    for cache in ("cold", "warm"):  # cold: evicted from the page cache before each run; warm: straight after
        for what in ("cat", "load"):
            if cache == "cold":
                _drop_cache(path)
            t0 = time.time()
            if what == "cat":
                subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)
            else:
                ckpt.load(net, path, verbose=False, threads=threads)
                if device.type == "cuda":
                    torch.cuda.synchronize()
            times[what, cache] = time.time() - t0
        ratio = times["load", cache] / times["cat", cache]
        print(f"bench {cache}: {gb:.2f} GB {fmt} -> {device}, {threads} threads: cat {times['cat', cache]:.2f}s"
              f" ({gb / times['cat', cache]:.2f} GB/s), ckpt.load {times['load', cache]:.2f}s"
              f" ({gb / times['load', cache]:.2f} GB/s) = {ratio:.2f}x cat"
              + (f" (target <= 1.2x: {'PASS' if ratio <= 1.2 else 'FAIL'})" if cache == "cold" else ""), flush=True)
    return times
