"""Checkpoint files: what they hold and whether their bytes are intact, without loading a tensor.

ckpt.py loads and engine/resume.py saves through this file. Every source is sniffed before it is parsed (a 0-byte file or
an HTML error page saved under a checkpoint's name is named as such), headers are validated as strictly as their
own libraries do, and the bytes can be checked against what the file records about itself: the zip CRC-32 of each
.pt record (torch.load never checks them), and the per-tensor checksums resume.save writes into a step's meta.json.
Contents: errors and sniffing -> tables of contents (safetensors, .pt, DCP + meta.json; killed and cut-short saves) ->
identity -> checksums (bit sums, CRC-32 arithmetic) -> reading rows -> verify_bytes.
"""
import contextlib
import hashlib
import io
import json
import math
import os
import re
import stat
import struct
import warnings
import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: `except Exception` misses it
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

# torch warns at every DCP save and load without a process group, even with no_dist=True, that it is "assuming the
# intent" to work in a single process. Without a group that is the intent (a 1-process train.py, export, sample.py):
# this one message is filtered, around these calls only; every other warning still shows.
SINGLE_PROCESS_WARNING = r"torch\.distributed is (disabled, )?unavailable or uninitialized, assuming the intent"


@contextlib.contextmanager
def dcp_call():
    """Around dcp.save / dcp.load: yields no_dist (True without a process group) and, then, drops torch's warning
    that a single process is meant."""
    no_dist = not (dist.is_available() and dist.is_initialized())
    if not no_dist:
        yield False
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=SINGLE_PROCESS_WARNING, category=UserWarning)
        yield True


class CheckpointError(RuntimeError):
    pass


META_KEYS = ("step", "world_size", "lora_only", "extra")  # what resume.save always writes into meta.json
STEP_RE = re.compile(r"^step_(\d{8})$")  # a training step directory (engine/resume.py writes them)

# -----------------------------------------------------------------------------
# Errors that name the real cause: permissions, empty files, error pages, legacy formats


def denied(path):
    st = os.stat(path)
    return (f"{path}: permission denied (mode {stat.filemode(st.st_mode)}, owner uid {st.st_uid}, this process runs"
            f" as uid {os.geteuid()}): the checkpoint is there but unreadable; fix it with chmod/chown")


def weight_map(path):
    """{key: shard} of a safetensors index json, sorted by shard."""
    try:
        with open(path) as f:
            keys = json.load(f)["weight_map"]
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path}: not a safetensors index (a JSON object with a weight_map): {type(e).__name__}:"
                              f" {e}; truncated, or an error page saved by a failed download") from e
    return dict(sorted(keys.items(), key=lambda kv: kv[1]))


def _sniff(path, kind):
    """Size and magic bytes before any parser, so that a 0-byte file or an HTML/JSON error page saved under a
    checkpoint's name (a gated or failed download) is reported as what it is, not as a parser's complaint."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(64)
    except PermissionError as e:
        raise CheckpointError(denied(path)) from e
    if size == 0:
        raise CheckpointError(f"{path}: empty file (0 bytes): an interrupted or failed download; delete it and"
                              " download it again")
    text = head.lstrip()
    if text[:1] in (b"<", b"{", b"[") and b"\x00" not in head:  # no binary checkpoint starts like printable text
        raise CheckpointError(f"{path}: a {size}-byte text file starting {text[:48]!r}, not a checkpoint: an HTML/JSON"
                              " error page saved by a failed download (gated Cosmos repos need an accepted license"
                              " and HF_TOKEN); delete it and download it again")
    if kind == "pt" and head[:4] != b"PK\x03\x04":
        legacy = head[:1] == b"\x80"  # a pickle protocol opcode: torch.save before the zip format (torch < 1.6)
        raise CheckpointError(f"{path}: " + ("legacy (pre-zip) .pt format: it cannot be memory-mapped or checked;"
                                             " re-save it with torch.save in a current torch" if legacy else
                                             f"not a zip-format .pt (first bytes {head[:8]!r}): truncated or corrupt"))
    return size


# -----------------------------------------------------------------------------
# Tables of contents: key -> (shape, dtype) and where the bytes are, read without touching tensor bytes


_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


@dataclass(kw_only=True)
class Source:
    path: str
    kind: str  # "pt" | "safetensors" | "dcp"
    entries: dict  # file key -> (shape, dtype), or (None, type name) for a non-tensor value
    tensors: dict = None  # .pt: the mmapped tensors
    spans: dict = None  # .safetensors: key -> (file, first byte)
    info: dict = None  # .safetensors: its __metadata__ (export.py records source, step, lora_only)
    records: dict = None  # .pt: key -> (record data offset, record bytes, zip CRC-32, tensor is exactly the record)
    meta: dict = None  # DCP step dir: its meta.json (resume.save), with the save-time "checksums"


def _no_duplicates(pairs):
    seen, dups = set(), set()
    for key, _ in pairs:
        (dups if key in seen else seen).add(key)
    if dups:
        raise CheckpointError(f"header repeats key(s) {sorted(dups)[:3]}: which copy is meant is undefined")
    return dict(pairs)


def _safetensors_table(path, entries, spans):
    """Parse and validate a safetensors header ourselves (we need byte offsets to read only this rank's rows), as
    strictly as the safetensors library: no duplicate keys, tensors exactly tiling the data section in order.
    Returns the header's __metadata__ ({} if none)."""
    size = _sniff(path, "safetensors")
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little") if size >= 8 else -1
        if n < 2 or 8 + n > size:
            raise CheckpointError(f"{path}: truncated or not safetensors ({size} bytes, header length {n})")
        try:
            header = json.loads(f.read(n), object_pairs_hook=_no_duplicates)
        except (ValueError, CheckpointError) as e:
            raise CheckpointError(f"{path}: corrupt safetensors header: {e}") from e
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header: not a JSON object")
    table = []
    for key, info in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype, shape, (lo, hi) = _ST_DTYPES[info["dtype"]], tuple(info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{path}: {key}: invalid header entry {info!r} ({type(e).__name__} {e})") from e
        if not all(isinstance(v, int) and v >= 0 for v in (*shape, lo, hi)) or lo > hi:
            raise CheckpointError(f"{path}: {key}: invalid header entry {info!r} (negative or non-integer)")
        if hi - lo != math.prod(shape) * dtype.itemsize:
            raise CheckpointError(f"{path}: {key} {shape} {dtype} spans {hi - lo} bytes")
        table.append((lo, hi, key, shape, dtype))
    end = 0
    for lo, hi, key, shape, dtype in sorted(table):
        if lo != end:
            raise CheckpointError(f"{path}: {key} starts at data byte {lo}, expected {end}: tensors "
                                  f"{'overlap' if lo < end else 'leave a gap'} (a malformed header); refused")
        entries[key], spans[key], end = (shape, dtype), (path, 8 + n + lo), hi
    if 8 + n + end != size:
        raise CheckpointError(f"{path}: truncated: the header describes {8 + n + end} bytes, the file has {size}")
    info = header.get("__metadata__")
    return info if isinstance(info, dict) else {}


def _pt_records(path, tensors):
    """{key: (record data offset, record bytes, CRC-32, whole)} of a zip-format .pt: torch.load never checks the zip
    CRCs, so the loader does, each rank over the rows it reads anyway. Under mmap every storage is a slice of one
    mapping of the whole file, so storage address minus record data offset is one constant for all of them.
    whole: the tensor is exactly its record's bytes (so the ranks' rows partition the record)."""
    records = []
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        for info in z.infolist():
            if "/data/" not in info.filename:
                continue
            f.seek(info.header_offset)
            head = f.read(30)
            if head[:4] != b"PK\x03\x04" or info.compress_type != zipfile.ZIP_STORED:
                raise CheckpointError(f"{path}: zip record {info.filename} is corrupt or compressed")
            n, m = struct.unpack("<HH", head[26:30])
            records.append((info.header_offset + 30 + n + m, info.file_size, info.CRC))
    meta = [k for k, t in tensors.items() if isinstance(t, torch.Tensor) and t.is_meta]
    if meta:  # torch.save of meta tensors writes their shapes and no bytes
        raise CheckpointError(f"{path}: {len(meta)} of {len(tensors)} tensors (e.g. {meta[0]}) were saved on the meta "
                              "device: shapes without values (a model built on meta and saved before to_empty() and "
                              "its weights were loaded); save the materialised weights")
    storages = {}
    for key, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes():
            storages.setdefault(t.untyped_storage().data_ptr(), []).append(key)
    if not storages:
        return {}
    if not records:
        raise CheckpointError(f"{path}: no tensor records in its zip: not written by torch.save? Re-save it")
    by_offset = {off: (size, crc) for off, size, crc in records}
    base, out = min(storages) - min(records)[0], {}
    for ptr, keys in storages.items():
        size, crc = by_offset.get(ptr - base, (None, None))
        if size != tensors[keys[0]].untyped_storage().nbytes():
            raise CheckpointError(f"{path}: cannot find the zip record holding {keys[0]}, so its CRC cannot be"
                                  " checked: not written by torch.save? Re-save it with torch.save")
        for k in keys:
            t = tensors[k]
            out[k] = (ptr - base, size, crc, t.is_contiguous() and t.storage_offset() == 0 and t.nbytes == size)
    return out


def read_meta(step_dir):
    """A step directory's meta.json (resume.save writes it atomically after DCP finished), checked."""
    path = os.path.join(step_dir, "meta.json")
    try:
        with open(path) as f:
            meta = json.load(f)
    except PermissionError as e:
        raise CheckpointError(denied(path)) from e
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise CheckpointError(f"{path}: truncated or corrupt ({type(e).__name__}: {e}). resume.save writes it"
                              f" atomically, so it was damaged after the save: restore it, or move {step_dir} away"
                              " to resume from the step before") from e
    missing = [k for k in META_KEYS if not isinstance(meta, dict) or k not in meta]
    if missing:
        raise CheckpointError(f"{path}: lacks {missing}: not written by resume.save, or edited")
    return meta


def incomplete_save(path, keys=()):
    """One line for what a killed resume.save left: a step_XXXXXXXX.tmp directory, or the DCP files of a training
    state (keys: its rng.rank* entries) without the meta.json written last; None for anything else."""
    if not os.path.isdir(path) or os.path.exists(os.path.join(path, "meta.json")):
        return None
    name = os.path.basename(os.path.normpath(path))
    if not (name.endswith(".tmp") and STEP_RE.match(name[:-4])) and not any(k.startswith("rng.rank") for k in keys):
        return None
    run = os.path.dirname(os.path.normpath(path)) or "."
    return (f"{path}: an incomplete save (no meta.json"
            f"{'' if os.path.exists(os.path.join(path, '.metadata')) else ', no .metadata'}): a killed save, never "
            f"verified; pass the run directory ({run}) or an intact step of it (step_XXXXXXXX, no .tmp)")


def cut_short(step_dir, md=None):
    """The first file of a DCP directory shorter than its .metadata records, or missing, as one line ("PATH: truncated
    (N of the M bytes its .metadata records)"); None when every file is whole. Sizes only: no tensor is read (DCP
    itself fails on a cut-short file with an empty EOFError)."""
    if md is None:
        md = FileSystemReader(step_dir).read_metadata()
    need = {}
    for item in (md.storage_data or {}).values():
        need[item.relative_path] = max(need.get(item.relative_path, 0), item.offset + item.length)
    for name, size in sorted(need.items()):
        path = os.path.join(step_dir, name)
        if not os.path.isfile(path):
            return f"{path}: missing (its .metadata records {size} bytes there)"
        if os.path.getsize(path) < size:
            return f"{path}: truncated ({os.path.getsize(path)} of the {size} bytes its .metadata records)"
    return None


def open_source(path):
    """Read only the table of contents of a local checkpoint (see resolve_source for the accepted forms)."""
    if os.path.isdir(path):
        try:
            md = FileSystemReader(path).read_metadata()
        except (Exception, CheckpointException) as e:
            raise CheckpointError(f"{path}: unreadable DCP .metadata: {type(e).__name__}: {e}") from e
        killed = incomplete_save(path, md.state_dict_metadata)
        if killed:
            raise CheckpointError(killed)
        short = cut_short(path, md)
        if short:
            raise CheckpointError(f"{short}: the checkpoint {path} is damaged (a copy or a disk cut it short): restore "
                                  "the file, or use an earlier step")
        meta = read_meta(path) if os.path.exists(os.path.join(path, "meta.json")) else None
        return Source(path=path, kind="dcp", meta=meta,
                      entries={k: (tuple(m.size), m.properties.dtype) if isinstance(m, TensorStorageMetadata)
                               else (None, "bytes") for k, m in md.state_dict_metadata.items()})
    if path.endswith(".json"):
        shards = weight_map(path)
        entries, spans = {}, {}
        for shard in dict.fromkeys(shards.values()):
            shard_path = os.path.join(os.path.dirname(path), shard)
            if not os.path.isfile(shard_path):
                raise CheckpointError(f"{path}: shard {shard} is missing")
            _safetensors_table(shard_path, entries, spans)
        wrong = [k for k, s in shards.items() if k not in spans or os.path.basename(spans[k][0]) != s]
        if wrong:
            raise CheckpointError(f"{path}: {len(wrong)} keys are not in the shard the index names, e.g. {wrong[:3]}")
        return Source(path=path, kind="safetensors", entries=entries, spans=spans)
    if path.endswith(".safetensors"):
        entries, spans = {}, {}
        info = _safetensors_table(path, entries, spans)
        return Source(path=path, kind="safetensors", entries=entries, spans=spans, info=info)
    _sniff(path, "pt")
    try:  # weights_only: never unpickle arbitrary objects; mmap: no tensor byte is read until it is copied.
        # Older TransformerEngine saved `_extra_state` as io.BytesIO, which holds bytes only: allowed.
        with torch.serialization.safe_globals([io.BytesIO]):
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:
        raise CheckpointError(f"{path}: cannot be read as a weights-only .pt (truncated, or pickled objects):"
                              f" {type(e).__name__}: {str(e).splitlines()[0]}") from e
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a dict of tensors, got {type(obj).__name__}")
    entries = {k: (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else (None, type(v).__name__)
               for k, v in obj.items()}
    return Source(path=path, kind="pt", entries=entries, tensors=obj, records=_pt_records(path, obj))


# -----------------------------------------------------------------------------
# Identity: every rank must be reading the same bytes


def identity(path):
    """What every rank compares before copying anything. A file: its size and a sha256 of its first and last MiB
    (2 MiB read). An index: the index in full and each shard like a file. A step dir: .metadata and meta.json in
    full (meta.json holds every tensor's checksum) and the sizes of its .distcp files, so that no rank's reads grow
    with the world size. Two revisions, a partial copy or another save differ here; the path does not count."""
    if os.path.isdir(path):
        root, names = path, sorted(os.listdir(path))
        whole = [n for n in names if n in (".metadata", "meta.json")]
        ends, sized = [], [n for n in names if n.endswith(".distcp")]
    elif path.endswith(".json"):
        root = os.path.dirname(path)
        whole, ends, sized = [os.path.basename(path)], list(dict.fromkeys(weight_map(path).values())), []
    else:
        root, whole, ends, sized = os.path.dirname(path), [], [os.path.basename(path)], []
    h, total, files = hashlib.sha256(), 0, whole + ends + sized
    for name in files:
        with open(os.path.join(root, name), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            data = f.read() if name in whole else b"" if name in sized else \
                f.read(1 << 20) + os.pread(f.fileno(), 1 << 20, max(0, size - (1 << 20)))
        h.update(f"{name if len(files) > 1 else ''}:{size}:".encode() + data)
        total += size
    return f"{total} bytes in {len(files)} file(s), sha256 {h.hexdigest()[:16]}"


# -----------------------------------------------------------------------------
# Checksums


def bitsum(t):
    """Order-independent checksum of the raw bits (mod 2^64), summed in the widest word that divides a row, so
    the sums of row shards add up to the full tensor's. Any single flipped bit changes it (not a cryptographic
    hash: swapped words do not). int64 words: ~12 GB/s on one CPU core."""
    if t.numel() == 0:
        return 0
    row = t[0].numel() * t.element_size() if t.dim() else t.element_size()
    word = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}[math.gcd(row, 8)]
    return int(t.detach().contiguous().reshape(-1).view(torch.uint8).view(word).sum(dtype=torch.int64)) % 2 ** 64


def check_sums(path, got, recorded):
    """Compare {key: bitsum} with the {key: hex} a step's meta.json recorded at save; raise naming the keys."""
    unrecorded = sorted(set(got) - set(recorded))
    if unrecorded:
        raise CheckpointError(f"{path}: meta.json records no checksum of {unrecorded[:4]}: edited, or not written by"
                              " resume.save")
    bad = [k for k, s in sorted(got.items()) if int(recorded[k], 16) != s % 2 ** 64]
    if bad:
        raise CheckpointError(f"{path}: {len(bad)} tensor(s) differ from the checksums recorded when this step was"
                              f" saved, e.g. {bad[:4]}: the files changed after the save (bit rot, a bad copy)."
                              " Do not use this step: resume from an older one (move this directory away)")


# CRC-32 of a concatenation from the CRCs of its parts (zlib's crc32_combine, as polynomial arithmetic mod the
# CRC polynomial): crc(A + B) = shift(crc(A), len(B)) ^ crc(B). Each rank shifts the CRC of its rows by the number
# of record bytes after them; the XOR over ranks is the record's CRC.
_POLY = 0xEDB88320


def _multmodp(a, b):
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if a & (m - 1) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


_X2N = [1 << 30]  # x^(2^n) mod p
for _ in range(31):
    _X2N.append(_multmodp(_X2N[-1], _X2N[-1]))


@lru_cache(maxsize=4096)
def _x8n(n):  # x^(8n) mod p
    p, k = 1 << 31, 3
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n, k = n >> 1, k + 1
    return p


def crc_shift(crc, nbytes):
    return _multmodp(_x8n(nbytes), crc) if crc else 0


def tensor_crc(t):
    return zlib.crc32(t.reshape(-1).view(torch.uint8).numpy())  # releases the GIL: reader threads overlap


def crc_range(path, offset, nbytes, chunk=64 << 20):
    crc = 0
    for start in range(offset, offset + nbytes, chunk):
        crc = zlib.crc32(pread(path, start, min(chunk, offset + nbytes - start), False).numpy(), crc)
    return crc


# -----------------------------------------------------------------------------
# Reading bytes: byte ranges, a key's rows, and verifying them against the file's own record


def pread(path, offset, nbytes, pin):
    buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
    view, done = memoryview(buf.numpy()), 0
    with open(path, "rb", buffering=0) as f:
        while done < nbytes:  # preadv releases the GIL: the reader threads overlap their disk reads
            n = os.preadv(f.fileno(), [view[done:]], offset + done)
            if n == 0:
                raise CheckpointError(f"{path}: unexpected end of file at byte {offset + done}")
            done += n
    return buf


def read_rows(src, key, lo, hi, pin):
    """Rows lo:hi (dim 0) of a key of a .pt (from the mmap) or .safetensors (pread), pinned for a GPU if pin."""
    shape, dtype = src.entries[key]
    if src.kind == "pt":
        t = src.tensors[key][lo:hi] if src.tensors[key].dim() else src.tensors[key]
        # for a GPU, fault the mmapped pages in here, in this reader thread (a pageable host-to-device copy would
        # serialise the disk reads inside the driver), then DMA from pinned memory
        return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t) if pin else t
    path, start = src.spans[key]
    row = math.prod(shape[1:]) * dtype.itemsize if shape else dtype.itemsize
    buf = pread(path, start + lo * row, (hi - lo) * row, pin)
    return buf.view(dtype).view((hi - lo, *shape[1:]) if shape else ())


def verify_bytes(src, keys=None, threads=8):
    """Read a source's bytes and check them against what it records about itself: a .pt's zip CRCs (of the records
    holding `keys`, default all), a step dir's save-time checksums (of every tensor they cover). Single process.
    Returns a one-line account; raises CheckpointError naming the tensors that fail."""
    if src.kind == "pt":
        records = sorted({src.records[k][:3] for k in (src.records if keys is None else keys)})
        with ThreadPoolExecutor(max(1, threads)) as pool:
            bad = {off for (off, _, crc), got in zip(records, pool.map(lambda r: crc_range(src.path, *r[:2]),
                                                                        records)) if got != crc}
        names = sorted(k for k, r in src.records.items() if r[0] in bad)
        if bad:
            raise CheckpointError(f"{src.path}: the bytes of {names[:4]} fail their zip CRC-32 check: the file is"
                                  " corrupt (a flipped bit, a bad copy or download); download it again")
        return f"{len(records)} zip records match their CRC-32"
    if not (src.meta and "checksums" in src.meta):
        return "not checked: no checksums recorded (safetensors; a DCP dir without engine/resume.py's meta.json)"
    recorded, got, batch, size = src.meta["checksums"], {}, {}, 0
    absent = [k for k in recorded if src.entries.get(k, (None,))[0] is None]
    if absent:
        raise CheckpointError(f"{src.path}: meta.json has checksums of {absent[:3]}, which .metadata does not hold")
    for i, k in enumerate(sorted(recorded)):  # in ~1 GB batches: a 14B step with optimizer state is ~170 GB
        batch[k] = torch.empty(src.entries[k][0], dtype=src.entries[k][1])
        size += batch[k].nbytes
        if size > 1 << 30 or i == len(recorded) - 1:
            with dcp_call():
                dcp.load(batch, checkpoint_id=src.path, no_dist=True)
            got.update((key, bitsum(t)) for key, t in batch.items())
            batch, size = {}, 0
    check_sums(src.path, got, recorded)
    return f"{len(got)} tensors match the checksums recorded at save"
