"""Loading and saving weights: explicit, strict and loud.

Every missing, unexpected or mis-shaped key is an error, reported in full before any tensor is copied.
(Core of the module: key normalisation, the strict report, loading .safetensors/.pt into a plain model.)
"""
import json
import os
from dataclasses import dataclass, field

import torch
from safetensors import safe_open

# Keys that released Cosmos checkpoints carry but that hold no weights of our network: TransformerEngine metadata
# and the trainer's bookkeeping counters. They are listed in the report, never silently dropped.
IGNORABLE_SUFFIXES = ("._extra_state",)
IGNORABLE_KEYS = ("accum_video_sample_counter", "accum_image_sample_counter", "accum_iteration",
                  "accum_train_in_hours")
WRAPPER_SEGMENTS = ("module", "_orig_mod", "_checkpoint_wrapped_module")  # removed wherever they appear
RELEASE_PREFIXES = ("net", "net_ema")


def normalize_key(key, release_prefix):
    """Whole-segment key normalisation (never str.replace: 'net.' also occurs inside other names)."""
    parts = key.split(".")
    if release_prefix is not None:
        if parts[0] != release_prefix:
            return None  # belongs to the other release copy (net vs net_ema) or to something else
        parts = parts[1:]
    return ".".join(p for p in parts if p not in WRAPPER_SEGMENTS)


def is_ignorable(key):
    return key in IGNORABLE_KEYS or key.endswith(IGNORABLE_SUFFIXES)


@dataclass
class LoadReport:
    source: str
    loaded: list = field(default_factory=list)
    missing: list = field(default_factory=list)
    unexpected: list = field(default_factory=list)
    shape_mismatch: list = field(default_factory=list)  # (key, file shape, model shape)
    collisions: list = field(default_factory=list)  # (normalised key, [file keys])
    ignored: list = field(default_factory=list)  # known-ignorable keys present in the file
    other_prefix: list = field(default_factory=list)  # keys of the release copy not chosen (net_ema vs net)
    dtype_conversions: dict = field(default_factory=dict)  # "bf16->fp32": count

    @property
    def ok(self):
        return not (self.missing or self.unexpected or self.shape_mismatch or self.collisions)

    def summary(self):
        conv = ", ".join(f"{k}: {v}" for k, v in sorted(self.dtype_conversions.items())) or "none"
        return (f"load report for {self.source}: loaded {len(self.loaded)}, missing {len(self.missing)}, "
                f"unexpected {len(self.unexpected)}, shape mismatch {len(self.shape_mismatch)}, "
                f"collisions {len(self.collisions)}, ignored (known) {len(self.ignored)}, "
                f"other release copy {len(self.other_prefix)}, dtype conversions: {conv}")

    def details(self, limit=20):
        lines = [self.summary()]
        for name in ("missing", "unexpected", "shape_mismatch", "collisions"):
            items = getattr(self, name)
            for item in items[:limit]:
                lines.append(f"  {name}: {item}")
            if len(items) > limit:
                lines.append(f"  {name}: ... and {len(items) - limit} more")
        return "\n".join(lines)


class StrictLoadError(RuntimeError):
    pass


_SHORT = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}


def _dtype_name(dtype):
    return _SHORT.get(dtype, str(dtype).replace("torch.", ""))


def read_file_tensors(path):
    """{key: tensor} for a .safetensors file or a .pt state dict (mmap, weights_only: never arbitrary objects)."""
    if path.endswith(".safetensors"):
        with safe_open(path, framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}
    if path.endswith((".pt", ".pth")):
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
            raise StrictLoadError(f"{path}: expected a flat dict of tensors, got {type(obj).__name__}")
        return obj
    raise StrictLoadError(f"{path}: unsupported checkpoint format (expected .safetensors, .pt or .pth)")


def choose_release_prefix(keys, ema, source):
    """Released files prefix keys with net. (and net_ema.). Holding both needs an explicit ema choice."""
    present = {k.split(".", 1)[0] for k in keys} & set(RELEASE_PREFIXES)
    if not present:
        if ema:
            raise StrictLoadError(f"{source}: ema=True but the file has no net_ema. keys")
        return None
    if present == {"net", "net_ema"} and ema is None:
        raise StrictLoadError(f"{source}: holds both net. and net_ema. weights; pass ema=True or ema=False")
    want = "net_ema" if ema else "net"
    if want not in present:
        raise StrictLoadError(f"{source}: asked for {want}. weights, the file has only {sorted(present)}")
    return want


def build_report(model_entries, file_entries, source, ema=None):
    """Compare {key: (shape, dtype)} of the model and of a file. Returns (report, {model key: file key})."""
    report = LoadReport(source=str(source))
    prefix = choose_release_prefix(file_entries, ema, source)
    mapping, sources = {}, {}
    for file_key in file_entries:
        key = normalize_key(file_key, prefix)
        if key is None:
            report.other_prefix.append(file_key)
        elif is_ignorable(key):
            report.ignored.append(file_key)
        else:
            sources.setdefault(key, []).append(file_key)
    for key, file_keys in sources.items():
        if len(file_keys) > 1:
            report.collisions.append((key, file_keys))
        elif key not in model_entries:
            report.unexpected.append(file_keys[0])
        else:
            (fshape, fdtype), (mshape, mdtype) = file_entries[file_keys[0]], model_entries[key]
            if tuple(fshape) != tuple(mshape):
                report.shape_mismatch.append((key, tuple(fshape), tuple(mshape)))
                continue
            if fdtype != mdtype:
                name = f"{_dtype_name(fdtype)}->{_dtype_name(mdtype)}"
                report.dtype_conversions[name] = report.dtype_conversions.get(name, 0) + 1
            mapping[key] = file_keys[0]
            report.loaded.append(key)
    report.missing = sorted(set(model_entries) - set(sources))
    return report, mapping


def model_entries(model):
    return {k: (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()}


def load(model, source, ema=None, verbose=True):
    """Strictly load a checkpoint file into a (non-sharded) model. Raises StrictLoadError with the full report."""
    source = os.fspath(source)
    if not os.path.exists(source):
        raise FileNotFoundError(f"checkpoint not found: {source}")
    tensors = read_file_tensors(source)
    report, mapping = build_report(model_entries(model), {k: (tuple(v.shape), v.dtype) for k, v in tensors.items()},
                                   source, ema)
    if not report.ok:
        raise StrictLoadError(report.details())
    state = model.state_dict()
    with torch.no_grad():
        for key, file_key in mapping.items():
            state[key].copy_(tensors[file_key])
    if verbose:
        print(report.summary(), flush=True)
    return report


def save_json(path, obj):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
