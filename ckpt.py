"""Loading weights into a plain or FSDP2-sharded model: explicit, strict and loud.

Training-state checkpoints (save / resume / rotate / export) are engine/resume.py, which builds on this file.

    python ckpt.py check --config v2w-2b 2b-480p-16fps   # strict report + byte verification; exit 0 only if it loads

Why this module is paranoid: a run meant to start from a pretrained Cosmos checkpoint trained from random weights
for three days because a checkpointer skipped any path ending in `.pt` and logged "Training from scratch.".
So here: every source is resolved or rejected, every rank must be reading the same file, keys are compared in full
before any tensor is copied, all ranks agree on the outcome and raise together, the bytes read are checked against
what the file records about itself (a .pt's zip CRCs, a step directory's save-time checksums), and after loading
every local shard is checked against the file's bytes.
Contents: every rank reads the same file -> strict report -> loading -> init guard -> CLI.
Where a source comes from (named inits, hub downloads, a path resolved or rejected) is base/inits.py; reading and checking
the files themselves (formats, CRCs, checksums) is base/formats.py.
"""
import functools
import inspect
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
from torch.distributed.tensor import DTensor

from base import cli, inits
from base.collectives import agree, comm_device, gather, local_rows, rank, say, world_size
from base.formats import (
    CheckpointError,
    bitsum,
    check_sums,
    crc_range,
    crc_shift,
    dcp_call,
    identity,
    open_source,
    read_rows,
    tensor_crc,
    verify_bytes,
)
from base.inits import CONFIGS, check_init_config, get_config, resolve_source
from model import DiT
from nets.lora import add_lora

NAMED_INITS, INIT_CONFIGS = inits.NAMED_INITS, inits.INIT_CONFIGS  # read as ckpt.* by train.py and the tests

# Keys that released files carry but that hold no weights of our network: TransformerEngine metadata and the trainer's
# counters. They are counted in the report, never silently dropped.
IGNORABLE_SUFFIXES = ("._extra_state",)
IGNORABLE_KEYS = ("accum_video_sample_counter", "accum_image_sample_counter", "accum_iteration",
                  "accum_train_in_hours")
WRAPPER_SEGMENTS = ("module", "_orig_mod", "_checkpoint_wrapped_module")  # removed wherever they appear
RELEASE_PREFIXES = ("net", "net_ema")
LORA_KEYS = r"\.lora_[ab]\.weight$"  # allow_missing pattern for loading a base checkpoint into a LoRA model

# -----------------------------------------------------------------------------
# Ranks read the same file (the collectives that make every rank agree: base/collectives.py)


def _same_file_everywhere(source, path, ident):
    """Each rank copies only its own rows: ranks reading different files (node-local caches filled at different
    times, an unpinned hf:// name resolved to two revisions) would load a silent row-wise mix of two checkpoints."""
    got = gather((os.fspath(source), path, ident))
    odd = [r for r, (_, _, i) in enumerate(got) if i != got[0][2]]
    if odd:
        (s0, p0, i0), (s1, p1, i1) = got[0], got[odd[0]]
        p0, p1 = (p if p == s else f"{s} -> {p}" for s, p in ((s0, p0), (s1, p1)))
        raise CheckpointError(f"ranks read different files for one checkpoint: rank 0 {p0} ({i0}) vs rank {odd[0]}"
                              f" {p1} ({i1}); ranks differing from rank 0: {odd}. Pin a revision"
                              " (hf://ORG/REPO/FILE@REV) and give every rank the same copy (one shared filesystem, or"
                              " caches filled from one revision)")


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


def weight_prefixes(src, ema):
    """Where a source's weights are. Release files: chosen from the keys (None). A DCP step dir holds the raw weights
    under model. and train.py's EMA of the trainable parameters under ema.: ema=True takes every key the EMA holds
    from ema. and the others (buffers, a LoRA run's frozen base) from model., and the report counts both."""
    if src.kind != "dcp":
        return None
    if not ema:
        return "model"
    if not any(k.startswith("ema.") for k in src.entries):
        raise CheckpointError(f"{src.path}: ema=True (train.py --ema-weights net_ema, sample.py --ema, ckpt.py check"
                              " --ema net_ema) but this step directory holds no ema.* tensors: its run kept no EMA"
                              " (train.py --ema 0). Load its raw weights instead (--ema-weights net / --ema auto)")
    return ("ema", "model")


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
    taken_from: dict = field(default_factory=dict)  # prefix -> count, when a key may come from several (ema., model.)
    checksum: int = None  # after loading: of the file's bytes of every loaded tensor, independent of world size
    model_config: str = ""  # its name in inits.CONFIGS, for the wrong-network hint ("" = not a named config)
    ERRORS = ("missing", "unexpected", "shape_mismatch", "dtype_errors", "non_tensor", "collisions")

    @property
    def ok(self):
        return not any(getattr(self, name) for name in self.ERRORS)

    def summary(self):
        conv = ", ".join(f"{k} x{v}" for k, v in sorted(self.dtype_conversions.items())) or "none"
        errors = ", ".join(f"{n.replace('_', ' ')} {len(getattr(self, n))}" for n in self.ERRORS)
        if self.dtype_errors:  # the tensors named on this first line too (a log may keep only it)
            first = "; ".join(e.split(": narrowing")[0] for e in self.dtype_errors[:3])
            errors = errors.replace(f"dtype errors {len(self.dtype_errors)}", f"dtype errors {len(self.dtype_errors)}"
                                    f" ({first}{'; ...' if len(self.dtype_errors) > 3 else ''})")
        taken = "".join(f", {n} from {p}." for p, n in self.taken_from.items())
        return (f"{len(self.loaded)} tensors match{taken}; {errors}; known-ignorable {len(self.ignored)},"
                f" allowed missing {len(self.allowed_missing)}, other copy/state {len(self.other_prefix)};"
                f" dtype conversions: {conv}")

    def family_hint(self):
        """One line when the keys say the file and the model are different networks (Predict2 / 2.5 / agibot); the
        configs it names are the model's size class (tiny nets for a tiny model)."""
        def has(keys, part):
            return any(part in k for k in keys)
        tiny = "tiny" in self.model_config
        predict2, p25, agibot = (("tiny", "p25-tiny", "p25-tiny-agibot") if tiny else
                                 ("v2w-2b or v2w-14b", "p25-2b or p25-14b", "p25-2b-agibot"))
        if has(self.unexpected, ".cam_encoder."):
            return f"the file is the robot/multiview-agibot network (per-block cam_encoder): use --config {agibot}"
        if has(self.unexpected, "crossattn_proj."):
            return f"the file is a Cosmos-Predict2.5 network (crossattn_proj, Reason1 text): use --config {p25}"
        if has(self.missing, "crossattn_proj."):
            return ("the model is a Predict2.5 config (crossattn_proj) but the file has no text projection: a Predict2"
                    f" checkpoint loads into --config {predict2}")
        if has(self.missing, ".cam_encoder."):
            return (f"the model has cam_encoder ({agibot}) but the file does not: the base Predict2.5 checkpoints"
                    f" load into --config {p25}")
        if has(self.shape_mismatch, "crossattn_proj."):
            return ("the text projection's in-width differs (Reason1 embeddings are 100352 wide in the released"
                    " networks, tiny configs use their own width)")
        return ""

    def details(self, limit=12):
        lines = [f"{self.source}: {'would load' if self.ok else 'would NOT load'}: {self.summary()}"]
        if not self.ok and self.family_hint():
            lines.insert(0, f"{self.source}: wrong network: {self.family_hint()}")
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


def _lossy(fdtype, mdtype):
    """True if mdtype cannot hold every fdtype value exactly (fewer mantissa bits, or a smaller exponent range:
    fp16 -> bf16 loses bits, bf16 -> fp16 overflows and underflows)."""
    f, m = torch.finfo(fdtype), torch.finfo(mdtype)
    return m.eps > f.eps or m.max < f.max or m.tiny > f.tiny


def _dtype_problem(fdtype, mdtype, trainable):
    if fdtype.is_floating_point != mdtype.is_floating_point or (not fdtype.is_floating_point and fdtype != mdtype):
        return "int/bool/float mismatch"
    if trainable and fdtype != mdtype and _lossy(fdtype, mdtype):
        return "narrowing a trainable parameter (the cast would change its values)"
    return None


def build_report(model_entries, file_entries, source, ema=None, allow_missing=(), prefix=None):
    """Compare model {key: (shape, dtype[, trainable])} with file {key: (shape, dtype)}.
    Returns (report, {model key: file key}). prefix fixes the weights' top-level prefix (DCP: 'model'), or gives
    several in priority order (('ema', 'model'): a key comes from the first prefix that holds it)."""
    report = LoadReport(source=str(source))
    if prefix is None:
        prefixes = (choose_release_prefix(file_entries, ema, source),)
        other = set(RELEASE_PREFIXES) - set(prefixes)
    else:
        prefixes = (prefix,) if isinstance(prefix, str) else tuple(prefix)
        other = {k.split(".", 1)[0] for k in file_entries} - set(prefixes)
    mapping, sources = {}, {}
    report.taken_from = dict.fromkeys(prefixes, 0) if len(prefixes) > 1 else {}
    for file_key in file_entries:
        top = [p for p in prefixes if p is None or file_key.split(".", 1)[0] == p]
        key = normalize_key(file_key, top[0]) if top else None
        if key is None and file_key.split(".", 1)[0] in other:
            report.other_prefix.append(file_key)
        elif key is None:
            report.unexpected.append(file_key)  # e.g. unprefixed keys mixed into a net. file
        elif is_ignorable(key):
            report.ignored.append(file_key)
        else:
            sources.setdefault(key, {}).setdefault(top[0], []).append(file_key)
    for key, by_prefix in sources.items():
        chosen = next(p for p in prefixes if p in by_prefix)
        file_keys = by_prefix[chosen]
        report.other_prefix += [k for p, ks in by_prefix.items() if p != chosen for k in ks]  # shadowed by chosen
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
                if len(prefixes) > 1:
                    report.taken_from[chosen] += 1
    for key in sorted(set(model_entries) - set(sources)):
        allowed = any(re.search(p, key) for p in allow_missing)
        (report.allowed_missing if allowed else report.missing).append(key)
    return report, mapping


# -----------------------------------------------------------------------------
# Loading: every rank reads and copies only its own rows, checksumming them on the way; then the sums are combined
# across ranks and checked against the file's own record (zip CRCs, save-time checksums), and the local shards
# against the bytes copied


def _finite(t):
    if not t.is_floating_point() or t.numel() == 0:
        return True
    lo, hi = torch.aminmax(t.float() if t.element_size() == 1 else t)  # NaN propagates; 10x faster than isfinite
    return bool(lo.isfinite() and hi.isfinite())


def _copy_into(model, src, mapping, threads, crc_owners=()):
    """Copy this rank's rows of every mapped key; return {key: (file checksum of the rows, expected model bits,
    shifted CRC-32 of the rows)}. The CRC part only for keys in crc_owners (.pt: the key whose rows tile a record)."""
    state = model.state_dict()
    targets = {key: local_rows(state[key]) for key in mapping}
    for local, *_ in targets.values():
        if local.is_floating_point():
            local.detach().fill_(float("nan"))  # poison: a row that is never written cannot pass _verify

    def copy(key, rows, crc=0):
        local, _, _, counts = targets[key]
        if not _finite(rows):
            raise CheckpointError(f"{src.path}: {mapping[key]} holds NaN or Inf values")
        expect = rows.to(local.dtype)
        if expect is not rows and local.is_floating_point() and torch.finfo(local.dtype).max < \
                torch.finfo(rows.dtype).max and not _finite(expect):  # only frozen weights may narrow (report)
            raise CheckpointError(f"{src.path}: {mapping[key]}: values overflow {_dtype_name(local.dtype)} when cast"
                                  f" from {_dtype_name(rows.dtype)} (max |x| {rows.float().abs().max().item():.4g}):"
                                  f" load it into a {_dtype_name(rows.dtype)} or fp32 model")
        with torch.no_grad():
            local.copy_(expect)
        file_sum = bitsum(rows)
        return key, (file_sum if counts else 0, file_sum if expect is rows else bitsum(expect), crc if counts else 0)
    if src.kind == "dcp":  # DCP reads exactly the chunks overlapping each local shard; dtypes are converted after
        staged = {fkey: state[key] if state[key].dtype == src.entries[fkey][1]
                  else torch.empty_like(state[key], dtype=src.entries[fkey][1]) for key, fkey in mapping.items()}
        with dcp_call() as no_dist:
            dcp.load(staged, checkpoint_id=src.path, no_dist=no_dist)
        return dict(copy(key, staged[fkey].to_local() if isinstance(staged[fkey], DTensor) else staged[fkey])
                    for key, fkey in mapping.items())

    def one(key):  # in a reader thread: preadv / mmap page faults, torch copies and zlib all release the GIL
        local, lo, hi, _ = targets[key]
        if hi == lo:
            return key, (0, 0, 0)
        rows = read_rows(src, mapping[key], lo, hi, local.device.type == "cuda")
        crc = 0
        if key in crc_owners:  # rows lo:hi are record bytes [lo * row, hi * row)
            _, size, _, _ = src.records[mapping[key]]
            crc = crc_shift(tensor_crc(rows), size - hi * (rows.nbytes // (hi - lo)))
        return copy(key, rows.to(local.device), crc)
    order = sorted(mapping, key=lambda k: src.spans[mapping[k]] if src.spans else (src.path, 0))
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        return dict(pool.map(one, order))


def _verify(model, sums):
    """Re-read the model's own tensors: each local shard must carry exactly the bits copied from the file (the NaN
    poison of a row that was never written would change the checksum)."""
    state = model.state_dict()
    bad = [key for key, (_, expect, _) in sums.items() if bitsum(local_rows(state[key])[0]) != expect]
    if bad:
        raise CheckpointError(f"{len(bad)} local shards differ from the file after copying: {bad[:5]}")


def _combine(values, xor=False):
    """Per-key ints (< 2^64) summed mod 2^64, or XORed, over ranks: the same list on every rank."""
    if world_size() == 1 or not values:
        return [v % 2 ** 64 for v in values]
    t = torch.tensor([v - 2 ** 64 if v >= 2 ** 63 else v for v in values], dtype=torch.int64, device=comm_device())
    parts = [torch.empty_like(t) for _ in range(world_size())]
    dist.all_gather(parts, t)
    out = functools.reduce(torch.bitwise_xor, parts) if xor else torch.stack(parts).sum(0)  # int64 sums wrap: exact
    return [v % 2 ** 64 for v in out.tolist()]


def _check_crcs(src, mapping, keys, crcs, owners):
    """.pt: every zip record holding a loaded tensor must match its CRC-32. A record that no loaded key tiles
    (a view into a larger storage) is read whole by rank 0."""
    got = {src.records[mapping[k]][0]: c for k, c in zip(keys, crcs) if k in owners}
    rest = sorted({src.records[mapping[k]][:2] for k in keys} - {src.records[mapping[k]][:2] for k in owners})
    whole = agree(f"reading {src.path}", lambda: [crc_range(src.path, *r) if rank() == 0 else 0 for r in rest])
    got.update(zip([off for off, _ in rest], _combine(whole, xor=True)))
    bad = sorted(mapping[k] for k in keys if got[src.records[mapping[k]][0]] != src.records[mapping[k]][2])
    if bad:
        raise CheckpointError(f"{src.path}: the bytes of {bad[:4]} fail their zip CRC-32 check: the file is corrupt"
                              " (a flipped bit, a bad copy or download); download it again")
    return len(got)


def config_name(cfg):
    """The name of a DiTConfig in CONFIGS ("" for an unnamed one)."""
    return next((name for name, c in CONFIGS.items() if c == cfg), "")


def lora_only_note(path, meta):
    """What to do with a LoRA-only step directory (adapters and buffers, no base), each a command that works."""
    run = meta["extra"].get("config") if isinstance(meta["extra"], dict) else None
    run = run if isinstance(run, dict) else {}  # train.py records its flags here
    flags = (f"--config {run.get('config', 'C')} {path} --lora-rank {run.get('lora', 'R')} --init "
             f"{run.get('init', 'BASE')}")
    return (f"{path} is a LoRA-only step directory (meta.json lora_only): LoRA adapters and buffers, not the base. "
            f"Sample it with `python sample.py --ckpt {path}` (its run rebuilt: base + adapters), export the whole "
            f"network with `python export.py {path} merged.safetensors --merge-lora`, continue its run with "
            f"train.py --out {os.path.dirname(os.path.abspath(path))}, check it with `python ckpt.py check {flags}`; "
            "in Python: engine/runs.build_from_step")


def adapters_only_note(path, src, report):
    """One line for a file of LoRA adapters without their base (export.py of a LoRA run, no --merge-lora)
    loaded where the whole network goes, else "": the merge that makes it whole, or the run to pass instead."""
    adapters = [k for k in src.entries if re.search(LORA_KEYS, k)]
    if src.kind == "dcp" or not adapters or not report.missing:
        return ""
    step = (src.info or {}).get("source")  # export.py records the step directory it read
    run = os.path.dirname(os.path.normpath(step)) if step else "RUN"
    return (f"{path}: adapters only (a LoRA export: {len(adapters)} LoRA tensors and buffers, none of the "
            f"{len(report.missing)} base weights the network needs): merge it with `python export.py "
            f"{step or 'RUN'} merged.safetensors --merge-lora`, or pass the run directory ({run}) in its place")


def load(model, source, ema=None, allow_missing=(), verbose=True, threads=8):
    """Strictly load a checkpoint into a plain or FSDP2-sharded model, in place. Returns the LoadReport.

    source: anything resolve_source accepts (named init, hf://, .pt, .safetensors, index json, DCP step dir).
    ema: which weights: a release file's net_ema. (True) or net. (False) copy, None = the only one present; a DCP
    step dir's saved EMA (True: ema.* where it has them, model.* for the rest) or its raw weights (False/None).
    allow_missing: regexes of model keys the file may lack (e.g. LORA_KEYS); those keep their init_weights values.
    Every rank reads its own rows (mmap / pread, no broadcast, no full copy per rank); all ranks raise together.
    """
    t0 = time.time()

    def prepare():
        check_init_config(source, getattr(model, "cfg", None))
        path = resolve_source(source)
        if any(v.is_meta for v in model.state_dict().values()):
            raise CheckpointError("the model is on the meta device: call to_empty() and init_weights() first")
        src = open_source(path)
        report, mapping = build_report(model_entries(model), src.entries, path, ema, allow_missing,
                                       weight_prefixes(src, ema))
        report.model_config = config_name(getattr(model, "cfg", None))
        if not report.ok:
            lora = "\n" + lora_only_note(path, src.meta) if src.meta and src.meta["lora_only"] else ""
            raise CheckpointError(adapters_only_note(path, src, report) or report.details() + lora)
        return src, report, mapping, identity(path)
    src, report, mapping, ident = agree(f"checking {source}", prepare)
    _same_file_everywhere(source, src.path, ident)
    owners = {}  # .pt: record -> the first key whose rows tile it
    for k in sorted(mapping):
        if src.kind == "pt" and src.records[mapping[k]][3]:
            owners.setdefault(src.records[mapping[k]][0], k)
    sums = agree(f"loading {src.path}", lambda: _copy_into(model, src, mapping, threads, set(owners.values())))
    agree(f"verifying {src.path}", lambda: _verify(model, sums))
    keys = sorted(sums)
    file_sums = _combine([sums[k][0] for k in keys])
    if src.kind == "pt":
        n = _check_crcs(src, mapping, keys, _combine([sums[k][2] for k in keys], xor=True), set(owners.values()))
        integrity = f"{n} zip records match their CRC-32"
    elif src.meta and "checksums" in src.meta:
        check_sums(src.path, {mapping[k]: s for k, s in zip(keys, file_sums)}, src.meta["checksums"])
        integrity = f"{len(keys)} tensors match the checksums recorded at save"
    else:
        integrity = "no checksums recorded in this format: not checked against a record"
    checksum = sum((i + 1) * s for i, s in enumerate(file_sums)) % 2 ** 64
    numel = sum(math.prod(src.entries[mapping[k]][0]) for k in keys)
    nbytes = sum(math.prod(src.entries[mapping[k]][0]) * src.entries[mapping[k]][1].itemsize for k in keys)
    dt = time.time() - t0
    if verbose:
        say(f"ckpt: loaded {len(keys)} tensors, {numel:,} values, {nbytes / 1e9:.2f} GB from {src.path} in {dt:.1f}s"
             f" ({nbytes / 1e9 / max(dt, 1e-9):.2f} GB/s); " + report.summary())
        say(f"ckpt: verified on {world_size()} rank(s), all reading {ident}: every local shard holds exactly the"
             f" file's bits, all finite; {integrity}; checksum {checksum:016x}")
    report.checksum = checksum
    return report


# -----------------------------------------------------------------------------
# CLI: check


def check(config, source, ema=None, lora_rank=0, dtype=None, allow_missing=(), init="", verify=True):
    """The strict report of SOURCE against a model config, built on the meta device (no weights in memory), then its
    bytes checked against the file's own record (--no-verify: skip). A LoRA-only step directory holds adapters only:
    it is checked with --lora-rank, and the base it was trained from with --init. Exit 0 only if it would load."""
    with torch.device("meta"):
        net = DiT(get_config(config))
    check_init_config(source, net.cfg)
    if dtype is not None:
        net = net.to(dtype)
    if lora_rank:
        add_lora(net, lora_rank)
    src, ok = open_source(resolve_source(source)), True
    entries, lora_only = model_entries(net), bool(src.meta and src.meta["lora_only"])
    if lora_only:
        ranks = sorted({s[0] for k, (s, _) in src.entries.items() if k.endswith(".lora_a.weight") and s})
        run = src.meta["extra"].get("config", {}) if isinstance(src.meta["extra"], dict) else {}
        run = run if isinstance(run, dict) else {}  # train.py records its flags here
        if not lora_rank or not init:
            raise CheckpointError(f"{src.path} is a LoRA-only step directory (meta.json lora_only): it holds LoRA"
                                  f" adapters (rank {ranks}) and buffers, not the base weights. Check both with `python"
                                  f" ckpt.py check --config {config} {source} --lora-rank {ranks[0] if ranks else 'R'}"
                                  f" --init {run.get('init', 'BASE')}` (--init: the base it was trained from, as"
                                  " train.py --init; random: its seeded init, no file)")
        if init == "random":  # train.py --init random: the base is the run's seeded init_weights, no file
            if run.get("init", "random") != "random":
                raise ValueError(f"--init random: the run of {src.path} was trained from --init {run['init']}: "
                                 f"pass --init {run['init']}")
            print(f"check: base of {src.path}: random init (train.py --init random, seed {run.get('seed', 0)}): "
                  "no file to check; the adapters are checked below", flush=True)
        else:  # --ema picks the step's EMA; the base is checked with the copy the run trained from (--ema-weights)
            ok = check(config, init, {"net": False, "net_ema": True}.get(run.get("ema_weights")), lora_rank, dtype,
                       allow_missing, "", verify)
        frozen = {k for k, p in net.named_parameters() if not p.requires_grad}
        entries = {k: e for k, e in entries.items() if k not in frozen}  # what resume.save(lora_only=True) stores
    elif init:
        raise ValueError(f"--init {init}: only for a LoRA-only step directory (the base it was trained from)")
    if lora_rank and not lora_only:
        allow_missing = (*allow_missing, LORA_KEYS)  # a base checkpoint has no adapters
    report, mapping = build_report(entries, src.entries, src.path, ema, allow_missing, weight_prefixes(src, ema))
    report.model_config = config
    print(report.details(), flush=True)
    if verify and report.ok:
        print(f"check: bytes of {src.path}: {verify_bytes(src, mapping.values())}", flush=True)
    ok = ok and report.ok
    print(f"check: {'OK, would load' if ok else 'FAILED, would not load'} into {config}"
          f"{f' with LoRA rank {lora_rank}' if lora_rank else ''}", flush=True)
    return ok


@dataclass
class Check:
    source: str  # the checkpoint: a named init, hf://ORG/REPO/PATH[@REV], .pt, .safetensors, index json, step dir
    config: str = ""  # the model config to check against (required), e.g. v2w-2b
    ema: str = "auto"  # which weights: auto (the only copy) | net | net_ema (a release's net_ema. copy, a step's EMA)
    lora_rank: int = 0  # check a LoRA model of this rank (adapters may be missing from a base checkpoint)
    init: str = ""  # for a LoRA-only step directory: the base checkpoint it was trained from (train.py --init; random:
    # the run's seeded init, nothing to check)
    dtype: str = "fp32"  # model dtype: fp32 | bf16
    allow_missing: tuple = ()  # regexes of model keys the file may lack, comma-separated
    verify: bool = True  # read the bytes and check them against the file's own record (zip CRCs, step checksums)

    def __post_init__(self):
        if not self.config:
            raise ValueError("ckpt.py check: --config is required (e.g. --config v2w-2b)")
        if self.ema not in ("auto", "net", "net_ema") or self.dtype not in ("fp32", "bf16"):
            raise ValueError(f"ckpt.py check: --ema {self.ema!r} must be auto|net|net_ema, --dtype {self.dtype!r}"
                             " fp32|bf16")


def main(argv=None):
    """`python ckpt.py check ...` -> exit code (0: would load, 1: would not). User errors raise (cli.main)."""
    argv = cli.subcommand(sys.argv[1:] if argv is None else list(argv), "check", __doc__,
                          "python ckpt.py check SOURCE --config NAME (see python ckpt.py check --help)")
    if argv is None:
        return 0
    a = cli.parse(Check, argv, description=inspect.cleandoc(check.__doc__), positional=("source",),
                  prog="ckpt.py check")
    ok = check(a.config, a.source, {"auto": None, "net": False, "net_ema": True}[a.ema], a.lora_rank,
               {"fp32": torch.float32, "bf16": torch.bfloat16}[a.dtype], a.allow_missing, a.init, a.verify)
    return 0 if ok else 1


if __name__ == "__main__":
    cli.main(main, user_errors=(CheckpointError, ValueError, OSError))
