"""Training-state checkpoints: save, resume, rotate; the network of a step directory (export: export.py).

Weights are loaded strictly by ckpt.py; this file adds what a training run needs on top: model + optimizer + per-rank
RNG (+ any extra state such as an EMA) in one DCP directory per step, written so that a killed run always finds its
newest complete checkpoint.

Layout: OUT/step_%08d/ (DCP + meta.json), written as step_%08d.tmp and renamed when complete; OUT/latest names the
newest complete one and is written only after the rename; a rotated-out one is renamed step_%08d.deleting first.
Every step's meta.json records a checksum of every tensor saved (formats.bitsum, summed over the ranks' shards);
resume, export, ckpt.load and `ckpt.py check` verify the bytes they read against it, so a flipped bit is an error that
names the tensor. A state with a NaN/Inf is never saved; a full disk is named as such.
Evaluation markers (eval.json: "completed" means completed) decide rotation; the rest of the run directory (its lock,
settings, metrics and plot) is engine/rundir.py's.
Contents: pointer and rotation -> RNG -> save / resume (+ checksums) -> evaluation markers -> the network of a step
directory (sample.py, evaluate.py, export.py).
"""
import errno
import hashlib
import json
import math
import os
import random
import re
import shutil
import time

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._nested_dict import flatten_state_dict  # DCP's own key flattening (private)
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

import ckpt
from base.collectives import agree, gather, local_rows, rank, say, world_size
from base.files import fsync_dir, write_atomic
from base.formats import STEP_RE, bitsum, check_sums, dcp_call, denied, read_meta
from ckpt import CheckpointError, build_report, model_entries, open_source

# Top-level DCP keys of a training checkpoint; extra_state groups take any other plain name
TRAINING_KEYS = ("model", "optim", "rng")
DELETING = ".deleting"  # rotate(): a step directory being deleted
KEEP_MARKER = "keep.json"  # a step directory holding it is never rotated out (keep_checkpoint)

# -----------------------------------------------------------------------------
# The latest pointer, complete checkpoints, rotation


def commit_latest(out_dir, name):
    write_atomic(os.path.join(out_dir, "latest"), name + "\n")


def complete_checkpoints(out_dir):
    """[(step, path)] of complete checkpoints (final name + .metadata + meta.json), oldest first."""
    found = []
    if os.path.isdir(out_dir) and not os.access(out_dir, os.R_OK | os.X_OK):
        raise CheckpointError(denied(out_dir))
    for name in os.listdir(out_dir) if os.path.isdir(out_dir) else []:
        m, path = STEP_RE.match(name), os.path.join(out_dir, name)
        if m and not os.access(path, os.R_OK | os.X_OK):  # unreadable looks incomplete: say what it really is
            raise CheckpointError(denied(path))
        if m and os.path.isfile(f"{path}/.metadata") and os.path.isfile(f"{path}/meta.json"):
            found.append((int(m.group(1)), path))
    return sorted(found)


def find_resume(out_dir):
    """Newest complete checkpoint, or None. A `latest` that is malformed or names a missing/incomplete directory
    is an error (our saves never produce one); a `latest` older than the newest complete one means a crash between
    the rename and the pointer update, and is reported."""
    done = complete_checkpoints(out_dir)
    pointer = os.path.join(out_dir, "latest")
    if os.path.exists(pointer):
        with open(pointer) as f:
            name = f.read().strip()
        if not STEP_RE.match(name):
            raise CheckpointError(f"{pointer}: holds {name[:40]!r}, not a step_XXXXXXXX name")
        if os.path.join(out_dir, name) not in [p for _, p in done]:
            raise CheckpointError(f"{pointer} names {name}, which is missing or incomplete; complete checkpoints:"
                                  f" {[os.path.basename(p) for _, p in done]}. Fix or remove the pointer.")
        if os.path.join(out_dir, name) != done[-1][1]:
            print(f"ckpt: {pointer} names {name} but {os.path.basename(done[-1][1])} is complete and newer"
                  " (crash before the pointer update): resuming from the newer one", flush=True)
    return done[-1][1] if done else None


def finite_and_evaluated_well(path):
    """Known good: meta.json says finite, and eval.json holds finite values (unknown counts as not good)."""
    try:
        if read_meta(path).get("finite") is not True:
            return False
    except CheckpointError:
        return False
    result = read_eval_marker(path)  # eval_loss (SFT) or eval_reward* (RL): every value finite
    return result is not None and all(math.isfinite(v) for v in result.values() if isinstance(v, (int, float)))


def rotate(out_dir, keep):
    """Delete complete checkpoints beyond the newest `keep`, never the `latest` target nor the newest known-good one
    (a diverged run keeps its last good checkpoint). Only save() calls this, after its own save completed; saves are
    synchronous, so a step_*.tmp older than the newest complete step is a killed run's (deleted), a newer one could
    be in flight (kept)."""
    if keep < 2:
        raise CheckpointError(f"keep={keep}: at least 2 checkpoints must be kept")
    done = complete_checkpoints(out_dir)
    protect = {p for _, p in done[-keep:]}
    protect.update([p for _, p in done if finite_and_evaluated_well(p)][-1:])
    protect.update(p for _, p in done if os.path.isfile(os.path.join(p, KEEP_MARKER)))  # named to the user: kept
    pointer = os.path.join(out_dir, "latest")
    if os.path.exists(pointer):
        with open(pointer) as f:
            protect.add(os.path.join(out_dir, f.read().strip()))
    delete_checkpoints([p for _, p in done if p not in protect] + leftovers(out_dir, done, tmp=True))


def keep_checkpoint(path, why):
    """Mark a complete step directory as never rotated out (a KEEP_MARKER file saying why): RL's fidelity guard
    names the newest checkpoint within its bound, which `--keep` would otherwise delete as the run goes on."""
    write_atomic(os.path.join(path, KEEP_MARKER), json.dumps({"why": why}) + "\n")


def leftovers(out_dir, done, tmp=False):
    """What killed runs left besides the complete checkpoints `done`: step_*.deleting, incomplete step_* dirs older than
    the newest complete one (half-deleted before .deleting existed) and, with tmp, older step_*.tmp (killed saves)."""
    newest, complete, found = done[-1][0] if done else -1, {p for _, p in done}, []
    for name in os.listdir(out_dir):
        m, path = STEP_RE.match(name.removesuffix(".tmp").removesuffix(DELETING)), os.path.join(out_dir, name)
        if not m or path in complete:
            continue
        older = int(m.group(1)) < newest
        if name.endswith(DELETING) or (older and name == m.group(0)) or (tmp and older and name.endswith(".tmp")):
            found.append(path)
    return found


def delete_checkpoints(paths):
    """A step dir is renamed step_*.deleting before its files go: a kill mid-delete leaves no half checkpoint."""
    for path in paths:
        try:
            if STEP_RE.match(os.path.basename(path)):
                os.rename(path, path + DELETING)  # atomic: gone from complete_checkpoints before a byte is deleted
                path += DELETING
            shutil.rmtree(path)
        except OSError as e:  # a failed delete costs disk space, not the run: say so and continue
            print(f"ckpt: WARNING: could not delete old checkpoint {path}: {e}", flush=True)


# -----------------------------------------------------------------------------
# RNG state


def _rng_state():
    """This rank's RNG states as tensors (saved under rng.rank{r}: DCP keeps one value per shared key)."""
    _, keys, pos, has_gauss, cached = np.random.get_state()
    version, py_state, gauss = random.getstate()
    state = {"torch": torch.get_rng_state(), "numpy": torch.from_numpy(keys.astype(np.int64)),
             "numpy_extra": torch.tensor([pos, has_gauss, cached], dtype=torch.float64),
             "python": torch.tensor([version, *py_state], dtype=torch.int64),
             "python_gauss": torch.tensor([math.nan if gauss is None else gauss], dtype=torch.float64)}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state):
    torch.set_rng_state(state["torch"])
    pos, has_gauss, cached = state["numpy_extra"].tolist()
    np.random.set_state(("MT19937", state["numpy"].numpy().astype(np.uint32), int(pos), int(has_gauss), cached))
    py = state["python"].tolist()
    gauss = state["python_gauss"].item()
    random.setstate((py[0], tuple(py[1:]), None if math.isnan(gauss) else gauss))
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])


# -----------------------------------------------------------------------------
# Save and resume (collective)


def _check_extra_state(extra_state):
    """{name: {key: tensor}}; a name becomes the DCP prefix of its tensors, so it must not be one of ours."""
    for name, tensors in (extra_state or {}).items():
        if not re.fullmatch(r"[A-Za-z_]\w*", name) or name in TRAINING_KEYS:
            raise CheckpointError(f"extra_state name {name!r}: a plain name other than {TRAINING_KEYS}")
        if not isinstance(tensors, dict) or not all(isinstance(t, torch.Tensor) for t in tensors.values()):
            raise CheckpointError(f"extra_state[{name!r}] must be a dict of tensors")
    return extra_state or {}


def state_checksums(state, saved=None):
    """Collective: {DCP key: formats.bitsum} of every tensor of a nested state dict, the same on every rank. A
    sharded tensor's rows are summed once each over the ranks; a plain tensor must be equal on every rank that holds
    it (DCP stores one of the copies, whichever). saved ({key: (shape, dtype)}, on resume): tensors that DCP read
    into another dtype than was saved are left out."""
    flat, _ = flatten_state_dict(state)  # the keys .metadata will hold

    def local():
        out = {}
        for k, v in flat.items():
            if not isinstance(v, torch.Tensor) or (saved is not None and v.dtype != saved[k][1]):
                continue
            if isinstance(v, DTensor):
                part, _, _, counts = local_rows(v)
                out[k] = ("rows", bitsum(part) if counts else 0)
            else:
                out[k] = ("whole", bitsum(v))
        return out
    sums = {}
    for theirs in gather(agree("checksumming the state", local)):
        for key, (kind, s) in theirs.items():
            if kind == "rows":
                sums[key] = (sums.get(key, 0) + s) % 2 ** 64
            elif sums.setdefault(key, s) != s:
                raise CheckpointError(f"{key}: a plain (unsharded) tensor differs between ranks, and DCP keeps one"
                                      " copy, whichever: make it equal on every rank, or shard it")
    return sums


def _verify_read(path, state, meta, entries):
    """Collective: what DCP just read must match the checksums save recorded (bit rot, a bad copy, an edit)."""
    if "checksums" not in meta:
        say(f"ckpt: WARNING: {path}/meta.json records no checksums (saved before they existed): bytes not verified")
        return "bytes NOT verified (no checksums recorded)"
    sums = state_checksums(state, entries)
    check_sums(path, sums, meta["checksums"])
    other = [k for k, v in flatten_state_dict(state)[0].items() if torch.is_tensor(v) and v.dtype != entries[k][1]]
    return f"{len(sums)} tensors match the checksums recorded at save" + (
        f"; {len(other)} read into another dtype, not compared" if other else "")


def nonfinite_tensors(state):
    """Collective: the sorted DCP keys of a state's float tensors with NaN/Inf on any rank (RNG aside: Python's holds
    a NaN by design)."""
    flat, _ = flatten_state_dict(state)
    keys = [k for k, v in flat.items() if torch.is_tensor(v) and v.is_floating_point() and not k.startswith("rng.")]
    local = [flat[k].to_local() if isinstance(flat[k], DTensor) else flat[k] for k in keys]
    bad = [k for k, t in zip(keys, local) if not bool(torch.isfinite(t).all())]  # (Adam's step may be on the CPU)
    return sorted({k for theirs in gather(bad) for k in theirs})


def no_space(err):
    """The ENOSPC / EDQUOT OSError in err, its causes or (DCP) its ranks' failures, or None."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return err
        if isinstance(err, CheckpointException):
            return next(filter(None, (no_space(e) for e, _ in err.failures.values())), None)
        err = err.__cause__ or err.__context__
    return None


def disk_full_named(tmp, write):
    """write(), a full disk (or quota) named as such, not as a DCP error; the partial tmp goes (its space back)."""
    try:
        return write()
    except (Exception, CheckpointException) as e:
        full = no_space(e)
        if full is None:
            raise
        free = shutil.disk_usage(os.path.dirname(tmp) or ".").free
        if rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"{os.strerror(full.errno).lower()}: writing {tmp} ({free / 2 ** 30:.2f} GiB free "
                              "there): nothing was committed, the earlier checkpoints and `latest` are intact; free "
                              "space (or lower --keep) and resume") from e


def save(out_dir, step, model, optimizer=None, extra=None, keep=3, lora_only=False, extra_state=None):
    """Collective: write OUT/step_%08d (model, optimizer, this rank's RNG; `extra` -> meta.json), then point
    OUT/latest at it and rotate. extra must be JSON-serialisable (step, data position, LR schedule state, config).
    lora_only: store only trainable parameters (the frozen base comes from the init checkpoint on resume).
    extra_state: {name: {key: tensor}} stored as `name.key` beside the model (e.g. {"ema": {fqn: tensor}}, sharded
    like the parameters); resume must be given the same names and keys."""
    if keep < 2:
        raise CheckpointError(f"keep={keep}: at least 2 checkpoints must be kept (the newest may be mid-write)")
    extra_state = _check_extra_state(extra_state)
    meta = {"step": step, "world_size": world_size(), "lora_only": lora_only, "time": time.time(),
            "torch": torch.__version__, "extra": extra or {}}
    try:
        json.dumps(meta)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"save(step={step}): extra must be JSON-serialisable: {e}") from e
    name = f"step_{step:08d}"
    final, tmp = os.path.join(out_dir, name), os.path.join(out_dir, name + ".tmp")

    def prepare():
        if os.path.exists(final):
            raise CheckpointError(f"{final} already exists; refusing to overwrite a complete checkpoint")
        if rank() == 0:
            if os.path.exists(tmp):
                print(f"ckpt: removing {tmp}, left by a killed save", flush=True)
                shutil.rmtree(tmp)
            os.makedirs(tmp)
    options = StateDictOptions(ignore_frozen_params=lora_only)
    state = {"model": get_model_state_dict(model, options=options), f"rng.rank{rank()}": _rng_state()}
    if optimizer is not None:
        state["optim"] = get_optimizer_state_dict(model, optimizer, options=options)
    state.update((group, dict(tensors)) for group, tensors in extra_state.items())
    bad = nonfinite_tensors(state)  # before anything is written
    if bad:
        raise CheckpointError(f"step {step}: not saved: {len(bad)} tensor(s) hold NaN/Inf (first: {bad[0]}): the run "
                              f"diverged; {out_dir}'s checkpoints are untouched (resume from the newest with a lower "
                              "learning rate)")
    meta["finite"] = True  # rotate() keeps the newest known-good checkpoint
    agree(f"saving {final}", prepare)
    meta["checksums"] = {k: f"{s:016x}" for k, s in sorted(state_checksums(state).items())}
    with dcp_call() as no_dist:
        agree(f"writing {tmp}", lambda: disk_full_named(tmp, lambda: dcp.save(state, checkpoint_id=tmp,
                                                                              no_dist=no_dist)))

    def finish():
        if rank() != 0:
            return
        if not os.path.isfile(f"{tmp}/.metadata"):
            raise CheckpointError(f"{tmp}: DCP returned without writing .metadata")
        disk_full_named(tmp, lambda: write_atomic(f"{tmp}/meta.json", json.dumps(meta, indent=1)))
        os.rename(tmp, final)  # the directory appears under its final name only when complete
        fsync_dir(out_dir)
        commit_latest(out_dir, name)
        rotate(out_dir, keep)
    agree(f"committing {final}", finish)
    groups = "".join(f", {group} x{len(tensors)}" for group, tensors in extra_state.items())
    say(f"ckpt: saved {final} ({'trainable only, ' if lora_only else ''}{len(state['model'])} model tensors{groups})")
    return final


def resume(out_dir, model, optimizer=None, restore_rng=True, extra_state=None):
    """Collective: load the newest complete checkpoint in out_dir into model/optimizer (and this rank's RNG if the
    world size is unchanged). Returns the saved `extra` dict plus 'step', or None if out_dir holds no checkpoint.
    For a lora_only checkpoint, load the frozen base first (ckpt.load(model, init, allow_missing=(LORA_KEYS,))).
    extra_state: the tensors save() was given, restored in place; the checkpoint must hold exactly these names and
    keys (an extra state saved but not asked for, or asked for but not saved, is an error)."""
    extra_state = _check_extra_state(extra_state)
    path = agree(f"finding a checkpoint in {out_dir}", lambda: find_resume(out_dir) if rank() == 0 else None,
                 share=True)
    if path is None:
        say(f"ckpt: no complete checkpoint in {out_dir}")
        return None

    def check():
        meta = read_meta(path)
        options = StateDictOptions(ignore_frozen_params=meta["lora_only"])
        msd = get_model_state_dict(model, options=options)
        ours = {k: v for k, v in model_entries(model).items() if k in msd}
        entries = open_source(path).entries
        report, _ = build_report(ours, entries, path, prefix="model")
        if not report.ok:
            raise CheckpointError(report.details())
        saved = sorted({k.split(".", 1)[0] for k in entries} - set(TRAINING_KEYS))
        if saved != sorted(extra_state):
            raise CheckpointError(f"{path} holds extra state {saved}, the caller restores {sorted(extra_state)}"
                                  " (train.py: resume with the --ema of the saved run)")
        for group, tensors in extra_state.items():  # trainable=True: exact dtypes, no narrowing
            report, _ = build_report({k: (tuple(t.shape), t.dtype, True) for k, t in tensors.items()}, entries,
                                     f"{path} ({group})", prefix=group)
            if not report.ok:
                raise CheckpointError(report.details())
        return meta, options, msd, entries
    meta, options, msd, entries = agree(f"checking {path}", check)
    state = {"model": msd}
    if optimizer is not None:
        state["optim"] = get_optimizer_state_dict(model, optimizer, options=options)
    state.update((group, dict(tensors)) for group, tensors in extra_state.items())  # DCP loads into these tensors
    same_world = meta["world_size"] == world_size()
    if restore_rng and same_world:
        state[f"rng.rank{rank()}"] = _rng_state()
    with dcp_call() as no_dist:
        agree(f"reading {path}", lambda: dcp.load(state, checkpoint_id=path, no_dist=no_dist))
    verified = _verify_read(path, state, meta, entries)

    def apply():
        result = set_model_state_dict(model, state["model"], options=StateDictOptions(
            ignore_frozen_params=options.ignore_frozen_params, strict=not options.ignore_frozen_params))
        trainable = {k for k, p in model.named_parameters() if p.requires_grad}
        if result.unexpected_keys or set(result.missing_keys) & trainable:  # frozen base: from the init file
            raise CheckpointError(f"{path}: model keys not restored: {result}")
        if optimizer is not None:
            set_optimizer_state_dict(model, optimizer, state["optim"], options=options)
        if restore_rng and same_world:
            _set_rng_state(state[f"rng.rank{rank()}"])
    agree(f"restoring {path}", apply)
    rng = "restored" if restore_rng and same_world else f"not restored (saved with world size {meta['world_size']})"
    groups = "".join(f", {group} x{len(tensors)}" for group, tensors in extra_state.items())
    say(f"ckpt: resumed {path}: step {meta['step']}, {len(msd)} model tensors"
        f"{', optimizer' if optimizer is not None else ''}{groups}, RNG {rng}; {verified}")
    return dict(meta["extra"], step=meta["step"])


# -----------------------------------------------------------------------------
# Evaluation markers: a checkpoint counts as evaluated only once its eval.json is complete (rotation reads them)


EVAL_MARKER = "eval.json"


def eval_marker_valid(step_dir):
    """A checkpoint counts as evaluated only if its marker exists, parses, and its checksum matches its contents; a
    partial or tampered marker is reported and the checkpoint evaluated again."""
    return read_eval_marker(step_dir, report=True) is not None


def read_eval_marker(step_dir, report=False):
    """A valid marker's result (eval_marker_valid), else None; report: say so for a partial one."""
    path = os.path.join(step_dir, EVAL_MARKER)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            marker = json.load(f)
    except json.JSONDecodeError as e:
        if report:
            print(f"eval: {path} is partial ({e}): evaluating again", flush=True)
        return None
    body = json.dumps(marker.get("result"), sort_keys=True)
    valid = marker.get("status") == "completed" and marker.get("sha256") == hashlib.sha256(body.encode()).hexdigest()
    return marker["result"] if valid else None


def write_eval_marker(step_dir, result):
    """Written last, atomically, and only once the evaluation finished: "completed" means completed."""
    body = json.dumps(result, sort_keys=True)
    write_atomic(os.path.join(step_dir, EVAL_MARKER), json.dumps(
        {"status": "completed", "result": result, "sha256": hashlib.sha256(body.encode()).hexdigest()}, indent=1))


# -----------------------------------------------------------------------------
# A LoRA step's base (sample.py and evaluate.py check the step they read: rundir.checked_step)


def lora_base(step_dir, meta=None):
    """A LoRA-only step's base (its run's --init) checked to be there: adapters are of no use without the exact
    weights they were trained on. A named or hf:// base is resolved when it is loaded."""
    meta = meta or read_meta(step_dir)
    run = meta["extra"].get("config") if isinstance(meta["extra"], dict) else None
    init = run.get("init", "random") if isinstance(run, dict) and meta["lora_only"] else "random"
    if init == "random" or init in ckpt.NAMED_INITS or init.startswith("hf://") or os.path.exists(init):
        return
    where = "" if os.path.isabs(init) else ", or run from the folder train.py ran in (the path is relative to it)"
    raise CheckpointError(f"{step_dir} holds LoRA adapters only, and {init}, the run's recorded LoRA base (`init` in "
                          f"its config.json), is gone: the adapters cannot be used without it; restore it at that "
                          f"path{where}")


# -----------------------------------------------------------------------------
# The network of a step directory, as train.py built it (sample.py, evaluate.py, export.py)


