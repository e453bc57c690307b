"""Reading LeRobot datasets, format v2.0, v2.1 or v3.0 (decided from the files present, not the version string).

The metadata (info.json, episodes, tasks) becomes a Source with one Episode per episode: its parquet file and, per
camera slot, the mp4 and the time span that hold it. open_source checks the frame tables' columns up front (every
v3.0 data file; the first v2.x file, since one writer wrote them all: reading 70k parquet footers would cost minutes);
per episode, check_frames_table checks its parquet rows (and its columns again).

Camera slots are found through an alias table (CAMERA_ALIASES; `--cameras` overrides it); a slot is never left
unfilled. stitch.py lays the slots out as a grid (or writes them as separate views) and does all the video work.

Camera parameters (for the multi-view layout's Pluecker rays), when the dataset carries them, are found per camera by
its name (the last dotted part of its video key) in two conventions (sources in docs/multiview.md):
  droid: `camera_extrinsics.<name>` float[6] = [x, y, z, roll, pitch, yaw], the camera's pose in the robot base frame
    (camera -> base, metres), R = Rz(yaw) Ry(pitch) Rx(roll) (scipy's from_euler("xyz")), as lerobot's DROID port
    writes it, copied from the RLDS episode metadata into every frame. For the wrist camera that is its pose at frame
    0 (DROID's metadata takes the first step); where it is constant and the table has EE_POSE_COLUMN, the camera is
    moved with the gripper: T_base_cam(t) = T_base_ee(t) T_base_ee(0)^-1 T_base_cam(0), as DROID computed it while
    recording (the hand-eye offset is fixed). No intrinsics: stitch.py --camera-params gives them.
  cv: `sensors.<name>.extrinsic_cv` float[3,4] (world -> camera, OpenCV axes: x right, y down, z forward) and
    `sensors.<name>.intrinsic_cv` float[3,3] (in pixels of the stored frames), as ManiSkill exports write them.

Writing them too, synthetic ones, for the tiny default and the tests (no downloads, every frame readable):
    python stitch.py --synthetic OUT    # make_synthetic(OUT): 4 episodes, 3 DROID cameras, LeRobot v2.1, H.264
Every frame shows code_frame: its camera's colour and, as white/black bit blocks, the episode, the camera and the
frame_index (the code of tests/data/*/README.md), so a test can read back which camera and source frame ended up
where. make_synthetic(..., cameras=True) also writes each camera's parameters per frame (synthetic_w2c), for
`stitch.py --layout views` (docs/multiview.md).

Contents, top to bottom: records -> metadata -> per episode -> camera parameters -> synthetic datasets.
"""
import dataclasses
import json
import os
import re
import subprocess
import tempfile
from collections import Counter
from fractions import Fraction

import imageio_ffmpeg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from base.squareworld import (ACTION_SQUARE, BEHAVIOURS, COMMAND_DX, COMMAND_DY, SQUARE_RANGE, orbit_command,  # noqa: F401
                              check_behaviours, episode_behaviour, square_commands)

SLOTS = ("ext_1", "ext_2", "wrist")  # stitch.py's grid: top-left, top-right, bottom-left; bottom-right stays black

# Camera names per slot, matched against the last dotted part of a feature key, best first (specs/data.md 1.4).
CAMERA_ALIASES = {"ext_1": ("exterior_1_left", "exterior_image_1_left", "robot0_agentview_left"),
                  "ext_2": ("exterior_2_left", "exterior_image_2_left", "robot0_agentview_right"),
                  "wrist": ("wrist_image_left", "wrist_left", "robot0_eye_in_hand")}
PLACEHOLDER_TASKS = {"", "none", "null", "nan", "n/a"}
LANGUAGE_COLUMNS = ("language_instruction", "language_instruction_2", "language_instruction_3")
EE_POSE_COLUMN = "observation.state.cartesian_position"  # DROID port: gripper pose in the base frame, [xyz, Euler xyz]


@dataclasses.dataclass(kw_only=True)
class Episode:
    index: int
    length: int  # parquet rows
    tasks: list  # task strings of the episode metadata (only --per-task uses them)
    data_path: str
    segments: dict  # slot -> (mp4 path, from_timestamp, to_timestamp)


@dataclasses.dataclass(kw_only=True)
class Source:
    root: str
    name: str
    layout: str  # "v2" (v2.0 / v2.1) or "v3"
    fps: Fraction
    cams: dict  # slot -> feature key
    cam_hw: dict  # slot -> (height, width) from info.json
    task_table: dict  # task_index -> task string
    episodes: list
    cam_params: dict | None = None  # slot -> (convention, extrinsics column, intrinsics column or None); None: none
    features: dict = dataclasses.field(default_factory=dict)  # info.json's features (base/actions.py reads action/state)


# ------------------------------------------------------------------------------------------------------ metadata

def unstitched(root: str, flag: str = "--data", frames: int = 0, height: int = 0, width: int = 0,
               views: bool | None = None) -> str | None:
    """The one-line refusal for a raw LeRobot dataset (meta/info.json, no manifest.jsonl) given where a stitched
    folder is read, naming the stitch.py command that makes one at the run's clip size (frames, height, width: the
    config's; 0 = not known, the command then says so) and layout (views: a multi-view config; None = not known);
    None for anything else."""
    if not os.path.isfile(os.path.join(root, "meta", "info.json")) or \
            os.path.isfile(os.path.join(root, "manifest.jsonl")):
        return None
    out = os.path.normpath(root) + ("_views" if views else "_grid")
    known = frames and height and width
    command = (f"python stitch.py {root} {out}{' --layout views' * bool(views)} --size "
               + (f"{height}x{width} --frames {frames}" if known else "HxW --frames N"))
    notes = [] if known else ["HxW and N: your config's clip; without them stitch.py writes 93x432x768"]
    notes += ["multi-view configs: --layout views"] if views is None else []
    note = f" ({'; '.join(notes)})" if notes else ""
    return (f"{flag} {root} is a LeRobot dataset (meta/info.json), not a stitched folder: run stitch.py first, "
            f"`{command}`{note}, then pass {flag} {out}")


class BadParquet(ValueError):
    """A parquet file pyarrow cannot read (truncated, corrupt, not parquet); the message names the file."""


def read_parquet(path: str, schema: bool = False, **kwargs):
    """pq.read_schema(path) (schema=True) or pq.read_table(path, **kwargs); a damaged file is a BadParquet naming
    it and pyarrow's reason, not a bare pyarrow error (which names no file)."""
    try:
        return pq.read_schema(path) if schema else pq.read_table(path, **kwargs)
    except (pa.ArrowException, OSError) as e:  # ArrowInvalid (bad footer) is a ValueError, a bad page an OSError
        if isinstance(e, FileNotFoundError):
            raise
        raise BadParquet(f"{path}: damaged or unreadable parquet file (pyarrow: {' '.join(str(e).split())}); "
                         "re-download or re-export it, then rerun") from None


def missing_columns(names: list, layout: str) -> str | None:
    """What a frame table lacks for stitching, or None: frame_index, timestamp, episode_index (v3.0 files hold many
    episodes), and a task (task_index or a language column)."""
    need = ["frame_index", "timestamp"] + (["episode_index"] if layout == "v3" else [])
    missing = [c for c in need if c not in names]
    if not any(c in names for c in ("task_index",) + LANGUAGE_COLUMNS):
        missing.append(f"task_index (or one of {', '.join(LANGUAGE_COLUMNS)})")
    return ", ".join(missing) or None


def read_jsonl(path: str) -> list:
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                rows += [json.loads(line)] if line.strip() else []
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON ({e})") from None
    return rows


def resolve_cameras(features: dict, override: str, where: str) -> dict:
    videos = sorted(k for k, v in features.items() if v.get("dtype") == "video")
    images = sorted(k for k, v in features.items() if v.get("dtype") == "image")
    cams = dict(item.split("=", 1) for item in override.split(",")) if override else {}
    if override and sorted(cams) != sorted(SLOTS):
        raise ValueError(f"--cameras {override!r}: give each of the slots {SLOTS} once, as slot=KEY")
    for slot, aliases in CAMERA_ALIASES.items():
        for alias in aliases if slot not in cams else ():
            hits = [k for k in videos + images if k.split(".")[-1] == alias]
            if len(hits) > 1:
                raise ValueError(f"{where}: camera slot {slot} is ambiguous: {hits}; pass --cameras")
            if hits:
                cams[slot] = hits[0]
                break
        if slot not in cams:
            raise ValueError(f"{where}: no camera for grid slot {slot} (tried {aliases}); video features are "
                             f"{videos}. A slot is never left black: pass --cameras if it has another name")
        if cams[slot] not in videos:
            kind = "stored as images in the parquet" if cams[slot] in images else "not a video feature"
            raise ValueError(f"{where}: camera {cams[slot]!r} ({slot}) is {kind}; video features are {videos}")
    return cams


def camera_hw(feature: dict, key: str) -> tuple:
    dims = dict(zip(feature.get("names") or [], feature.get("shape") or []))  # by name: [H,W,C] and [C,H,W] occur
    if "height" not in dims or "width" not in dims:
        raise ValueError(f"feature {key}: no height/width in names={feature.get('names')} shape={feature.get('shape')}")
    return int(dims["height"]), int(dims["width"])


def open_source(src: str, cameras: str = "") -> Source:
    """Read a LeRobot v2.0 / v2.1 / v3.0 dataset's metadata; the layout comes from the files, not the version."""
    src = os.path.abspath(src)
    info_path = os.path.join(src, "meta", "info.json")
    if not os.path.isfile(info_path):
        raise FileNotFoundError(f"{info_path} not found: {src} is not a LeRobot v2/v3 dataset")
    with open(info_path, encoding="utf-8") as f:
        info = json.load(f)
    for key in ("fps", "features", "data_path", "video_path"):
        if info.get(key) is None:
            raise ValueError(f"{info_path}: {key!r} is missing or null")
    fps = Fraction(str(info["fps"])).limit_denominator(1001)
    cams = resolve_cameras(info["features"], cameras, info_path)
    path = lambda template, **kw: os.path.join(src, template.format(**kw))  # noqa: E731
    episodes = []
    if os.path.isfile(os.path.join(src, "meta", "episodes.jsonl")):
        layout, chunks = "v2", int(info.get("chunks_size", 1000))
        table = {int(r["task_index"]): r["task"] for r in read_jsonl(os.path.join(src, "meta", "tasks.jsonl"))}
        for row in read_jsonl(os.path.join(src, "meta", "episodes.jsonl")):
            ep, length, chunk = int(row["episode_index"]), int(row["length"]), int(row["episode_index"]) // chunks
            segs = {s: (path(info["video_path"], episode_chunk=chunk, video_key=k, episode_index=ep), 0.0,
                        float(length / fps)) for s, k in cams.items()}
            data = path(info["data_path"], episode_chunk=chunk, episode_index=ep)
            episodes.append(Episode(index=ep, length=length, tasks=list(row.get("tasks") or []), data_path=data,
                                    segments=segs))
    elif os.path.isdir(os.path.join(src, "meta", "episodes")):
        layout = "v3"
        # the task string is the pandas index column, whatever name it was stored under; re-index by task_index
        table = {int(r.pop("task_index")): next(iter(r.values()))
                 for r in read_parquet(os.path.join(src, "meta", "tasks.parquet")).to_pylist()}
        for file in sorted(os.path.join(d, n) for d, _, ns in os.walk(os.path.join(src, "meta", "episodes"))
                           for n in ns if n.endswith(".parquet")):
            columns = [c for c in read_parquet(file, schema=True).names if not c.startswith("stats/")]
            for row in read_parquet(file, columns=columns).to_pylist():
                segs = {}
                for s, k in cams.items():
                    if f"videos/{k}/from_timestamp" not in row:
                        raise ValueError(f"{file}: no column videos/{k}/from_timestamp for camera {k}")
                    v = lambda name: row[f"videos/{k}/{name}"]  # noqa: E731
                    segs[s] = (path(info["video_path"], video_key=k, chunk_index=v("chunk_index"),
                                    file_index=v("file_index")), v("from_timestamp"), v("to_timestamp"))
                data = path(info["data_path"], chunk_index=row["data/chunk_index"], file_index=row["data/file_index"])
                episodes.append(Episode(index=int(row["episode_index"]), length=int(row["length"]),
                                        tasks=list(row.get("tasks") or []), data_path=data, segments=segs))
    else:
        raise ValueError(f"{src}: has neither meta/episodes.jsonl (v2.x) nor meta/episodes/ (v3.0)")
    if not episodes:
        raise ValueError(f"{src}: the dataset lists no episodes")
    episodes.sort(key=lambda e: e.index)
    for file in [episodes[0].data_path] + [seg[0] for seg in episodes[0].segments.values()]:
        if not os.path.isfile(file):  # a broken template (e.g. a hard-coded camera) would skip every episode
            raise FileNotFoundError(f"{file} (episode {episodes[0].index}, templates of {info_path}) does not exist")
    for file in sorted({e.data_path for e in episodes}) if layout == "v3" else [episodes[0].data_path]:
        names = read_parquet(file, schema=True).names
        missing = missing_columns(names, layout)
        if missing:
            raise ValueError(f"{file}: the frame table has no column {missing} (columns: "
                             f"{names[:20]}); stitch.py needs LeRobot's frame_index, timestamp, "
                             "episode_index and task_index")
    name = re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(src))  # no commas: upstream splits metadata.csv on them
    cam_hw = {s: camera_hw(info["features"][k], k) for s, k in cams.items()}
    params = camera_columns(info["features"], cams, info_path)
    return Source(root=src, name=name, layout=layout, fps=fps, cams=cams, cam_hw=cam_hw, task_table=table,
                  episodes=episodes, cam_params=params, features=info["features"])


# ----------------------------------------------------------------------------------------------- per episode

def check_frames_table(ep: Episode, source: Source) -> tuple:
    """Check an episode's parquet rows and pick its task: (task, None) or (None, (reason, detail))."""
    if not os.path.isfile(ep.data_path):
        return None, ("missing_file", f"{ep.data_path} (episode {ep.index}'s frame table) does not exist")
    names = read_parquet(ep.data_path, schema=True).names  # a damaged file: BadParquet (stitch.py: bad_parquet)
    missing = missing_columns(names, source.layout)
    if missing:
        return None, ("missing_column", f"{ep.data_path}: the frame table has no column {missing}")
    cols = [c for c in ("frame_index", "timestamp", "task_index") + LANGUAGE_COLUMNS if c in names]
    filters = [("episode_index", "=", ep.index)] if source.layout == "v3" else None  # v3 files hold many episodes
    rows = read_parquet(ep.data_path, columns=cols, filters=filters).to_pydict()
    frame_index = np.asarray(rows["frame_index"])
    if not np.array_equal(frame_index, np.arange(ep.length)):
        return None, ("length_mismatch", f"{ep.data_path}: frame_index is not 0..{ep.length - 1}")
    # the parquet timestamp is float32; frame_index/fps is the canonical time
    error = float(np.max(np.abs(np.asarray(rows["timestamp"], np.float64) - frame_index / float(source.fps))))
    if error > 1e-3:
        return None, ("timestamp_error", f"{ep.data_path}: timestamps are up to {error:.4f}s off frame_index/fps")
    task = source.task_table.get(Counter(rows["task_index"]).most_common(1)[0][0], "") if "task_index" in rows else ""
    for col in LANGUAGE_COLUMNS:
        if task.strip().lower() in PLACEHOLDER_TASKS and col in rows:
            task = rows[col][0] or ""
    if task.strip().lower() in PLACEHOLDER_TASKS:
        return None, ("no_task", f"episode {ep.index}: task_index and language columns give no task")
    return task, None


def select_episodes(source: Source, cfg) -> list:
    """The episodes a stitch.StitchConfig asks for: those listed in cfg.episodes (a file), then the first
    cfg.per_task of each task; all when neither is set."""
    episodes = source.episodes
    if cfg.episodes:
        with open(cfg.episodes, encoding="utf-8") as f:
            tokens = f.read().replace(",", " ").split()
        if not all(t.isdigit() for t in tokens):
            raise ValueError(f"{cfg.episodes}: not episode indices: {[t for t in tokens if not t.isdigit()][:5]}")
        missing = sorted({int(t) for t in tokens} - {e.index for e in episodes})
        if missing:
            raise ValueError(f"{cfg.episodes}: episodes {missing[:10]} are not in {source.root}")
        episodes = [e for e in episodes if e.index in {int(t) for t in tokens}]
    if cfg.per_task:  # the first N episodes (by index) of each task, as the episode metadata names it
        seen, kept = Counter(), []
        for e in episodes:
            seen[tuple(e.tasks[:1])] += 1
            kept += [e] if seen[tuple(e.tasks[:1])] <= cfg.per_task else []
        episodes = kept
    return episodes



# ------------------------------------------------------------------------------------------ camera parameters

def camera_columns(features: dict, cams: dict, where: str) -> dict | None:
    """slot -> (convention, extrinsics column, intrinsics column or None) for the cameras whose parameters the frame
    table holds (module docstring); None when no camera has any. A column of another shape, or parameters for only
    some of the cameras (the others would get made-up rays), is a ValueError."""
    found = {}
    for slot, key in cams.items():
        name = key.split(".")[-1]
        droid, ext, intr = f"camera_extrinsics.{name}", f"sensors.{name}.extrinsic_cv", f"sensors.{name}.intrinsic_cv"
        for col, shape in ((droid, [6]), (ext, [3, 4]), (intr, [3, 3])):
            if col in features and list(features[col].get("shape") or []) != shape:
                raise ValueError(f"{where}: feature {col} has shape {features[col].get('shape')}, expected {shape} "
                                 "(see base/lerobot.py for the camera-parameter conventions read)")
        if (ext in features) != (intr in features):
            raise ValueError(f"{where}: {ext if ext in features else intr} without "
                             f"{intr if ext in features else ext}: a camera needs both")
        found.update({slot: ("cv", ext, intr)} if ext in features else
                     {slot: ("droid", droid, None)} if droid in features else {})
    if found and len(found) != len(cams):
        raise ValueError(f"{where}: camera parameters for {sorted(found)} but not for "
                         f"{sorted(set(cams) - set(found))}; pass --camera-params none to use the fallback rig for all")
    return found or None


def camera_summary(source: Source, camera_params) -> str:
    """The start-up line's camera part for --layout views; ValueError when the options and the dataset disagree."""
    conventions = {c for c, *_ in (source.cam_params or {}).values()}
    if camera_params == "none":
        return ("camera parameters: IGNORED (--camera-params none): no cameras/*.npz; data.ViewClips will use the "
                "fallback rig (docs/multiview.md)")
    if not conventions:
        if camera_params != "auto":
            raise ValueError(f"--camera-params: {source.root} has no camera extrinsics for these intrinsics to go "
                             "with; pass auto (the fallback rig at training) or none")
        return (f"camera parameters: NONE in {source.root} (no camera_extrinsics.* / sensors.*.extrinsic_cv "
                "columns): data.ViewClips will use the fallback rig (docs/multiview.md)")
    if "droid" in conventions and camera_params == "auto":
        raise ValueError(f"{source.root}: camera_extrinsics.* columns (lerobot's DROID port) hold no intrinsics: "
                         "pass --camera-params fx,fy,cx,cy@HxW (docs/multiview.md has DROID's), or none")
    if "droid" not in conventions and camera_params != "auto":
        raise ValueError(f"--camera-params: {source.root} has its own intrinsics (sensors.*.intrinsic_cv); pass "
                         "auto to use them, or none")
    cols = {s: c[1] for s, c in source.cam_params.items()}
    given = "" if camera_params == "auto" else f" with intrinsics {camera_params[0]} at {camera_params[1]} (HxW)"
    return f"camera parameters: REAL, per output frame, from {cols}{given}"


def euler_xyz_matrix(euler: np.ndarray) -> np.ndarray:
    """[..., 3] (roll, pitch, yaw) -> [..., 3, 3] = Rz(yaw) Ry(pitch) Rx(roll): scipy's from_euler("xyz")."""
    (ca, cb, cc), (sa, sb, sc) = np.cos(np.moveaxis(euler, -1, 0)), np.sin(np.moveaxis(euler, -1, 0))
    return np.stack([np.stack([cb * cc, sa * sb * cc - ca * sc, ca * sb * cc + sa * sc], -1),
                     np.stack([cb * sc, sa * sb * sc + ca * cc, ca * sb * sc - sa * cc], -1),
                     np.stack([-sb, sa * cb, ca * cb], -1)], -2)


def pose_matrix(pose: np.ndarray) -> np.ndarray:
    """[n, 6] (x, y, z, roll, pitch, yaw) -> [n, 4, 4] homogeneous transforms with R = euler_xyz_matrix."""
    out = np.tile(np.eye(4), (len(pose), 1, 1))
    out[:, :3, :3], out[:, :3, 3] = euler_xyz_matrix(pose[:, 3:]), pose[:, :3]
    return out


def read_cameras(ep: Episode, source: Source, frames: np.ndarray, intrinsics: tuple | None) -> dict:
    """slot -> (w2c [n,3,4] world -> camera (OpenCV axes), (fx, fy, cx, cy) [n,4] in pixels of the stored frames)
    at the frame_index values `frames`, float64. `intrinsics` ((fx, fy, cx, cy), (height, width) they refer to) is
    used for cameras whose convention has none (droid). ValueError (the message names the column) on values that
    are not finite, a rotation that is not one, or a focal length <= 0."""
    cols = sorted({c for _, *names in source.cam_params.values() for c in names if c})
    cols += [EE_POSE_COLUMN] if EE_POSE_COLUMN in read_parquet(ep.data_path, schema=True).names else []
    filters = [("episode_index", "=", ep.index)] if source.layout == "v3" else None
    table = read_parquet(ep.data_path, columns=cols, filters=filters)
    if table.num_rows != ep.length:
        raise ValueError(f"{ep.data_path}: {table.num_rows} rows of camera parameters for episode {ep.index}, "
                         f"the metadata says {ep.length}")
    out = {}
    for slot, (convention, ext_col, k_col) in source.cam_params.items():
        ext = np.asarray(table[ext_col].to_pylist(), np.float64)
        if convention == "droid":
            if intrinsics is None:
                raise ValueError(f"{ext_col}: this convention has no intrinsics; pass --camera-params fx,fy,cx,cy@HxW")
            cam = pose_matrix(ext[frames])  # camera -> base
            if slot == "wrist" and EE_POSE_COLUMN in cols and (ext == ext[0]).all():  # the port's one pose: frame 0's
                ee = pose_matrix(np.asarray(table[EE_POSE_COLUMN].to_pylist(), np.float64))
                cam = ee[frames] @ np.linalg.inv(ee[0]) @ cam
            rot = cam[:, :3, :3]  # invert: w2c = [R^T | -R^T t]
            w2c = np.concatenate([rot.swapaxes(-1, -2), -rot.swapaxes(-1, -2) @ cam[:, :3, 3:]], -1)
            (fx, fy, cx, cy), (kh, kw) = intrinsics
            (h, w) = source.cam_hw[slot]
            k = np.tile([fx * w / kw, fy * h / kh, cx * w / kw, cy * h / kh], (len(frames), 1))
        else:
            w2c, mat = ext[frames], np.asarray(table[k_col].to_pylist(), np.float64)[frames]
            k = np.stack([mat[:, 0, 0], mat[:, 1, 1], mat[:, 0, 2], mat[:, 1, 2]], -1)
        rot = w2c[:, :, :3]
        if not (np.isfinite(w2c).all() and np.isfinite(k).all()):
            raise ValueError(f"{ext_col}: non-finite camera parameters in episode {ep.index}")
        if np.abs(rot @ rot.swapaxes(-1, -2) - np.eye(3)).max() > 1e-3 or (np.linalg.det(rot) < 0).any():
            raise ValueError(f"{ext_col}: not a rotation (R R^T != I or det < 0) in episode {ep.index}")
        if (k[:, :2] <= 0).any():
            raise ValueError(f"{k_col or ext_col}: focal length <= 0 in episode {ep.index}")
        out[slot] = (w2c, k)
    return out


# -------------------------------------------------------------------------------------------- synthetic datasets

CAMERA_COLOURS = {1: (200, 30, 30), 2: (30, 170, 30), 3: (30, 60, 200)}  # as in tests/data/*/README.md
SYNTHETIC_TASKS = ('Put the marker, then the cap, in the "blue" cup.', "Öffne die Schublade — langsam!")


def code_frame(episode: int, camera: int, frame_index: int, height: int, width: int, square=None) -> np.ndarray:
    """The frame code of tests/data/*/README.md, scaled from 180x320: camera colour; white/black bit blocks for the
    episode (4 bits), camera (2) and sync 1010 on the top band and frame_index (10) on the bottom; a square sweeping
    right. With `square` (x, y) (make_synthetic's motion="actions"): the camera colour and an ACTION_SQUARE square, its
    top-left corner there in 320x180 pixels, nothing else (ACTION_SQUARE says why)."""
    img = np.empty((height, width, 3), np.uint8)
    img[:] = CAMERA_COLOURS[camera]
    sx, sy = width / 320, height / 180
    if square is not None:
        (x0, y0), size = square, ACTION_SQUARE
        img[round(y0 * sy):round((y0 + size) * sy), round(x0 * sx):round((x0 + size) * sx)] = (255, 255, 0)
        return img
    bits = lambda value, n: [(value >> (n - 1 - i)) & 1 for i in range(n)]  # noqa: E731 (MSB first)
    for y0, y1, values in ((8, 40, bits(episode % 16, 4) + bits(camera, 2) + [1, 0, 1, 0]),
                           (136, 172, bits(frame_index % 1024, 10))):
        for k, bit in enumerate(values):
            img[round(y0 * sy):round(y1 * sy), round((32 * k + 4) * sx):round((32 * k + 28) * sx)] = 255 * bit
    x0, y0 = 8 + 8 * (frame_index % 36), 78
    img[round(y0 * sy):round((y0 + 24) * sy), round(x0 * sx):round((x0 + 24) * sx)] = (255, 255, 0)
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


def synthetic_info(lengths, height: int, width: int, fps: int, widths: dict, cams: list, params: dict) -> dict:
    """make_synthetic's meta/info.json."""
    scalar = lambda dtype: {"dtype": dtype, "shape": [1], "names": None}  # noqa: E731
    video = {"dtype": "video", "shape": [height, width, 3], "names": ["height", "width", "channels"],
             "info": {"video.height": height, "video.width": width, "video.codec": "h264", "video.pix_fmt": "yuv420p",
                      "video.is_depth_map": False, "video.fps": fps, "video.channels": 3, "has_audio": False}}
    robot = widths["observation.state"]
    info = {"codebase_version": "v2.1", "robot_type": "droid", "total_episodes": len(lengths),
            "total_frames": sum(lengths), "total_tasks": len(SYNTHETIC_TASKS), "total_videos": 3 * len(lengths),
            "total_chunks": 1, "chunks_size": 1000, "fps": fps, "splits": {"train": f"0:{len(lengths)}"},
            "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
            "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
            "features": {**{c: video for c in cams},
                         **{k: {"dtype": "float32", "shape": [widths[k]], "names": [f"joint_{i}" for i in range(8)]
                                if robot == 8 else [f"{prefix}{a}" for a in "xy"] + [f"pad_{i}" for i in
                                                                                   range(widths[k] - 2)]}
                            for k, prefix in (("observation.state", "square_"), ("action", "d"))},
                         "timestamp": scalar("float32"),
                         **{k: scalar("int64") for k in ("frame_index", "episode_index", "index", "task_index")}}}
    info["features"].update({col: {"dtype": "float32", "shape": [3, 4 if kind == "extrinsic" else 3], "names": None}
                             for col, (_, kind) in params.items()})
    return info


def make_synthetic(out: str, lengths=(72, 60, 8, 84), height: int = 90, width: int = 160, fps: int = 15,
                   cameras: bool = False, motion: str = "fixed", action_width: int = 2, without=()) -> str:
    """Write a LeRobot v2.1 dataset (lerobot's files, H.264 video) with 3 DROID cameras showing code_frame; with
    cameras, each frame also carries every camera's parameters (sensors.<name>.extrinsic_cv from synthetic_w2c and
    sensors.<name>.intrinsic_cv: a pinhole with fx = fy = 0.8 width, centred), for --layout views.

    motion: "fixed" sweeps the square right whatever the (sinusoid, 8-dim) state and action say; "actions" moves it by
    each frame's command (square_commands, from the BEHAVIOURS families less `without`; each episode's family is in
    meta/episodes.jsonl as "behaviour"): action [2] = (dx, dy), observation.state [2] = its position (x, y), both
    in 320x180 pixels, so a model can learn that the commands cause the motion (issue 36, the tiny-action config);
    "orbit" likewise, each command squareworld.orbit_command's (an expert a policy can imitate: policy.py's tiny data);
    action_width > 2 pads the command with zeros to that width (7: Bridge's, for v2w-2b-action's action_dim 12 x 7).
    Tasks alternate between two strings with commas, quotes and non-ASCII; the 8-frame episode is too short for any
    clip. Built in a temporary folder and renamed at the end, so a killed run leaves no half dataset behind."""
    if motion not in ("fixed", "actions", "orbit") or action_width < 2 or (motion == "fixed" and action_width != 2):
        raise ValueError(f"motion={motion!r}, action_width={action_width}: expected 'fixed', 'actions' or 'orbit', "
                         "and a width >= 2 with 'actions' or 'orbit' only")
    if without and motion != "actions":
        raise ValueError(f"without={list(without)}: behaviour families exist with motion='actions' only")
    check_behaviours(without)
    robot = 8 if motion == "fixed" else 2  # the state and action widths
    widths = {"observation.state": robot, "action": robot if motion == "fixed" else action_width}
    if os.path.exists(out):
        raise FileExistsError(f"{out} exists; make_synthetic never writes into an existing folder")
    tmp = f"{out}.tmp-{os.getpid()}"
    cams = [f"observation.images.{c}" for c in ("exterior_1_left", "exterior_2_left", "wrist_left")]
    params = {f"sensors.{c.split('.')[-1]}.{kind}_cv": (i, kind) for i, c in enumerate(cams, 1)
              for kind in ("extrinsic", "intrinsic")} if cameras else {}
    info = synthetic_info(lengths, height, width, fps, widths, cams, params)
    for sub in ["meta", "data/chunk-000"] + [f"videos/chunk-000/{c}" for c in cams]:
        os.makedirs(os.path.join(tmp, sub))
    meta = {"episodes": [], "tasks": [{"task_index": i, "task": t} for i, t in enumerate(SYNTHETIC_TASKS)],
            "episodes_stats": []}
    for ep, length in enumerate(lengths):
        cols = write_episode(tmp, info, ep, lengths, (height, width, fps), widths, cams, params, without,
                             motion == "orbit")
        task = SYNTHETIC_TASKS[ep % len(SYNTHETIC_TASKS)]
        family = "orbit" if motion == "orbit" else episode_behaviour(ep, without) if robot == 2 else None
        behaviour = {"behaviour": family} if family else {}
        meta["episodes"].append({"episode_index": ep, "tasks": [task], "length": length, **behaviour})
        meta["episodes_stats"].append(episode_stats(ep, cols, length))
    return finish_v21(tmp, out, meta, info)


def episode_stats(ep: int, cols: dict, length: int) -> dict:
    """One episode's row of meta/episodes_stats.jsonl (v2.1): per column min, max, mean, std and count."""
    return {"episode_index": ep, "stats": {k: {
        "min": v.min(0).tolist(), "max": v.max(0).tolist(), "mean": v.mean(0).tolist(), "std": v.std(0).tolist(),
        "count": [length]} for k, v in cols.items()}}


def finish_v21(tmp: str, out: str, meta: dict, info: dict) -> str:
    """A v2.1 dataset built in `tmp`: its meta/*.jsonl and meta/info.json written, then renamed to `out` (a killed
    writer leaves no half dataset behind)."""
    for name, rows in meta.items():
        with open(os.path.join(tmp, "meta", name + ".jsonl"), "w", encoding="utf-8", newline="") as f:
            f.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    with open(os.path.join(tmp, "meta", "info.json"), "w", encoding="utf-8", newline="") as f:
        f.write(json.dumps(info, indent=4))
    os.rename(tmp, out)
    return out


def write_episode(tmp: str, info: dict, ep: int, lengths, video: tuple, widths: dict, cams: list, params: dict,
                  without, orbit: bool = False) -> dict:
    """One make_synthetic episode's parquet and videos; returns its columns."""
    (height, width, fps), length = video, lengths[ep]
    t, robot = np.arange(length), widths["observation.state"]
    state = (np.sin(t[:, None] / 10 + np.arange(8)) / 2).astype(np.float32)
    state, action = square_commands(ep, length, without, orbit) if robot == 2 else (state, np.roll(state, -1, axis=0))
    action = np.pad(action, ((0, 0), (0, widths["action"] - action.shape[1])))  # action_width's zero dims
    cols = {"observation.state": state, "action": action,
            "timestamp": (t / fps).astype(np.float32), "frame_index": t, "episode_index": np.full(length, ep),
            "index": sum(lengths[:ep]) + t, "task_index": np.full(length, ep % len(SYNTHETIC_TASKS))}
    pinhole = np.array([[0.8 * width, 0, width / 2], [0, 0.8 * width, height / 2], [0, 0, 1]], np.float32)
    cols.update({col: synthetic_w2c(i, t).astype(np.float32) if kind == "extrinsic" else
                 np.tile(pinhole, (length, 1, 1)) for col, (i, kind) in params.items()})
    vector = lambda v: pa.FixedSizeListArray.from_arrays(pa.array(v.ravel()), v.shape[1])  # noqa: E731
    pq.write_table(pa.table({k: vector(v) if v.ndim == 2 else pa.array(v.tolist()) if v.ndim == 3 else v
                             for k, v in cols.items()}),
                   os.path.join(tmp, info["data_path"].format(episode_chunk=0, episode_index=ep)))
    for camera, key in enumerate(cams, 1):
        path = os.path.join(tmp, info["video_path"].format(episode_chunk=0, video_key=key, episode_index=ep))
        encode(path, [code_frame(ep, camera, k, height, width, state[k] if robot == 2 else None)
                      for k in range(length)], fps)
    return cols


def check_synthetic(root: str, lengths, motion: str, stitched: str, without=()) -> None:
    """A make_synthetic folder written by another generator (other episode lengths, or with motion="actions" other
    commands, behaviour families or square size: the episodes' families or episode 0's square positions differ) is a
    ValueError naming it and `stitched`, the folder made from it, so a tiny preset never trains on what an older
    version of this file wrote."""
    with open(os.path.join(root, "meta", "episodes.jsonl"), encoding="utf-8") as f:
        episodes = [json.loads(line) for line in f if line.strip()]
    got = [e["length"] for e in episodes]
    same = got == list(lengths)
    if same and motion in ("actions", "orbit"):
        table = pq.read_table(os.path.join(root, "data", "chunk-000", "episode_000000.parquet"),
                              columns=["observation.state"])
        state = np.asarray(table.column("observation.state").to_pylist(), np.float32)
        same = np.array_equal(state, square_commands(0, lengths[0], without, motion == "orbit")[0]) and \
            [e.get("behaviour") for e in episodes] == ["orbit" if motion == "orbit" else episode_behaviour(i, without)
                                                       for i in range(len(got))]
    if not same:
        what = f"{len(got)} episodes, this version writes {len(lengths)}" if len(got) != len(lengths) else \
            "other square commands than this version's"
        raise ValueError(f"{root}: written by another version of the synthetic generator ({what}): delete {root} and "
                         f"{stitched} (and any other folder stitched from it), then rerun: they are rebuilt")
