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
ClipSampler. Decoding a clip (read_clip, ClipError) and probing a file are base/video.py."""
import hashlib
import io
import json
import os
import pickle
import sys
from collections import Counter
from dataclasses import dataclass

import numpy as np
import safetensors.torch
import torch
from torch.utils.data import Dataset, Sampler

from base import camera
from base.inits import get_config
from base.video import ClipError, probe_video, read_clip, sha1_file
from nets import vae

NEGATIVE_STEM = "negative_prompt"  # t5.py writes the negative prompt's embedding as t5_xxl/negative_prompt.pickle
MANIFEST_KEYS = ("stem", "prompt", "n_out", "height", "width")  # what GridClips needs of a manifest.jsonl line
TEXT_ENCODERS = ("t5", "reason1")  # t5_xxl/<stem>.pickle|.safetensors, or reason1/<sha1(prompt)>.safetensors
REASON1_FORMAT = "reason1-full-concat-v1"  # the metadata "format" t5.py --encoder reason1 writes
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


def negative_prompt_path(root: str, text_encoder: str = "t5") -> str | None:
    """t5.py's embedding of the negative prompt (t5.NEGATIVE_PROMPT) in a stitched folder, or None if not computed."""
    exts = (".safetensors",) if text_encoder == "reason1" else (".pickle", ".safetensors")
    paths = [os.path.join(root, "reason1" if text_encoder == "reason1" else "t5_xxl", NEGATIVE_STEM + e) for e in exts]
    return next((path for path in paths if os.path.exists(path)), None)


# ------------------------------------------------------------------------------------------- text embeddings

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


def read_pickle_embedding(path: str) -> np.ndarray:
    """The array of an upstream t5_xxl/<stem>.pickle: a list of one numpy array (tokens, dim)."""
    with open(path, "rb") as f:
        blob = f.read()
    try:
        obj = _NumpyOnly(io.BytesIO(blob)).load()
    except (EOFError, ValueError, TypeError, pickle.UnpicklingError) as e:  # a refused class says so itself
        if isinstance(e, pickle.UnpicklingError) and str(e).startswith("refusing"):
            raise
        raise ValueError(f"{path}: truncated or damaged pickle ({len(blob)} bytes; {type(e).__name__}: {e}); "
                         "recompute it with t5.py (delete the file first)") from None
    if not (isinstance(obj, list) and len(obj) == 1 and isinstance(obj[0], np.ndarray)):
        raise ValueError(f"{path}: expected a list of one numpy array, got {type(obj).__name__}")
    return obj[0]


def check_finite(path: str, values):
    """ValueError naming the file when a text embedding (numpy or torch) holds NaN or Inf."""
    finite = torch.isfinite(values).all() if isinstance(values, torch.Tensor) else np.isfinite(values).all()
    if not finite:
        raise ValueError(f"{path}: the text embedding holds NaN/Inf values; recompute it with t5.py (delete the file "
                         "first)")


def check_text_shape(path: str, shape: tuple, is_float: bool, text_len: int, text_dim: int):
    if len(shape) != 2 or shape[1] != text_dim or not 1 <= shape[0] <= text_len or not is_float:
        raise ValueError(f"{path}: text embedding has shape {tuple(shape)}{'' if is_float else ' (not float)'}, "
                         f"expected float (1..{text_len}, {text_dim}): text_dim is the model's crossattn_emb_channels "
                         "(1024 for Cosmos-Predict2's T5-XXL) or crossattn_proj_in_channels (100352 for Predict2.5's "
                         "Reason1); recompute it with t5.py (delete the file first)")


def reason1_path(root: str, prompt: str) -> str:
    """Where t5.py --encoder reason1 keeps a prompt's embedding: one file per unique prompt."""
    return os.path.join(root, "reason1", hashlib.sha1(prompt.encode()).hexdigest() + ".safetensors")


def check_reason1_embedding(path: str, prompt: str | None, text_len: int, text_dim: int):
    """Header-only check of a reason1/*.safetensors: one bf16 tensor "crossattn_emb" (tokens, text_dim), metadata
    format REASON1_FORMAT and (unless prompt is None) the prompt it embeds."""
    with safetensors.safe_open(path, framework="pt") as f:
        meta, keys = f.metadata() or {}, list(f.keys())
        if "crossattn_emb" not in keys:
            raise ValueError(f"{path}: no tensor 'crossattn_emb' (has {sorted(keys)}); recompute it with "
                             f"`python t5.py ROOT --encoder reason1` (delete the file first)")
        tensor = f.get_slice("crossattn_emb")
        shape, dtype = tensor.get_shape(), tensor.get_dtype()
    if dtype != "BF16" or meta.get("format") != REASON1_FORMAT:
        raise ValueError(f"{path}: crossattn_emb is {dtype} with format {meta.get('format')!r}, expected BF16 with "
                         f"{REASON1_FORMAT!r} (t5.py --encoder reason1 writes it); delete it and rerun t5.py")
    check_text_shape(path, shape, True, text_len, text_dim)
    if prompt is not None and meta.get("prompt") != prompt:
        raise ValueError(f"{path}: embeds {meta.get('prompt')!r}, not this video's prompt {prompt!r}; delete it and "
                         "rerun `python t5.py ROOT --encoder reason1`")


def load_reason1_embedding(path: str, text_len: int, text_dim: int) -> tuple:
    """(emb [text_len, text_dim] bf16, as stored (float32 would double ~98 MiB per sample), zero-padded past the
    file's rows; mask [text_len] int64, 1 on every stored row: Reason1's pad tokens are real tokens, not masked)."""
    check_reason1_embedding(path, None, text_len, text_dim)
    arr = safetensors.torch.load_file(path)["crossattn_emb"]
    check_finite(path, arr)  # at every read: ~98 MiB a file are too many to read them all at start-up
    emb, mask = torch.zeros(text_len, text_dim, dtype=arr.dtype), torch.zeros(text_len, dtype=torch.int64)
    emb[:len(arr)], mask[:len(arr)] = arr, 1
    return emb, mask


def read_text_array(path: str, text_len: int, text_dim: int):
    """The checked (tokens, dim) array of t5_xxl/<stem>.pickle (upstream: a list of one float16 array, numpy) or
    .safetensors (tensor "text_emb"): a float array of the shape the run needs, every value finite."""
    if path.endswith(".pickle"):
        arr = read_pickle_embedding(path)
        check_text_shape(path, arr.shape, arr.dtype.kind == "f", text_len, text_dim)
    else:
        tensors = safetensors.torch.load_file(path)
        if "text_emb" not in tensors:
            raise ValueError(f"{path}: no tensor 'text_emb' (has {sorted(tensors)})")
        arr = tensors["text_emb"]
        check_text_shape(path, arr.shape, arr.is_floating_point(), text_len, text_dim)
    check_finite(path, arr)
    return arr


def load_text_embedding(path: str, text_len: int, text_dim: int) -> tuple:
    """(emb [text_len, text_dim] float32 zero-padded, mask [text_len] int64) from a read_text_array file."""
    arr = read_text_array(path, text_len, text_dim)
    arr = torch.from_numpy(arr.astype(np.float32)) if isinstance(arr, np.ndarray) else arr.float()
    emb, mask = torch.zeros(text_len, text_dim), torch.zeros(text_len, dtype=torch.int64)
    emb[:len(arr)], mask[:len(arr)] = arr, 1
    return emb, mask


def check_text_embeddings(files: list, text_len: int, text_dim: int) -> int:
    """Raise ValueError at the first of files [(path, prompt)] that load_text_embedding would refuse (its shape, its
    values NaN/Inf, a truncated pickle); returns how many files were read whole: all of them.

    Cost: every file is read whole, since a file's size says nothing of its values (a NaN has as many bytes as a
    number): ~0.25 ms and ~250 kB for a DROID prompt's pickle, ~18 s and ~17 GB for 70k videos (which the page cache
    then keeps for the workers)."""
    for path, _ in files:
        read_text_array(path, text_len, text_dim)
    return len(files)


TINY_CONFIGS = ("tiny", "p25-tiny", "p25-tiny-agibot", "tiny-action")  # CPU-fast: tiny VAE, 9x64x112, stand-in prompt
T5_WIDTH = 1024  # T5-XXL's embedding width


def tiny_data(config):
    """The tiny default's own folder (train.py builds it): 2x2 grids, a camera net's views, an action net's grids."""
    net = get_config(config)
    return "data/tiny_" + ("views" if net.camera_channels else "action_grid" if net.action_dim else "grid")


def standin_text(config, data_dir):
    """Whether a run reads stand-in text (standin_text_embedding of each prompt) instead of embedding files: the
    tiny configs on the tiny default's own folder; p25-tiny* anywhere (their text is 96 wide: no released encoder
    writes it); tiny on a folder without t5_xxl/. tiny is T5-wide, so a folder of yours that has t5_xxl/ trains
    and samples on those embeddings, as a released config does."""
    if config not in TINY_CONFIGS:
        return False
    if get_config(config).crossattn_proj_in_channels != T5_WIDTH or \
            os.path.normpath(data_dir) == os.path.normpath(tiny_data(config)):
        return True
    return not os.path.isdir(os.path.join(data_dir, "t5_xxl"))


def standin_text_embedding(prompt: str, text_len: int, text_dim: int) -> tuple:
    """The tiny default's stand-in for T5: one N(0,1) row per word of the prompt (at most text_len), from a generator
    seeded with sha256(prompt), zero-padded; the same prompt always gives the same embedding. Not for real training."""
    seed = int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:8], "little") >> 1
    n = min(text_len, max(1, len(prompt.split())))
    emb, mask = torch.zeros(text_len, text_dim), torch.zeros(text_len, dtype=torch.int64)
    emb[:n], mask[:n] = torch.randn(n, text_dim, generator=torch.Generator().manual_seed(seed)), 1
    return emb, mask


def text_files(root: str, videos: list, text: str, text_encoder: str, text_len: int, text_dim: int) -> tuple:
    """(stem -> embedding file, files read whole) of videos: text="t5" reads text_encoder's files (GridClips'
    docstring), "standin" none. Raises at start-up, naming the file and the command that makes it, when one is
    missing or check_text_embeddings / check_reason1_embedding refuses it."""
    if text not in ("t5", "standin") or text_encoder not in TEXT_ENCODERS or (text, text_encoder) == ("standin",
                                                                                                     "reason1"):
        raise ValueError(f"text={text!r}, text_encoder={text_encoder!r}: text must be 't5' (embeddings from files) or "
                         f"'standin' (the tiny default, no files: text_encoder stays 't5'); text_encoder one of "
                         f"{TEXT_ENCODERS}")
    if text == "standin":
        return {}, 0
    if text_encoder == "reason1":
        paths = {v.stem: reason1_path(root, v.prompt) for v in videos}
        missing = [v for v in videos if not os.path.exists(paths[v.stem])]
        if missing:
            raise FileNotFoundError(f"{root}: {len(missing)} of {len(videos)} videos have no Reason1 embedding "
                                    f"({paths[missing[0].stem]} for {missing[0].stem}); compute them with "
                                    f"`python t5.py {root} --encoder reason1`")
        for path, prompt in {paths[v.stem]: v.prompt for v in videos}.items():  # one file per unique prompt
            check_reason1_embedding(path, prompt, text_len, text_dim)
        return paths, 0
    candidates = lambda stem: (os.path.join(root, "t5_xxl", stem + ext) for ext in (".pickle", ".safetensors"))  # noqa
    paths = {v.stem: next((p for p in candidates(v.stem) if os.path.exists(p)), None) for v in videos}
    missing = [stem for stem, path in paths.items() if path is None]
    if missing:
        raise FileNotFoundError(f"{root}: {len(missing)} of {len(videos)} videos have no text embedding "
                                f"(t5_xxl/{missing[0]}.pickle or .safetensors); compute them with "
                                f"`python t5.py {root}`. Only the built-in tiny default may use text='standin'.")
    return paths, check_text_embeddings([(paths[v.stem], v.prompt) for v in videos], text_len, text_dim)


def clip_text(dataset, video: Video) -> tuple:
    """(emb, mask) of a GridClips / ViewClips video, as its text settings say."""
    if dataset.text == "standin":
        return standin_text_embedding(video.prompt, dataset.text_len, dataset.text_dim)
    load = load_reason1_embedding if dataset.text_encoder == "reason1" else load_text_embedding
    return load(dataset.text_paths[video.stem], dataset.text_len, dataset.text_dim)


def negative_embedding(root: str, text_len: int, text_dim: int, standin: bool = False, path: str = "",
                       text_encoder: str = "t5") -> tuple:
    """(emb [text_len, text_dim], where it came from): the uncond branch of CFG. `path`, else the default negative
    prompt as t5.py embedded it beside root's prompts (t5_xxl/ or, with text_encoder="reason1", reason1/), else
    zeros; the second value says which, for the start-up line (zeros are never silent). standin: the tiny default's
    stand-in text, whose negative is zeros."""
    if text_encoder not in TEXT_ENCODERS:
        raise ValueError(f"text_encoder={text_encoder!r} must be one of {TEXT_ENCODERS}")
    path = path or (None if standin else negative_prompt_path(root, text_encoder))
    if path:
        load = load_reason1_embedding if text_encoder == "reason1" else load_text_embedding
        return load(path, text_len, text_dim)[0], path
    folder, flag = ("reason1", " --encoder reason1") if text_encoder == "reason1" else ("t5_xxl", "")
    return torch.zeros(text_len, text_dim), ("zeros (the tiny stand-in text)" if standin else
                                             f"NONE in {root}/{folder} (run `python t5.py {root}{flag}` to embed the "
                                             "default negative prompt): zeros")


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
