"""Activation checkpointing for the DiT blocks: small named policies, validated when they are built.

Each `model.blocks[i]` has a `checkpoint_fn` attribute (None by default). `Block.forward` calls
`checkpoint_fn(self._forward, *args)` when it is set and grad is enabled, so the checkpoint lives *inside* the
block: module names, `named_parameters()` and state_dict keys never change, FSDP hooks stay on the block, and
`block.compile()` compiles the checkpoint call with it. Usage (train.py / grpo.py / bench.py):

    sac.apply(model, "selective", every=1)   # validated here: a bad mode is a ValueError, not a crash later
    ... first training step ...
    sac.check_first_step("selective")        # raises if the save list never matched a real kernel

Modes (docs/memory.md has the measured memory and time per mode, and how to choose):
    none       no checkpointing: every activation is kept
    block      full recompute: only the block inputs are kept
    mm         keep matmul outputs, recompute attention and elementwise work
    attn       keep attention (SDPA) outputs, recompute matmuls and elementwise work
    selective  keep matmul and attention outputs, recompute only the cheap elementwise work

Upstream's full-recompute mode handed `context_fn=None` to the checkpoint wrapper and crashed at the first
forward; here every mode has a callable context function and `make_checkpoint_fn` runs a tiny checkpointed
forward+backward before anything is returned.
"""
import functools
from collections import Counter

import torch
import torch.nn as nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts, noop_context_fn

MODES = ("none", "block", "mm", "attn", "selective")

aten = torch.ops.aten
# Matched on the OpOverloadPacket at dispatch level (below autograd, so nn.Linear shows up as mm/addmm).
# aten.linear is listed because some backends register it as a leaf.
MM_OPS = frozenset({aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten.linear})
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
    for name, m in model.named_modules():
        # a dropout mask drawn in the forward must be redrawn identically in the recompute; our DiT has none,
        # and preserve_rng_state=True would cover one, but refuse rather than rely on it silently
        if isinstance(m, nn.Dropout) and m.p > 0 and mode != "none":
            raise ValueError(f"{name}: dropout p={m.p} under activation checkpointing; the DiT is built without")
    fn = make_checkpoint_fn(mode)
    wrapped = []
    for i, block in enumerate(model.blocks):
        on = fn is not None and i % every == 0
        block.checkpoint_fn = fn if on else None
        if on:
            wrapped.append(i)
    reset_counters()
    return wrapped


def check_first_step(mode):
    """After the first training step: assert the save list matched real kernels, else raise with what was seen.

    Catches kernel-name drift (cuDNN vs flash SDPA, deterministic mode switching the kernel, a new backend), which
    would otherwise silently recompute attention or matmuls. Returns the per-group save counts.
    """
    validate(mode)
    counts = {g: SAVED_GROUPS[g] for g in ("mm", "attn")}
    missing = [g for g in sorted(SAVE_GROUPS[mode]) if counts[g] == 0]
    if missing:
        seen = ", ".join(f"{k} x{v}" for k, v in SEEN.most_common(40)) or "nothing (were any blocks checkpointed?)"
        raise RuntimeError(f"sac mode {mode!r}: no {'/'.join(missing)} op was saved in the first step; the save "
                           f"lists do not name the kernels that ran. Ops seen in checkpointed blocks: {seen}")
    return counts
