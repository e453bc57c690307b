"""Will my job fit? Per-rank memory, FSDP2 and --cp traffic of a train.py step, and the --sac auto checkpointing plan.

The formulas follow collectives.shard_model exactly (dim-0 shards of ceil(rows / N) rows; blocks 0..n-2 resharded after
forward, the last block, final_layer and the root kept; bf16 all-gathers on the GPU, fp32 reduce-scatters of the
trainable grads); tests/test_bench.py checks them against a real gloo run and against the bytes the collectives are
handed. bench.py --world N runs the step itself (rank 0 under a fake process group) and prints both; train.py
calls `auto_plan` for --sac auto. docs/memory.md, "Before you queue a job", has the model and its limits.
"""
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import fp8 as fp8_lib
import sac
from lora import LORA_TARGETS, adapted_linears, add_lora, quantize_base, target_linears
from model import Block, Condition, DiT, condition_mask


class CollectiveBytes(TorchDispatchMode):
    """Counts what FSDP2 hands to the process group: all-gather outputs and reduce-scatter inputs, in bytes."""

    def __init__(self):
        super().__init__()
        self.allgather = self.reduce_scatter = self.alltoall = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__  # c10d._allgather_base_(out, in) / c10d._reduce_scatter_base_(out, in)
        self.allgather += args[0].nbytes if name == "_allgather_base_" else 0
        self.reduce_scatter += args[1].nbytes if name == "_reduce_scatter_base_" else 0
        self.alltoall += args[1].nbytes if name == "alltoall_base_" else 0  # --cp: cp.py's exchanges (out, in)
        return func(*args, **(kwargs or {}))


def fsdp_units(net):
    """(name, parameters, all-gathers per step) per FSDP2 unit, as collectives.shard_model wraps them: blocks 0..n-2 are
    resharded after forward, so gathered again in backward; the last block, final_layer and the root are kept."""
    inner = {id(p) for m in [*net.blocks, net.final_layer] for p in m.parameters()}
    last = len(net.blocks) - 1
    return ([("root", [p for p in net.parameters() if id(p) not in inner], 1)]
            + [(f"blocks.{i}", list(b.parameters()), 1 if i == last else 2) for i, b in enumerate(net.blocks)]
            + [("final_layer", list(net.final_layer.parameters()), 1)])


def shard_numel(p, world, rank=None):
    """Elements of `p` on `rank` under FSDP2's dim-0 sharding (chunks of ceil(rows / world)); rank None: padded."""
    rows, chunk = p.shape[0], -(-p.shape[0] // world)
    return (chunk if rank is None else max(0, min(chunk, rows - rank * chunk))) * (p.numel() // rows)


def state_formula(net, world, rank):
    """Bytes of `rank`'s shards of the params, grads (trainable only) and AdamW states (2 per trainable element plus
    a 4-byte step per trainable tensor), from the unsharded (meta) model in train.py's dtypes."""
    params = [(p, shard_numel(p, world, rank) * p.element_size()) for p in net.parameters()]
    grads = sum(n for p, n in params if p.requires_grad)
    return dict(params=sum(n for _, n in params), grads=grads,
                optimizer=2 * grads + 4 * sum(p.requires_grad for p, _ in params))


def state_measured(net, optimizer):
    """The same three numbers from the live tensors' local shards (DTensor.to_local) on this rank."""
    local = lambda t: (t.to_local() if hasattr(t, "to_local") else t).nbytes  # noqa: E731
    return dict(params=sum(local(p) for p in net.parameters()),
                grads=sum(local(p.grad) for p in net.parameters() if p.grad is not None),
                optimizer=sum(local(t) for st in optimizer.state.values() for t in st.values() if torch.is_tensor(t)))


def fsdp_traffic(net, world, compute_dtype, link_gb_s):
    """Bytes FSDP2 moves per step: all-gathers in the compute dtype (frozen LoRA bases included), reduce-scatters of
    the trainable grads in fp32; none on one rank. A ring collective of S bytes sends and receives (N-1)/N x S per
    rank. Not overlappable: the root's and block 0's gathers before the first compute and their reduce-scatters after
    the last (the optimizer waits for them)."""
    size = compute_dtype.itemsize * (world > 1)
    ag = rs = edge = 0
    for name, params, gathers in fsdp_units(net):
        unit_ag = sum(shard_numel(p, world) for p in params) * world * size
        unit_rs = sum(shard_numel(p, world) for p in params if p.requires_grad) * world * 4 * (world > 1)
        ag, rs = ag + gathers * unit_ag, rs + unit_rs
        edge += (unit_ag + unit_rs) if name in ("root", "blocks.0") else 0
    ring, link = (world - 1) / world, link_gb_s * 1e9
    return dict(allgather_bytes=ag, reduce_scatter_bytes=rs, link_bytes_per_rank=round(ring * (ag + rs)),
                comm_s=ring * (ag + rs) / link, exposed_s=ring * edge / link)


def cp_traffic(cfg, latent, cp, compute_dtype, recompute_blocks, link_gb_s):
    """Bytes the Ulysses all-to-alls (cp.py) are handed per step on one rank: per self-attention, q, k, v and the
    output, 4 tensors of [B, L/N, D] in the compute dtype, in forward, again in backward, and again per block whose
    forward is recomputed (any --sac mode but none replays the exchange). Each sends (N-1)/N of itself over the link.
    Not overlapped: the attention waits for its inputs. Left out: the output all-gather along time ([B, L, p*p*C]: the
    final layer's 64 features per token) and cp.check_replicated's fingerprints, both < 1% of one exchange."""
    if cp == 1:
        return dict(alltoall_bytes=0, cp_link_bytes_per_rank=0, cp_comm_s=0.0)
    B, _, T, H, W = latent
    L = (T // cfg.patch_temporal) * (H // cfg.patch_spatial) * (W // cfg.patch_spatial)
    per_layer = 4 * B * (L // cp) * cfg.model_channels * compute_dtype.itemsize
    handed = per_layer * (2 * cfg.num_blocks + recompute_blocks)
    link = round(handed * (cp - 1) / cp)
    return dict(alltoall_bytes=handed, cp_link_bytes_per_rank=link, cp_comm_s=link / (link_gb_s * 1e9))


def lora_base(net):
    """The frozen base weights of the adapted Linears (what --fp8 stores in e4m3)."""
    return [m.weight for m in adapted_linears(net)]


def resident_bytes(net, fp8=False):
    """A step's weights and gradients held whole in their dtypes, no optimizer (bench.py without --world); with fp8 the
    LoRA base as e4m3."""
    total = sum(p.numel() * p.element_size() * (1 + p.requires_grad) for p in net.parameters())
    return total if not fp8 else total + sum(fp8_lib.stored_bytes(p) - p.numel() * p.element_size()
                                             for p in lora_base(net))


def auto_plan(net, world, device, dtype, latent, text_len, lora, mem_budget_gib, fp8=False, fixed_bytes=None):
    """--sac auto for any driver (this planner; train.py): `net` is the meta model (LoRA added, not yet sharded).

    Fixed per-rank bytes: rank 0's state (state_formula) and the units FSDP holds gathered in the compute dtype (root,
    final layer, last block, the current and the prefetched block). One block, built unsharded in the compute dtype
    as FSDP runs it, is measured under every mode at the inputs a meta forward of the whole model gives it; then
    sac.plan_auto. Returns (costs, AutoPlan, fixed bytes); an impossible budget is a ValueError.
    fp8: the block measured with train.py --fp8's GEMMs (LoRA: its base quantised). fixed_bytes: instead of train.py's
    FSDP state (bench.py without --world: the resident weights and gradients in the compute dtype).
    """
    cfg, captured = net.cfg, {}
    gathered = [*fsdp_units(net)[0][1], *net.final_layer.parameters(), *net.blocks[-1].parameters(),
                *net.blocks[0].parameters(), *net.blocks[0].parameters()]
    fixed = sum(state_formula(net, world, 0).values()) + sum(p.numel() for p in gathered) * dtype.itemsize \
        if fixed_bytes is None else fixed_bytes
    if fixed_bytes is None and fp8 and lora:  # train.py --fp8: the frozen base whole on every rank in e4m3, not sharded
        fixed += sum(fp8_lib.stored_bytes(p) - shard_numel(p, world, 0) * p.element_size() for p in lora_base(net))
    with torch.device("meta"):
        net_meta, block = DiT(cfg).to(dtype), Block(cfg).to(dtype)
    net_meta.blocks[0].register_forward_pre_hook(lambda m, args: captured.setdefault("args", args))
    x0 = torch.empty(latent, device="meta")
    B, _, T, H, W = latent
    grid = (B, T // cfg.patch_temporal, H // cfg.patch_spatial, W // cfg.patch_spatial)
    with torch.no_grad():  # the net itself, not a loss: only the shapes matter (camera maps for agibot configs)
        text = torch.empty(B, text_len, cfg.crossattn_proj_in_channels, device="meta")
        camera = torch.empty(*grid, cfg.camera_channels, device="meta") if cfg.camera_channels else None
        cond = Condition(text, condition_mask=condition_mask(x0, 1), camera=camera)
        net_meta(x0, torch.ones(B, device="meta"), cond)
    wrapped = torch.nn.ModuleDict({"blocks": torch.nn.ModuleList([block])})
    if lora:
        add_lora(wrapped, lora)
    elif fp8:
        fp8_lib.convert_trainable(target_linears(wrapped, LORA_TARGETS))
    block.to_empty(device=device)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(std=0.02)
    if lora and fp8:
        quantize_base(wrapped)
    real = lambda t: torch.randn(t.shape, device=device).to(t.dtype) if torch.is_tensor(t) else t  # noqa: E731
    costs = sac.measure_block_costs(block, [tuple(map(real, a)) if isinstance(a, tuple) else real(a)
                                            for a in captured["args"]])
    del block
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the step's reserved memory is then its own
    return costs, sac.plan_auto(costs, int(mem_budget_gib * 2**30), fixed, cfg.num_blocks), fixed
