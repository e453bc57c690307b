"""Writing a LeRobot v2.1 dataset from episodes held in memory: per episode, each camera's frames and the per-frame
columns (observation.state, action, ...), written as lerobot's files (meta/info.json, tasks.jsonl, episodes.jsonl,
episodes_stats.jsonl, one parquet and one H.264 mp4 per camera and episode), which base/lerobot.open_source reads.

    write_v21(OUT, [{"frames": {"observation.image": [T, H, W, 3] uint8}, "columns": {"observation.state": [T, S],
               "action": [T, A]}, "task": "Push the T.", "extra": {"behaviour": "expert"}}, ...], fps=10)

An episode's "extra" keys go into its episodes.jsonl line beside lerobot's own (readers ignore what they do not know):
tasks/pushtworld.py records each episode's behaviour family there. Built in a temporary folder and renamed at the
end, as make_synthetic does, so a killed run leaves no half dataset behind.
"""
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from base.lerobot import encode, episode_stats, finish_v21

DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"


def features_of(episode: dict, fps: int, names: dict) -> dict:
    """info.json's features of an episode's cameras and columns (names: column -> its dims' names)."""
    features = {}
    for key, frames in episode["frames"].items():
        h, w = frames.shape[1:3]
        features[key] = {"dtype": "video", "shape": [h, w, 3], "names": ["height", "width", "channels"],
                         "info": {"video.height": h, "video.width": w, "video.codec": "h264",
                                  "video.pix_fmt": "yuv420p", "video.is_depth_map": False, "video.fps": fps,
                                  "video.channels": 3, "has_audio": False}}
    for key, values in episode["columns"].items():
        width = values.shape[1]
        features[key] = {"dtype": "float32", "shape": [width], "names": names.get(key, [f"{key}_{i}" for i in
                                                                                       range(width)])}
    scalar = lambda dtype: {"dtype": dtype, "shape": [1], "names": None}  # noqa: E731
    features["timestamp"] = scalar("float32")
    features.update({k: scalar("int64") for k in ("frame_index", "episode_index", "index", "task_index")})
    return features


def write_v21(out: str, episodes: list, fps: int, robot_type: str = "", names: dict | None = None) -> str:
    """Write `episodes` (module docstring) as a LeRobot v2.1 dataset in out (a new folder); every episode has the same
    cameras and columns, of the same widths. names: column -> its dims' names for info.json."""
    if os.path.exists(out):
        raise FileExistsError(f"{out} exists; write_v21 never writes into an existing folder")
    if not episodes:
        raise ValueError(f"write_v21 {out}: no episodes")
    features = features_of(episodes[0], fps, names or {})
    for i, ep in enumerate(episodes):
        lengths = {len(v) for v in [*ep["frames"].values(), *ep["columns"].values()]}
        if features_of(ep, fps, names or {}) != features or len(lengths) != 1:
            raise ValueError(f"write_v21 {out}: episode {i} has other cameras, columns or widths than episode 0, "
                             f"or frames and columns of different lengths ({sorted(lengths)})")
    tasks = list(dict.fromkeys(ep["task"] for ep in episodes))
    lengths = [len(next(iter(ep["columns"].values()))) for ep in episodes]
    info = {"codebase_version": "v2.1", "robot_type": robot_type, "total_episodes": len(episodes),
            "total_frames": sum(lengths), "total_tasks": len(tasks),
            "total_videos": len(episodes) * len(episodes[0]["frames"]), "total_chunks": 1, "chunks_size": 1000,
            "fps": fps, "splits": {"train": f"0:{len(episodes)}"}, "data_path": DATA_PATH, "video_path": VIDEO_PATH,
            "features": features}
    if len(episodes) > info["chunks_size"]:
        raise ValueError(f"write_v21 {out}: {len(episodes)} episodes; this writer fills one chunk of 1000")
    tmp = f"{out}.tmp-{os.getpid()}"
    for sub in ["meta", "data/chunk-000"] + [f"videos/chunk-000/{key}" for key in episodes[0]["frames"]]:
        os.makedirs(os.path.join(tmp, sub))
    meta = {"episodes": [], "tasks": [{"task_index": i, "task": t} for i, t in enumerate(tasks)],
            "episodes_stats": []}
    for ep, (episode, length) in enumerate(zip(episodes, lengths)):
        t = np.arange(length)
        cols = {**{k: np.asarray(v, np.float32) for k, v in episode["columns"].items()},
                "timestamp": (t / fps).astype(np.float32), "frame_index": t, "episode_index": np.full(length, ep),
                "index": sum(lengths[:ep]) + t, "task_index": np.full(length, tasks.index(episode["task"]))}
        vector = lambda v: pa.FixedSizeListArray.from_arrays(pa.array(v.ravel()), v.shape[1])  # noqa: E731
        pq.write_table(pa.table({k: vector(v) if v.ndim == 2 else v for k, v in cols.items()}),
                       os.path.join(tmp, DATA_PATH.format(episode_chunk=0, episode_index=ep)))
        for key, frames in episode["frames"].items():
            encode(os.path.join(tmp, VIDEO_PATH.format(episode_chunk=0, video_key=key, episode_index=ep)),
                   list(np.asarray(frames, np.uint8)), fps)
        meta["episodes"].append({"episode_index": ep, "tasks": [episode["task"]], "length": length,
                                 **episode.get("extra", {})})
        meta["episodes_stats"].append(episode_stats(ep, cols, length))
    return finish_v21(tmp, out, meta, info)
