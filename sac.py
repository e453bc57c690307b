"""Activation checkpointing for the DiT blocks: small named policies, validated when they are built.

Each `model.blocks[i]` has a `checkpoint_fn` attribute (None by default). `Block.forward` calls
`checkpoint_fn(self._forward, *args)` when it is set and grad is enabled, so the checkpoint lives *inside* the
block: module names, `named_parameters()` and state_dict keys never change, FSDP hooks stay on the block, and
`block.compile()` compiles the checkpoint call with it. Usage (train.py / grpo.py / bench.py):

    sac.apply(model, "selective", every=1)   # validated here: a bad mode is a ValueError, not a crash later
    ... first training step ...
    sac.check_first_step("selective")        # raises if the save list never matched a real kernel

    costs = sac.measure_block_costs(block, inputs)                # one block, every mode, the real device and shapes
    plan = sac.plan_auto(costs, budget_bytes, fixed_bytes, len(model.blocks))   # fastest mix that fits, or ValueError
    sac.apply_per_block(model, plan.modes); print(plan.why)       # bench.py --world N --sac auto --mem-budget GiB

Modes (docs/memory.md has the measured memory and time per mode, and how to choose):
    none       no checkpointing: every activation is kept
    block      full recompute: only the block inputs are kept
    mm         keep matmul outputs, recompute attention and elementwise work
    attn       keep attention (SDPA) outputs, recompute matmuls and elementwise work
    selective  keep matmul and attention outputs, recompute only the cheap elementwise work
    auto       (bench.py) a mode per block: the fastest mix whose predicted peak fits --mem-budget

Upstream's full-recompute mode handed `context_fn=None` to the checkpoint wrapper and crashed at the first
forward; here every mode has a callable context function and `make_checkpoint_fn` runs a tiny checkpointed
forward+backward before anything is returned.

Will my job fit? (the second half) Per-rank memory, FSDP2 and --cp traffic of a train.py step, and --sac auto's
plan: Will my job fit? Per-rank memory, FSDP2 and --cp traffic of a train.py step, and the --sac auto checkpointing plan.

The formulas follow collectives.shard_model exactly (dim-0 shards of ceil(rows / N) rows; blocks 0..n-2 resharded after
forward, the last block, final_layer and the root kept; bf16 all-gathers on the GPU, fp32 reduce-scatters of the
trainable grads); tests/test_bench.py checks them against a real gloo run and against the bytes the collectives are
handed. bench.py --world N runs the step itself (rank 0 under a fake process group) and prints both; train.py
calls `auto_plan` for --sac auto. docs/memory.md, "Before you queue a job", has the model and its limits.
"""
import contextlib
import functools
import statistics
import time
import weakref
from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts, noop_context_fn

import condition
from base import fp8
from model import Block, DiT
from nets.lora import LORA_TARGETS, adapted_linears, add_lora, quantize_base, target_linears

MODES = ("none", "block", "mm", "attn", "selective")

aten = torch.ops.aten
# Matched on the OpOverloadPacket at dispatch level (below autograd, so nn.Linear shows up as mm/addmm).
# aten.linear is listed because some backends register it as a leaf.
MM_OPS = frozenset({aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten.linear, *fp8.GEMM_OPS})  # --fp8's GEMMs
# Every SDPA backend. On H200 with torch 2.11 the default kernel is cuDNN's and deterministic mode switches to
# flash, so a list without either silently recomputes attention (cosmos-predict2's mm_only does exactly that).
ATTN_OPS = frozenset({aten._scaled_dot_product_cudnn_attention, aten._scaled_dot_product_flash_attention,
                      aten._scaled_dot_product_efficient_attention, aten._scaled_dot_product_flash_attention_for_cpu,
                      aten._scaled_dot_product_fused_attention_overrideable, aten._flash_attention_forward,
                      aten._efficient_attention_forward})
OP_GROUP = {**{op: "mm" for op in MM_OPS}, **{op: "attn" for op in ATTN_OPS}}
SAVE_GROUPS = {"none": frozenset(), "block": frozenset(), "mm": frozenset({"mm"}), "attn": frozenset({"attn"}),
               "selective": frozenset({"mm", "attn"})}

# Forward-pass counters, filled by the policies (the recompute pass is not counted): SAVED[op name] and
# SAVED_GROUPS['mm'|'attn'] count outputs kept, SEEN[op name] counts calls inside checkpointed blocks. Under
# torch.compile the policy runs while the graph is traced, so the counters fill on the first (tracing) step only.
SAVED = Counter()
SAVED_GROUPS = Counter()
SEEN = Counter()


def reset_counters():
    for c in (SAVED, SAVED_GROUPS, SEEN):
        c.clear()


def validate(mode, every=1):
    if mode not in MODES:
        raise ValueError(f"unknown activation-checkpointing mode {mode!r}; valid: {', '.join(MODES)}")
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise ValueError(f"every must be an int >= 1, got {every!r}")


def _policy(save_groups):
    def policy_fn(ctx, func, *args, **kwargs):
        group = OP_GROUP.get(func.overloadpacket)
        keep = group in save_groups
        if not ctx.is_recompute:  # count the forward only; the recompute replays the same decisions
            name = str(func)
            SEEN[name] += 1
            if keep:
                SAVED[name] += 1
                SAVED_GROUPS[group] += 1
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE
    return policy_fn


def context_fn(mode):
    """The zero-argument callable that `checkpoint(..., context_fn=...)` calls once per checkpointed call.

    Never None: `none` and `block` get torch's own no-op context function (checkpoint's default), the selective
    modes a `functools.partial` of `create_selective_checkpoint_contexts` (the form torch.compile understands).
    """
    validate(mode)
    if mode in ("none", "block"):
        return noop_context_fn
    return functools.partial(create_selective_checkpoint_contexts, _policy(SAVE_GROUPS[mode]))


def make_checkpoint_fn(mode):
    """`fn(function, *args)` that runs `function` under activation checkpointing, or None for mode `none`.

    Validates the mode, that its context function is callable and returns two context managers, and runs a tiny
    checkpointed forward+backward so that a signature or None problem fails here, in seconds.
    """
    validate(mode)
    ctx = context_fn(mode)
    if not callable(ctx):
        raise TypeError(f"context function for mode {mode!r} is not callable: {ctx!r}")
    pair = ctx()
    if not (isinstance(pair, tuple) and len(pair) == 2
            and all(hasattr(c, "__enter__") and hasattr(c, "__exit__") for c in pair)):
        raise TypeError(f"context function for mode {mode!r} must return two context managers, got {pair!r}")
    if mode == "none":
        return None
    kwargs = dict(use_reentrant=False, preserve_rng_state=True)  # RNG restored: recompute == forward, bit for bit
    if mode != "block":  # full recompute: leave context_fn out (checkpoint's default), never pass None
        kwargs["context_fn"] = ctx
    fn = functools.partial(checkpoint, **kwargs)
    with torch.enable_grad():
        t = torch.ones(2, requires_grad=True)
        fn(lambda a: a * 2, t).sum().backward()
    if not torch.equal(t.grad, torch.full((2,), 2.0)):
        raise RuntimeError(f"checkpoint self-test for mode {mode!r} gave grad {t.grad.tolist()}, expected [2, 2]")
    return fn


def apply(model, mode="none", every=1):
    """Set `checkpoint_fn` on blocks with `i % every == 0` (the others and all blocks under `none` get None).

    Returns the indices of the checkpointed blocks. Calling it again replaces the previous setting.
    """
    validate(mode, every)
    return apply_per_block(model, block_modes(mode, every, len(model.blocks)))


def block_modes(mode, every, num_blocks):
    """`mode` on blocks i % every == 0, `none` on the others: the per-block list apply_per_block takes."""
    return [mode if i % every == 0 else "none" for i in range(num_blocks)]


def apply_per_block(model, modes):
    """One mode per block (e.g. `plan_auto(...).modes`), each validated and self-tested as in `apply`.

    Returns the indices of the checkpointed blocks. Calling it again replaces the previous setting.
    """
    if len(modes) != len(model.blocks):
        raise ValueError(f"{len(modes)} activation-checkpointing modes for {len(model.blocks)} blocks: need one each")
    for mode in modes:
        validate(mode)
    for name, m in model.named_modules():
        # a dropout mask drawn in the forward must be redrawn identically in the recompute; our DiT has none,
        # and preserve_rng_state=True would cover one, but refuse rather than rely on it silently
        if isinstance(m, nn.Dropout) and m.p > 0 and set(modes) != {"none"}:
            raise ValueError(f"{name}: dropout p={m.p} under activation checkpointing; the DiT is built without")
    fns = {mode: make_checkpoint_fn(mode) for mode in sorted(set(modes))}
    for block, mode in zip(model.blocks, modes):
        block.checkpoint_fn = fns[mode]
    reset_counters()
    return [i for i, mode in enumerate(modes) if fns[mode] is not None]


def check_first_step(mode):
    """After the first training step: assert the save list matched real kernels, else raise with what was seen.

    `mode` is one mode or the list of per-block modes (`apply_per_block`). Catches kernel-name drift (cuDNN vs flash
    SDPA, deterministic mode switching the kernel, a new backend), which would otherwise silently recompute attention
    or matmuls. Returns the per-group save counts.
    """
    modes = [mode] if isinstance(mode, str) else list(mode)
    for m in modes:
        validate(m)
    counts = {g: SAVED_GROUPS[g] for g in ("mm", "attn")}
    missing = [g for g in sorted(set().union(*(SAVE_GROUPS[m] for m in modes))) if counts[g] == 0]
    if missing:
        seen = ", ".join(f"{k} x{v}" for k, v in SEEN.most_common(40)) or "nothing (were any blocks checkpointed?)"
        raise RuntimeError(f"sac mode {mode!r}: no {'/'.join(missing)} op was saved in the first step; the save "
                           f"lists do not name the kernels that ran. Ops seen in checkpointed blocks: {seen}")
    return counts


# -----------------------------------------------------------------------------
# auto: the fastest per-block mix of modes that fits a per-rank memory budget, from measured per-block costs

AUTO_MODES = ("none", "selective", "mm", "attn", "block")


@dataclass(frozen=True)
class BlockCost:
    """One block's forward + backward under one mode, in bytes above what was allocated before it."""
    saved_bytes: int  # held from the end of its forward to its backward (its output: the next block's input)
    peak_bytes: int  # the most held at once during its forward + backward (saved, recompute, grads, workspace)
    seconds: float  # forward + backward, recompute included


class LiveBytes(TorchDispatchMode):
    """CPU stand-in for the CUDA allocator's statistics: bytes of the storages that ops create, until freed.

    Exact for the tensors themselves (no allocator rounding, caching or workspace) and deterministic. Views of an
    input are not new memory; a storage is counted once and uncounted when its last reference dies.
    """

    def __init__(self):
        super().__init__()
        self.live, self.peak, self.counted = 0, 0, set()

    def _free(self, key, nbytes):
        self.live -= nbytes
        self.counted.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if torch.is_tensor(t)}
        for t in tree_leaves(out):
            if not torch.is_tensor(t):
                continue
            storage = t.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
            if nbytes and key not in inputs and key not in self.counted:
                self.counted.add(key)
                self.live += nbytes
                self.peak = max(self.peak, self.live)
                weakref.finalize(storage, self._free, key, nbytes)
        return out


def _block_step(block, inputs, cuda):
    """(saved bytes, peak bytes, seconds) of one forward + backward of `block(*inputs)`."""
    for t in [*block.parameters(), *inputs]:
        if torch.is_tensor(t):
            t.grad = None
    tracker = contextlib.nullcontext() if cuda else LiveBytes()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    with tracker:
        out = block(*inputs)
        saved = torch.cuda.memory_allocated() - base if cuda else tracker.live
        out.backward(torch.ones_like(out))
        del out
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return saved, torch.cuda.max_memory_allocated() - base if cuda else tracker.peak, seconds


def measure_block_costs(block, inputs, modes=AUTO_MODES, reps=2):
    """{mode: BlockCost} from running `block(*inputs)` forward + backward under each mode, after one warm-up.

    Use the real device, dtype and shapes (bench.py captures a block's inputs from a meta forward of the whole
    model). CUDA: memory_allocated / max_memory_allocated deltas, time the median of `reps`. CPU: LiveBytes (the
    tensors' bytes, deterministic) and wall-clock time (noisy: a CPU plan is a code-path check, not a forecast).
    A mode under which one block alone runs out of memory is left out of the result.
    """
    cuda = any(t.is_cuda for t in block.parameters())
    inputs = [t.detach().requires_grad_(t.is_floating_point()) if torch.is_tensor(t) else t for t in inputs]
    before = block.checkpoint_fn
    costs = {}
    for mode in modes:
        block.checkpoint_fn = make_checkpoint_fn(mode)
        try:
            runs = [_block_step(block, inputs, cuda) for _ in range(reps + 1)][1:]
        except torch.OutOfMemoryError:  # one block alone does not fit this way: left out, and plan_auto says so
            torch.cuda.empty_cache()
            continue
        costs[mode] = BlockCost(runs[-1][0], max(r[1] for r in runs), statistics.median(r[2] for r in runs))
    block.checkpoint_fn = before
    for t in [*block.parameters(), *inputs]:
        if torch.is_tensor(t):
            t.grad = None
    reset_counters()
    return costs


@dataclass
class AutoPlan:
    modes: list  # one per block, for apply_per_block
    peak_bytes: int  # predicted per-rank peak: fixed + activations
    seconds: float  # predicted blocks' forward + backward time
    why: str  # one or two lines for the log


def _mix_peak(counts, costs, fixed_bytes):
    """Predicted peak of a mix ({mode: blocks}, in forward order): when block i runs its backward, every block before
    it still holds its saved bytes, so peak = fixed + max_i(sum_{j<i} saved_j + peak_i)."""
    held, worst = 0, 0
    for mode, n in counts.items():
        if n:
            c = costs[mode]
            worst = max(worst, held + (n - 1) * c.saved_bytes + c.peak_bytes)
            held += n * c.saved_bytes
    return fixed_bytes + worst


def _compositions(total, parts):
    if parts == 1:
        yield (total,)
        return
    for first in range(total + 1):
        for rest in _compositions(total - first, parts - 1):
            yield (first, *rest)


def plan_auto(costs, budget_bytes, fixed_bytes, num_blocks):
    """The fastest per-block mix of the measured modes whose predicted per-rank peak fits `budget_bytes`.

    costs: {mode: BlockCost} (measure_block_costs, or synthetic); fixed_bytes: what the rank holds regardless of
    the mix (sharded params, grads and optimizer states, FSDP's gathered blocks: plan.auto_plan). Every mix of
    counts is tried (5 modes x 36 blocks: 91k), ties go to the smaller peak. An impossible budget is a ValueError.
    """
    # forward order: largest (peak - saved) first minimises that max (swap two neighbours to see)
    modes = sorted((m for m in AUTO_MODES if m in costs), key=lambda m: costs[m].saved_bytes - costs[m].peak_bytes)
    if not modes or set(costs) - set(modes) or num_blocks < 1:
        raise ValueError(f"plan_auto needs costs for modes among {AUTO_MODES} and num_blocks >= 1, got "
                         f"{sorted(costs)} and {num_blocks}")
    gib = lambda n: f"{n / 2**30:.4g} GiB"  # noqa: E731
    best = None
    for split in _compositions(num_blocks, len(modes)):
        counts = dict(zip(modes, split))
        peak = _mix_peak(counts, costs, fixed_bytes)
        seconds = sum(n * costs[m].seconds for m, n in counts.items())
        if peak <= budget_bytes and (best is None or (seconds, peak) < best[:2]):
            best = (seconds, peak, counts)
    uniform = {m: _mix_peak({m: num_blocks}, costs, fixed_bytes) for m in AUTO_MODES if m in costs}
    needs = ", ".join(f"{m} {gib(p)}" for m, p in uniform.items())
    if best is None:
        least = min(_mix_peak(dict(zip(modes, s)), costs, fixed_bytes) for s in _compositions(num_blocks, len(modes)))
        raise ValueError(f"--mem-budget {gib(budget_bytes)}: no checkpointing mix fits; the smallest needs "
                         f"{gib(least)} per rank ({gib(fixed_bytes)} fixed; one mode on every block: {needs}). "
                         "Raise the budget, use more ranks, LoRA, or --offload")
    seconds, peak, counts = best
    plan, spans = [], []
    for mode in (m for m in modes if counts[m]):
        spans.append(f"{mode} x{counts[mode]}" + (f" (blocks {len(plan)}-{len(plan) + counts[mode] - 1})"
                                                  if counts[mode] > 1 else f" (block {len(plan)})"))
        plan += [mode] * counts[mode]
    fastest = min(uniform, key=lambda m: num_blocks * costs[m].seconds)
    why = (f"sac auto: {', '.join(spans)}: predicted peak {gib(peak)} of the {gib(budget_bytes)} budget "
           f"({gib(fixed_bytes)} fixed), blocks {seconds:.3f} s vs {num_blocks * costs[fastest].seconds:.3f} s "
           f"for the fastest ({fastest}).\nsac auto: per-rank peak with one mode everywhere: {needs}"
           + "".join(f"; no cost for {m} (measured: one block alone ran out of memory)" for m in AUTO_MODES
                     if m not in costs))
    return AutoPlan(plan, peak, seconds, why)


# -----------------------------------------------------------------------------
# Will my job fit? Per-rank memory and traffic formulas (bench.py --world N) and the --sac auto plan (train.py)


class CollectiveBytes(TorchDispatchMode):
    """Counts what FSDP2 hands to the process group: all-gather outputs and reduce-scatter inputs, in bytes."""

    def __init__(self):
        super().__init__()
        self.allgather = self.reduce_scatter = self.alltoall = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__  # c10d._allgather_base_(out, in) / c10d._reduce_scatter_base_(out, in)
        self.allgather += args[0].nbytes if name == "_allgather_base_" else 0
        self.reduce_scatter += args[1].nbytes if name == "_reduce_scatter_base_" else 0
        self.alltoall += args[1].nbytes if name == "alltoall_base_" else 0  # --cp: base/cp.py's exchanges (out, in)
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
    """Bytes the Ulysses all-to-alls (base/cp.py) are handed per step on one rank: per self-attention, q, k, v and the
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


def resident_bytes(net, fp8_base=False):
    """A step's weights and gradients held whole in their dtypes, no optimizer (bench.py without --world); with fp8 the
    LoRA base as e4m3."""
    total = sum(p.numel() * p.element_size() * (1 + p.requires_grad) for p in net.parameters())
    return total if not fp8_base else total + sum(fp8.stored_bytes(p) - p.numel() * p.element_size()
                                             for p in lora_base(net))


def auto_plan(net, world, device, dtype, latent, text_len, lora, mem_budget_gib, fp8_base=False, fixed_bytes=None):
    """--sac auto for any driver (this planner; train.py): `net` is the meta model (LoRA added, not yet sharded).

    Fixed per-rank bytes: rank 0's state (state_formula) and the units FSDP holds gathered in the compute dtype (root,
    final layer, last block, the current and the prefetched block). One block, built unsharded in the compute dtype
    as FSDP runs it, is measured under every mode at the inputs a meta forward of the whole model gives it; then
    plan_auto. Returns (costs, AutoPlan, fixed bytes); an impossible budget is a ValueError.
    fp8_base: the block measured with train.py --fp8's GEMMs (LoRA: its base quantised). fixed_bytes: instead of train.py's
    FSDP state (bench.py without --world: the resident weights and gradients in the compute dtype).
    """
    cfg, captured = net.cfg, {}
    gathered = [*fsdp_units(net)[0][1], *net.final_layer.parameters(), *net.blocks[-1].parameters(),
                *net.blocks[0].parameters(), *net.blocks[0].parameters()]
    fixed = sum(state_formula(net, world, 0).values()) + sum(p.numel() for p in gathered) * dtype.itemsize \
        if fixed_bytes is None else fixed_bytes
    if fixed_bytes is None and fp8_base and lora:  # train.py --fp8: the frozen base whole on every rank in e4m3, not sharded
        fixed += sum(fp8.stored_bytes(p) - shard_numel(p, world, 0) * p.element_size() for p in lora_base(net))
    with torch.device("meta"):
        net_meta, block = DiT(cfg).to(dtype), Block(cfg).to(dtype)
    net_meta.blocks[0].register_forward_pre_hook(lambda m, args: captured.setdefault("args", args))
    x0 = torch.empty(latent, device="meta")
    B, _, T, H, W = latent
    with torch.no_grad():  # the net itself, not a loss: only the shapes matter (camera maps for agibot configs)
        text = torch.empty(B, text_len, cfg.crossattn_proj_in_channels, device="meta")
        cond = condition.standin(cfg, x0, text, pixels=(8 * H, 8 * W))  # camera maps and actions of their shapes
        net_meta(x0, torch.ones(B, device="meta"), cond)
    wrapped = torch.nn.ModuleDict({"blocks": torch.nn.ModuleList([block])})
    if lora:
        add_lora(wrapped, lora)
    elif fp8_base:
        fp8.convert_trainable(target_linears(wrapped, LORA_TARGETS))
    block.to_empty(device=device)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(std=0.02)
    if lora and fp8_base:
        quantize_base(wrapped)
    real = lambda t: torch.randn(t.shape, device=device).to(t.dtype) if torch.is_tensor(t) else t  # noqa: E731
    costs = measure_block_costs(block, [tuple(map(real, a)) if isinstance(a, tuple) else real(a)
                                            for a in captured["args"]])
    del block
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the step's reserved memory is then its own
    return costs, plan_auto(costs, int(mem_budget_gib * 2**30), fixed, cfg.num_blocks), fixed
