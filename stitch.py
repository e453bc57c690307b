"""LeRobot robot episodes -> 2x2 grid H.264 videos for Cosmos-Predict2 video2world post-training (or, with
--layout views, one video per camera for the Predict2.5 multi-view model, docs/multiview.md).

    python stitch.py SRC OUT [--stride 4] [--frames 93] [--size 432x768] [--workers N] [--prompt droid|TEMPLATE]
                     [--min-frames N] [--episodes FILE] [--per-task N] [--cameras ...] [--fit auto] [--crf 15]
                     [--max-skip-fraction 0.1] [--progress-every 100] [--layout grid|views|one] [--camera-params auto]
    python stitch.py --synthetic OUT    # tiny synthetic LeRobot v2.1 dataset (H.264) for the tiny default and tests
    python stitch.py --help             # every flag, with its default

Grid: top-left exterior_1_left, top-right exterior_2_left, bottom-left wrist, bottom-right black. OUT gets
videos/<stem>.mp4, metas/<stem>.txt, metadata.csv, manifest.jsonl (one line per verified video, written last),
skips.jsonl (one line per skipped episode with its reason) and RECIPE.json; stems are <source folder>__ep<index>.
Views: videos/<stem>.<slot>.mp4 per camera slot (ext_1, ext_2, wrist) at --size, all of the same length, and, when the
dataset has camera parameters, cameras/<stem>.npz (per output frame and view: w2c, intrinsics at --size). When the
dataset has `action`: actions/<stem>.npz (the commands between kept frames, the states at them) and action_stats.json.
One (--layout one): videos/<stem>.mp4 as a grid folder's, the ext_1 camera alone filling --size (a one-camera dataset
at the frame's whole resolution instead of a quarter of it); the other two slots are cut and checked, not shown.

Per episode one ffmpeg command cuts each camera out of its mp4 by timestamp, keeps every stride-th frame, logs the
source timestamp of each kept frame (checked here), resizes it into its cell, stacks the grid and encodes it with
libx264; Python checks everything (the LeRobot metadata is read by base/lerobot.py), verifies the output (base/video.py probes
it) and keeps the books.

Exit status: 0 when the folder is usable; 1 when it holds no video, or when more than --max-skip-fraction of the
episodes long enough to keep were skipped for another reason than length or a missing task (what was written stays:
a rerun retries the retryable skips); 2 for a user error (a bad flag, --size, a missing column), in one line before
any work. Without a terminal (SLURM logs) progress is one line every --progress-every episodes instead of a bar.
"""
import contextlib
import dataclasses
import errno
import hashlib
import json
import multiprocessing
import os
import re
import string
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from fractions import Fraction

import imageio_ffmpeg
import numpy as np
from tqdm import tqdm

from base import actions, cli
from base.camera import fitted_intrinsics
from base.files import sha1_file, write_atomic
from base.lerobot import (  # make_synthetic:
    SLOTS,
    BadParquet,
    Episode,
    Source,
    camera_summary,
    check_frames_table,
    make_synthetic,  # --synthetic; the tiny default's
    open_source,
    read_cameras,
    select_episodes,
)
from base.video import cell_filter, check_ffmpeg, ffmpeg_exe, fit_of, probe_video

RECIPE_VERSION = 1  # bump when the code changes the bytes written for the same recipe
DROID_TEMPLATE = (
    "A multi-view video shows that a robot {task} The video is split into four views: The top-left view shows the "
    "robotic arm from the left side, the top-right view shows it from the right side, the bottom-left view shows a "
    "first-person perspective from the robot's end-effector (gripper), and the bottom-right view is a black screen "
    "(inactive view). The robot {task}")
DROID_VIEWS_TEMPLATE = (  # --layout views: one prompt for the three separate views (no grid to describe)
    "A robot arm {task}, seen by three cameras: two fixed on the left and right of the workspace and one on the "
    "robot's gripper.")
RETRYABLE = {"bad_parquet", "ffmpeg_error", "verify_error", "worker_error", "write_error"}  # a rerun retries these
FILTERED = {"too_short", "too_short_after_decode", "no_task"}  # dropped by design: not counted by --max-skip-fraction
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}  # OSErrors that mean "OUT can't take more"
LAYOUTS = ("grid", "views", "one")  # --layout: what one episode's video(s) show (StitchConfig.layout)
MODES = ("src", "out", "synthetic")  # StitchConfig fields that pick what the command does, not how


@dataclasses.dataclass
class StitchConfig:
    src: str = ""  # SRC: the LeRobot dataset folder (format v2.0, v2.1 or v3.0)
    out: str = ""  # OUT: the grid folder to write; a rerun resumes it
    synthetic: str = ""  # write a tiny synthetic LeRobot v2.1 dataset (H.264) to this folder, then exit
    stride: int = 4  # keep every stride-th source frame (DROID 15 fps / 4 = 3.75 fps)
    frames: int = 93  # clip length the model trains on
    size: str = "432x768"  # grid HxW, both multiples of 16 (the DiT needs H/8 and W/8 even)
    min_frames: int = 0  # shortest video kept, in output frames; 0 = --frames (use 94 for the upstream loader)
    workers: int = 0  # episodes in parallel; 0 = one per core (an episode's ffmpeg keeps ~1.1 cores busy)
    prompt: str = "droid"  # "droid" or a template holding {task}
    episodes: str = ""  # file with the episode indices to stitch (a pilot subset)
    per_task: int = 0  # keep the first N episodes of each task; 0 = all
    cameras: str = ""  # override the alias table: "ext_1=KEY,ext_2=KEY,wrist=KEY"
    fit: str = "auto"  # auto: stretch when the aspect is within 5% of the cell's, else pad; or stretch / pad
    crf: int = 15  # x264 constant rate factor of the written grid videos (lower = better, larger)
    preset: str = "fast"  # x264 preset (speed vs file size at the same quality)
    retry_skips: bool = False  # also retry episodes skipped for data reasons (too_short, no_task, ...)
    max_skip_fraction: float = 0.1  # exit 1 when more than this fraction of the episodes long enough to keep
    # was skipped for another reason than length or a missing task (1 = never); a folder with no video always exits 1
    progress_every: int = 100  # without a terminal (SLURM logs): one progress line every N episodes; 0 = none
    layout: str = "grid"  # grid: one 2x2 grid video per episode; views: one video per camera at --size (multi-view);
    # one: the ext_1 camera alone filling --size (a one-camera dataset at the full frame, read as a grid folder)
    camera_params: str = "auto"  # views only: auto = the dataset's camera parameters if it has any; none = ignore
    # them (training then uses the fallback rig); fx,fy,cx,cy@HxW = intrinsics (pixels of an HxW image) for datasets
    # that carry extrinsics only (lerobot's DROID port)

    def __post_init__(self):  # checked when built, so a bad flag stops the run before any work
        if self.stride < 1 or self.frames < 1 or min(self.min_frames, self.per_task, self.workers) < 0:
            raise ValueError(f"--stride and --frames must be >= 1, --min-frames / --per-task / --workers >= 0: "
                             f"got {self.stride}, {self.frames}, {self.min_frames}, {self.per_task}, {self.workers}")
        if self.fit not in ("auto", "stretch", "pad"):
            raise ValueError(f"--fit {self.fit}: expected auto, stretch or pad")
        if not 0 <= self.max_skip_fraction <= 1 or self.progress_every < 0:
            raise ValueError(f"--max-skip-fraction {self.max_skip_fraction} must lie in [0, 1] and --progress-every "
                             f"{self.progress_every} be >= 0")
        if self.layout not in LAYOUTS or (self.layout != "views" and self.camera_params != "auto"):
            raise ValueError(f"--layout {self.layout} --camera-params {self.camera_params}: expected --layout "
                             f"{', '.join(LAYOUTS)}; --camera-params is for --layout views only")
        parse_size(self.size), prompt_template(self.prompt), parse_camera_params(self.camera_params)


def make_config(overrides: dict) -> StitchConfig:
    names = {f.name for f in dataclasses.fields(StitchConfig)}
    if set(overrides) - names:
        raise ValueError(f"unknown stitch option(s) {sorted(set(overrides) - names)}; known: {sorted(names)}")
    return StitchConfig(**overrides)


def parse_size(size: str) -> tuple:
    m = re.fullmatch(r"([1-9]\d*)x([1-9]\d*)", size)
    if not m or int(m[1]) % 16 or int(m[2]) % 16:
        raise ValueError(f"--size {size}: expected HxW, both multiples of 16 (the DiT needs H/8 and W/8 even), "
                         "e.g. 432x768")
    return int(m[1]), int(m[2])


def parse_camera_params(text: str):
    """"auto", "none", or ((fx, fy, cx, cy), (height, width)) from "fx,fy,cx,cy@HxW"."""
    if text in ("auto", "none"):
        return text
    m = re.fullmatch(r"([^,@]+),([^,@]+),([^,@]+),([^,@]+)@([1-9]\d*)x([1-9]\d*)", text)
    try:
        k = tuple(float(v) for v in m.groups()[:4]) if m else None
    except ValueError:
        k = None
    if not k or min(k[:2]) <= 0:
        raise ValueError(f"--camera-params {text}: expected auto, none or fx,fy,cx,cy@HxW (focal lengths > 0), "
                         "e.g. 531.0,531.0,640.0,360.0@720x1280")
    return k, (int(m[5]), int(m[6]))


def prompt_template(prompt: str, layout: str = "grid") -> tuple:
    """(template, template_id); a custom template must use {task} and no other field."""
    if prompt == "droid":
        return (DROID_VIEWS_TEMPLATE, "droid-views") if layout == "views" else (DROID_TEMPLATE, "droid")
    fields = {f for _, f, _, _ in string.Formatter().parse(prompt) if f is not None}
    if fields != {"task"}:
        raise ValueError(f"prompt template {prompt!r} must contain {{task}} and no other field (has {fields or 'none'})")
    return prompt, "custom-" + hashlib.sha1(prompt.encode()).hexdigest()[:8]


def normalize_task(task: str) -> str:
    """Strip, collapse whitespace and newlines, drop '"' and trailing .!?, lower-case (specs/data.md 2.6)."""
    return " ".join(task.replace('"', " ").split()).rstrip(".!? ").lower()


# ------------------------------------------------------------------------------------------------------ ffmpeg

def segment_input(path: str, start: float, length: int, fps: Fraction) -> list:
    """ffmpeg input options for source frames start .. start + (length-1)/fps: the cut lies half a frame inside each
    boundary, so float timestamps can't add or lose a frame."""
    seek, end = max(0.0, start - 0.5 / fps), start + (length - 0.5) / fps
    return ["-threads", "1", "-ss", f"{seek:.6f}", "-t", f"{end - seek:.6f}", "-i", path]


def x264_args(crf: int, preset: str) -> list:
    return ["-an", "-c:v", "libx264", "-preset", preset, "-crf", str(crf), "-pix_fmt", "yuv420p", "-threads", "2"]


def cell_hw(cfg: StitchConfig) -> tuple:
    """The size each camera is resized to: a quarter of --size in the grid, all of it as a view or --layout one."""
    H, W = parse_size(cfg.size)
    return (H // 2, W // 2) if cfg.layout == "grid" else (H, W)


def episode_command(ep: Episode, source: Source, cfg: StitchConfig, fits: dict, out: list, log_times: bool) -> list:
    """One ffmpeg command for one episode: cut each camera's segment out, keep every stride-th frame, (log its source
    timestamp,) resize it into its cell and write `out` (output options + path): the cells stacked into the grid, or
    with --layout views each camera to its own file (the path's `{view}` becomes the slot), with --layout one ext_1's
    camera alone as the whole frame.

    The j-th kept frame of every camera gets the same timestamp j/out_fps, so stacking pairs them; hstack/vstack stop
    at the shortest camera (views are stacked side by side too, then cropped apart, so they end together). With
    log_times, -copyts keeps the source timestamps for showinfo@<slot> to print."""
    (h, w), fps_out = cell_hw(cfg), source.fps / cfg.stride
    chains = [f"[{i}:v:0]select='not(mod(n,{cfg.stride}))',{f'showinfo@{slot},' * log_times}"
              f"setpts=N*{fps_out.denominator}/({fps_out.numerator}*TB),"
              f"{cell_filter(source.cam_hw[slot], (h, w), fits[slot])}[{slot}]" for i, slot in enumerate(SLOTS)]
    if cfg.layout == "views":
        chains += ["".join(f"[{s}]" for s in SLOTS) + f"hstack=inputs={len(SLOTS)}:shortest=1,split={len(SLOTS)}"
                   + "".join(f"[row_{s}]" for s in SLOTS)]
        chains += [f"[row_{s}]crop={w}:{h}:{i * w}:0[view_{s}]" for i, s in enumerate(SLOTS)]
        maps = [a for s in SLOTS for a in ("-map", f"[view_{s}]", "-r", str(fps_out), *out[:-1],
                                           out[-1].replace("{view}", s))]
    elif cfg.layout == "one":  # stacked and cropped as views are, so the video ends with the shortest camera
        chains += ["".join(f"[{s}]" for s in SLOTS) + f"hstack=inputs={len(SLOTS)}:shortest=1,crop={w}:{h}:0:0[grid]"]
        maps = ["-map", "[grid]", "-r", str(fps_out), *out]
    else:
        chains += ["[ext_1][ext_2]hstack=shortest=1[top]", f"[wrist]pad={w * 2}:{h}:0:0:black[bottom]",
                   "[top][bottom]vstack=shortest=1[grid]"]
        maps = ["-map", "[grid]", "-r", str(fps_out), *out]
    inputs = [a for slot in SLOTS for a in segment_input(*ep.segments[slot][:2], ep.length, source.fps)]
    return [ffmpeg_exe(), "-hide_banner", "-nostdin", "-nostats", *(["-copyts"] if log_times else []), *inputs,
            "-filter_complex", ";".join(chains), *maps]


# ------------------------------------------------------------------------------------------------ one episode

_CTX = {}  # per worker process (see _init_worker): source, cfg, out, fits, template, template_id, recipe_hash


def _init_worker(ctx: dict):
    _CTX.clear()
    _CTX.update(ctx)  # sent once per worker, not with each of 70k jobs


def stitch_episode(stem: str, ep: Episode) -> dict:
    """Stitch one episode: {"done": manifest record} or {"skip": skip record}. Never raises."""
    skip = lambda reason, detail: {"skip": {"stem": stem, "source": _CTX["source"].name,  # noqa: E731
                                            "episode_index": ep.index, "reason": reason, "detail": detail}}
    try:
        result = run_episode(stem, ep)
    except BadParquet as e:  # a damaged frame table: its path and pyarrow's reason, no traceback
        result = skip("bad_parquet", str(e))
    except OSError as e:  # a full disk is named, not hidden in a traceback
        result = skip("write_error", f"{errno.errorcode[e.errno]} ({e.strerror}) writing {e.filename}") \
            if e.errno in WRITE_ERRNOS else skip("worker_error", traceback.format_exc(limit=4).strip())
    except Exception:  # a bug or an odd file must not stop the other 70k episodes: recorded, and retried on rerun
        result = skip("worker_error", traceback.format_exc(limit=4).strip())
    for partial in [*video_files(_CTX["out"], stem, _CTX["cfg"].layout).values(), camera_file(_CTX["out"], stem),
                    actions.action_file(_CTX["out"], stem)]:
        if "skip" in result and os.path.exists(partial + ".tmp"):
            os.remove(partial + ".tmp")
    return result


def video_files(out: str, stem: str, layout: str) -> dict:
    """name -> path of an episode's videos: {"grid": videos/<stem>.mp4}, or per slot videos/<stem>.<slot>.mp4."""
    if layout == "views":
        return {s: os.path.join(out, "videos", f"{stem}.{s}.mp4") for s in SLOTS}
    return {"grid": os.path.join(out, "videos", stem + ".mp4")}


def camera_file(out: str, stem: str) -> str:
    return os.path.join(out, "cameras", stem + ".npz")


def run_episode(stem: str, ep: Episode) -> dict:
    """stitch_episode's work (it catches what this raises): the checks in the order of their cost, then the
    renames into place; a skip renames nothing (stitch_episode removes the .tmp files)."""
    source, cfg, fits = _CTX["source"], _CTX["cfg"], _CTX["fits"]
    fps, cams = source.fps, source.cams
    skip = lambda reason, detail: {"skip": {"stem": stem, "source": source.name, "episode_index": ep.index,  # noqa
                                            "reason": reason, "detail": detail}}
    task, problem = check_frames_table(ep, source)
    if problem:
        return skip(*problem)
    for slot, (path, start, end) in ep.segments.items():
        if not os.path.isfile(path):
            return skip("missing_file", f"{cams[slot]}: {path}")
        if abs(round((end - start) * fps) - ep.length) > 1:
            return skip("segment_mismatch", f"{cams[slot]}: [{start}, {end}) s holds {(end - start) * fps:.1f} "
                                            f"frames, the parquet {ep.length}")
    (H, W), views = parse_size(cfg.size), cfg.layout == "views"
    files = video_files(_CTX["out"], stem, cfg.layout)
    video = os.path.join(_CTX["out"], "videos", stem + (".{view}.mp4" if views else ".mp4"))
    text, problem = encode_episode(ep, source, cfg, fits, video)
    if problem:
        return skip(*problem)
    counts, short, problem = kept_frames(text, ep, source, cfg)
    if problem:
        return skip(*problem)
    n, min_frames = counts[short], cfg.min_frames or cfg.frames
    if n < min_frames:
        return skip("too_short_after_decode", f"{n} frames decoded, need {min_frames}")
    for path in files.values():  # decode it back: n frames, h264, the output size
        try:
            info = probe_video(path + ".tmp")
        except RuntimeError as e:
            return skip("verify_error", str(e))
        if (info["frames"], info["codec"], info["height"], info["width"]) != (n, "h264", H, W):
            return skip("verify_error", f"{path}: expected {n} frames {H}x{W} h264, read back {info}")
    cameras = "absent"
    if views and source.cam_params and _CTX["camera_params"] != "none":
        try:  # output frame j is source frame j*stride (checked above by timestamp)
            found = read_cameras(ep, source, np.arange(n) * cfg.stride, _CTX["camera_params"])
        except ValueError as e:
            return skip("bad_parquet" if isinstance(e, BadParquet) else "bad_camera", str(e))
        with open(camera_file(_CTX["out"], stem) + ".tmp", "wb") as f:  # per view in SLOTS order, per output frame
            np.savez(f, views=np.array(SLOTS), w2c=np.stack([found[s][0] for s in SLOTS]).astype(np.float32),
                     intrinsics=np.stack([fitted_intrinsics(found[s][1], source.cam_hw[s], (H, W), fits[s])
                                          for s in SLOTS]).astype(np.float32))
        os.replace(camera_file(_CTX["out"], stem) + ".tmp", camera_file(_CTX["out"], stem))
        cameras = "real"
    robot, problem = actions.write_episode(_CTX["out"], stem, ep, source, _CTX["actions"], cfg.stride, n) \
        if _CTX["actions"] else (None, None)  # the commands between the kept frames, the states at them
    if problem:
        return skip(*problem)
    prompt = _CTX["template"].format(task=normalize_task(task))
    metas = os.path.join(_CTX["out"], "metas", stem + ".txt")
    with open(metas + ".tmp", "w", encoding="utf-8") as f:
        f.write(prompt)
    os.replace(metas + ".tmp", metas)
    written = {}
    for name, path in files.items():
        written[name] = {"sha1": sha1_file(path + ".tmp"), "bytes": os.path.getsize(path + ".tmp")}
        os.replace(path + ".tmp", path)
    record = {
        "stem": stem, "source": source.name, "layout": source.layout, "episode_index": ep.index, "cams": cams,
        "fit": fits, "src_fps": str(fps), "stride": cfg.stride, "out_fps": str(fps / cfg.stride), "src_len": ep.length,
        "cam_frames": counts, "n_out": n, "height": H, "width": W, "task_raw": task, "prompt": prompt,
        "prompt_template_id": _CTX["template_id"], "crf": cfg.crf, **(written.get("grid") or {}),
        "recipe_hash": _CTX["recipe_hash"], **({"actions": robot} if robot else {})}
    if views:  # which views in which order, and whether cameras/<stem>.npz holds their real parameters
        record.update(views={s: written[s] for s in SLOTS}, cameras=cameras)
    return {"done": record}


def encode_episode(ep: Episode, source: Source, cfg: StitchConfig, fits: dict, video: str) -> tuple:
    """(ffmpeg's log, None) once video + ".tmp" is written, or (None, (reason, detail)) when ffmpeg failed."""
    with tempfile.TemporaryFile("w+", errors="replace") as log:
        command = episode_command(ep, source, cfg, fits, [*x264_args(cfg.crf, cfg.preset), "-f", "mp4", "-y",
                                                          video + ".tmp"], log_times=True)
        rc = subprocess.run(command, stderr=log).returncode
        log.seek(0)
        text = log.read()
        if rc != 0:
            lines = text.strip().splitlines()
            full = [(errno.errorcode[n], ln.strip()) for ln in lines for n in WRITE_ERRNOS if os.strerror(n) in ln]
            if full:  # the disk, not the episode (ffmpeg prints strerror): named, and retried by a rerun
                return None, ("write_error", f"{full[0][0]} writing {video}.tmp: ffmpeg rc {rc}: {full[0][1]}")
            return None, ("ffmpeg_error", f"ffmpeg rc {rc}: {' | '.join(lines[-3:])}")
        return text, None


def kept_frames(text: str, ep: Episode, source: Source, cfg: StitchConfig) -> tuple:
    """(frames per camera, the shortest camera, None or (reason, detail)) from ffmpeg's showinfo log: a skip
    when a camera ends early or a kept frame is not the source frame its timestamp should be."""
    fps, cams = source.fps, source.cams
    # alignment by timestamp: kept frame j of each camera must be the source frame at from_timestamp + j*stride/fps
    times = {s: np.array(re.findall(rf"\[showinfo@{s} @ [^\]]*\] n:\s*\d+ pts:\s*\S+ pts_time:(\S+)", text), float)
             for s in SLOTS}
    counts = {s: len(t) for s, t in times.items()}
    n_want = (ep.length - 1) // cfg.stride + 1
    n_floor = (max(ep.length - 2, 1) - 1) // cfg.stride + 1  # a camera may be up to 2 source frames short
    short = min(SLOTS, key=counts.get)
    if counts[short] < n_floor:  # the shortest camera ended the grid; the others were not read to their end
        return counts, short, ("cam_len_mismatch", f"{cams[short]} gave {counts[short]} frames, the "
                                                   f"parquet length {ep.length} makes {n_want} at stride "
                                                   f"{cfg.stride}")
    for s in SLOTS:
        expect = ep.segments[s][1] + np.arange(counts[s]) * cfg.stride / float(fps)
        off = np.flatnonzero(np.abs(times[s] - expect) >= 0.5 / float(fps))
        if len(off):
            return counts, short, ("misaligned", f"{cams[s]}: kept frame {off[0]} is the source frame at "
                                                 f"{times[s][off[0]]} s, expected {expect[off[0]]:.4f} s "
                                                 "(dropped or repeated source frames?)")
    return counts, short, None


# ----------------------------------------------------------------------------------------- the whole dataset

def load_records(path: str, valid) -> dict:
    """stem -> last valid record of a jsonl file; a torn last line (killed mid-write) is dropped, not fatal."""
    records = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    print(f"stitch: dropping a torn line of {path}: {line[:80]!r}", file=sys.stderr)
                    continue
                if valid(rec):
                    records[rec["stem"]] = rec
    return records


def jsonl(records: dict) -> str:
    """Sorted by stem, so a killed-and-rerun build ends with the same bytes as a clean one."""
    return "".join(json.dumps(records[s], ensure_ascii=False) + "\n" for s in sorted(records))


def metadata_csv(done: dict) -> str:
    """Header video,prompt (a views folder lists each view); the prompt is always quoted (RFC 4180), the path never
    (upstream splits on the first ,)."""
    q = '"'
    return "video,prompt\n" + "".join(f"videos/{s}{'.' * bool(v)}{v}.mp4,{q}{done[s]['prompt'].replace(q, q + q)}{q}\n"
                                      for s in sorted(done) for v in done[s].get("views") or [""])


def outputs_intact(out: str, rec: dict, layout: str) -> bool:
    files, sizes = video_files(out, rec.get("stem"), layout), rec.get("views") or {"grid": {"bytes": rec.get("bytes")}}
    return (set(sizes) == set(files) and all(os.path.isfile(p) and os.path.getsize(p) == sizes[k]["bytes"]
                                             for k, p in files.items()) and actions.intact(out, rec)
            and (rec.get("cameras") != "real" or os.path.isfile(camera_file(out, rec["stem"]))))


def fit_policy(cfg: StitchConfig, src_hw: tuple, cell_hw: tuple) -> str:
    return fit_of(cfg.fit, src_hw, cell_hw)


def stitch(src: str, out: str, **overrides) -> dict:
    """Stitch the episodes of LeRobot dataset src into out (resuming a killed run); returns the counts (outcome_problem
    says whether they make a usable folder)."""
    cfg = make_config({**overrides, "src": src, "out": out})
    source = open_source(src, cfg.cameras)
    camera_params = parse_camera_params(cfg.camera_params)
    if cfg.layout == "views":
        views = ", ".join(f"{s}={k}" for s, k in source.cams.items())
        print(f"stitch: views {views}; {camera_summary(source, camera_params)}")
    dims, stats, line = actions.plan(source)  # {} without `action`: said once, stitched as before
    print(line)
    check_ffmpeg()
    recipe, recipe_hash, template, template_id = recipe_of(cfg)
    prepare_out(out, cfg, recipe, recipe_hash, ("actions",) if dims else ())
    min_frames = cfg.min_frames or cfg.frames
    manifest_path, skips_path = os.path.join(out, "manifest.jsonl"), os.path.join(out, "skips.jsonl")
    # done = a manifest line whose videos (camera, actions files) are there at the recorded sizes (renamed last)
    done = load_records(manifest_path, lambda r: outputs_intact(out, r, cfg.layout))
    skips = {s: r for s, r in load_records(skips_path, lambda r: "stem" in r).items() if s not in done}
    write_atomic(manifest_path, jsonl(done))
    write_atomic(skips_path, jsonl(skips))

    episodes = select_episodes(source, cfg)
    stems = {e.index: f"{source.name}__ep{e.index:06d}" for e in episodes}
    fits = {s: fit_policy(cfg, source.cam_hw[s], cell_hw(cfg)) for s in SLOTS}
    jobs, pre_skips, already = [], [], 0
    for e in episodes:
        stem, n_out = stems[e.index], (e.length - 1) // cfg.stride + 1
        if stem in done:
            already += 1
        elif stem in skips and not cfg.retry_skips and skips[stem]["reason"] not in RETRYABLE:
            pass
        elif n_out < min_frames:  # cheap pre-filter from the metadata: no decoding
            pre_skips.append({"stem": stem, "source": source.name, "episode_index": e.index, "reason": "too_short",
                              "detail": f"{e.length} source frames -> {n_out} at stride {cfg.stride}, need {min_frames}"})
        else:
            jobs.append((stem, e))

    ctx = {"source": source, "cfg": cfg, "out": out, "fits": fits, "template": template, "template_id": template_id,
           "camera_params": camera_params, "recipe_hash": recipe_hash, "actions": dims}
    with open(manifest_path, "a", encoding="utf-8") as manifest, open(skips_path, "a", encoding="utf-8") as skipf:
        def record(kind: str, rec: dict):
            f = manifest if kind == "done" else skipf
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")  # one write + flush per line
            f.flush()
            os.fsync(f.fileno())
            (done if kind == "done" else skips)[rec["stem"]] = rec
            if kind == "done":
                skips.pop(rec["stem"], None)
            elif rec["reason"] in RETRYABLE:
                tqdm.write(f"stitch: {rec['stem']}: {rec['reason']}: {rec['detail']}", file=sys.stderr)

        for rec in pre_skips:
            record("skip", rec)
        run_jobs(jobs, ctx, cfg, source.name, record)
    write_atomic(manifest_path, jsonl(done))
    write_atomic(skips_path, jsonl(skips))
    write_atomic(os.path.join(out, "metadata.csv"), metadata_csv(done))
    if dims:  # the normalisation statistics: the dataset's, else computed from every episode written
        actions.write_stats(out, dims, stats, [stem for stem in sorted(done) if done[stem].get("actions")])

    written = sum(stems[e.index] in done for e in episodes)
    reasons = Counter(skips[stems[e.index]]["reason"] for e in episodes if stems[e.index] in skips)
    summary = {"episodes_in": len(episodes), "written": written, "skipped": sum(reasons.values()),
               "by_reason": dict(sorted(reasons.items())), "new": written - already, "already_done": already}
    print(f"stitch: {source.name}: {len(episodes)} episodes in = {written} written + {summary['skipped']} skipped "
          f"({', '.join(f'{k}: {v}' for k, v in sorted(reasons.items())) or 'none'}); this run wrote "
          f"{summary['new']}, {already} were already done -> {out}")
    if written + summary["skipped"] != len(episodes):
        raise RuntimeError(f"stitch: counts do not add up, an episode was neither written nor skipped: {summary}")
    return summary


def recipe_of(cfg: StitchConfig) -> tuple:
    """(recipe, its hash, prompt template, its id): what decides the bytes written, kept in RECIPE.json."""
    H, W = parse_size(cfg.size)
    template, template_id = prompt_template(cfg.prompt, cfg.layout)
    min_frames = cfg.min_frames or cfg.frames
    recipe = {"version": RECIPE_VERSION, "stride": cfg.stride, "size": [H, W], "min_frames": min_frames,
              "fit": cfg.fit, "prompt_template": template, "prompt_template_id": template_id, "crf": cfg.crf,
              "preset": cfg.preset, "codec": "libx264", "pix_fmt": "yuv420p"}
    if cfg.layout == "views":  # only here, so a grid recipe (and its hash) stays what it always was
        recipe.update(layout="views", camera_params=cfg.camera_params)
    elif cfg.layout == "one":
        recipe.update(layout="one")
    recipe_hash = hashlib.sha1(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    return recipe, recipe_hash, template, template_id


def prepare_out(out: str, cfg: StitchConfig, recipe: dict, recipe_hash: str, more: tuple = ()):
    """out's folders (and `more` of them) without a killed run's .tmp files, and its RECIPE.json: a folder built by
    another recipe is refused, not mixed into."""
    for sub in ("videos", "metas") + (("cameras",) if cfg.layout == "views" else ()) + more:
        os.makedirs(os.path.join(out, sub), exist_ok=True)
        for name in os.listdir(os.path.join(out, sub)):  # leftovers of a killed run
            if name.endswith(".tmp"):
                os.remove(os.path.join(out, sub, name))
    recipe_path = os.path.join(out, "RECIPE.json")
    if os.path.exists(recipe_path):
        with open(recipe_path, encoding="utf-8") as f:
            old = json.load(f)
        if old.get("recipe_hash") != recipe_hash:  # what differs only: the whole recipes are ~1,500 characters
            changed = cli.differences(old, recipe, skip=("recipe_hash", "ffmpeg")) or "recipe_hash only"
            raise ValueError(f"{out} was built with another recipe ({recipe_path} -> this run: {changed}); rerun "
                             "with the folder's settings to resume it, or stitch into a new OUT")
    else:
        write_atomic(recipe_path, json.dumps({**recipe, "recipe_hash": recipe_hash,
                                              "ffmpeg": imageio_ffmpeg.get_ffmpeg_version()}, indent=1))


def run_jobs(jobs: list, ctx: dict, cfg: StitchConfig, name: str, record):
    """record(kind, rec) of each job's stitch_episode as it ends: here for one worker or job, else in a pool;
    progress is a bar on a terminal, else a line every --progress-every episodes."""
    workers = cfg.workers or os.cpu_count() or 1
    serial = workers == 1 or len(jobs) <= 1
    with contextlib.nullcontext() if serial else ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker,
            initargs=(ctx,)) as pool:  # spawn: workers start clean, without our open files (specs/data.md 3.7)
        if serial:
            _init_worker(ctx)
        results = (stitch_episode(*job) for job in jobs) if serial else \
            (f.result() for f in as_completed([pool.submit(stitch_episode, *job) for job in jobs]))
        terminal, t0, this_run = sys.stdout.isatty(), time.time(), Counter()
        for k, result in enumerate(tqdm(results, total=len(jobs), desc=f"stitch {name}", unit="ep",
                                        disable=not terminal), 1):
            record(*next(iter(result.items())))
            this_run.update(result.keys())
            if not terminal and cfg.progress_every and k % cfg.progress_every == 0:  # the summary ends it
                rate = k / max(time.time() - t0, 1e-9)
                eta = (len(jobs) - k) / rate
                print(f"stitch {name}: {k}/{len(jobs)} episodes ({this_run['done']} written, "
                      f"{this_run['skip']} skipped), {rate:.2f} ep/s, ETA {int(eta // 3600)}h"
                      f"{int(eta % 3600 // 60):02d}m{int(eta % 60):02d}s", flush=True)


def outcome_problem(summary: dict, max_skip_fraction: float, out: str) -> str | None:
    """Why a finished stitch() must exit 1, or None: the folder holds no video, or more than max_skip_fraction of the
    episodes long enough to keep were skipped for another reason than the length and task filters (FILTERED)."""
    reasons = ", ".join(f"{k}: {v}" for k, v in summary["by_reason"].items()) or "none"
    first = next((f"; the first: {r['stem']}: {r['reason']}: {''.join(str(r.get('detail')).splitlines()[-1:])}"
                  for r in load_records(os.path.join(out, "skips.jsonl"), lambda r: r.get("reason") not in FILTERED)
                  .values()), "")  # the first episode that failed (not a filter), its detail's last line
    if summary["written"] == 0:
        return (f"{out} holds no video: {summary['episodes_in']} episodes in, {summary['skipped']} skipped "
                f"({reasons}){first}; the reasons are in {out}/skips.jsonl")
    failed = sum(n for reason, n in summary["by_reason"].items() if reason not in FILTERED)
    kept_or_failed = summary["written"] + failed
    if failed > max_skip_fraction * kept_or_failed:
        return (f"{failed} of {kept_or_failed} episodes long enough to keep were skipped ({failed / kept_or_failed:.0%}"
                f" > --max-skip-fraction {max_skip_fraction}; {reasons}){first}; the reasons are in {out}/skips.jsonl. "
                f"The {summary['written']} videos written stay; a rerun retries {', '.join(sorted(RETRYABLE))}; pass "
                "a larger --max-skip-fraction to accept the folder as it is")
    return None


# ------------------------------------------------------------------------------------------------------ CLI

def main(argv=None) -> int:
    given = cli.parse_flags(StitchConfig, argv, description=__doc__, positional=("src", "out"), prog="stitch.py")
    cfg = cli.build(StitchConfig, given)  # every option is checked here, before any work
    options = {k: v for k, v in given.items() if k not in MODES}
    if cfg.synthetic and not (cfg.src or cfg.out or options):
        print(f"stitch: wrote a synthetic LeRobot dataset to {make_synthetic(cfg.synthetic)}")
    elif cfg.src and cfg.out and not cfg.synthetic:
        problem = outcome_problem(stitch(cfg.src, cfg.out, **options), cfg.max_skip_fraction, cfg.out)
        if problem:
            print(f"stitch.py: error: {problem}", file=sys.stderr, flush=True)
            return 1
    else:
        raise ValueError("give SRC OUT [options], or --synthetic OUT alone (see --help)")
    return 0


if __name__ == "__main__":
    cli.main(main, user_errors=(ValueError, OSError))
