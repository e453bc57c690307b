"""Training clips from a stitched grid folder (stitch.py's output, or any upstream-style videos/ + t5_xxl/ folder),
or from a `stitch.py --layout views` folder for the Predict2.5 multi-view model (ViewClips, docs/multiview.md).

    ds = GridClips("data/droid_grid", frames=93, height=432, width=768)       # real T5 embeddings required
    ds = GridClips(..., text_dim=100352, text_encoder="reason1")               # Predict2.5: reason1/<sha1(prompt)>
    sampler = ClipSampler(len(ds), rank=rank, world_size=world_size, seed=0)
    loader = DataLoader(ds, batch_size=1, sampler=sampler, num_workers=8)
    ...
    ckpt["sampler"] = sampler.state_dict(consumed=step * batch_size)         # exact even with prefetching workers
    sampler.load_state_dict(ckpt["sampler"])                                  # before building the loader iterator
    neg = negative_prompt_path("data/droid_grid")                             # t5.py's negative prompt, or None

A sample is a contiguous window of exactly `frames` frames (a 93-frame video gives frames 0..92; the upstream loader
crashed there) of the video's own pixels, as `video` [3,T,H,W] in [-1,1], with `text_emb` [text_len, text_dim]
zero-padded, `text_mask` [text_len], `prompt`, `stem`, `start` (first frame) and `skipped` (videos that failed on the
way to this sample).

What is checked when, so that bad data stops a run at start-up and not in a DataLoader worker at step 2:
  at construction (every process): the manifest's sizes against (height, width) (a mismatch is an error: videos are
    never resized); each video's existence, byte count and frame count from the manifest (a counted skip); without a
    manifest, the first video is probed for its size (an error) and frame count; every t5 text embedding's shape, key
    and values, NaN/Inf refused (an error; see check_text_embeddings for what that costs; Reason1 files: their header
    here, their values at every read); a video named like t5.py's negative prompt (an error).
  at first use of a video in each process (a counted skip, reported once, and the next video is used): its file(s)
    still there (missing_file: one deleted since start-up is skipped and counted like one missing at start-up); the
    manifest's sha1 of the file; without a manifest the probe of its size and frame count (folders without a manifest
    can't be probed whole at start-up: 70k videos x ~30 ms); a truncated or too-short decode; a decode that logs errors
    even though ffmpeg exits 0; a views episode's camera file, its shapes and values (bad_camera: NaN/Inf).

Text embeddings: text_encoder="t5" reads t5_xxl/<stem>.pickle (upstream) or .safetensors, float32 as returned;
"reason1" reads t5.py --encoder reason1's reason1/<sha1(prompt)>.safetensors (bf16, returned as bf16: ~98 MiB a
sample at 512 x 100352, twice that in float32), its rows all unmasked (Reason1's pad tokens are real tokens).

Contents, top to bottom: Video and the folder listing (manifest or upstream layout, negative_prompt_path) -> text
embeddings (safe unpickling, shape checks, Reason1 files, the start-up check) -> GridClips -> ViewClips ->
ClipSampler -> Windows (one window by video and start, through GridClips' / ViewClips' own reader). Decoding a clip (read_clip, ClipError) and probing a file are base/video.py."""
import json
import os
import sys
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from base import camera
from base.files import sha1_file
from base.video import ClipError, probe_video, read_clip
from clips.text import NEGATIVE_STEM, clip_text, text_files
from nets import vae

MANIFEST_KEYS = ("stem", "prompt", "n_out", "height", "width")  # what GridClips needs of a manifest.jsonl line
VIEW_ORDER = camera.VIEW_ORDER  # the views of a views folder, in the camera net's order


@dataclass(kw_only=True)
class Video:
    stem: str
    path: str
    prompt: str
    frames: int | None  # from the manifest; None = probe it on first use
    size: tuple | None = None  # (height, width) from the manifest; None = probe it on first use
    sha1: str | None = None  # from the manifest: checked at first use in each process
    bytes: int | None = None  # from the manifest: checked at construction (a stat)
    views: dict | None = None  # stitch.py --layout views: slot -> Video of that camera's file
    cameras: str | None = None  # views: "real" (cameras/<stem>.npz) or "absent"


def seed_of(*parts: int) -> int:
    """A well-mixed 63-bit seed from integers (numpy's SeedSequence hashing)."""
    return int(np.random.SeedSequence(list(parts)).generate_state(1, np.uint64)[0] >> np.uint64(1))


def read_manifest(path: str) -> list:
    """The records of a manifest.jsonl, each with the keys GridClips needs (MANIFEST_KEYS)."""
    records = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:  # stitch.py rewrites the manifest whole at the end of a run
                raise ValueError(f"{path}:{n}: not valid JSON ({e}); a killed stitch.py leaves a torn line: rerun "
                                 "it to finish the folder") from None
            missing = [k for k in MANIFEST_KEYS if k not in rec]
            if missing:
                raise ValueError(f"{path}:{n}: no {missing} (stitch.py writes {list(MANIFEST_KEYS)}); restitch, or "
                                 "remove manifest.jsonl to read videos/ and metas/ as an upstream folder")
            records.append(rec)
    return records


def list_videos(root: str) -> list:
    """Videos of a stitched folder: from manifest.jsonl when there is one, else every videos/*.mp4 with its prompt
    from metas/<stem>.txt (the upstream layout). A video may not be named like the negative prompt's embedding."""
    manifest = os.path.join(root, "manifest.jsonl")
    if os.path.exists(manifest):
        videos = [Video(stem=r["stem"], path=os.path.join(root, "videos", r["stem"] + ".mp4"), prompt=r["prompt"],
                        frames=int(r["n_out"]), size=(int(r["height"]), int(r["width"])), sha1=r.get("sha1"),
                        bytes=r.get("bytes"))
                  if "views" not in r else  # a views folder: one file per camera slot, one Video each
                  Video(stem=r["stem"], path="", prompt=r["prompt"], frames=int(r["n_out"]),
                        size=(int(r["height"]), int(r["width"])), cameras=r.get("cameras"),
                        views={s: Video(stem=f"{r['stem']}.{s}",
                                        path=os.path.join(root, "videos", f"{r['stem']}.{s}.mp4"),
                                        prompt=r["prompt"], frames=int(r["n_out"]),
                                        size=(int(r["height"]), int(r["width"])), sha1=f["sha1"], bytes=f["bytes"])
                               for s, f in r["views"].items()})
                  for r in read_manifest(manifest)]
    else:
        folder = os.path.join(root, "videos")
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"{root}: neither manifest.jsonl nor videos/ exists; build it with stitch.py")
        videos = []
        for name in sorted(n for n in os.listdir(folder) if n.endswith(".mp4")):
            stem = name[:-4]
            meta = os.path.join(root, "metas", stem + ".txt")
            prompt = open(meta, encoding="utf-8").read().strip() if os.path.exists(meta) else ""
            videos.append(Video(stem=stem, path=os.path.join(folder, name), prompt=prompt, frames=None))
    if any(v.stem == NEGATIVE_STEM for v in videos):
        raise ValueError(f"{root}: a video is named {NEGATIVE_STEM}.mp4, the name t5.py gives the negative prompt's "
                         f"embedding (t5_xxl/{NEGATIVE_STEM}.pickle); rename the video (and its metas/ and manifest "
                         "entries)")
    return videos


# ------------------------------------------------------------------------------------------- text embeddings


def list_folder(root: str, height: int, width: int, views: bool) -> list:
    """list_videos(root), refused (ValueError, one line) when its manifest's sizes are not height x width or its
    layout is not the one asked for (views: stitch.py --layout views)."""
    videos = list_videos(root)
    sizes = Counter(v.size for v in videos if v.size is not None)
    if set(sizes) - {(height, width)}:
        wrong = [(s, n) for s, n in sizes.most_common() if s != (height, width)]
        raise size_error(root, wrong[0][0], f"{wrong[0][1]} of {len(videos)} in manifest.jsonl", height, width)
    if any((v.views is None) == views for v in videos):
        raise ValueError(f"{root}: {'a grid' if views else 'a multi-view'} folder; "
                         + ("ViewClips reads `python stitch.py SRC OUT --layout views` folders" if views else
                            "read it with data.ViewClips (GridClips reads grid folders)"))
    return videos


def file_problem(video: Video, frames: int) -> str | None:
    """Why a video cannot give `frames`-frame clips, from what construction can see cheaply: a counted skip."""
    if not os.path.isfile(video.path):
        return f"missing_file: {video.path}"
    if video.bytes is not None and os.path.getsize(video.path) != video.bytes:
        return f"bytes_mismatch: {video.path} has {os.path.getsize(video.path)} bytes, the manifest {video.bytes} " \
               "(a partial copy?)"
    if video.frames is not None and video.frames < frames:
        return f"too_short: {video.frames} frames < {frames}"
    return None


def short_videos(skipped: dict, frames: int, sep: str = "") -> str:
    """sep + the cause and the fix when videos were skipped as too short (file_problem's too_short), or ""."""
    have = sorted(int(reason.split()[1]) for reason in skipped.values() if reason.startswith("too_short: "))
    fit = (max(have, default=1) - 1) // 4 * 4 + 1  # the longest 4k+1-frame clip (the VAE's) the longest of them holds
    return "" if not have else (f"{sep}{len(have)} video(s) have {have[0]}{f'-{have[-1]}' * (have[-1] > have[0])} "
                                f"frames, fewer than the {frames} a clip needs: restitch with a smaller --stride (more "
                                f"frames per episode), or train with --frames {fit}")


def size_error(root: str, found: tuple, where: str, height: int, width: int) -> ValueError:
    return ValueError(f"{root}: the videos are {found[0]}x{found[1]} ({where}), this run asks for {height}x{width}; "
                      f"videos are never resized: pass --height {found[0]} --width {found[1]}, or restitch with "
                      f"`python stitch.py SRC OUT --size {height}x{width}`")


def require_file(path: str):
    """ClipError missing_file for a file deleted since start-up: a counted skip, as one missing at start-up."""
    if not os.path.isfile(path):
        raise ClipError(f"missing_file: {path} (deleted since start-up)")


def first_loadable(dataset, item) -> tuple:
    """(video, attempt, clip) of an item, rng from its seed; a bad video (ClipError) is said once and skipped."""
    index, sample_seed = item if isinstance(item, tuple) else (item, seed_of(dataset.seed, item))
    rng = np.random.default_rng(sample_seed)
    for attempt in range(len(dataset.videos)):
        video = dataset.videos[(index + attempt) % len(dataset.videos)]
        if video.stem in dataset.failed:
            continue
        try:
            return video, attempt, dataset._clip(video, rng)
        except ClipError as e:
            dataset.failed[video.stem] = str(e)
            print(f"{type(dataset).__name__}: skipping {video.path or video.stem}: {e} ({len(dataset.failed)} failed "
                  "in this process)", file=sys.stderr)
    stem, why = next(iter(dataset.failed.items()))  # a user error, one line (each was said above as it failed)
    raise ValueError(f"{dataset.root}: all {len(dataset.failed)} videos failed to load, e.g. {stem}: {why}")


class GridClips(Dataset):
    """Clips of `frames` frames from a stitched folder whose videos are height x width; see the module docstring.

    Sizes: a folder with a manifest whose videos are not height x width is refused at construction. A folder without
    one (upstream layout) is refused when its first video is another size; any other video of another size is
    skipped and counted at first use (wrong_size), since probing every video at start-up costs ~30 ms each.
    text="t5" reads the embeddings of text_encoder ("t5": t5_xxl/<stem>.pickle or .safetensors, float32 [text_len,
    text_dim]; "reason1": reason1/<sha1(prompt)>.safetensors, bf16) and fails at construction if any is missing or
    has the wrong shape (or, t5, NaN/Inf values); text="standin" uses standin_text_embedding (the built-in tiny
    default only). An item is a video index, or (index, sample_seed) as ClipSampler yields; the seed picks the window
    start, so a resumed run draws the same clips. A --layout views folder is ViewClips'."""

    def __init__(self, root: str, frames: int, height: int, width: int, text_len: int = 512, text_dim: int = 1024,
                 text: str = "t5", seed: int = 0, dtype: torch.dtype = torch.float32, text_encoder: str = "t5"):
        text_files(root, [], text, text_encoder, text_len, text_dim)  # the settings, before any file is read
        if frames < 1 or height < 2 or width < 2:
            raise ValueError(f"frames={frames}, height={height}, width={width}: need frames >= 1 and a real size")
        self.root, self.frames, self.height, self.width = root, frames, height, width
        self.text, self.text_len, self.text_dim, self.seed, self.dtype = text, text_len, text_dim, seed, dtype
        self.text_encoder = text_encoder
        self.failed = {}  # stem -> reason, found while loading, in this process
        self.verified = set()  # stems whose sha1 matched the manifest's, in this process
        videos = list_folder(root, height, width, views=False)
        problems = {v.stem: file_problem(v, frames) for v in videos}
        self.skipped = {s: p for s, p in problems.items() if p}  # stem -> reason, found at construction (every worker)
        self.videos = [v for v in videos if not problems[v.stem]]
        for v in [v for v in self.videos if v.size is None]:  # no manifest: the first readable video decides
            try:
                self._probe(v)
            except ClipError as e:
                self.skipped[v.stem] = str(e)
                self.videos.remove(v)
                continue
            if v.size != (height, width):
                raise size_error(root, v.size, f"{v.path}, probed", height, width)
            break
        if not self.videos:
            raise ValueError(f"{root}: no usable video for {frames}-frame clips ({len(self.skipped)} skipped: "
                             f"{dict(list(self.skipped.items())[:5])}){short_videos(self.skipped, frames, '; ')}")
        self.text_paths, read = text_files(root, self.videos, text, text_encoder, text_len, text_dim)
        reasons = Counter(reason.split(":")[0] for reason in self.skipped.values())
        print(f"GridClips: {root}: {len(self.videos)} videos {height}x{width}, {len(self.skipped)} skipped"
              + (f" {dict(reasons)}" if reasons else "") + short_videos(self.skipped, frames, "; ")
              + (f"; {text_encoder} text embeddings checked ({read} files read whole)" if text == "t5" else ""))

    def __len__(self):
        return len(self.videos)

    def __getitem__(self, item) -> dict:
        video, attempt, (clip, start, *more) = first_loadable(self, item)  # more: a subclass's fields (clips/actionclips.py)
        emb, mask = clip_text(self, video)
        pixels = torch.empty((3,) + clip.shape[:3], dtype=self.dtype)
        pixels.copy_(torch.from_numpy(clip).permute(3, 0, 1, 2))  # [T,H,W,3] uint8 -> [3,T,H,W]
        return {"video": pixels.div_(127.5).sub_(1.0), "text_emb": emb, "text_mask": mask,
                "prompt": video.prompt, "stem": video.stem, "start": start, "skipped": attempt, **dict(*more)}

    @staticmethod
    def _probe(video: Video):
        """Frame count (packets, no decoding) and size of a video without a manifest entry."""
        try:
            info = probe_video(video.path, decode=False)
        except RuntimeError as e:
            raise ClipError(f"unreadable: {e}") from None
        video.frames, video.size = info["frames"], (info["height"], info["width"])

    def _clip(self, video: Video, rng) -> tuple:
        require_file(video.path)
        if video.frames is None or video.size is None:
            self._probe(video)
        if video.size != (self.height, self.width):
            raise ClipError(f"wrong_size: {video.path} is {video.size[0]}x{video.size[1]}, expected "
                            f"{self.height}x{self.width}")
        if video.frames < self.frames:
            raise ClipError(f"too_short: {video.frames} frames < {self.frames}")
        if video.sha1 and video.stem not in self.verified:  # once per video and process: ~5 ms for a 4 MB grid
            digest = sha1_file(video.path)
            if digest != video.sha1:
                raise ClipError(f"sha1_mismatch: {video.path} has sha1 {digest}, manifest.jsonl says {video.sha1} "
                                "(changed since stitch.py wrote it)")
            self.verified.add(video.stem)
        start = int(rng.integers(0, video.frames - self.frames + 1))  # inclusive: T == frames gives start 0
        return read_clip(video.path, start, self.frames, self.height, self.width), start


class ViewClips(Dataset):
    """Multi-view clips from a `stitch.py --layout views` folder, for the Predict2.5 agibot model (docs/multiview.md).

    An item (an index, or (index, sample_seed) as ClipSampler yields) is a dict:
      video [V,3,T,H,W] in [-1,1], the views in VIEW_ORDER, the agibot model's internal order [hand_0, head, hand_1]
        = [wrist, ext_1 (exterior_1_left), ext_2 (exterior_2_left)]: the same window of frames in every view;
      w2c [V,Tl,3,4] (world -> camera, OpenCV axes) and intrinsics [V,Tl,4] ((fx, fy, cx, cy) in pixels of H x W),
        float32, one per LATENT frame (Tl = (T-1)/4 + 1): latent k <-> pixel frame start + 4k (frame 0 is latent 0
        alone, latent k >= 1 encodes frames 4k-3..4k, of which 4k is the last), as upstream's camera files are;
      cameras "real" (the folder's cameras/<stem>.npz) or "fallback" (camera.fallback_cameras: the folder has none,
        said once at construction); views (the slot names, in order); text_emb, text_mask, prompt, stem, start,
        skipped as GridClips.
    Checks as GridClips (per view file: existence, bytes, length, sha1 at first use, decode errors) plus each
    camera file's presence at construction and its shapes and values (NaN/Inf: bad_camera) at first use. T must be
    4k+1 (the VAE's frame counts)."""

    def __init__(self, root: str, frames: int, height: int, width: int, text_len: int = 512, text_dim: int = 1024,
                 text: str = "t5", seed: int = 0, dtype: torch.dtype = torch.float32, text_encoder: str = "t5"):
        text_files(root, [], text, text_encoder, text_len, text_dim)  # the settings, before any file is read
        if frames < 1 or frames % 4 != 1 or height < 16 or width < 16:
            raise ValueError(f"frames={frames}, height={height}, width={width}: need frames = 4k+1 (the VAE's "
                             "frame counts, one camera per latent frame) and a real size")
        self.root, self.frames, self.height, self.width = root, frames, height, width
        self.text, self.text_len, self.text_dim, self.seed, self.dtype = text, text_len, text_dim, seed, dtype
        self.text_encoder, self.skipped, self.failed, self.verified = text_encoder, {}, {}, set()
        videos = list_folder(root, height, width, views=True)
        self.videos = []
        for v in videos:
            if sorted(v.views) != sorted(VIEW_ORDER):
                raise ValueError(f"{root}/manifest.jsonl: {v.stem} has views {sorted(v.views)}, ViewClips needs "
                                 f"{sorted(VIEW_ORDER)} (stitch.py's slots)")
            problem = next(filter(None, (file_problem(v.views[s], frames) for s in VIEW_ORDER)), None)
            if not problem and v.cameras == "real" and not os.path.isfile(self._camera_path(v)):
                problem = f"missing_file: {self._camera_path(v)}"
            self.skipped.update({v.stem: problem} if problem else {})
            self.videos += [] if problem else [v]
        if not self.videos:
            raise ValueError(f"{root}: no usable video for {frames}-frame clips ({len(self.skipped)} skipped: "
                             f"{dict(list(self.skipped.items())[:5])}){short_videos(self.skipped, frames, '; ')}")
        kinds = {v.cameras for v in self.videos}
        if len(kinds) > 1 or kinds - {"real", "absent"}:
            raise ValueError(f"{root}/manifest.jsonl: cameras {sorted(map(str, kinds))}; one stitch.py recipe writes "
                             "all 'real' or all 'absent': restitch the folder")
        self.fallback = None if kinds != {"absent"} else \
            camera.fallback_cameras(len(VIEW_ORDER), vae.latent_frames(frames), height, width)  # base/camera.py's rig
        self.text_paths, read = text_files(root, self.videos, text, text_encoder, text_len, text_dim)
        reasons = Counter(reason.split(":")[0] for reason in self.skipped.values())
        print(f"ViewClips: {root}: {len(self.videos)} episodes x {len(VIEW_ORDER)} views {' '.join(VIEW_ORDER)} "
              f"{height}x{width}, {len(self.skipped)} skipped" + (f" {dict(reasons)}" if reasons else "")
              + short_videos(self.skipped, frames, "; ")
              + (f"; {text_encoder} text embeddings checked ({read} files read whole)" if text == "t5" else ""))
        if self.fallback is not None:
            print(f"ViewClips: {root} has NO camera parameters (stitched without them): every clip gets "
                  "camera.fallback_cameras, a fixed made-up rig that only tells the views apart; sample such a model "
                  "with the same fallback (docs/multiview.md)")

    def _camera_path(self, video: Video) -> str:
        return os.path.join(self.root, "cameras", video.stem + ".npz")

    def __len__(self):
        return len(self.videos)

    def __getitem__(self, item) -> dict:
        video, attempt, (clips, start, w2c, intrinsics, *more) = first_loadable(self, item)
        emb, mask = clip_text(self, video)
        pixels = torch.empty((len(clips), 3) + clips[0].shape[:3], dtype=self.dtype)
        for v, clip in enumerate(clips):  # [T,H,W,3] uint8 -> [3,T,H,W]
            pixels[v].copy_(torch.from_numpy(clip).permute(3, 0, 1, 2))
        return {"video": pixels.div_(127.5).sub_(1.0), "w2c": w2c, "intrinsics": intrinsics,
                "cameras": "fallback" if self.fallback is not None else "real", "views": list(VIEW_ORDER),
                "text_emb": emb, "text_mask": mask, "prompt": video.prompt, "stem": video.stem, "start": start,
                "skipped": attempt, **dict(*more)}

    def _clip(self, video: Video, rng) -> tuple:
        for slot in VIEW_ORDER:  # once per file and process
            view = video.views[slot]
            require_file(view.path)
            if view.sha1 and view.stem not in self.verified:
                digest = sha1_file(view.path)
                if digest != view.sha1:
                    raise ClipError(f"sha1_mismatch: {view.path} has sha1 {digest}, manifest.jsonl says {view.sha1} "
                                    "(changed since stitch.py wrote it)")
                self.verified.add(view.stem)
        start = int(rng.integers(0, video.frames - self.frames + 1))
        latent_frames = start + 4 * np.arange(vae.latent_frames(self.frames))
        if self.fallback is not None:
            w2c, intrinsics = (t.clone() for t in self.fallback)
        else:
            path = self._camera_path(video)
            require_file(path)
            with np.load(path) as f:
                names, w2c_all, k_all = [str(n) for n in f["views"]], f["w2c"], f["intrinsics"]
            n = (len(names), video.frames)
            if sorted(names) != sorted(VIEW_ORDER) or w2c_all.shape != n + (3, 4) or k_all.shape != n + (4,):
                raise ClipError(f"bad_camera: {path} holds views {names}, w2c {w2c_all.shape}, intrinsics "
                                f"{k_all.shape}; expected {sorted(VIEW_ORDER)}, {n + (3, 4)}, {n + (4,)}")
            if not (np.isfinite(w2c_all).all() and np.isfinite(k_all).all()):
                raise ClipError(f"bad_camera: {path} holds NaN/Inf values; restitch the episode (delete the file "
                                "first)")
            order = [names.index(s) for s in VIEW_ORDER]
            w2c = torch.from_numpy(w2c_all[order][:, latent_frames].astype(np.float32))
            intrinsics = torch.from_numpy(k_all[order][:, latent_frames].astype(np.float32))
        clips = [read_clip(video.views[s].path, start, self.frames, self.height, self.width) for s in VIEW_ORDER]
        return clips, start, w2c, intrinsics


class ClipSampler(Sampler):
    """Endless, deterministic, resumable sampler of (video_index, sample_seed) for each rank.

    Epoch e is a permutation of all videos seeded by (seed, e), the same on every rank, padded by wrapping to a
    multiple of world_size; rank r takes slots r, r + world_size, ... Its one piece of state is `position`: the
    samples this rank has consumed over all epochs. sample_seed depends on (seed, epoch, slot) only, so a sample
    gets the same window whatever the world size."""

    def __init__(self, num_videos: int, rank: int = 0, world_size: int = 1, seed: int = 0, shuffle: bool = True):
        if num_videos < 1 or not 0 <= rank < world_size:
            raise ValueError(f"num_videos={num_videos} must be >= 1 and 0 <= rank={rank} < world_size={world_size}")
        self.num_videos, self.rank, self.world_size = num_videos, rank, world_size
        self.seed, self.shuffle = seed, shuffle
        self.per_rank = -(-num_videos // world_size)  # samples per rank per epoch
        self.position = 0

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_videos)
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_videos)

    def __iter__(self):
        epoch, order = None, None
        while True:
            e, offset = divmod(self.position, self.per_rank)
            if e != epoch:
                epoch, order = e, self._order(e)
            slot = offset * self.world_size + self.rank
            self.position += 1
            yield int(order[slot % self.num_videos]), seed_of(self.seed, e, slot)

    def state_dict(self, consumed: int | None = None) -> dict:
        """consumed: samples the training loop has taken from this rank's loader (step * batch_size); pass it when
        DataLoader workers prefetch, since the sampler has then run ahead of the loop."""
        return {"position": self.position if consumed is None else consumed, "num_videos": self.num_videos,
                "world_size": self.world_size, "seed": self.seed, "shuffle": self.shuffle}

    def load_state_dict(self, state: dict):
        for key in ("num_videos", "world_size", "seed", "shuffle"):
            if state[key] != getattr(self, key):
                raise ValueError(f"sampler state has {key}={state[key]}, this run {getattr(self, key)}: resuming "
                                 "would replay or skip samples; keep the dataset, world size and seed")
        self.position = int(state["position"])


def train_count(folder, dataset, holdout_flag, frames, say):
    """How many of the folder's videos train (the last --holdout in name order are held out; -1: 2%, at least
    one); a folder left with none is refused with the cause first (short videos or too few episodes), then the fix."""
    holdout = holdout_flag if holdout_flag >= 0 else max(1, len(dataset) // 50)
    if 0 < len(dataset) - holdout < holdout:  # legal, but rarely meant: the tiny preset's 2 of a 3-episode folder
        say(f"WARNING: {folder}: --holdout {holdout} leaves {len(dataset) - holdout} of its {len(dataset)} "
            "usable videos to train on, fewer than it holds out: stitch more episodes, or pass a smaller --holdout")
    if len(dataset) - holdout < 1:  # the cause first (videos shorter than the clips, or too few episodes), the fix
        short, n = short_videos(dataset.skipped, frames), len(dataset)
        raise ValueError(f"{folder}: " + (f"{short}; the {n} video(s) left are" if short else f"only {n} usable "
                         f"video(s) for {frames}-frame clips,") + f" all held out by --holdout {holdout}: "
                         + ("" if short else "stitch more episodes, or ") + ("pass --holdout 1 (evaluate.py and "
                         "policyeval.py need one held-out episode), or " if n > 1 else "") + "--holdout 0 to train on "
                         "them all (no held-out evaluation: evaluate.py and policyeval.py then refuse the run)")
    return len(dataset) - holdout


# -----------------------------------------------------------------------------
# One window by (video, start): what the latent cache, evaluation and the chained objectives read


class FixedStart:
    """Stands in for the numpy Generator that GridClips / ViewClips._clip draw a window start from, and returns the
    start asked for: the cache reads a window through exactly the code (and checks) training reads it with."""

    def __init__(self, start: int):
        self.start = start

    def integers(self, low: int, high: int) -> int:
        if not low <= self.start < high:
            raise ValueError(f"window start {self.start} outside [{low}, {high})")
        return self.start


class Windows(Dataset):
    """(video index, start) -> the window's pixels as GridClips / ViewClips give them ([3,T,H,W] or [V,3,T,H,W]
    float32 in [-1, 1]) with its cameras (clips/actionclips.py's: action, state), or the ClipError's text: the encoder
    counts it, nothing is raised."""

    def __init__(self, clips, items: list):
        self.clips, self.items = clips, items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        index, start = self.items[i]
        try:
            got = self.clips._clip(self.clips.videos[index], FixedStart(start))
        except ClipError as e:
            return {"index": index, "start": start, "error": str(e)}
        views = isinstance(self.clips, ViewClips)
        pixels = torch.stack([torch.from_numpy(c) for c in got[0]]) if views else torch.from_numpy(got[0])
        # [(V,) T, H, W, 3] uint8 -> [(V,) 3, T, H, W]: the same operations as GridClips, so the same bits
        item = {"index": index, "start": start, "video": pixels.movedim(-1, -4).float().div_(127.5).sub_(1.0)}
        extra = got[-1] if isinstance(got[-1], dict) else {}  # clips/actionclips.py: the clip's action chunk and states
        return item | ({"w2c": got[2], "intrinsics": got[3]} if views else {}) | extra
