"""Video files through the bundled ffmpeg (imageio-ffmpeg): the executable and its codecs, probing, sha1, reading.

stitch.py writes videos with these and verifies them; clips/data.py checks them at first use and reads its clips with
read_clip (the exact frames, never resized unless asked). Also the one atomic file write (write_atomic) of
stitch.py's manifests and engine/resume.py's / cache.py's run files: a leaf every writer can import.
"""
import os
import re
import subprocess
import tempfile

import imageio_ffmpeg
import numpy as np
import torch


def cell_filter(src_hw: tuple, cell_hw: tuple, fit: str) -> str:
    """ffmpeg's filter fitting a camera of src_hw into a grid cell of cell_hw (fit: stretch or pad), as stitch.py
    writes every grid and tasks/square.py renders its true frames."""
    (sh, sw), (ch, cw) = src_hw, cell_hw
    flags = "area" if sh >= ch and sw >= cw else "bicubic"  # area when shrinking, bicubic when enlarging
    if fit == "stretch":
        return f"scale={cw}:{ch}:flags={flags},format=yuv420p"
    return (f"scale={cw}:{ch}:force_original_aspect_ratio=decrease:force_divisible_by=2:flags={flags},"
            f"format=yuv420p,pad={cw}:{ch}:(ow-iw)/2:(oh-ih)/2:black")


def fit_of(fit: str, src_hw: tuple, cell_hw: tuple) -> str:
    """stitch.py's --fit for one camera: auto stretches when the aspect is within 5% of the cell's, else pads."""
    if fit != "auto":
        return fit
    return "stretch" if abs(src_hw[1] / src_hw[0] / (cell_hw[1] / cell_hw[0]) - 1) <= 0.05 else "pad"


def ffmpeg_exe() -> str:
    return imageio_ffmpeg.get_ffmpeg_exe()  # honours IMAGEIO_FFMPEG_EXE


def check_ffmpeg():
    """Sources need a software AV1 decoder (LeRobot writes AV1; ffmpeg's native av1 is hwaccel-only), output libx264."""
    run = lambda what: subprocess.run([ffmpeg_exe(), "-hide_banner", what], capture_output=True, text=True).stdout  # noqa
    if not re.search(r"\b(libdav1d|libaom-av1)\b", run("-decoders")):
        raise RuntimeError(f"{ffmpeg_exe()} has no libdav1d / libaom-av1 decoder; upgrade imageio-ffmpeg")
    if not re.search(r"\blibx264\b", run("-encoders")):
        raise RuntimeError(f"{ffmpeg_exe()} has no libx264 encoder; point IMAGEIO_FFMPEG_EXE to one that has")


def probe_video(path: str, decode: bool = True) -> dict:
    """Frame count, codec and size of a video's first stream; decode=False counts packets without decoding."""
    args = [ffmpeg_exe(), "-hide_banner", "-nostdin", "-nostats", "-progress", "pipe:1", "-threads", "1",
            "-i", path, "-map", "0:v:0", *([] if decode else ["-c", "copy"]), "-f", "null", "-"]
    proc = subprocess.run(args, capture_output=True, text=True, errors="replace")
    stream = re.search(r"Stream #0:\d+.*?: Video: (\w+).*?, (\d+)x(\d+)", proc.stderr)
    frames = re.findall(r"^frame=(\d+)", proc.stdout, re.M)
    errors = [line for line in proc.stderr.splitlines() if "rror" in line or "nvalid" in line]
    if proc.returncode != 0 or not stream or not frames or errors:
        raise RuntimeError(f"{path}: unreadable (ffmpeg rc {proc.returncode}): "
                           f"{(errors or proc.stderr.strip().splitlines() or ['no output'])[-1]}")
    return {"frames": int(frames[-1]), "codec": stream[1], "height": int(stream[3]), "width": int(stream[2])}


class ClipError(Exception):
    """A video that cannot give a clip: the sample moves on to the next video. The message starts with the reason."""


def read_clip(path: str, start: int, frames: int, height: int, width: int, fit: str = "exact") -> np.ndarray:
    """Frames start .. start+frames-1 as uint8 [frames, height, width, 3] RGB. ClipError (the message starts with the
    reason) when they aren't all there (truncated), when the decoder logs an error although ffmpeg exits 0
    (decode_error), or with fit="exact" when the video is not height x width (wrong_size).

    fit="exact" (GridClips) gives the video's own pixels, never resized. "stretch" (like the upstream loader) and
    "crop" (keeps the aspect, centre-crops) resize on purpose, for callers that ask for it. Selecting by frame number
    (not time) makes the window exact; our videos are short, so decoding from frame 0 costs little."""
    if fit not in ("exact", "stretch", "crop"):
        raise ValueError(f"fit={fit!r}: expected exact, stretch or crop")
    scale = {"exact": "", "stretch": f",scale={width}:{height}:flags=bilinear",
             "crop": f",scale={width}:{height}:force_original_aspect_ratio=increase:flags=bilinear,"
                     f"crop={width}:{height}"}[fit]
    # level+info: every log line carries its level, so decode errors are told apart from the stream description
    args = [ffmpeg_exe(), "-hide_banner", "-nostdin", "-nostats", "-loglevel", "level+info", "-threads", "2",
            "-i", path, "-map", "0:v:0", "-vf", f"select='gte(n,{start})'{scale}", "-frames:v", str(frames),
            "-fps_mode", "passthrough", "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1"]
    clip = np.empty((frames, height, width, 3), np.uint8)
    with tempfile.TemporaryFile() as log:  # a file, not a pipe: a flood of decode errors can't block ffmpeg
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log)
        view, got = memoryview(clip).cast("B"), 0
        with proc.stdout:
            while got < len(view) and (n := proc.stdout.readinto(view[got:])):
                got += n
            extra = proc.stdout.read(1)  # ffmpeg stops after `frames`; anything more would be a bug
        rc = proc.wait()
        log.seek(0)
        text = log.read().decode(errors="replace")
    stream = re.search(r"Stream #0:\d+.*?: Video: .*?, (\d+)x(\d+)", text)  # the input's, listed before the output's
    if fit == "exact" and stream and (int(stream[2]), int(stream[1])) != (height, width):
        raise ClipError(f"wrong_size: {path} is {stream[2]}x{stream[1]}, expected {height}x{width}")
    errors = [line for line in text.splitlines() if re.search(r"\[(error|fatal|panic)\]", line)]
    if rc != 0 or got != len(view) or extra:
        raise ClipError(f"truncated: decoded {got // (height * width * 3)} of {frames} frames from frame {start} "
                        f"(ffmpeg rc {rc}{': ' + errors[-1] if errors else ''})")
    if errors:
        raise ClipError(f"decode_error: {len(errors)} error line(s) decoding frames {start}..{start + frames - 1} "
                        f"(ffmpeg rc 0): {errors[0]}")
    return clip


def write_mp4(path, video_3_T_H_W, fps=16):
    """Write a [3,T,H,W] video in [-1,1] as H.264 mp4 (yuv420p: sides rounded down to even)."""
    import imageio.v2 as imageio
    frames = ((video_3_T_H_W.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    frames = frames.permute(1, 2, 3, 0).cpu().numpy()  # [T,H,W,3]
    H, W = frames.shape[1] // 2 * 2, frames.shape[2] // 2 * 2
    tmp = path + ".tmp.mp4"
    with imageio.get_writer(tmp, fps=fps, codec="libx264", quality=8, pixelformat="yuv420p",
                            macro_block_size=1) as writer:
        for frame in frames[:, :H, :W]:
            writer.append_data(frame)
    os.replace(tmp, path)  # a reader never sees a half-written file
    return path
