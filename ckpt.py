"""Loading weights into a plain or FSDP2-sharded model: explicit, strict and loud.

Training-state checkpoints (save / resume / rotate / export) are resume.py, which builds on this file.

    python ckpt.py check --config v2w-2b 2b-480p-16fps     # strict report from metadata, exit 0 only if it loads

Why this module is paranoid: a run meant to start from a pretrained Cosmos checkpoint trained from random weights
for three days because a checkpointer skipped any path ending in `.pt` and logged "Training from scratch.".
So here: every source is resolved or rejected, keys are compared in full before any tensor is copied, all ranks
agree on the outcome and raise together, and after loading every local shard is checked against the file's bytes.
Contents: sources -> strict report -> loading -> init guard -> CLI.
"""
import argparse
import io
import json
import math
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: `except Exception` misses it
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.tensor import DTensor, Replicate, Shard

from model import DiT, add_lora, denoise, get_config


class CheckpointError(RuntimeError):
    pass


# Released checkpoints (cosmos_dit.md §7.1: flat dicts, `net.` keys, bf16). Only the DROID one pins a revision.
_V2W = "hf://nvidia/Cosmos-Predict2-{size}-Video2World/model-{res}p-{fps}fps.pt"
NAMED_INITS = {f"{size.lower()}-{res}p-{fps}fps": _V2W.format(size=size, res=res, fps=fps)
               for size in ("2B", "14B") for res in (480, 720) for fps in (16, 10)}
NAMED_INITS["droid"] = ("hf://nvidia/Cosmos-Predict2-14B-Sample-GR00T-Dreams-DROID/model-480p-16fps.pt"
                        "@ebc29d30a3fab504bcc779a85bca073d14ad39f9")
# Keys that released files carry but that hold no weights of our network: TransformerEngine metadata and the trainer's
# counters. They are counted in the report, never silently dropped.
IGNORABLE_SUFFIXES = ("._extra_state",)
IGNORABLE_KEYS = ("accum_video_sample_counter", "accum_image_sample_counter", "accum_iteration",
                  "accum_train_in_hours")
WRAPPER_SEGMENTS = ("module", "_orig_mod", "_checkpoint_wrapped_module")  # removed wherever they appear
RELEASE_PREFIXES = ("net", "net_ema")
LORA_KEYS = r"\.lora_[ab]\.weight$"  # allow_missing pattern for loading a base checkpoint into a LoRA model
STEP_RE = re.compile(r"^step_(\d{8})$")  # a training step directory (resume.py writes them)

# -----------------------------------------------------------------------------
# Ranks agree on every outcome (resume.py's collectives use these too)


def rank():
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size():
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def say(*args):
    if rank() == 0:
        print(*args, flush=True)


def agree(what, fn, share=False):
    """Run fn on every rank. If it raised anywhere, every rank raises CheckpointError with the first failure's text,
    so no rank is left waiting in a collective. share=True returns rank 0's (picklable) result on every rank."""
    err, result = None, None
    try:
        result = fn()
    except (Exception, CheckpointException) as e:
        err = e
    if isinstance(err, CheckpointException):  # DCP's text is a traceback per rank: keep the exceptions only
        msg = f"{what}: DCP failed: " + "; ".join(f"rank {r}: {type(e).__name__}: {e}"
                                                  for r, (e, _) in sorted(err.failures.items()))
    elif err is not None:
        msg = f"{what}: {err if isinstance(err, CheckpointError) else f'{type(err).__name__}: {err}'}"
    if world_size() == 1:
        if isinstance(err, CheckpointError):
            raise err
        if err is not None:
            raise CheckpointError(msg) from err
        return result
    gathered = [None] * world_size()
    dist.all_gather_object(gathered, (None if err is None else msg, result if share and err is None else None))
    failed = [r for r, (m, _) in enumerate(gathered) if m is not None]
    if failed:  # the same text on every rank
        raise CheckpointError(f"failed on rank(s) {failed}; rank {failed[0]}: {gathered[failed[0]][0]}") from err
    return gathered[0][1] if share else result


# -----------------------------------------------------------------------------
# Sources: resolve a name to a local path, then read its key/shape/dtype table without touching tensor bytes


def resolve_source(init, offline=None):
    """Named init, hf://org/repo/path[@rev], a file or a directory -> a local path. Anything else is an error."""
    init = os.fspath(init)
    if init == "random":
        raise CheckpointError("'random' is not a checkpoint: the caller keeps init_weights() and must not call load")
    init = NAMED_INITS.get(init, init)
    if init.startswith("hf://"):
        return _hf_download(init, offline)
    if not os.path.exists(init):
        hint = "" if os.sep in init or "." in init else f" (not a named init either: {sorted(NAMED_INITS)})"
        raise CheckpointError(f"checkpoint not found: {init}{hint}; use --init random to train from scratch")
    if os.path.isdir(init):
        names = os.listdir(init)
        if ".metadata" in names:
            return init
        index = [n for n in names if n.endswith(".safetensors.index.json")]
        if len(index) == 1:
            return os.path.join(init, index[0])
        if any(n.endswith(".distcp") for n in names):
            raise CheckpointError(f"{init}: DCP shards but no .metadata: an incomplete (crashed) save")
        if any(STEP_RE.match(n) for n in names):
            raise CheckpointError(f"{init} is a training out_dir: pass one of its step_XXXXXXXX directories")
        raise CheckpointError(f"{init}: directory holds no checkpoint (no .metadata, no *.safetensors.index.json;"
                              f" {len(names)} entries)")
    if not init.endswith((".pt", ".pth", ".safetensors", ".safetensors.index.json")):
        raise CheckpointError(f"{init}: unsupported checkpoint format (.pt/.pth, .safetensors, an index json, a DCP dir)")
    return init


def _hf_download(url, offline):
    from huggingface_hub import constants, hf_hub_download
    spec, _, revision = url[len("hf://"):].partition("@")
    parts = spec.split("/")
    if len(parts) < 3 or not all(parts):
        raise CheckpointError(f"{url}: expected hf://ORG/REPO/PATH[@REVISION]")
    repo, filename = "/".join(parts[:2]), "/".join(parts[2:])
    offline = constants.HF_HUB_OFFLINE if offline is None else offline

    def fetch(name):
        try:
            return hf_hub_download(repo, name, revision=revision or None, local_files_only=offline)
        except Exception as e:  # re-raised with the url and what to do; the original stays chained
            mode = "offline (HF_HUB_OFFLINE=1): not in the local cache" if offline else "download failed"
            raise CheckpointError(f"{url}: {mode}: {type(e).__name__}: {e}. Gated Cosmos repos need an accepted"
                                  " license and HF_TOKEN; pre-download with `python ckpt.py check`.") from e
    path = fetch(filename)
    if filename.endswith(".index.json"):  # sharded safetensors: fetch every shard next to the index
        with open(path) as f:
            for shard in sorted(set(json.load(f)["weight_map"].values())):
                fetch(os.path.join(os.path.dirname(filename), shard))
    return path


_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


@dataclass
class Source:
    path: str
    kind: str  # "pt" | "safetensors" | "dcp"
    entries: dict  # file key -> (shape, dtype), or (None, type name) for a non-tensor value
    prefix: str = None  # fixed top-level prefix of the model weights (DCP: "model"); None = release prefix rules
    tensors: dict = None  # .pt: the mmapped tensors
    spans: dict = None  # .safetensors: key -> (file, first byte)


def _safetensors_table(path, entries, spans):
    """Parse a safetensors header ourselves: we need byte offsets to read only this rank's rows."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little") if size >= 8 else -1
        if n < 0 or 8 + n > size:
            raise CheckpointError(f"{path}: truncated or not safetensors ({size} bytes, header length {n})")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise CheckpointError(f"{path}: corrupt safetensors header: {e}") from e
    end = 0
    for key, info in header.items():
        if key == "__metadata__":
            continue
        if info["dtype"] not in _ST_DTYPES:
            raise CheckpointError(f"{path}: {key} has unsupported dtype {info['dtype']}")
        dtype, shape, (lo, hi) = _ST_DTYPES[info["dtype"]], tuple(info["shape"]), info["data_offsets"]
        if hi - lo != math.prod(shape) * dtype.itemsize:
            raise CheckpointError(f"{path}: {key} {shape} {dtype} spans {hi - lo} bytes")
        entries[key], spans[key], end = (shape, dtype), (path, 8 + n + lo), max(end, hi)
    if 8 + n + end != size:
        raise CheckpointError(f"{path}: truncated: the header describes {8 + n + end} bytes, the file has {size}")


def open_source(path):
    """Read only the table of contents of a local checkpoint (see resolve_source for the accepted forms)."""
    if os.path.isdir(path):
        try:
            md = FileSystemReader(path).read_metadata().state_dict_metadata
        except (Exception, CheckpointException) as e:
            raise CheckpointError(f"{path}: unreadable DCP .metadata: {type(e).__name__}: {e}") from e
        return Source(path, "dcp", {k: (tuple(m.size), m.properties.dtype) if isinstance(m, TensorStorageMetadata)
                                    else (None, "bytes") for k, m in md.items()}, prefix="model")
    if path.endswith(".json"):
        with open(path) as f:
            weight_map = json.load(f)["weight_map"]
        entries, spans = {}, {}
        for shard in sorted(set(weight_map.values())):
            shard_path = os.path.join(os.path.dirname(path), shard)
            if not os.path.isfile(shard_path):
                raise CheckpointError(f"{path}: shard {shard} is missing")
            _safetensors_table(shard_path, entries, spans)
        wrong = [k for k, s in weight_map.items() if k not in spans or os.path.basename(spans[k][0]) != s]
        if wrong:
            raise CheckpointError(f"{path}: {len(wrong)} keys are not in the shard the index names, e.g. {wrong[:3]}")
        return Source(path, "safetensors", entries, spans=spans)
    if path.endswith(".safetensors"):
        entries, spans = {}, {}
        _safetensors_table(path, entries, spans)
        return Source(path, "safetensors", entries, spans=spans)
    try:  # weights_only: never unpickle arbitrary objects; mmap: no tensor byte is read until it is copied.
        # Older TransformerEngine saved `_extra_state` as io.BytesIO, which holds bytes only: allowed.
        with torch.serialization.safe_globals([io.BytesIO]):
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:
        raise CheckpointError(f"{path}: cannot be read as a weights-only .pt (truncated, legacy format or pickled"
                              f" objects): {type(e).__name__}: {str(e).splitlines()[0]}") from e
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a dict of tensors, got {type(obj).__name__}")
    entries = {k: (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else (None, type(v).__name__)
               for k, v in obj.items()}
    return Source(path, "pt", entries, tensors=obj)


# -----------------------------------------------------------------------------
# The strict report, computed from metadata before any tensor is copied


def normalize_key(key, release_prefix):
    """Whole-segment key normalisation (never str.replace: 'net.' also occurs inside 'adaln_net.')."""
    parts = key.split(".")
    if release_prefix is not None:
        if parts[0] != release_prefix:
            return None
        parts = parts[1:]
    return ".".join(p for p in parts if p not in WRAPPER_SEGMENTS)


def is_ignorable(key):
    return key in IGNORABLE_KEYS or key.endswith(IGNORABLE_SUFFIXES)


def choose_release_prefix(keys, ema, source):
    """Released files prefix keys with net. (and net_ema.). Holding both needs an explicit ema choice."""
    present = {k.split(".", 1)[0] for k in keys} & set(RELEASE_PREFIXES)
    if not present:
        if ema:
            raise CheckpointError(f"{source}: ema=True but the file has no net_ema. keys")
        return None
    if ema is None:
        if len(present) == 2:
            raise CheckpointError(f"{source}: holds both net. and net_ema. weights; pass ema=True or ema=False")
        return present.pop()
    want = "net_ema" if ema else "net"
    if want not in present:
        raise CheckpointError(f"{source}: asked for {want}. weights, the file has only {sorted(present)}")
    return want


_SHORT = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}


def _dtype_name(dtype):
    return _SHORT.get(dtype, str(dtype).replace("torch.", ""))


def _collapse(keys):
    """'blocks.*.mlp.layer1.weight x28' instead of 28 lines."""
    groups = {}
    for k in keys:
        groups.setdefault(re.sub(r"(^|\.)blocks\.\d+\.", r"\1blocks.*.", k), []).append(k)
    return [ks[0] if len(ks) == 1 else f"{g} x{len(ks)}" for g, ks in groups.items()]


@dataclass
class LoadReport:
    source: str
    loaded: list = field(default_factory=list)
    missing: list = field(default_factory=list)
    unexpected: list = field(default_factory=list)
    shape_mismatch: list = field(default_factory=list)  # "key: file (..) vs model (..)"
    dtype_errors: list = field(default_factory=list)  # int<->float, or narrowing a trainable parameter
    non_tensor: list = field(default_factory=list)
    collisions: list = field(default_factory=list)  # "key <- [file keys]"
    allowed_missing: list = field(default_factory=list)  # missing but matched by allow_missing
    ignored: list = field(default_factory=list)  # known-ignorable keys present in the file
    other_prefix: list = field(default_factory=list)  # the release copy not chosen, or non-model DCP state
    dtype_conversions: dict = field(default_factory=dict)  # "bf16->fp32": count
    checksum: int = None  # after loading: of the file's bytes of every loaded tensor, independent of world size
    ERRORS = ("missing", "unexpected", "shape_mismatch", "dtype_errors", "non_tensor", "collisions")

    @property
    def ok(self):
        return not any(getattr(self, name) for name in self.ERRORS)

    def summary(self):
        conv = ", ".join(f"{k} x{v}" for k, v in sorted(self.dtype_conversions.items())) or "none"
        errors = ", ".join(f"{n.replace('_', ' ')} {len(getattr(self, n))}" for n in self.ERRORS)
        return (f"{len(self.loaded)} tensors match; {errors}; known-ignorable {len(self.ignored)},"
                f" allowed missing {len(self.allowed_missing)}, other copy/state {len(self.other_prefix)};"
                f" dtype conversions: {conv}")

    def details(self, limit=12):
        lines = [f"{self.source}: {'would load' if self.ok else 'would NOT load'}: {self.summary()}"]
        for name in (*self.ERRORS, "allowed_missing", "ignored"):
            items = _collapse(getattr(self, name))
            lines += [f"  {name}: {item}" for item in items[:limit]]
            if len(items) > limit:
                lines.append(f"  {name}: ... and {len(items) - limit} more groups")
        return "\n".join(lines)


def model_entries(model):
    """{key: (shape, dtype, trainable)} from model.state_dict(); DTensor shapes are global. Works on meta."""
    trainable = {k for k, p in model.named_parameters() if p.requires_grad}
    return {k: (tuple(v.shape), v.dtype, k in trainable) for k, v in model.state_dict().items()}


def _dtype_problem(fdtype, mdtype, trainable):
    if fdtype.is_floating_point != mdtype.is_floating_point or (not fdtype.is_floating_point and fdtype != mdtype):
        return "int/bool/float mismatch"
    if trainable and fdtype.itemsize > mdtype.itemsize:
        return "narrowing a trainable parameter"
    return None


def build_report(model_entries, file_entries, source, ema=None, allow_missing=(), prefix=None):
    """Compare model {key: (shape, dtype[, trainable])} with file {key: (shape, dtype)}.
    Returns (report, {model key: file key}). prefix fixes the weights' top-level prefix (DCP: 'model')."""
    report = LoadReport(source=str(source))
    if prefix is None:
        prefix = choose_release_prefix(file_entries, ema, source)
        other = set(RELEASE_PREFIXES) - {prefix}
    else:
        other = {k.split(".", 1)[0] for k in file_entries} - {prefix}
    mapping, sources = {}, {}
    for file_key in file_entries:
        key = normalize_key(file_key, prefix)
        if key is None and file_key.split(".", 1)[0] in other:
            report.other_prefix.append(file_key)
        elif key is None:
            report.unexpected.append(file_key)  # e.g. unprefixed keys mixed into a net. file
        elif is_ignorable(key):
            report.ignored.append(file_key)
        else:
            sources.setdefault(key, []).append(file_key)
    for key, file_keys in sources.items():
        fshape, fdtype = file_entries[file_keys[0]]
        if len(file_keys) > 1:
            report.collisions.append(f"{key} <- {file_keys}")
        elif fshape is None:
            report.non_tensor.append(f"{file_keys[0]} ({fdtype})")
        elif key not in model_entries:
            report.unexpected.append(file_keys[0])
        else:
            mshape, mdtype, *trainable = model_entries[key]
            problem = _dtype_problem(fdtype, mdtype, bool(trainable and trainable[0]))
            if tuple(fshape) != tuple(mshape):
                report.shape_mismatch.append(f"{key}: file {tuple(fshape)} vs model {tuple(mshape)}")
            elif problem:
                report.dtype_errors.append(f"{key}: {_dtype_name(fdtype)} -> {_dtype_name(mdtype)}: {problem}")
            else:
                if fdtype != mdtype:
                    name = f"{_dtype_name(fdtype)}->{_dtype_name(mdtype)}"
                    report.dtype_conversions[name] = report.dtype_conversions.get(name, 0) + 1
                mapping[key] = file_keys[0]
                report.loaded.append(key)
    for key in sorted(set(model_entries) - set(sources)):
        allowed = any(re.search(p, key) for p in allow_missing)
        (report.allowed_missing if allowed else report.missing).append(key)
    return report, mapping


# -----------------------------------------------------------------------------
# Loading: every rank reads and copies only its own rows; then the local shards are checked against the file


def _local_rows(value):
    """(local tensor, lo, hi, counts) for a model tensor: the dim-0 rows this rank holds (torch.chunk semantics,
    as FSDP2's Shard(0)), and whether this rank adds its rows to the global checksum (one copy of each row)."""
    if not isinstance(value, DTensor):
        return value, 0, (value.shape[0] if value.dim() else 1), rank() == 0
    lo, hi, counts = 0, value.shape[0], True
    coord = value.device_mesh.get_coordinate()
    for i, placement in enumerate(value.placements):
        if isinstance(placement, Replicate):
            counts = counts and coord[i] == 0
        elif isinstance(placement, Shard) and placement.dim == 0:
            k = math.ceil((hi - lo) / value.device_mesh.size(i))
            lo, hi = min(lo + coord[i] * k, hi), min(lo + coord[i] * k + k, hi)
        else:
            raise CheckpointError(f"unsupported placement {placement} (only Shard(0) and Replicate)")
    local = value.to_local()
    if tuple(local.shape) != (hi - lo, *value.shape[1:]):
        raise CheckpointError(f"local shard {tuple(local.shape)} is not rows {lo}:{hi} of {tuple(value.shape)}")
    return local, lo, hi, counts


def _bitsum(t):
    """Order-independent checksum of the raw bits (mod 2^64), summed in the widest word that divides a row, so
    the sums of row shards add up to the full tensor's. int64 words: ~12 GB/s on one CPU core."""
    if t.numel() == 0:
        return 0
    row = t[0].numel() * t.element_size() if t.dim() else t.element_size()
    word = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}[math.gcd(row, 8)]
    return int(t.detach().contiguous().reshape(-1).view(torch.uint8).view(word).sum(dtype=torch.int64))


def _finite(t):
    if not t.is_floating_point() or t.numel() == 0:
        return True
    lo, hi = torch.aminmax(t.float() if t.element_size() == 1 else t)  # NaN propagates; 10x faster than isfinite
    return bool(lo.isfinite() and hi.isfinite())


def _pread(path, offset, nbytes, pin):
    buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
    view, done = memoryview(buf.numpy()), 0
    with open(path, "rb", buffering=0) as f:
        while done < nbytes:  # preadv releases the GIL: the reader threads overlap their disk reads
            n = os.preadv(f.fileno(), [view[done:]], offset + done)
            if n == 0:
                raise CheckpointError(f"{path}: unexpected end of file at byte {offset + done}")
            done += n
    return buf


def _read_rows(src, key, lo, hi, pin):
    shape, dtype = src.entries[key]
    if src.kind == "pt":
        t = src.tensors[key][lo:hi] if src.tensors[key].dim() else src.tensors[key]
        # for a GPU, fault the mmapped pages in here, in this reader thread (a pageable host-to-device copy would
        # serialise the disk reads inside the driver), then DMA from pinned memory
        return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t) if pin else t
    path, start = src.spans[key]
    row = math.prod(shape[1:]) * dtype.itemsize if shape else dtype.itemsize
    buf = _pread(path, start + lo * row, (hi - lo) * row, pin)
    return buf.view(dtype).view((hi - lo, *shape[1:]) if shape else ())


def _copy_into(model, src, mapping, threads):
    """Copy this rank's rows of every mapped key; return {key: (file checksum of the rows, expected model bits)}."""
    state = model.state_dict()
    targets = {key: _local_rows(state[key]) for key in mapping}
    for local, *_ in targets.values():
        if local.is_floating_point():
            local.detach().fill_(float("nan"))  # poison: a row that is never written cannot pass _verify

    def copy(key, rows):
        local, _, _, counts = targets[key]
        if not _finite(rows):
            raise CheckpointError(f"{src.path}: {mapping[key]} holds NaN or Inf values")
        expect = rows.to(local.dtype)
        with torch.no_grad():
            local.copy_(expect)
        file_sum = _bitsum(rows)
        return key, (file_sum if counts else 0, file_sum if expect is rows else _bitsum(expect))
    if src.kind == "dcp":  # DCP reads exactly the chunks overlapping each local shard; dtypes are converted after
        staged = {fkey: state[key] if state[key].dtype == src.entries[fkey][1]
                  else torch.empty_like(state[key], dtype=src.entries[fkey][1]) for key, fkey in mapping.items()}
        dcp.load(staged, checkpoint_id=src.path)
        return dict(copy(key, staged[fkey].to_local() if isinstance(staged[fkey], DTensor) else staged[fkey])
                    for key, fkey in mapping.items())

    def one(key):  # in a reader thread: preadv / mmap page faults and torch copies all release the GIL
        local, lo, hi, _ = targets[key]
        if hi == lo:
            return key, (0, 0)
        return copy(key, _read_rows(src, mapping[key], lo, hi, local.device.type == "cuda").to(local.device))
    order = sorted(mapping, key=lambda k: src.spans[mapping[k]] if src.spans else (src.path, 0))
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        return dict(pool.map(one, order))


def _verify(model, sums):
    """Re-read the model's own tensors: each local shard must carry exactly the bits copied from the file (the NaN
    poison of a row that was never written would change the checksum)."""
    state = model.state_dict()
    bad = [key for key, (_, expect) in sums.items() if _bitsum(_local_rows(state[key])[0]) != expect]
    if bad:
        raise CheckpointError(f"{len(bad)} local shards differ from the file after copying: {bad[:5]}")


def _comm_device():
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"


def load(model, source, ema=None, allow_missing=(), verbose=True, threads=8):
    """Strictly load a checkpoint into a plain or FSDP2-sharded model, in place. Returns the LoadReport.

    source: anything resolve_source accepts (named init, hf://, .pt, .safetensors, index json, DCP step dir).
    ema: which release copy (net_ema if True, net if False; None = the only one present).
    allow_missing: regexes of model keys the file may lack (e.g. LORA_KEYS); those keep their init_weights values.
    Every rank reads its own rows (mmap / pread, no broadcast, no full copy per rank); all ranks raise together.
    """
    t0 = time.time()

    def prepare():
        path = resolve_source(source)
        if any(v.is_meta for v in model.state_dict().values()):
            raise CheckpointError("the model is on the meta device: call to_empty() and init_weights() first")
        src = open_source(path)
        report, mapping = build_report(model_entries(model), src.entries, path, ema, allow_missing, src.prefix)
        if not report.ok:
            raise CheckpointError(report.details())
        return src, report, mapping
    src, report, mapping = agree(f"checking {source}", prepare)
    sums = agree(f"loading {src.path}", lambda: _copy_into(model, src, mapping, threads))
    agree(f"verifying {src.path}", lambda: _verify(model, sums))
    keys = sorted(sums)
    file_sums = torch.tensor([sums[k][0] for k in keys], dtype=torch.int64)
    if world_size() > 1:
        file_sums = file_sums.to(_comm_device())
        dist.all_reduce(file_sums)
    checksum = sum((i + 1) * int(s) for i, s in enumerate(file_sums.tolist())) % 2 ** 64
    numel = sum(math.prod(src.entries[mapping[k]][0]) for k in keys)
    nbytes = sum(math.prod(src.entries[mapping[k]][0]) * src.entries[mapping[k]][1].itemsize for k in keys)
    dt = time.time() - t0
    if verbose:
        say(f"ckpt: loaded {len(keys)} tensors, {numel:,} values, {nbytes / 1e9:.2f} GB from {src.path} in {dt:.1f}s"
             f" ({nbytes / 1e9 / max(dt, 1e-9):.2f} GB/s); " + report.summary())
        say(f"ckpt: verified on {world_size()} rank(s): every local shard holds exactly the file's bits, all finite;"
             f" checksum {checksum:016x}")
    report.checksum = checksum
    return report


# -----------------------------------------------------------------------------
# The iteration-0 init guard. Measured as a ratio to the loss of predicting zero velocity on the same batch and
# noise: random init (our init_weights) gives ~1.6-1.8, an all-zero output exactly 1.0, a network that denoises at
# all < 1 (~0.5 for a tiny model after 150 steps, tests/test_ckpt.py). Scale-free, unlike the field's absolute
# numbers (~13 random vs 0.3-3 warm for upstream's init and latents).

GUARD_SIGMAS = (0.25, 1.0, 4.0)
GUARD_MAX_RATIO = 0.75


@torch.no_grad()
def guard_loss(net, x0, crossattn_emb, condition_mask=None, fps=None, sigmas=GUARD_SIGMAS, seed=0):
    """(loss, zero_loss): rectified-flow velocity MSE mean((v - (eps - x0))^2) at fixed sigmas with seeded noise,
    and the same MSE for v = 0. Conditioning frames (target unpredictable there) are left out. Collective under
    FSDP: every rank passes its own batch; the sums are all-reduced so every rank gets the same numbers."""
    g = torch.Generator(device=x0.device).manual_seed(seed * 1000 + rank())
    weight = torch.ones_like(x0[:, :1]) if condition_mask is None else 1 - condition_mask.float()
    sums = torch.zeros(3, dtype=torch.float64, device=x0.device)
    for s in sigmas:
        eps = torch.randn(x0.shape, generator=g, device=x0.device, dtype=torch.float32)
        sigma = torch.full((x0.shape[0],), float(s), device=x0.device)
        _, velocity = denoise(net, x0.float() + s * eps, sigma, crossattn_emb, gt_frames=x0,
                              condition_mask_B_1_T_H_W=condition_mask, fps=fps)
        target = eps - x0.float()
        sums += torch.stack([((velocity - target) ** 2 * weight).sum(), (target ** 2 * weight).sum(),
                             weight.sum() * x0.shape[1]]).double()
    if world_size() > 1:
        sums = sums.to(_comm_device())
        dist.all_reduce(sums)
    return (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()


def init_guard(loss, zero_loss, max_ratio=GUARD_MAX_RATIO, source=""):
    """Stop (on every rank: the inputs are all-reduced) if the iteration-0 loss looks like an untrained network."""
    ratio = loss / zero_loss
    say(f"init guard: iteration-0 loss {loss:.4f} vs zero-velocity loss {zero_loss:.4f}: ratio {ratio:.3f},"
         f" must be < {max_ratio} (random init ~1.7, zero output 1.0, trained ~0.5)")
    if not math.isfinite(ratio) or ratio >= max_ratio:
        raise CheckpointError(f"init guard: the network starting from {source or 'its init'} does not denoise"
                              f" (loss ratio {ratio:.3f} >= {max_ratio}): it looks like random init, so the"
                              " pretrained weights did not go in. Refusing to train.")
    return ratio


# -----------------------------------------------------------------------------
# CLI: check


def check(config, source, ema=None, lora_rank=0, dtype=None, allow_missing=()):
    """The strict report of `source` against a config, on the meta device (no weights in memory). True if ok."""
    with torch.device("meta"):
        net = DiT(get_config(config))
    if dtype is not None:
        net = net.to(dtype)
    if lora_rank:
        add_lora(net, lora_rank)
        allow_missing = (*allow_missing, LORA_KEYS)
    path = resolve_source(source)
    src = open_source(path)
    report, _ = build_report(model_entries(net), src.entries, path, ema, allow_missing, src.prefix)
    print(report.details(), flush=True)
    print(f"check: {'OK, would load' if report.ok else 'FAILED, would not load'} into {config}", flush=True)
    return report.ok


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("check", help="print the strict report of SOURCE against --config; exit 0 only if it loads")
    p.add_argument("source")
    p.add_argument("--config", required=True)
    p.add_argument("--ema", choices=("auto", "net", "net_ema"), default="auto")
    p.add_argument("--lora-rank", type=int, default=0, help="check a LoRA model (adapters may be missing)")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--allow-missing", action="append", default=[], help="regex of model keys the file may lack")
    args = parser.parse_args(argv)
    ema = {"auto": None, "net": False, "net_ema": True}[args.ema]
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    try:
        ok = check(args.config, args.source, ema, args.lora_rank, dtype, tuple(args.allow_missing))
    except CheckpointError as e:
        print(f"check: FAILED: {e}", flush=True)
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
