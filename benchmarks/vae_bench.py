"""The Wan2.1 VAE's encode and decode timed on random weights and a random video: one JSON line.

    python benchmarks/vae_bench.py --bench [--frames 93 --height 432 --width 768 --window 16 --runs 3 --cudnn-benchmark]
"""
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository's modules
from base import cli  # noqa: E402
from nets.vae import DTYPES, VAE_CONFIGS, WanVAE, check_window, get_vae_config  # noqa: E402


@dataclass(frozen=True)
class BenchConfig:
    bench: bool = False  # time encode and decode (random weights, random video), print one JSON line
    config: str = "real"  # VAE config: real (the released architecture) | tiny
    device: str = "cuda"  # cuda | cpu
    dtype: str = "bf16"  # bf16 | fp32 | fp16 (Cosmos runs the VAE in bf16)
    frames: int = 93  # video frames, 4k+1
    height: int = 432  # pixels, a multiple of 8
    width: int = 768  # pixels, a multiple of 8
    window: int = 16  # encoder temporal window: frames per call after the first (a multiple of 4; Cosmos uses 16)
    runs: int = 3  # timed runs after one warm-up; the median is reported
    cudnn_benchmark: bool = False  # set torch.backends.cudnn.benchmark

    def __post_init__(self):
        if self.config not in VAE_CONFIGS:
            raise ValueError(f"--config {self.config!r}; valid: {', '.join(sorted(VAE_CONFIGS))}")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype {self.dtype!r}; valid: {', '.join(DTYPES)}")
        if self.frames < 1 or (self.frames - 1) % 4 or min(self.height, self.width) < 8 or self.height % 8 \
                or self.width % 8:
            raise ValueError(f"--frames {self.frames} --height {self.height} --width {self.width}: need 4k+1 frames "
                             "and positive multiples of 8 for height and width")
        check_window(self.window)
        if self.runs < 1:
            raise ValueError(f"--runs {self.runs}: need >= 1")


def bench(args):
    """Time encode/decode of random weights on a random video; print one JSON line."""
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    cuda = device.type == "cuda"
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    cfg = get_vae_config(args.config)
    torch.manual_seed(0)
    with torch.device(device):
        model = WanVAE(cfg)  # default init: timing and memory do not depend on the weight values
    model = model.to(dtype).eval().requires_grad_(False)
    video = torch.rand(1, 3, args.frames, args.height, args.width, device=device, dtype=dtype) * 2 - 1

    def measure(fn):
        fn()  # warm-up (cuDNN algorithm selection, allocator growth); the result is dropped
        times, peak = [], None
        for _ in range(args.runs):
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            t0 = time.perf_counter()
            out = fn()
            if cuda:
                torch.cuda.synchronize()
                peak = (torch.cuda.max_memory_allocated() - base) / 2**30
            times.append(time.perf_counter() - t0)
            del out  # so the next run starts from the same live memory
        return statistics.median(times), peak

    enc_s, enc_peak = measure(lambda: model.encode(video, temporal_window=args.window))
    latent = model.encode(video, temporal_window=args.window)
    dec_s, dec_peak = measure(lambda: model.decode(latent))
    weights_gib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
    print(json.dumps({
        "bench": "vae", "config": args.config, "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "dtype": args.dtype, "video": [1, 3, args.frames, args.height, args.width], "latent": list(latent.shape),
        "latent_finite": bool(torch.isfinite(latent).all()),
        "window": args.window, "runs": args.runs, "cudnn_benchmark": args.cudnn_benchmark,
        "encode_s": round(enc_s, 4), "decode_s": round(dec_s, 4),
        # peak = allocation above what was live before the call (weights, input), like the upstream numbers
        "encode_peak_gib": None if enc_peak is None else round(enc_peak, 3),
        "decode_peak_gib": None if dec_peak is None else round(dec_peak, 3),
        "weights_gib": round(weights_gib, 3), "torch": torch.__version__}))


def main(argv=None):
    args = cli.parse(BenchConfig, argv, description="Wan2.1 VAE benchmark (random weights): "
                     "python benchmarks/vae_bench.py --bench [--frames 93 --height 432 --width 768 --window 16 --runs 3]")
    if not args.bench:
        raise ValueError("nothing to do: pass --bench")
    bench(args)


if __name__ == "__main__":
    cli.main(lambda: main(sys.argv[1:]))
