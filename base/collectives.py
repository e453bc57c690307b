"""Collectives and sharding: what every rank must agree on, in one place (imports nothing of ours but formats).

Ranks: `rank`, `world_size` (0 and 1 without a process group), `say` (print on rank 0). Agreement: `agree` runs a
function on every rank and raises on all of them together if it failed anywhere (no rank left waiting in a
collective), `gather` is every rank's picklable value; `all_mean`, `any_rank`, `ranks_any` reduce one step's numbers
and flags. Sharding: `shard_model` is train.py's FSDP2 layout (bench.py and rlplan.py follow it), `local_rows` the
dim-0 rows a rank holds of a (DTensor) model tensor. Context parallelism (base/cp.py's mesh: a cp group is cp consecutive
ranks): `dp_coords`, `gather_groups` (one copy of each cp group's tensor) and `sum_groups` (a sum over dp groups).
Not named dist: every file aliases torch.distributed as `dist`.
"""
import math
import os

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: `except Exception` misses it
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard

from base.formats import CheckpointError

# -----------------------------------------------------------------------------
# Ranks agree on every outcome (ckpt.py's and engine/resume.py's loading and saving, train.py's settings)


def rank():
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size():
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def comm_device():
    """Where a collective's tensors must live: the rank's GPU under NCCL, the CPU under gloo."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"


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


def gather(value):
    """Every rank's (picklable) value, on every rank."""
    if world_size() == 1:
        return [value]
    out = [None] * world_size()
    dist.all_gather_object(out, value)
    return out


def all_mean(value, device):
    t = torch.tensor([float(value)], dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t)
        t /= dist.get_world_size()
    return t.item()


def any_rank(flag, device):
    return ranks_any([flag], device)[0]


def ranks_any(flags, device):
    """[bool]: for each flag, whether it is set on any rank (one collective)."""
    t = torch.tensor([int(f) for f in flags], device=device)
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [bool(v) for v in t.tolist()]


# -----------------------------------------------------------------------------
# Sharding: FSDP2 per block, then the final layer, then the root (torchtitan's order); the rows a rank holds


def shard_model(net, device, cp=1, ignored=None):
    """FSDP2 over all ranks. With --cp C the mesh is the flattened dp x cp (torchtitan's dp_shard_cp: memory per rank
    falls with C too), and gradients are summed over the C ranks of a sample and averaged over the dp samples only.
    `ignored` parameters stay whole on every rank (--fp8: the frozen base, replaced by fp8 buffers after loading)."""
    world = dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp",) if cp == 1 else ("dp_cp",))
    # fp32 master weights, bf16 compute on GPUs, fp32 gradient reduction. cast_forward_inputs=False: the fp32 diffusion
    # time must not be rounded to bf16 on its way into a block (t = 0.9995 would arrive as 1.0).
    compute = torch.bfloat16 if device.type == "cuda" else torch.float32
    mp = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32, cast_forward_inputs=False)
    last = len(net.blocks) - 1
    for i, block in enumerate(net.blocks):
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=i < last,  # backward starts at the last
                    ignored_params=ignored)
    fully_shard(net.final_layer, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    fully_shard(net, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    if cp > 1:  # each cp rank holds its frames' part of a sample's gradient: sum those, mean over the dp samples
        for unit in [*net.blocks, net.final_layer, net]:  # a SUM reduce-scatter, then / dp (gloo has no PREMUL_SUM)
            unit.set_gradient_divide_factor(world // cp)
            unit.set_force_sum_reduction_for_comms(True)
    return net


def local_rows(value):
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


# -----------------------------------------------------------------------------
# Context parallelism's groups (cp.make_mesh: ranks r = dp_index * cp + cp_index)


def dp_coords(cp):
    """(dp_rank, dp_world) of this rank when cp groups are cp consecutive ranks (cp.make_mesh's layout)."""
    return rank() // cp, world_size() // cp


def gather_groups(local, cp=1):
    """[..., n] -> [..., dp * n]: each dp group's tensor in dp rank order, taken from the first rank of its cp group.

    RL's rewards: the cp ranks of a group ran the same rollouts, so one copy per group enters the statistics, and
    what is derived from it (the advantages) is the same on all of them (the loss must be: base/cp.py's docstring).
    The buffers are allocated on local's device, which must be the process group's (CUDA under NCCL: an all_gather
    into host memory is not a supported call)."""
    if world_size() == 1:
        return local
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, local.contiguous())
    return torch.cat(parts[::cp], dim=-1)


def sum_groups(t, cp=1):
    """All-reduce sum of `t` in place over the dp groups (over all ranks, / cp: a cp group's ranks hold copies)."""
    if world_size() > 1:
        dist.all_reduce(t)
        t /= cp
    return t


def setup_distributed(cfg):
    """(distributed, rank, world, device): the torchrun environment's process group, one device per rank; one GPU
    without torchrun gets a 1-rank group, so FSDP2 does the bf16 compute as on many."""
    device_type = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    distributed = "RANK" in os.environ or device_type == "cuda"
    if distributed:
        if "RANK" not in os.environ:  # one GPU without torchrun: a 1-rank group, so FSDP2 does the bf16 compute too
            os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                              MASTER_PORT=os.environ.get("MASTER_PORT", "29511"))
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        local = int(os.environ.get("LOCAL_RANK", 0))
    else:
        rank, world, local = 0, 1, 0
    device = torch.device(device_type, local) if device_type == "cuda" else torch.device("cpu")
    if device_type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return distributed, rank, world, device
