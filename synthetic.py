"""Synthetic LeRobot datasets for the tiny default and the tests: no downloads, every frame readable.

    python stitch.py --synthetic OUT    # make_synthetic(OUT): 4 episodes, 3 DROID cameras, LeRobot v2.1, H.264

Every frame shows code_frame: its camera's colour and, as white/black bit blocks, the episode, the camera and the
frame_index (the code of tests/data/*/README.md), so a test can read back which camera and source frame ended up
where. make_synthetic(..., cameras=True) also writes each camera's parameters per frame (synthetic_w2c), for
`stitch.py --layout views` (docs/multiview.md).
"""
import json
import os
import subprocess
import tempfile

import imageio_ffmpeg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

CAMERA_COLOURS = {1: (200, 30, 30), 2: (30, 170, 30), 3: (30, 60, 200)}  # as in tests/data/*/README.md
SYNTHETIC_TASKS = ('Put the marker, then the cap, in the "blue" cup.', "Öffne die Schublade — langsam!")


def code_frame(episode: int, camera: int, frame_index: int, height: int, width: int) -> np.ndarray:
    """The frame code of tests/data/*/README.md, scaled from 180x320: camera colour; white/black bit blocks for the
    episode (4 bits), camera (2) and sync 1010 on the top band and frame_index (10) on the bottom; a moving square."""
    img = np.empty((height, width, 3), np.uint8)
    img[:] = CAMERA_COLOURS[camera]
    sx, sy = width / 320, height / 180
    bits = lambda value, n: [(value >> (n - 1 - i)) & 1 for i in range(n)]  # noqa: E731 (MSB first)
    for y0, y1, values in ((8, 40, bits(episode % 16, 4) + bits(camera, 2) + [1, 0, 1, 0]),
                           (136, 172, bits(frame_index % 1024, 10))):
        for k, bit in enumerate(values):
            img[round(y0 * sy):round(y1 * sy), round((32 * k + 4) * sx):round((32 * k + 28) * sx)] = 255 * bit
    x0 = 8 + 8 * (frame_index % 36)
    img[round(78 * sy):round(102 * sy), round(x0 * sx):round((x0 + 24) * sx)] = (255, 255, 0)
    return img


def encode(path: str, frames: list, fps) -> None:
    """Write RGB frames [H,W,3] uint8 as an H.264 (x264 veryfast, crf 18, yuv420p) mp4."""
    height, width = frames[0].shape[:2]
    args = [imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-nostdin", "-nostats", "-loglevel", "error", "-f",
            "rawvideo", "-pix_fmt", "rgb24", "-s", f"{width}x{height}", "-framerate", str(fps), "-i", "pipe:0", "-an",
            "-c:v", "libx264", "-preset", "veryfast", "-crf", "18", "-pix_fmt", "yuv420p", "-threads", "2", "-f",
            "mp4", "-y", path]
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.run(args, input=b"".join(f.tobytes() for f in frames), stderr=log)
        log.seek(0)
        if proc.returncode != 0:
            raise RuntimeError(f"encoding {path} failed: {' | '.join(log.read().strip().splitlines()[-3:])}")


def synthetic_w2c(camera: int, frame_index: np.ndarray) -> np.ndarray:
    """World -> camera [n,3,4] (OpenCV axes) of make_synthetic's camera 1-3: the exterior cameras stand left and right
    in front of the workspace, the wrist camera circles above it; all look at its centre (the world origin)."""
    k = np.asarray(frame_index, np.float64)
    eye = {1: np.tile([-0.6, -0.6, 0.5], (len(k), 1)), 2: np.tile([0.6, -0.6, 0.5], (len(k), 1)),
           3: np.stack([0.2 * np.cos(k / 8), 0.2 * np.sin(k / 8), np.full_like(k, 0.6)], -1)}[camera]
    z = -eye / np.linalg.norm(eye, axis=-1, keepdims=True)  # forward, towards the origin
    x = np.cross(z, [0.0, 0.0, 1.0])
    x /= np.linalg.norm(x, axis=-1, keepdims=True)  # right (world z is up, so image y points down)
    rot = np.stack([x, np.cross(z, x), z], -2)  # rows: the camera's axes in world coordinates
    return np.concatenate([rot, -rot @ eye[..., None]], -1)


def make_synthetic(out: str, lengths=(72, 60, 8, 84), height: int = 90, width: int = 160, fps: int = 15,
                   cameras: bool = False) -> str:
    """Write a LeRobot v2.1 dataset (lerobot's files, H.264 video) with 3 DROID cameras showing code_frame; with
    cameras, each frame also carries every camera's parameters (sensors.<name>.extrinsic_cv from synthetic_w2c and
    sensors.<name>.intrinsic_cv: a pinhole with fx = fy = 0.8 width, centred), for --layout views.

    Tasks alternate between two strings with commas, quotes and non-ASCII; the 8-frame episode is too short for any
    clip. Built in a temporary folder and renamed at the end, so a killed run leaves no half dataset behind."""
    if os.path.exists(out):
        raise FileExistsError(f"{out} exists; make_synthetic never writes into an existing folder")
    tmp = f"{out}.tmp-{os.getpid()}"
    cams = [f"observation.images.{c}" for c in ("exterior_1_left", "exterior_2_left", "wrist_left")]
    scalar = lambda dtype: {"dtype": dtype, "shape": [1], "names": None}  # noqa: E731
    video = {"dtype": "video", "shape": [height, width, 3], "names": ["height", "width", "channels"],
             "info": {"video.height": height, "video.width": width, "video.codec": "h264", "video.pix_fmt": "yuv420p",
                      "video.is_depth_map": False, "video.fps": fps, "video.channels": 3, "has_audio": False}}
    info = {"codebase_version": "v2.1", "robot_type": "droid", "total_episodes": len(lengths),
            "total_frames": sum(lengths), "total_tasks": len(SYNTHETIC_TASKS), "total_videos": 3 * len(lengths),
            "total_chunks": 1, "chunks_size": 1000, "fps": fps, "splits": {"train": f"0:{len(lengths)}"},
            "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
            "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
            "features": {**{c: video for c in cams},
                         **{k: {"dtype": "float32", "shape": [8], "names": [f"joint_{i}" for i in range(8)]}
                            for k in ("observation.state", "action")}, "timestamp": scalar("float32"),
                         **{k: scalar("int64") for k in ("frame_index", "episode_index", "index", "task_index")}}}
    params = {f"sensors.{c.split('.')[-1]}.{kind}_cv": (i, kind) for i, c in enumerate(cams, 1)
              for kind in ("extrinsic", "intrinsic")} if cameras else {}
    info["features"].update({col: {"dtype": "float32", "shape": [3, 4 if kind == "extrinsic" else 3], "names": None}
                             for col, (_, kind) in params.items()})
    for sub in ["meta", "data/chunk-000"] + [f"videos/chunk-000/{c}" for c in cams]:
        os.makedirs(os.path.join(tmp, sub))
    meta = {"episodes": [], "tasks": [{"task_index": i, "task": t} for i, t in enumerate(SYNTHETIC_TASKS)],
            "episodes_stats": []}
    for ep, length in enumerate(lengths):
        t, task_index = np.arange(length), ep % len(SYNTHETIC_TASKS)
        state = (np.sin(t[:, None] / 10 + np.arange(8)) / 2).astype(np.float32)
        cols = {"observation.state": state, "action": np.roll(state, -1, axis=0),
                "timestamp": (t / fps).astype(np.float32), "frame_index": t, "episode_index": np.full(length, ep),
                "index": sum(lengths[:ep]) + t, "task_index": np.full(length, task_index)}
        pinhole = np.array([[0.8 * width, 0, width / 2], [0, 0.8 * width, height / 2], [0, 0, 1]], np.float32)
        cols.update({col: synthetic_w2c(i, t).astype(np.float32) if kind == "extrinsic" else
                     np.tile(pinhole, (length, 1, 1)) for col, (i, kind) in params.items()})
        pq.write_table(pa.table({k: pa.FixedSizeListArray.from_arrays(pa.array(v.ravel()), 8) if v.ndim == 2 else
                                 pa.array(v.tolist()) if v.ndim == 3 else v for k, v in cols.items()}),
                       os.path.join(tmp, info["data_path"].format(episode_chunk=0, episode_index=ep)))
        for camera, key in enumerate(cams, 1):
            path = os.path.join(tmp, info["video_path"].format(episode_chunk=0, video_key=key, episode_index=ep))
            encode(path, [code_frame(ep, camera, k, height, width) for k in range(length)], fps)
        meta["episodes"].append({"episode_index": ep, "tasks": [SYNTHETIC_TASKS[task_index]], "length": length})
        meta["episodes_stats"].append({"episode_index": ep, "stats": {k: {
            "min": v.min(0).tolist(), "max": v.max(0).tolist(), "mean": v.mean(0).tolist(), "std": v.std(0).tolist(),
            "count": [length]} for k, v in cols.items()}})
    for name, rows in meta.items():
        with open(os.path.join(tmp, "meta", name + ".jsonl"), "w", encoding="utf-8", newline="") as f:
            f.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    with open(os.path.join(tmp, "meta", "info.json"), "w", encoding="utf-8", newline="") as f:
        f.write(json.dumps(info, indent=4))
    os.rename(tmp, out)
    return out
