"""Video files through the bundled ffmpeg (imageio-ffmpeg): the executable and its codecs, probing a file, sha1.

stitch.py writes videos with these and verifies them; data.py checks them at first use.
"""
import hashlib
import re
import subprocess

import imageio_ffmpeg


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


def sha1_file(path: str) -> str:
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
