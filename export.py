"""Export a train.py checkpoint: a step directory (DCP) -> one .safetensors with our keys, or a release-style .pt
(`net.` keys, bf16) that upstream Cosmos tools read. Single process, offline; every tensor checked against its
save-time checksum.

    python export.py OUT/step_00001000 model.safetensors     # our keys (--dtype bf16|fp32)
    python export.py OUT/step_00001000 release.pt --ema      # net. prefix, bf16; --ema adds upstream's net_ema. copy
    python export.py runs/tiny-grpo merged.pt --merge-lora   # a LoRA run: adapters folded into its --init base
"""
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from base import cli
from base.formats import CheckpointError, bitsum, check_sums, cut_short, dcp_call, read_meta
from engine.resume import find_resume
from engine.runs import build_from_step
from nets.lora import merged_state_dict


def _export_source(src, out_path):
    """(step dir, its meta) of an export: src itself or an out_dir's newest; out_path's directory must exist."""
    parent = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(parent):
        raise CheckpointError(f"{out_path}: its directory {parent} does not exist; create it (mkdir -p {parent})")
    path = src if os.path.isfile(os.path.join(src, ".metadata")) else find_resume(src)
    if path is None:
        raise CheckpointError(f"{src}: no complete checkpoint to export")
    short = cut_short(path)
    if short:  # DCP would fail on it with an empty EOFError
        raise CheckpointError(f"{short}: {path} is damaged (a copy or a full disk cut it short): restore the file, or "
                              "export an earlier step")
    return path, read_meta(path)


def _read_dcp(src, out_path, groups=("model",)):
    """({group: {key: full tensor}}, meta, path) of a step dir (or an out_dir's newest), checked against its
    save-time checksums; optimizer state is never read. A group with no tensors in the checkpoint is an error.
    out_path's directory must exist (checked first, before reading gigabytes)."""
    path, meta = _export_source(src, out_path)
    md = FileSystemReader(path).read_metadata().state_dict_metadata
    full = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in md.items()
            if k.split(".", 1)[0] in groups and isinstance(m, TensorStorageMetadata)}
    absent = [g for g in groups if not any(k.startswith(g + ".") for k in full)]
    if absent == ["ema"]:
        raise CheckpointError(f"--ema: {path} holds no EMA (its run was trained without train.py --ema RATE): export "
                              "it without --ema")
    if absent:
        raise CheckpointError(f"{path}: holds no {absent} tensors (saved without extra_state={{{absent[0]!r}: ...}}?)")
    with dcp_call():
        dcp.load(full, checkpoint_id=path, no_dist=True)
    if "checksums" not in meta:
        print(f"ckpt: WARNING: {path}/meta.json records no checksums (saved before they existed): not verified")
    else:
        check_sums(path, {k: bitsum(v) for k, v in full.items()}, meta["checksums"])
    return {g: {k[len(g) + 1:]: v for k, v in full.items() if k.startswith(g + ".")} for g in groups}, meta, path


def _export_tensors(src, out_path, groups, merge_lora):
    """({group: {key: tensor}}, meta, path) for an export: the step's own tensors, or with merge_lora the network of a
    LoRA run rebuilt (base + adapters, build_from_step) with its adapters folded in (group "ema": the EMA's)."""
    if not merge_lora:
        return _read_dcp(src, out_path, groups)
    path, meta = _export_source(src, out_path)
    if not meta["lora_only"]:
        raise CheckpointError(f"--merge-lora: {path} is not a LoRA-only step (it holds the whole network): drop "
                              "--merge-lora")
    return {g: merged_state_dict(build_from_step(path, torch.device("cpu"), g == "ema")) for g in groups}, meta, path


def export_safetensors(src, out_path, dtype=None, merge_lora=False):
    """DCP step dir (or out_dir: newest) -> one .safetensors with our keys; float tensors cast to dtype if given.
    A LoRA-only step exports its adapters and buffers, or with merge_lora the whole network, adapters folded in."""
    from safetensors.torch import save_file
    groups, meta, path = _export_tensors(src, out_path, ("model",), merge_lora)
    tensors = groups["model"]
    if dtype is not None:
        tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}
    tmp = out_path + ".tmp"
    lora_only = meta["lora_only"] and not merge_lora
    save_file({k: v.contiguous() for k, v in tensors.items()}, tmp,
              metadata={"source": path, "step": str(meta["step"]), "lora_only": str(lora_only),
                        "merged_lora": str(merge_lora)})
    os.replace(tmp, out_path)
    what = (": LoRA adapters and buffers only (a LoRA-only step; its base is the run's --init); --merge-lora writes "
            "the whole network, adapters folded into the plain keys" if lora_only else
            ": the whole network, LoRA adapters folded into the base weights" if merge_lora else "")
    print(f"ckpt: exported {len(tensors)} tensors of {path} to {out_path}{what}", flush=True)
    return out_path


def export_release_pt(src, out_path, ema=False, merge_lora=False):
    """DCP -> a release-style .pt (flat dict, `net.` keys, floats in bf16) that upstream Cosmos tools read.
    ema=True adds upstream's `net_ema.` copy: the network with the saved EMA (extra_state "ema") in place of the
    parameters it averages; every other tensor (buffers, frozen weights) as in `net.`. A LoRA-only step needs
    merge_lora (the adapters folded into the run's base)."""
    groups, meta, path = _export_tensors(src, out_path, ("model", "ema") if ema else ("model",), merge_lora)
    if meta["lora_only"] and not merge_lora:
        raise CheckpointError(f"{path} is LoRA-only (no base weights): a release .pt needs the full network; pass "
                              "--merge-lora (the adapters folded into the run's --init base)")
    net = groups["model"]
    release = {"net." + k: v for k, v in net.items()}
    if ema:
        unknown = sorted(set(groups["ema"]) - set(net))
        if unknown:
            raise CheckpointError(f"{path}: EMA keys that are not model keys: {unknown[:5]}")
        release.update({"net_ema." + k: groups["ema"].get(k, v) for k, v in net.items()})
    tmp = out_path + ".tmp"
    torch.save({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in release.items()}, tmp)
    os.replace(tmp, out_path)
    print(f"ckpt: exported {len(net)} tensors of {path} to {out_path} (net.{' and net_ema.' if ema else ''}"
          f" prefix, bf16{', LoRA merged' if merge_lora else ''})", flush=True)
    return out_path


# -----------------------------------------------------------------------------
# The command


DTYPES = {"keep": None, "bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass
class Export:
    source: str  # a DCP step directory, or a train.py out dir (its newest complete step)
    out: str  # OUT.safetensors (our keys) or OUT.pt (release-style: net. keys, bf16)
    dtype: str = "keep"  # .safetensors only: keep | bf16 | fp32
    ema: bool = False  # .pt only: add upstream's net_ema. copy, from the run's saved EMA (train.py --ema)
    merge_lora: bool = False  # a LoRA run (GRPO, --lora): the whole network, adapters folded into the run's --init base

    def __post_init__(self):
        if not self.out.endswith((".pt", ".safetensors")):
            raise ValueError(f"export.py: {self.out}: export to OUT.safetensors or OUT.pt")
        if self.dtype not in DTYPES or (self.out.endswith(".pt") and self.dtype != "keep"):
            raise ValueError(f"export.py: --dtype {self.dtype}: keep|bf16|fp32, for .safetensors only (a"
                             " release .pt is always bf16)")
        if self.ema and not self.out.endswith(".pt"):
            raise ValueError("export.py: --ema: only .pt (upstream's net_ema. copy); .safetensors holds"
                             " the raw weights")


def main(argv=None):
    """`python export.py SRC OUT [--ema] [--dtype bf16] [--merge-lora]` -> 0. User errors raise (cli.main)."""
    a = cli.parse(Export, sys.argv[1:] if argv is None else list(argv), description="A step directory (or a run's newest) -> OUT.safetensors with our"
                  " keys, or a release-style OUT.pt that upstream Cosmos tools read.", positional=("source", "out"),
                  prog="export.py")
    if a.out.endswith(".pt"):
        export_release_pt(a.source, a.out, a.ema, a.merge_lora)
    else:
        export_safetensors(a.source, a.out, DTYPES[a.dtype], a.merge_lora)
    return 0


if __name__ == "__main__":
    cli.main(main, user_errors=(CheckpointError, ValueError, OSError))
