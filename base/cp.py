"""Context parallelism (--cp N): the video tokens of one sample split over the N ranks of a cp group (Ulysses).

Each cp rank holds T/N latent frames of the sample: its rows of the patch embedding, the adaLN modulations, RoPE
positions, condition mask and camera map are those frames'. Self-attention is the one place that mixes frames:
q, k, v go through one all-to-all from [B, L/N, h, d] (my frames, all heads) to [B, L, h/N, d] (all frames, my
heads), SDPA runs unchanged on whole sequences, and a second all-to-all brings the output back. Cross-attention reads
the (replicated) text and needs no communication. The net's output is all-gathered along latent time, so the loss
code sees the whole sample on every cp rank, exactly as without CP.

Why Ulysses and not ring attention (numbers in docs/memory.md, "Context parallelism"): per layer and rank Ulysses
moves 4 (L/N) D (N-1)/N elements forward (q, k, v, out) against ring's 2 (L/N) D (N-1) (k and v passed around the
ring), i.e. 2/N of ring's bytes at N >= 2; it keeps SDPA's fused kernels untouched (ring needs per-block attention
with log-sum-exp merging), and all Cosmos heads counts (16, 40) divide the cp sizes a node has (2, 4, 8; 40 needs
N in 2, 4, 5, 8). Upstream Cosmos trains with the same all-to-all scheme ("minimal_a2a").

Rules this relies on, checked where they can be:
- every rank of a cp group calls the net with the SAME inputs (clip, noise, time, text): check_replicated compares
  a fingerprint of them at every forward and raises otherwise (train.py seeds by dp rank, not global rank);
- the loss is computed identically on every cp rank from the gathered output, so the gather's backward only takes
  this rank's slice of the (identical) gradient: no communication, and each rank's parameter gradient is the part
  of the sample's gradient that its frames contribute. Summed over the cp group it is the no-CP gradient; FSDP2
  averages over all dp x cp ranks, so collectives.shard_model sets the divide factor to dp (mean over samples only).
The collectives over the dp groups of this layout (dp_coords, gather_groups, sum_groups) are base/collectives.py's.
"""
from contextlib import contextmanager

import torch
import torch.distributed as dist


def make_mesh(device_type, world, cp):
    """(dp_rank, dp_size, cp_group) of this rank on a (dp, cp) mesh; cp = 1: (rank, world, None), no mesh built.

    Ranks r = dp_index * cp + cp_index: a cp group is cp consecutive ranks (one node's NVLink domain when cp <= 8).
    """
    if cp < 1 or world % cp:
        raise ValueError(f"--cp {cp} must divide the number of ranks {world} (world = dp x cp; start N ranks with "
                         "torchrun --nproc_per_node=N)")
    rank = dist.get_rank() if dist.is_initialized() else 0
    if cp == 1:
        return rank, world, None
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(device_type, (world // cp, cp), mesh_dim_names=("dp", "cp"))
    return rank // cp, world // cp, mesh.get_group("cp")


def check_split(cp, config, num_heads, latent_frames, frames):
    """--cp must split the heads and the latent frames (views included) evenly: else one line naming the fix."""
    if cp < 1:
        raise ValueError(f"--cp {cp}: >= 1 (1 = no context parallelism)")
    if num_heads % cp:
        raise ValueError(f"--cp {cp}: {config} has {num_heads} heads; use a --cp that divides them")
    if latent_frames % cp:
        raise ValueError(f"--cp {cp}: {latent_frames} latent frames (--frames {frames}) do not split evenly over {cp}"
                         " ranks; use --frames with (frames - 1) / 4 + 1 (times the views) a multiple of --cp")


def enable(net, group):
    """Run `net` (a model.DiT) context-parallel over `group` (None: off). Checks the heads split evenly."""
    n = 1 if group is None else dist.get_world_size(group)
    if net.cfg.num_heads % n:
        raise ValueError(f"--cp {n}: the {net.cfg.num_heads} attention heads of this config do not split evenly over"
                         f" {n} ranks; use a --cp that divides {net.cfg.num_heads}")
    net.cp_group = group
    for block in net.blocks:
        block.self_attn.cp_group = group
    return net


@contextmanager
def disabled(net):
    """No CP inside (each rank runs its own whole sample): the init guard, whose noise is drawn per rank."""
    group = net.cp_group
    enable(net, None)
    try:
        yield net
    finally:
        enable(net, group)


class _AllToAll(torch.autograd.Function):
    """out[i] (from rank i) = x_rank_i[my index] along dim 0; its own adjoint, so backward is the same exchange."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        x = x.contiguous()  # before empty_like, which would copy a view's permuted strides
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad, group=ctx.group)
        return out, None


# Both exchanges are graph breaks under torch.compile (--compile compiles each block): the collective and its
# layout copies run eagerly between the compiled parts of a block, on every backend (gloo has no traceable form).
@torch.compiler.disable
def seq_to_heads(x, group):
    """[..., L/N, h, d] (my tokens, all heads) -> [..., L, h/N, d] (all tokens in rank order, my heads)."""
    n = dist.get_world_size(group)
    x = x.unflatten(-2, (n, x.shape[-2] // n)).movedim(-3, 0)  # [N (head chunk), ..., L/N, h/N, d]
    return _AllToAll.apply(x, group).movedim(0, -4).flatten(-4, -3)  # received [N (token chunk), ...]


@torch.compiler.disable
def heads_to_seq(x, group):
    """[..., L, h/N, d] -> [..., L/N, h, d]: the inverse of seq_to_heads."""
    n = dist.get_world_size(group)
    x = x.unflatten(-3, (n, x.shape[-3] // n)).movedim(-4, 0)  # [N (token chunk), ..., L/N, h/N, d]
    return _AllToAll.apply(x, group).movedim(0, -3).flatten(-3, -2)  # received [N (head chunk), ...]


def local_frames(x, group, dim):
    """This rank's contiguous 1/N of `x` along `dim` (latent frames); the caller checked divisibility."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    return x.narrow(dim, r * (x.shape[dim] // n), x.shape[dim] // n)


class _GatherFrames(torch.autograd.Function):
    """All-gather along `dim`; backward keeps this rank's slice (the loss downstream is the same on every cp rank)."""

    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x, group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad):
        return local_frames(grad, ctx.group, ctx.dim), None, None


def gather_frames(x, group, dim):
    return _GatherFrames.apply(x, group, dim)


def check_replicated(tensors, group, what):
    """Raise unless every rank of `group` holds the same tensors: CP splits ONE sample, so the inputs must agree.

    A fingerprint per tensor, compared exactly (the same kernels on the same data round alike): the float64-accumulated
    sum of all of it, and of a strided subset of <= 65536 elements the sum of squares and a position-weighted sum
    (a Reason1 embedding is 51M elements: no float64 copy of it). One small all-gather per forward."""
    rows = []
    for t in tensors:
        if t is None:
            rows.append(torch.zeros(3, dtype=torch.float64))
            continue
        flat = t.detach().reshape(-1)
        v = flat[:: max(1, flat.numel() // 65536)].double()
        weights = torch.arange(1, v.numel() + 1, device=v.device, dtype=torch.float64) / max(v.numel(), 1)
        rows.append(torch.stack([flat.sum(dtype=torch.float64), v.square().sum(), (v * weights).sum()]).cpu())
    mine = torch.stack(rows).to(_comm_device(group))
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, mine, group=group)
    if not all(torch.equal(e, every[0]) for e in every):
        raise RuntimeError(f"--cp: the ranks of a cp group were given different {what}; context parallelism splits one"
                           " sample, so clip, noise, time and text must be drawn by dp rank, not by global rank")


def _comm_device(group):
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else "cpu"

