"""Stitching timed against the bundled ffmpeg alone: `stitch.py`'s wall and CPU time on a LeRobot folder against
decoding its camera segments plus encoding the same grid frames with the same x264 settings. One JSON line.

    python benchmarks/stitch_bench.py tests/data/lerobot_v21_tiny [--rounds 3] [stitch.py's options: --size, --frames, ...]
"""
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository's modules
from base import cli  # noqa: E402
from base.lerobot import SLOTS, open_source  # noqa: E402
from base.video import ffmpeg_exe  # noqa: E402
from stitch import (  # noqa: E402
    StitchConfig,
    episode_command,
    fit_policy,
    load_records,
    make_config,
    parse_size,
    segment_input,
    stitch,
    x264_args,
)


def bench(src: str, rounds: int = 3, **overrides) -> dict:
    """Time stitch() (one worker) on src against the bundled ffmpeg alone: decoding the three camera segments of
    every written episode to null plus encoding the same grid frames (from raw frames in a file) with the same x264
    settings. Also timed: our ffmpeg command without our checks (the cost of verification). The runs alternate for
    `rounds` rounds and the medians are reported, as the machine may be shared."""
    overrides = {"workers": 1, **overrides}
    cfg, source = make_config(overrides), open_source(src, overrides.get("cameras", ""))
    H, W = parse_size(cfg.size)
    by_index = {e.index: e for e in source.episodes}

    def timed(work) -> tuple:  # (wall s, cpu s of this process and its finished children)
        cpu = lambda: sum(resource.getrusage(resource.RUSAGE_CHILDREN)[:2]) + sum(resource.getrusage(resource.RUSAGE_SELF)[:2])  # noqa
        t0, c0 = time.perf_counter(), cpu()
        work()
        return time.perf_counter() - t0, cpu() - c0

    run_all = lambda commands: [subprocess.run(a, check=True, stdout=subprocess.DEVNULL) for a in commands]  # noqa
    times = {"stitch": [], "decode": [], "encode": [], "graph_unchecked": []}
    with tempfile.TemporaryDirectory(prefix="stitch-bench-") as tmp:
        for r in range(rounds):
            out = os.path.join(tmp, f"out{r}")
            times["stitch"].append(timed(lambda: stitch(src, out, **overrides)))
            written = load_records(os.path.join(out, "manifest.jsonl"), lambda rec: True)
            eps = [by_index[rec["episode_index"]] for rec in written.values()]
            fits = {s: fit_policy(cfg, source.cam_hw[s], (H // 2, W // 2)) for s in SLOTS}
            quiet = ["-loglevel", "error"]
            decode = [[ffmpeg_exe(), *quiet, *segment_input(*ep.segments[s][:2], ep.length, source.fps), "-map",
                       "0:v:0", "-f", "null", "-"] for ep in eps for s in SLOTS]
            raw = [os.path.join(tmp, f"{ep.index}.yuv") for ep in eps]  # the grid frames, made outside the timing
            run_all(episode_command(ep, source, cfg, fits, [*quiet, "-f", "rawvideo", "-pix_fmt", "yuv420p", "-y",
                                                            path], False) for ep, path in zip(eps, raw))
            encode = [[ffmpeg_exe(), *quiet, "-f", "rawvideo", "-pix_fmt", "yuv420p", "-s", f"{W}x{H}", "-framerate",
                       str(source.fps / cfg.stride), "-i", path, *x264_args(cfg.crf, cfg.preset), "-f", "mp4", "-y",
                       path + ".mp4"] for path in raw]
            unchecked = [episode_command(ep, source, cfg, fits, [*quiet, *x264_args(cfg.crf, cfg.preset), "-f", "mp4",
                                                              "-y", os.path.join(tmp, "g.mp4")], False) for ep in eps]
            for name, commands in (("decode", decode), ("encode", encode), ("graph_unchecked", unchecked)):
                times[name].append(timed(lambda: run_all(commands)))
    med = {k: np.median(np.array(v), axis=0) for k, v in times.items()}  # (wall, cpu)
    base = med["decode"] + med["encode"]
    result = {"source": source.name, "episodes_written": len(written), "grid_frames": sum(r["n_out"] for r in
              written.values()), "size": cfg.size, "stride": cfg.stride, "preset": cfg.preset, "crf": cfg.crf,
              "rounds": rounds, "cpus": os.cpu_count(),
              **{f"{k}_{unit}_s": round(float(v[i]), 2) for k, v in med.items() for i, unit in enumerate(("wall", "cpu"))},
              "ratio_wall": round(float(med["stitch"][0] / base[0]), 3),
              "ratio_cpu": round(float(med["stitch"][1] / base[1]), 3)}
    print(json.dumps(result))
    return result


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    rounds = 3
    if "--rounds" in args:
        i = args.index("--rounds")
        rounds = int(args[i + 1])
        del args[i: i + 2]
    given = cli.parse_flags(StitchConfig, args, description=__doc__, positional=("src",), prog="stitch_bench.py")
    if not given.get("src"):
        raise ValueError("give SRC, a LeRobot folder (see --help)")
    bench(given.pop("src"), rounds, **given)
    return 0


if __name__ == "__main__":
    cli.main(main, user_errors=(ValueError, OSError))
