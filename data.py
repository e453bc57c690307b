"""Training clips from a stitched grid folder (stitch.py's output, or any upstream-style videos/ + t5_xxl/ folder).

    ds = GridClips("data/droid_grid", frames=93, height=432, width=768)       # real T5 embeddings required
    sampler = ClipSampler(len(ds), rank=rank, world_size=world_size, seed=0)
    loader = DataLoader(ds, batch_size=1, sampler=sampler, num_workers=8)
    ...
    ckpt["sampler"] = sampler.state_dict(consumed=step * batch_size)         # exact even with prefetching workers
    sampler.load_state_dict(ckpt["sampler"])                                  # before building the loader iterator

A sample is a contiguous window of exactly `frames` frames (a 93-frame video gives frames 0..92; the upstream loader
crashed there), resized to (height, width) as `video` [3,T,H,W] in [-1,1], with `text_emb` [text_len, text_dim]
zero-padded, `text_mask` [text_len], `prompt`, `stem`, `start` (first frame) and `skipped` (videos that failed on the
way to this sample). A corrupt, truncated or too-short video never kills a worker: it is skipped, counted, reported
once per worker, and the next video is used instead.
"""
import hashlib
import io
import json
import os
import pickle
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass

import numpy as np
import safetensors.torch
import torch
from torch.utils.data import Dataset, Sampler

from stitch import ffmpeg_exe, probe_video


@dataclass
class Video:
    stem: str
    path: str
    prompt: str
    frames: int | None  # from the manifest; None = count it on first use


def seed_of(*parts: int) -> int:
    """A well-mixed 63-bit seed from integers (numpy's SeedSequence hashing)."""
    return int(np.random.SeedSequence(list(parts)).generate_state(1, np.uint64)[0] >> np.uint64(1))


class ClipError(Exception):
    """A video that cannot give a clip: the sample moves on to the next video."""


def list_videos(root: str) -> list:
    """Videos of a stitched folder: from manifest.jsonl when there is one, else every videos/*.mp4 with its prompt
    from metas/<stem>.txt (the upstream layout)."""
    manifest = os.path.join(root, "manifest.jsonl")
    if os.path.exists(manifest):
        with open(manifest, encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.strip()]
        return [Video(r["stem"], os.path.join(root, "videos", r["stem"] + ".mp4"), r["prompt"], int(r["n_out"]))
                for r in records]
    folder = os.path.join(root, "videos")
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{root}: neither manifest.jsonl nor videos/ exists; build it with stitch.py")
    videos = []
    for name in sorted(n for n in os.listdir(folder) if n.endswith(".mp4")):
        stem = name[:-4]
        meta = os.path.join(root, "metas", stem + ".txt")
        prompt = open(meta, encoding="utf-8").read().strip() if os.path.exists(meta) else ""
        videos.append(Video(stem, os.path.join(folder, name), prompt, None))
    return videos


class _NumpyOnly(pickle.Unpickler):
    """Unpickles the upstream t5_xxl/*.pickle (a list of one numpy array) and nothing else: a pickle can run code."""
    # protocols 2-4 rebuild arrays with _reconstruct (protocol 2 passes the bytes through _codecs.encode), protocol 5
    # (the default from Python 3.14) with _frombuffer
    ALLOWED = {("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "_reconstruct"),
               ("numpy._core.multiarray", "_reconstruct"), ("numpy.core.numeric", "_frombuffer"),
               ("numpy._core.numeric", "_frombuffer"), ("_codecs", "encode")}

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED and not (module == "numpy.dtypes" and name.endswith("DType")):
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a text-embedding pickle")
        return super().find_class(module, name)


def load_text_embedding(path: str, text_len: int, text_dim: int) -> tuple:
    """(emb [text_len, text_dim] float32 zero-padded, mask [text_len] int64) from t5_xxl/<stem>.pickle (upstream: a
    list of one float16 array (tokens, dim)) or .safetensors (tensor "text_emb" (tokens, dim))."""
    if path.endswith(".pickle"):
        with open(path, "rb") as f:
            obj = _NumpyOnly(io.BytesIO(f.read())).load()
        if not (isinstance(obj, list) and len(obj) == 1 and isinstance(obj[0], np.ndarray)):
            raise ValueError(f"{path}: expected a list of one numpy array, got {type(obj).__name__}")
        arr = torch.from_numpy(obj[0].astype(np.float32))
    else:
        tensors = safetensors.torch.load_file(path)
        if "text_emb" not in tensors:
            raise ValueError(f"{path}: no tensor 'text_emb' (has {sorted(tensors)})")
        arr = tensors["text_emb"].float()
    if arr.ndim != 2 or arr.shape[1] != text_dim or arr.shape[0] > text_len:
        raise ValueError(f"{path}: text embedding has shape {tuple(arr.shape)}, expected (<= {text_len}, {text_dim})")
    emb, mask = torch.zeros(text_len, text_dim), torch.zeros(text_len, dtype=torch.int64)
    emb[:len(arr)], mask[:len(arr)] = arr, 1
    return emb, mask


def standin_text_embedding(prompt: str, text_len: int, text_dim: int) -> tuple:
    """The tiny default's stand-in for T5: one N(0,1) row per word of the prompt (at most text_len), from a generator
    seeded with sha256(prompt), zero-padded; the same prompt always gives the same embedding. Not for real training."""
    seed = int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:8], "little") >> 1
    n = min(text_len, max(1, len(prompt.split())))
    emb, mask = torch.zeros(text_len, text_dim), torch.zeros(text_len, dtype=torch.int64)
    emb[:n], mask[:n] = torch.randn(n, text_dim, generator=torch.Generator().manual_seed(seed)), 1
    return emb, mask


def read_clip(path: str, start: int, frames: int, height: int, width: int, fit: str = "stretch") -> np.ndarray:
    """Frames start .. start+frames-1 as uint8 [frames, height, width, 3] RGB; ClipError when they aren't all there.

    fit="stretch" resizes straight to (height, width) like the upstream loader; "crop" keeps the aspect and
    centre-crops. Selecting by frame number (not time) makes the window exact; our videos are short, so decoding
    from frame 0 costs little."""
    scale = f"scale={width}:{height}:flags=bilinear" if fit == "stretch" else \
        f"scale={width}:{height}:force_original_aspect_ratio=increase:flags=bilinear,crop={width}:{height}"
    args = [ffmpeg_exe(), "-hide_banner", "-nostdin", "-loglevel", "error", "-threads", "2", "-i", path,
            "-map", "0:v:0", "-vf", f"select='gte(n,{start})',{scale}", "-frames:v", str(frames),
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
        if rc != 0 or got != len(view) or extra:
            log.seek(0)
            err = log.read().decode(errors="replace").strip().splitlines()
            raise ClipError(f"decoded {got // (height * width * 3)} of {frames} frames from frame {start} "
                            f"(ffmpeg rc {rc}{': ' + err[-1] if err else ''})")
    return clip


class GridClips(Dataset):
    """Clips of `frames` frames at (height, width) from a stitched folder; see the module docstring.

    text="t5" reads t5_xxl/<stem>.pickle or .safetensors and fails at construction if any is missing; text="standin"
    uses standin_text_embedding (the built-in tiny default only). An item is a video index, or (index, sample_seed)
    as ClipSampler yields; the seed picks the window start, so a resumed run draws the same clips."""

    def __init__(self, root: str, frames: int, height: int, width: int, text_len: int = 512, text_dim: int = 1024,
                 text: str = "t5", fit: str = "stretch", seed: int = 0, dtype: torch.dtype = torch.float32):
        if text not in ("t5", "standin") or fit not in ("stretch", "crop"):
            raise ValueError(f"text={text!r} must be 't5' or 'standin'; fit={fit!r} must be 'stretch' or 'crop'")
        if frames < 1 or height < 2 or width < 2:
            raise ValueError(f"frames={frames}, height={height}, width={width}: need frames >= 1 and a real size")
        self.root, self.frames, self.height, self.width, self.fit = root, frames, height, width, fit
        self.text, self.text_len, self.text_dim, self.seed, self.dtype = text, text_len, text_dim, seed, dtype
        self.skipped = {}  # stem -> reason, found at construction (same in every worker)
        self.failed = {}  # stem -> reason, found while loading, in this process
        self.videos = []
        for v in list_videos(root):
            if not os.path.isfile(v.path):
                self.skipped[v.stem] = f"missing_file: {v.path}"
            elif v.frames is not None and v.frames < frames:
                self.skipped[v.stem] = f"too_short: {v.frames} frames < {frames}"
            else:
                self.videos.append(v)
        if not self.videos:
            raise ValueError(f"{root}: no usable video for {frames}-frame clips ({len(self.skipped)} skipped: "
                             f"{dict(list(self.skipped.items())[:5])})")
        if text == "t5":
            self.text_paths = {v.stem: self._text_path(v.stem) for v in self.videos}
            missing = [s for s, p in self.text_paths.items() if p is None]
            if missing:
                raise FileNotFoundError(
                    f"{root}: {len(missing)} of {len(self.videos)} videos have no text embedding "
                    f"(t5_xxl/{missing[0]}.pickle or .safetensors); compute them with `python t5.py {root}`. "
                    "Only the built-in tiny default may use text='standin'.")
        reasons = Counter(reason.split(":")[0] for reason in self.skipped.values())
        print(f"GridClips: {root}: {len(self.videos)} videos, {len(self.skipped)} skipped {dict(reasons) or ''}")

    def _text_path(self, stem: str):
        for ext in (".pickle", ".safetensors"):
            path = os.path.join(self.root, "t5_xxl", stem + ext)
            if os.path.exists(path):
                return path
        return None

    def __len__(self):
        return len(self.videos)

    def __getitem__(self, item) -> dict:
        index, sample_seed = item if isinstance(item, tuple) else (item, seed_of(self.seed, item))
        rng = np.random.default_rng(sample_seed)
        for attempt in range(len(self.videos)):  # on a bad video, move on to the next one
            video = self.videos[(index + attempt) % len(self.videos)]
            if video.stem in self.failed:
                continue
            try:
                clip, start = self._clip(video, rng)
            except ClipError as e:
                self.failed[video.stem] = str(e)
                print(f"GridClips: skipping {video.path}: {e} ({len(self.failed)} failed in this process)",
                      file=sys.stderr)
                continue
            if self.text == "t5":
                emb, mask = load_text_embedding(self.text_paths[video.stem], self.text_len, self.text_dim)
            else:
                emb, mask = standin_text_embedding(video.prompt, self.text_len, self.text_dim)
            pixels = torch.empty((3,) + clip.shape[:3], dtype=self.dtype)
            pixels.copy_(torch.from_numpy(clip).permute(3, 0, 1, 2))  # [T,H,W,3] uint8 -> [3,T,H,W]
            return {"video": pixels.div_(127.5).sub_(1.0), "text_emb": emb, "text_mask": mask,
                    "prompt": video.prompt, "stem": video.stem, "start": start, "skipped": attempt}
        raise RuntimeError(f"{self.root}: every video failed to load in this process: {self.failed}")

    def _clip(self, video: Video, rng) -> tuple:
        if video.frames is None:  # no manifest: count packets once (no decoding)
            try:
                video.frames = probe_video(video.path, decode=False)["frames"]
            except RuntimeError as e:
                raise ClipError(str(e)) from None
        if video.frames < self.frames:
            raise ClipError(f"too_short: {video.frames} frames < {self.frames}")
        start = int(rng.integers(0, video.frames - self.frames + 1))  # inclusive: T == frames gives start 0
        return read_clip(video.path, start, self.frames, self.height, self.width, self.fit), start


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
