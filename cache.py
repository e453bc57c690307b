"""The on-disk latent cache: every clip window encoded once by the VAE, so training reads latents instead of
decoding and encoding video at every step (~0.7 s of a 2.9 s 2B step on an H200, BENCHMARKS.md). docs/cache.md.

    python cache.py --data DATA --out CACHE --vae real --vae-ckpt tokenizer.pth [--frames 93 --height 432
                    --width 768 --stride 32 --dtype auto --workers N]
    torchrun --nproc_per_node=8 cache.py ...        # video i is encoded by rank i % world
    ds = LatentClips(CACHE, DATA, 93, 432, 768, vae="real", vae_ckpt=..., dtype="bf16")   # GridClips' protocol

Why windows and not whole episodes: the Wan VAE is causal in time (frame 0 alone, then groups of 4 with a carried
cache), so the latent of a window starting at frame s is not a slice of the episode's latent. A video of n frames
caches the windows starting at 0, S, 2S, ... <= n - T, plus the last one (n - T) when the grid misses it, so the
episode's final frames are always in some window. Training draws one cached window uniformly per sample from the seed
ClipSampler hands out: deterministic and resumable like GridClips, but over these starts instead of every start.

CACHE holds cache.json (the key, written first), latents/<stem>.safetensors per video (latent [n, C, T', h, w] in
the encode dtype, exactly what vae.encode returned, views stacked on latent time as train.py does; starts [n]; for a
views folder w2c [n, V, T', 3, 4] and intrinsics [n, V, T', 4]; metadata: the key's hash, the video's manifest sha1
and one checksum per window, verified at every read), each written atomically, and index.json, written last by rank
0: the completion marker and what the reader checks at start-up (a reader never lists 70k files' headers). Rank 0
holds CACHE/.lock while it builds: a second cache.py on the folder is refused.

The key (cache.json) is everything that changes the latents: the VAE's name, config and checkpoint identity (size and
sha256 of its first and last MiB, as ckpt.py identifies files), frames, height, width, stride, layout, encode dtype
and, for views, the stitch recipe's camera parameters. A rerun with another key is refused; with the same key it
skips complete files (right key and manifest sha1) and encodes the rest: a killed run resumes, a restitched video is
re-encoded. A video that fails to decode is named in the summary and recorded in the index; the reader skips it as
GridClips skips a video that fails at first use.

Contents, top to bottom: config -> key and windows -> writing (windows read through GridClips / ViewClips, encode,
atomic files, the index) -> reading (check_cache, LatentClips) -> main.
"""
import dataclasses
import hashlib
import json
import os
import sys
import time

import safetensors
import safetensors.torch
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from base import cli, files
from base.camera import stack_views
from base.files import write_atomic
from base.formats import identity
from clips import data
from clips.data import FixedStart, Windows  # (video, start) -> a window, as training reads it
from clips import text as text_lib
from engine.build import build_vae
from nets import vae as vae_lib

FORMAT = "nanocosmos-latent-cache-v2"  # bump when the bytes written for one key change (v2: per-window sums)
READ_KEY = ("format", "vae", "vae_config", "vae_ckpt", "frames", "height", "width", "layout", "camera_params",
            "dtype")  # the key fields a reader must match; stride only shapes which windows exist


@dataclasses.dataclass
class CacheConfig:
    data: str = ""  # the stitched folder (stitch.py's output, grid or --layout views) whose clips to encode
    out: str = ""  # CACHE: the cache folder; a rerun with the same settings resumes it
    vae: str = "real"  # real (the released tokenizer.pth) or tiny (train.py's tiny configs: a seeded random VAE)
    vae_ckpt: str = ""  # tokenizer.pth (Wan2.1 VAE) for --vae real
    frames: int = 93  # clip length in frames (4k+1), as train.py --frames
    height: int = 432  # as train.py --height
    width: int = 768  # as train.py --width
    stride: int = 32  # frames between cached window starts (the last window is always added too): a third of a
    # 93-frame clip, so every frame is in ~3 windows at different places; 6 windows for a 250-frame video
    dtype: str = "auto"  # encode and storage dtype: auto = bf16 on CUDA, fp32 on CPU (train.py's); or bf16, fp32
    device: str = "auto"  # auto = cuda:LOCAL_RANK when CUDA is there, else cpu
    workers: int = -1  # DataLoader processes per rank decoding windows ahead of the encoder (0: in this process;
    # -1: min(8, this node's usable CPUs / its ranks)); more if the progress line's s/video is well above the VAE's
    # (~0.7 s a 93x432x768 window on an H200)
    progress_every: int = 100  # one progress line every N videos of each rank; 0 = none

    def __post_init__(self):  # checked when built, so a bad flag stops the run before any work
        if not self.data or not self.out:
            raise ValueError("--data DATA and --out CACHE are required (see --help)")
        if self.vae not in vae_lib.VAE_CONFIGS or (self.vae == "real") != bool(self.vae_ckpt):
            raise ValueError(f"--vae {self.vae} --vae-ckpt {self.vae_ckpt!r}: expected --vae real --vae-ckpt "
                             f"tokenizer.pth, or --vae tiny without --vae-ckpt")
        if self.frames < 1 or self.frames % 4 != 1 or self.height % 16 or self.width % 16 or self.height < 16 or \
                self.width < 16:
            raise ValueError(f"--frames {self.frames} --height {self.height} --width {self.width}: frames must be "
                             "4k+1 (the VAE's frame counts), height and width positive multiples of 16")
        if self.workers == -1:
            self.workers = default_workers()
        if self.stride < 1 or self.workers < 0 or self.progress_every < 0:
            raise ValueError(f"--stride {self.stride} must be >= 1, --workers {self.workers} and --progress-every "
                             f"{self.progress_every} >= 0")
        if self.dtype not in ("auto", "bf16", "fp32") or self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"--dtype {self.dtype} --device {self.device}: expected --dtype auto|bf16|fp32 and "
                             "--device auto|cpu|cuda")


def default_workers():
    """min(8, the CPUs this process may run on / the ranks of this node): 8 decoders per rank on a 64-core 8-GPU node,
    2 on a 2-core laptop (8 there would only thrash)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(8, cpus // int(os.environ.get("LOCAL_WORLD_SIZE", 1))))


# -----------------------------------------------------------------------------
# The key and the windows


def open_clips(data_dir: str, frames: int, height: int, width: int, **text) -> Dataset:
    """GridClips or ViewClips of data_dir, as its manifest's layout says (text: their text settings; default the
    stand-in, which reads no file). Every video must carry the manifest's sha1: it is how a restitched video is told
    apart from the one that was cached."""
    views = any(v.views for v in data.list_videos(data_dir))
    clips = (data.ViewClips if views else data.GridClips)(data_dir, frames, height, width,
                                                          **({"text": "standin"} | text))
    unsigned = [v.stem for v in clips.videos if video_sha1(v) is None]
    if unsigned:
        raise ValueError(f"{data_dir}: {len(unsigned)} of {len(clips.videos)} videos have no sha1 in manifest.jsonl "
                         f"(first: {unsigned[0]}); the cache needs it to notice a restitched video: build the folder "
                         "with stitch.py")
    return clips


def video_sha1(video: data.Video) -> str | None:
    """The manifest's identity of a video: its sha1, or a views episode's sha1s in VIEW_ORDER."""
    if video.views is None:
        return video.sha1
    sums = [video.views[s].sha1 for s in data.VIEW_ORDER]
    return None if None in sums else "+".join(sums)


def camera_params(data_dir: str, layout: str) -> str:
    """What decides a views folder's cameras (stitch.py's RECIPE.json camera_params); '' for grids."""
    if layout != "views":
        return ""
    path = os.path.join(data_dir, "RECIPE.json")
    if not os.path.exists(path):
        return "unknown (no RECIPE.json)"
    with open(path, encoding="utf-8") as f:
        return str(json.load(f).get("camera_params", "unknown"))


def make_key(data_dir: str, layout: str, vae: str, vae_ckpt: str, frames: int, height: int, width: int, dtype: str,
             stride: int | None = None) -> dict:
    """Everything that changes the cached latents (module docstring). The checkpoint's identity reads 2 MiB of it."""
    if vae not in vae_lib.VAE_CONFIGS:
        raise ValueError(f"vae={vae!r}: expected one of {sorted(vae_lib.VAE_CONFIGS)}")
    if vae == "real":
        ckpt = identity(vae_ckpt)  # ckpt.py's file identity
    else:
        ckpt = "none (vae.build_vae's seeded random weights)"
    return {"format": FORMAT, "vae": vae, "vae_config": repr(vae_lib.get_vae_config(vae)), "vae_ckpt": ckpt,
            "frames": frames, "height": height, "width": width, "layout": layout,
            "camera_params": camera_params(data_dir, layout), "dtype": dtype, "stride": stride}


def key_hash(key: dict) -> str:
    return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def differences(saved: dict, key: dict, fields, names=("in cache.json", "now")) -> str:
    """The fields where key differs from saved, for a one-line refusal ('' when none)."""
    return "; ".join(f"{k} {saved.get(k)!r} {names[0]}, {key[k]!r} {names[1]}" for k in fields
                     if saved.get(k) != key[k])


def window_starts(n: int, frames: int, stride: int) -> list:
    """0, stride, 2 stride, ... <= n - frames, then n - frames if the grid missed it (the episode's end)."""
    if n < frames:
        raise ValueError(f"a {n}-frame video has no {frames}-frame window")
    starts = list(range(0, n - frames + 1, stride))
    return starts + ([n - frames] if starts[-1] != n - frames else [])


def command(cache_dir: str, data_dir: str, vae: str, vae_ckpt: str, frames: int, height: int, width: int,
            dtype: str, stride: int | None = None) -> str:
    return (f"python cache.py --data {data_dir} --out {cache_dir} --vae {vae}"
            + (f" --vae-ckpt {vae_ckpt}" if vae_ckpt else "") + f" --frames {frames} --height {height} --width "
            f"{width} --dtype {dtype}" + (f" --stride {stride}" if stride else ""))


def latent_path(cache_dir: str, stem: str) -> str:
    return os.path.join(cache_dir, "latents", stem + ".safetensors")


def window_sum(*tensors) -> str:
    """The checksum of one cached window (its latent, and its cameras for views) that the file's metadata records:
    blake2b of the raw bytes (a 4 MiB 93x432x768 latent: ~5 ms; a flipped bit anywhere changes it)."""
    h = hashlib.blake2b(digest_size=8)
    for t in tensors:
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def read_cache_json(cache_dir: str) -> dict:
    """cache.json, refused when its key_hash is not the hash of its key's fields (edited after cache.py wrote it)."""
    path = os.path.join(cache_dir, "cache.json")
    with open(path, encoding="utf-8") as f:
        saved = json.load(f)
    if key_hash(saved["key"]) != saved.get("key_hash"):
        raise ValueError(f"{path}: its key_hash {saved.get('key_hash')} is not the hash of its fields "
                         f"({key_hash(saved['key'])}): it was edited after cache.py wrote it, and the latents may be "
                         f"for other settings; restore it, or delete {cache_dir} and rebuild the cache")
    return saved


def lock_out(out: str):
    """Rank 0's claim on CACHE/.lock for the whole build (files.claim: a second cache.py on it is refused)."""
    os.makedirs(out, exist_ok=True)
    return files.claim(os.path.join(out, ".lock"), f"--out {out} is in use by a running cache.py ({{holder}}): wait "
                        "for it to finish, or use another --out")


# -----------------------------------------------------------------------------
# Writing


def cached_entry(path: str, khash: str, sha1: str) -> tuple:
    """(index entry, None) for a complete latent file of this key and video, else (None, why not)."""
    if not os.path.exists(path):
        return None, "missing"
    try:
        with safetensors.safe_open(path, framework="pt") as f:
            meta, n = f.metadata() or {}, f.get_slice("latent").get_shape()[0]
            starts = f.get_tensor("starts").tolist()
    except safetensors.SafetensorError as e:  # a file cut short by a full disk or a copy: encoded again
        return None, f"unreadable ({e})"
    if meta.get("key") != khash:
        return None, f"another key ({meta.get('key')})"
    if meta.get("sha1") != sha1 or n != len(starts):
        return None, "restitched" if meta.get("sha1") != sha1 else f"{n} latents for {len(starts)} starts"
    return {"sha1": sha1, "starts": starts, "bytes": os.path.getsize(path)}, None


def write_blob(path: str, blob: bytes):
    """files.write_atomic (a killed run leaves the old file or a .tmp, never a partial file under the name)."""
    write_atomic(path, blob)


def rank0_check(fn, distributed: bool):
    """fn() on rank 0, its result there (None on the others); under torchrun a ValueError / OSError there is raised
    on every rank (none is left waiting in a collective)."""
    if not distributed:
        return fn()
    problem, result = None, None
    if dist.get_rank() == 0:
        try:
            result = fn()
        except (ValueError, OSError) as e:
            problem = str(e)
    shared = [problem]
    dist.broadcast_object_list(shared, 0)
    if shared[0]:
        raise ValueError(shared[0])
    return result


def claim(cfg: CacheConfig, key: dict):
    """Rank 0, holding CACHE's lock: refuse a CACHE of another key, else write cache.json first and drop the
    completion marker."""
    path = os.path.join(cfg.out, "cache.json")
    if os.path.exists(path):
        old = read_cache_json(cfg.out)["key"]
        diff = differences(old, key, list(key))
        if diff:
            raise ValueError(f"{cfg.out} holds latents of another setting: {diff}; a cache holds one setting: pass a "
                             f"new --out, or delete {cfg.out} to rebuild it")
    folder = os.path.join(cfg.out, "latents")
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(folder):  # a killed run's partial files
        if name.endswith(".tmp"):
            os.remove(os.path.join(folder, name))
    write_blob(path, json.dumps({"key": key, "key_hash": key_hash(key), "data": os.path.abspath(cfg.data)},
                                indent=1).encode())
    if os.path.exists(os.path.join(cfg.out, "index.json")):  # incomplete from here until this run's index
        os.remove(os.path.join(cfg.out, "index.json"))


def encode_videos(cfg: CacheConfig, clips, todo: list, khash: str, device: torch.device, dtype: str,
                  rank: int) -> tuple:
    """Encode every window of the videos clips.videos[i] for i in todo and write one file per video: returns
    ({stem: index entry}, {stem: ClipError text}, {"videos", "windows", "bytes", "seconds"} of this rank)."""
    views = len(data.VIEW_ORDER) if isinstance(clips, data.ViewClips) else 0
    vae = build_vae(cfg.vae, cfg.vae_ckpt, device, vae_lib.DTYPES[dtype])
    items = [(i, s) for i in todo for s in window_starts(clips.videos[i].frames, cfg.frames, cfg.stride)]
    loader = DataLoader(Windows(clips, items), batch_size=None, num_workers=cfg.workers,
                        prefetch_factor=2 if cfg.workers else None, pin_memory=device.type == "cuda")
    entries, failed, stats, t0 = {}, {}, {"videos": 0, "windows": 0, "bytes": 0}, time.perf_counter()

    def finish(video, got):
        path, sha1 = latent_path(cfg.out, video.stem), video_sha1(video)
        if "error" in got:
            failed[video.stem] = got["error"]
            if os.path.exists(path):  # another sha1's latents: never to be read again
                os.remove(path)
            print(f"cache: skipping {video.stem}: {got['error']}", file=sys.stderr, flush=True)
        else:
            tensors = {k: torch.stack(v).cpu().contiguous() for k, v in got.items() if k != "starts"}
            tensors["starts"] = torch.tensor(got["starts"], dtype=torch.int64)
            sums = [window_sum(*(tensors[k][i] for k in ("latent", "w2c", "intrinsics") if k in tensors))
                    for i in range(len(got["starts"]))]  # LatentClips checks each window it reads against its own
            blob = safetensors.torch.save(tensors, metadata={"format": FORMAT, "key": khash, "stem": video.stem,
                                                             "sha1": sha1, "sums": json.dumps(sums)})
            write_blob(path, blob)
            entries[video.stem] = {"sha1": sha1, "starts": got["starts"], "bytes": len(blob)}
            stats.update(videos=stats["videos"] + 1, windows=stats["windows"] + len(got["starts"]),
                         bytes=stats["bytes"] + len(blob))
        done, dt = len(entries) + len(failed), time.perf_counter() - t0
        if cfg.progress_every and done % cfg.progress_every == 0:
            print(f"cache: rank {rank}: {done}/{len(todo)} videos ({len(failed)} failed), {stats['windows']} windows, "
                  f"{stats['bytes'] / 1e9:.2f} GB, {dt / done:.2f} s/video, ETA {dt / done * (len(todo) - done):.0f} s",
                  flush=True)

    current, got = None, {}
    for item in loader:  # in order: a video's windows arrive one after the other
        if item["index"] != current:
            if current is not None:
                finish(clips.videos[current], got)
            current, got = item["index"], {"starts": [], "latent": []} | ({"w2c": [], "intrinsics": []} if views
                                                                          else {})
        if "error" in got:
            continue
        if "error" in item:
            got = {"error": item["error"]}
            continue
        video = item["video"].to(device, next(vae.parameters()).dtype)  # train.py's to_latent, one sample
        latent = vae.encode(video if views else video[None])  # views: the V views as one batch
        got["latent"].append(stack_views(latent, views)[0] if views else latent[0])
        got["starts"].append(item["start"])
        for k in ("w2c", "intrinsics") if views else ():
            got[k].append(item[k])
    if current is not None:
        finish(clips.videos[current], got)
    return entries, failed, dict(stats, seconds=time.perf_counter() - t0)


def build(cfg: CacheConfig, device: torch.device) -> dict:
    """Encode this rank's videos (i % world == rank) of cfg.data into cfg.out; rank 0 then writes index.json. Returns
    {"encoded": stems this rank encoded, "reused": stems it found complete, "failed": {stem: reason} of all ranks,
    "videos", "windows", "bytes": the whole cache's}."""
    distributed = dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    dtype = cfg.dtype if cfg.dtype != "auto" else "bf16" if device.type == "cuda" else "fp32"
    clips = open_clips(cfg.data, cfg.frames, cfg.height, cfg.width)
    key = make_key(cfg.data, "views" if isinstance(clips, data.ViewClips) else "grid", cfg.vae, cfg.vae_ckpt,
                   cfg.frames, cfg.height, cfg.width, dtype, cfg.stride)
    if distributed:  # node-local copies of the checkpoint or the data folder must be the same files on every rank
        keys = [None] * world
        dist.all_gather_object(keys, key)
        other = next((r for r, k in enumerate(keys) if k != keys[0]), None)
        if other is not None:
            diff = differences(keys[0], keys[other], list(key), ("on rank 0", f"on rank {other}"))
            raise ValueError(f"ranks disagree on the cache key: {diff}; point every rank at the same --vae-ckpt and "
                             "--data files")
    lock = rank0_check(lambda: lock_out(cfg.out), distributed)  # held until the index is written
    try:
        rank0_check(lambda: claim(cfg, key), distributed)
        return encode_and_index(cfg, clips, key, device, dtype, rank, world, distributed)
    finally:
        if lock is not None:
            lock.close()


def encode_and_index(cfg: CacheConfig, clips, key: dict, device: torch.device, dtype: str, rank: int, world: int,
                     distributed: bool) -> dict:
    """build()'s work once CACHE is claimed: encode what is not complete, then rank 0 writes index.json."""
    khash = key_hash(key)

    reused, todo = {}, []  # complete files are kept; anything else (missing, a .tmp, another sha1) is encoded again
    for i in range(rank, len(clips.videos), world):
        video = clips.videos[i]
        entry, why = cached_entry(latent_path(cfg.out, video.stem), khash, video_sha1(video))
        reused.update({video.stem: entry} if entry else {})
        todo += [] if entry else [i]
        if why not in (None, "missing"):
            print(f"cache: {video.stem}: encoding it again ({why})", flush=True)
    encoded, failed, stats = encode_videos(cfg, clips, todo, khash, device, dtype, rank)

    every = [(reused | encoded, failed, stats)]
    if distributed:
        every = [None] * world
        dist.all_gather_object(every, (reused | encoded, failed, stats))
    entries = {k: v for e, _, _ in every for k, v in e.items()}
    all_failed = {k: v for _, f, _ in every for k, v in f.items()}
    new = {k: sum(s[k] for _, _, s in every) for k in stats}
    summary = {"encoded": list(encoded), "reused": list(reused), "failed": all_failed, "videos": len(entries),
               "windows": sum(len(e["starts"]) for e in entries.values()),
               "bytes": sum(e["bytes"] for e in entries.values())}
    if rank == 0:  # the completion marker, in the dataset's order
        index = {"key_hash": khash, "videos": {v.stem: entries[v.stem] for v in clips.videos if v.stem in entries},
                 "failed": {v.stem: {"sha1": video_sha1(v), "reason": all_failed[v.stem]} for v in clips.videos
                            if v.stem in all_failed}, "skipped": clips.skipped}
        write_blob(os.path.join(cfg.out, "index.json"), json.dumps(index).encode())
        print(f"cache: {cfg.out}: {summary['videos']} videos, {summary['windows']} windows, "
              f"{summary['bytes'] / 1e9:.3f} GB ({dtype}, stride {cfg.stride}); this run: {new['videos']} videos "
              f"encoded ({new['windows']} windows, {new['bytes'] / 1e9:.3f} GB, "
              f"{new['seconds'] / max(1, new['videos']):.2f} s/video per rank), "
              f"{len(entries) - new['videos']} already complete, {len(all_failed)} failed"
              + (": " + ", ".join(f"{s} ({r})" for s, r in list(all_failed.items())[:5]) if all_failed else "")
              + (f"; {len(clips.skipped)} not cacheable, as GridClips/ViewClips skip them: "
                 f"{dict(list(clips.skipped.items())[:3])}" if clips.skipped else ""), flush=True)
    return summary


# -----------------------------------------------------------------------------
# Reading


def check_cache(cache_dir: str, data_dir: str, vae: str, vae_ckpt: str, frames: int, height: int, width: int,
                dtype: str, clips=None) -> dict:
    """cache_dir's index, once it is known to hold, for this key, the latents of every video of data_dir as
    GridClips / ViewClips list them (clips: that dataset, if built already). Else one ValueError line: which key
    fields differ, or how many videos are missing or restitched, and the command that (re)builds the cache. dtype is
    the encode dtype the run would use (train.py: bf16 on CUDA, fp32 on CPU). Costs one JSON read and a stat per
    video; the files' own headers are checked at first use in each process."""
    clips = clips if clips is not None else open_clips(data_dir, frames, height, width)
    key = make_key(data_dir, "views" if isinstance(clips, data.ViewClips) else "grid", vae, vae_ckpt, frames, height,
                   width, dtype)
    path = os.path.join(cache_dir, "cache.json")
    if not os.path.exists(path):
        raise ValueError(f"{cache_dir}: no cache.json, not a latent cache; build it with "
                         f"`{command(cache_dir, data_dir, vae, vae_ckpt, frames, height, width, dtype)}`")
    saved = read_cache_json(cache_dir)
    old = saved["key"]
    diff = differences(old, key, READ_KEY)
    if diff:
        fresh = command("NEW_CACHE", data_dir, vae, vae_ckpt, frames, height, width, dtype)
        raise ValueError(f"{cache_dir} was encoded with other settings: {diff}; build a cache for this run with "
                         f"`{fresh}` (or delete {cache_dir} and build it there)")
    rebuild = command(cache_dir, data_dir, vae, vae_ckpt, frames, height, width, dtype, old["stride"])
    index_path = os.path.join(cache_dir, "index.json")
    index = None
    if os.path.exists(index_path):
        with open(index_path, encoding="utf-8") as f:
            index = json.load(f)
    if index is None or index["key_hash"] != saved["key_hash"]:
        raise ValueError(f"{cache_dir} is incomplete (no index.json of its cache.json: cache.py was killed or is "
                         f"still running); finish it with `{rebuild}`")
    missing, stale, damaged = [], [], []
    for v in clips.videos:
        entry = index["videos"].get(v.stem) or index["failed"].get(v.stem)
        file = latent_path(cache_dir, v.stem)
        if entry is None:
            missing.append(v.stem)
        elif entry["sha1"] != video_sha1(v):
            stale.append(f"{v.stem}: cached {entry['sha1']}, manifest {video_sha1(v)}")
        elif v.stem in index["videos"] and (not os.path.exists(file) or os.path.getsize(file) != entry["bytes"]):
            damaged.append(file)
    problems = [f"{len(found)} {what} (first: {found[0]})" for found, what in (
        (missing, "have no cached latents"), (stale, "were restitched since (sha1)"),
        (damaged, "have a missing or resized latent file")) if found]
    if problems:
        raise ValueError(f"{cache_dir}: of the {len(clips.videos)} videos of {data_dir}, " + "; ".join(problems)
                         + f"; encode them with `{rebuild}` (it skips complete files)")
    return index


class LatentClips(Dataset):
    """GridClips / ViewClips' samples from a cache.py folder, with "latent" in place of "video": [C, T', h, w] in the
    cache's dtype as vae.encode returned it (views: stacked on latent time, [C, V*T', h, w], with w2c, intrinsics,
    cameras and views as ViewClips gives them), and text_emb, text_mask, prompt, stem, start, skipped as GridClips.

    The dataset of data_dir (its video list and order, text embeddings and their checks) is built as training would
    build it, and check_cache refuses a cache that does not match it. An item is an index or (index, sample_seed);
    the seed picks one of the video's cached windows uniformly, so a resumed run draws the same windows. A video that
    failed to decode when it was cached is skipped like a GridClips video failing at first use (data.first_loadable:
    the next video, counted in "skipped")."""

    def __init__(self, cache_dir: str, data_dir: str, frames: int, height: int, width: int, text_len: int = 512,
                 text_dim: int = 1024, text: str = "t5", seed: int = 0, text_encoder: str = "t5", vae: str = "real",
                 vae_ckpt: str = "", dtype: str = "bf16"):
        self.clips = open_clips(data_dir, frames, height, width, text_len=text_len, text_dim=text_dim, text=text,
                                seed=seed, text_encoder=text_encoder)
        self.index = check_cache(cache_dir, data_dir, vae, vae_ckpt, frames, height, width, dtype, clips=self.clips)
        self.root, self.videos, self.seed, self.skipped = cache_dir, self.clips.videos, seed, self.clips.skipped
        self.views = isinstance(self.clips, data.ViewClips)
        self.failed, self.sums = {}, {}  # as GridClips: per process; stem -> its windows' checksums, once read
        self.frames, self.height, self.width, self.vae, self.dtype = frames, height, width, vae, dtype
        cached = [self.index["videos"][v.stem]["starts"] for v in self.videos if v.stem in self.index["videos"]]
        print(f"LatentClips: {cache_dir}: {len(cached)} of {len(self.videos)} videos cached, "
              f"{sum(map(len, cached))} windows ({dtype})" + (f", {len(self.videos) - len(cached)} failed when "
                                                              "cached (skipped)" if len(cached) < len(self.videos)
                                                              else ""))

    def __len__(self):
        return len(self.videos)

    def __getitem__(self, item) -> dict:
        video, attempt, (latent, start, cameras) = data.first_loadable(self, item)
        emb, mask = text_lib.clip_text(self.clips, video)
        sample = {"latent": latent, "text_emb": emb, "text_mask": mask, "prompt": video.prompt, "stem": video.stem,
                  "start": start, "skipped": attempt}
        if self.views:
            sample.update(w2c=cameras[0], intrinsics=cameras[1], views=list(data.VIEW_ORDER),
                          cameras="fallback" if self.clips.fallback is not None else "real")
        return sample

    def _clip(self, video: data.Video, rng) -> tuple:
        if video.stem in self.index["failed"]:
            raise data.ClipError(f"failed when cached: {self.index['failed'][video.stem]['reason']}")
        entry, path = self.index["videos"][video.stem], latent_path(self.root, video.stem)
        k = int(rng.integers(0, len(entry["starts"])))
        try:
            with safetensors.safe_open(path, framework="pt") as f:
                if video.stem not in self.sums:  # once per video and process, like GridClips' sha1
                    self.sums[video.stem] = self.checked_header(path, f, entry)
                latent = f.get_slice("latent")[k]
                cameras = (f.get_slice("w2c")[k], f.get_slice("intrinsics")[k]) if self.views else None
        except safetensors.SafetensorError as e:  # its own text names no file
            raise ValueError(f"{path}: damaged safetensors file ({e}); rerun cache.py on {self.root}: it encodes "
                             "unreadable files again") from None
        if window_sum(latent, *(cameras or ())) != self.sums[video.stem][k]:
            raise ValueError(f"{path}: window {k} (start {entry['starts'][k]}) does not match the checksum cache.py "
                             "recorded: the file was damaged after it was written (a flipped bit, a bad copy); delete "
                             f"it and rerun cache.py on {self.root}")
        return latent, entry["starts"][k], cameras

    def checked_header(self, path: str, f, entry: dict) -> list:
        """The per-window checksums of an open latent file, once its metadata (key, sha1) matches the index and its
        latent shape and dtype match this run's settings; else one ValueError line naming the file."""
        meta = f.metadata() or {}
        if (meta.get("key"), meta.get("sha1")) != (self.index["key_hash"], entry["sha1"]):
            raise ValueError(f"{path}: key {meta.get('key')}, sha1 {meta.get('sha1')}; {self.root}/index.json "
                             f"says {self.index['key_hash']}, {entry['sha1']}: the file changed after "
                             "cache.py finished; rerun cache.py")
        latent = f.get_slice("latent")
        views = len(data.VIEW_ORDER) if self.views else 1
        want = [len(entry["starts"]), vae_lib.get_vae_config(self.vae).z_dim,
                views * vae_lib.latent_frames(self.frames), self.height // 8, self.width // 8]
        if list(latent.get_shape()) != want or latent.get_dtype() != {"bf16": "BF16", "fp32": "F32"}[self.dtype]:
            raise ValueError(f"{path}: latents {latent.get_dtype()} {latent.get_shape()}, this run needs "
                             f"{self.dtype} {want} ({self.frames}x{self.height}x{self.width} clips): not this "
                             "cache's file; delete it and rerun cache.py")
        return json.loads(meta["sums"])


# -----------------------------------------------------------------------------
# Main


def main(argv=None) -> int:
    cfg = cli.parse(CacheConfig, sys.argv[1:] if argv is None else argv, description=__doc__, prog="cache.py")
    kind = cfg.device if cfg.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    distributed = "RANK" in os.environ and not dist.is_initialized()  # torchrun
    if distributed:
        dist.init_process_group("nccl" if kind == "cuda" else "gloo")
    device = torch.device(kind, int(os.environ.get("LOCAL_RANK", 0))) if kind == "cuda" else torch.device("cpu")
    if kind == "cuda":
        torch.cuda.set_device(device)
    try:
        summary = build(cfg, device)
    finally:
        if distributed:
            dist.destroy_process_group()
    if not summary["videos"]:
        print(f"cache.py: error: {cfg.out} holds no video: {len(summary['failed'])} failed", file=sys.stderr,
              flush=True)
        return 1
    return 0


if __name__ == "__main__":
    cli.main(main, user_errors=(ValueError, OSError))
