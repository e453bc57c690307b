"""The prompts' text embeddings of a stitched folder, as the clips give them: T5 files (t5_xxl/<stem>.pickle, the
upstream format, or .safetensors; Predict2) or Cosmos-Reason1 files (reason1/<sha1(prompt)>.safetensors, bf16;
Predict2.5), checked at start-up (shape, key, values: NaN/Inf refused), read safely (pickles of numpy arrays only),
the negative prompt of CFG, and the tiny defaults' stand-in text (one seeded random row per word). t5.py writes the
files.

Contents, top to bottom: names and the negative prompt's file -> safe unpickling and shape checks -> Reason1 files ->
T5 files and the start-up check -> stand-in text -> a folder's files, a clip's text, the negative prompt.
"""
import hashlib
import io
import os
import pickle

import numpy as np
import safetensors.torch
import torch

from base.inits import TINY_CONFIGS, get_config, tiny_data

NEGATIVE_STEM = "negative_prompt"  # t5.py writes the negative prompt's embedding as t5_xxl/negative_prompt.pickle


TEXT_ENCODERS = ("t5", "reason1")  # t5_xxl/<stem>.pickle|.safetensors, or reason1/<sha1(prompt)>.safetensors


REASON1_FORMAT = "reason1-full-concat-v1"  # the metadata "format" t5.py --encoder reason1 writes


def negative_prompt_path(root: str, text_encoder: str = "t5") -> str | None:
    """t5.py's embedding of the negative prompt (t5.NEGATIVE_PROMPT) in a stitched folder, or None if not computed."""
    exts = (".safetensors",) if text_encoder == "reason1" else (".pickle", ".safetensors")
    paths = [os.path.join(root, "reason1" if text_encoder == "reason1" else "t5_xxl", NEGATIVE_STEM + e) for e in exts]
    return next((path for path in paths if os.path.exists(path)), None)


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


T5_WIDTH = 1024  # T5-XXL's embedding width


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


def clip_text(dataset, video) -> tuple:
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
