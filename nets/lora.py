"""LoRA for the DiT: low-rank adapters on the block Linears, with the base keys unchanged.

`add_lora(net, rank, alpha, targets)` turns the target `nn.Linear`s of every block into `LoRALinear` (a subclass:
`weight` keeps its key, the adapters add `lora_a` / `lora_b`) and freezes everything else; the 14B preset (r=32 on
self/cross q,k,v,o and both MLP layers) trains exactly 143,917,056 parameters. `set_lora_enabled(net, False)` gives
the frozen reference policy (GRPO's KL).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from base import fp8
from base.collectives import local_rows
from model import adapter_seed


class LoRALinear(nn.Linear):
    """nn.Linear plus a low-rank update; `weight`/`bias` keep their keys, the adapters add `lora_a`/`lora_b`."""

    def add_adapter(self, rank, alpha, seed):
        self.rank, self.scale, self.lora_enabled = rank, alpha / rank, True
        w = self.weight
        self.lora_a = nn.Linear(self.in_features, rank, bias=False, device=w.device, dtype=torch.float32)
        self.lora_b = nn.Linear(rank, self.out_features, bias=False, device=w.device, dtype=torch.float32)
        if not w.is_meta:
            self.reset_lora(seed)

    @torch.no_grad()
    def reset_lora(self, seed):
        """A's values depend on `seed` only, never on how FSDP shards A: drawn whole on the CPU, each rank copies its
        rows (a draw on the sharded tensor would give every layout, e.g. another --cp, a different model)."""
        full = torch.empty(self.lora_a.weight.shape)
        nn.init.kaiming_uniform_(full, a=math.sqrt(5), generator=torch.Generator().manual_seed(seed))
        local, lo, hi, _ = local_rows(self.lora_a.weight.data)
        local.copy_(full[lo:hi])
        nn.init.zeros_(self.lora_b.weight)  # the adapted model starts exactly at the base model

    def forward(self, x):
        if getattr(self, "weight_fp8", None) is not None:  # lora.quantize_base: the frozen base in fp8 GEMMs
            out = fp8.linear(x, self.weight_fp8, self.weight_scale, self.bias)
        else:
            out = super().forward(x)
        if not self.lora_enabled:
            return out
        # fp32 master adapters, computed in the activation dtype (as under FSDP2's bf16 param_dtype or autocast): an
        # fp32 copy of x would be saved for backward by every adapter (2x x's bytes) and run as slow fp32 GEMMs
        a, b = self.lora_a.weight.to(x.dtype), self.lora_b.weight.to(x.dtype)
        return out + F.linear(F.linear(x, a), b) * self.scale


LORA_TARGETS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.output_proj",
                "cross_attn.q_proj", "cross_attn.k_proj", "cross_attn.v_proj", "cross_attn.output_proj",
                "mlp.layer1", "mlp.layer2")


def target_linears(model, targets=LORA_TARGETS):
    """(name, module) of the plain nn.Linears of the blocks named by `targets` (add_lora's, fp8.convert_trainable's)."""
    return [(name, module) for name, module in model.named_modules()
            if type(module) is nn.Linear and name.startswith("blocks.") and name.split(".", 2)[2] in targets]


def add_lora(model, rank, alpha=None, targets=LORA_TARGETS):
    """Turn the target Linears of every block into LoRALinear in place, freeze everything else.

    Returns the adapter parameters (the only ones left trainable). alpha defaults to rank (scale 1).
    """
    if rank <= 0:
        raise ValueError(f"LoRA rank must be positive, got {rank}")
    alpha = float(rank if alpha is None else alpha)
    model.requires_grad_(False)
    adapted = []
    seed = adapter_seed()
    for name, module in target_linears(model, targets):
        module.__class__ = LoRALinear  # keeps the same weight Parameter object and its key
        module.add_adapter(rank, alpha, seed + len(adapted))
        adapted.append(name)
    if not adapted:
        raise ValueError(f"no Linear matched the LoRA targets {targets}")
    params = [p for m in model.modules() if isinstance(m, LoRALinear) for p in (m.lora_a.weight, m.lora_b.weight)]
    for p in params:
        p.requires_grad_(True)
    return params


def adapted_linears(model):
    """The LoRALinear modules of `model` (add_lora's), in module order: the frozen base that --fp8 holds in e4m3."""
    return [m for m in model.modules() if isinstance(m, LoRALinear)]


def set_lora_enabled(model, enabled):
    """Switch every adapter on/off: the LoRA-disabled model is the frozen reference policy (GRPO KL)."""
    for m in adapted_linears(model):
        m.lora_enabled = enabled


def folded_weight(m):
    """W + scale * B @ A, in fp32, cast back to W's dtype: the one weight a LoRALinear computes with."""
    return (m.weight.float() + m.lora_b.weight.float() @ m.lora_a.weight.float() * m.scale).to(m.weight.dtype)


@torch.no_grad()
def merged_state_dict(model):
    """The model's state_dict with every adapter folded into its base weight under the plain keys, no lora_a /
    lora_b: the network a LoRA run computes, for the config without LoRA."""
    state = {k: v for k, v in model.state_dict().items() if not k.endswith((".lora_a.weight", ".lora_b.weight"))}
    for name, m in model.named_modules():
        if isinstance(m, LoRALinear) and m.lora_enabled:
            state[name + ".weight"] = folded_weight(m)
    return state


@torch.no_grad()
def fold_lora_(model):
    """Fold every enabled adapter into its base weight in place and switch it off, for sampling only (the adapters
    train no more): one GEMM a linear instead of three, two casts and an add (a 2B net has 560 adapters; their cost
    unfolded: BENCHMARKS.md, policyeval). Call it before casting to bf16: one rounding, as merged_state_dict's."""
    for m in adapted_linears(model):
        if getattr(m, "weight_fp8", None) is not None:
            raise ValueError("fold_lora_: the base is held in fp8 (--fp8): folding would change weights fp8 never reads")
        if m.lora_enabled:
            m.weight.copy_(folded_weight(m))
            m.lora_enabled = False
    return model


# -----------------------------------------------------------------------------
# --fp8 with LoRA: the frozen base held in e4m3 (base/fp8.py's GEMMs run it in LoRALinear.forward)


def check_fp8_shapes(model):
    """The adapted Linears of a LoRA model (add_lora), checked as fp8.check_features does."""
    fp8.check_features([(name, m) for name, m in model.named_modules() if isinstance(m, LoRALinear)])


@torch.no_grad()
def quantize_base(model):
    """Every LoRALinear of `model` (add_lora) swaps its frozen weight for an fp8 copy, in place.

    The fp32/bf16 weight Parameter is deleted (that is the memory saved); the fp8 weight and its scale are non-persistent
    buffers, so state_dict() holds the adapters and every other key as before minus the adapted Linears' base weights
    (a LoRA run saves adapters only; the base comes from --init). Returns the number of Linears converted."""
    n = 0
    for module in model.modules():
        if isinstance(module, LoRALinear) and "weight" in module._parameters:
            weight = module._parameters.pop("weight")
            if weight.requires_grad:
                raise ValueError("lora.quantize_base: an adapted Linear's base weight is trainable; only a frozen base "
                                 "(add_lora) can be held in fp8")
            w_fp8, w_scale = fp8.quantize_weight(weight)
            del weight
            module.register_buffer("weight_fp8", w_fp8, persistent=False)
            module.register_buffer("weight_scale", w_scale, persistent=False)
            n += 1
    return n
