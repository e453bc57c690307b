"""FP8 GEMMs for the block Linears: LoRA's frozen base stored in float8 (e4m3), or a full fine-tune's forward and
input-gradient GEMMs in fp8 (weight gradients stay bf16).

Under LoRA the base weights never train, so they can be stored once in fp8 (half of bf16: 14B's 27 GiB becomes
13.6 GiB) and both GEMMs that touch them, the forward y = x W^T and the input gradient dx = dy W, run on the fp8
tensor cores (H100/H200: ~1.75x the bf16 rate at the 14B shapes). The adapters (nets/lora.py) stay in the activation dtype,
so every trained parameter gets exact bf16/fp32 gradients; only the frozen path is quantised.

Scaling (why this layout): the weight is quantised once per output channel, W[n, :] = s_n * Wq[n, :]. The forward
quantises x per row (token), y = sx_m s_n (xq Wq^T), which is torch._scaled_mm's row-wise mode as is. The backward
contracts over n, where a per-n scale cannot go into _scaled_mm's per-column scale; instead it is folded into the
gradient before its own per-row quantisation, dx = (dy * s) Wq, so ONE fp8 copy serves both GEMMs (a per-tensor weight
scale would lose accuracy; a second, differently scaled copy would give back the memory saved). Each quantisation is one
compiled kernel on the GPU (amax and cast of a row in one pass), and each fp8 GEMM with its quantisation is a custom
op (torch.library), so activation checkpointing and compile treat it as one op.

Full fine-tuning (`Fp8Linear`, the same kernels): the weight trains, so it stays a bf16/fp32 parameter (FSDP all-gathers
it as before) and is quantised per output channel inside the forward and again in the backward (one pass over a
layer's weight, fused under compile); its gradient dW = dy^T x is a bf16 GEMM on the saved bf16 input, as without fp8
(an fp8 weight gradient would put e4m3's error into the update itself). Two of the three GEMMs per Linear are fp8.

Why hand-written rather than torchao: torchao's float8 training (Float8Linear) keeps a bf16 weight and re-quantises it
every step (no memory saved, and a weight gradient we do not need), and its inference tensor subclasses are not built
to give an input gradient; the frozen-LoRA case is a few custom ops over torch._scaled_mm.

Numerics: e4m3 keeps 3 mantissa bits, so one GEMM's relative error on random data is ~3-4% per element (averaging over
K makes the output error smaller); tests/test_fp8.py bounds it on CPU, and BENCHMARKS.md gives the loss difference
against bf16 on the reference case and over a 50-step tiny LoRA run.
"""
import torch
import torch.nn as nn

E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max  # 448
TINY = 1e-12  # amax floor: an all-zero row quantises to zeros with a finite scale
Tensor = torch.Tensor


def quantize_rows(x, col_scale=None):
    """x [M, K] (times col_scale [K] first) -> (xq [M, K] e4m3, scale [M, 1] fp32), x ~= scale * xq, each row's amax
    at 448."""
    x = x.float() if col_scale is None else x.float() * col_scale
    scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=TINY) / E4M3_MAX
    return (x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


_compiled = {}


def _quantize(x, col_scale=None):
    """quantize_rows as one fused kernel on the GPU (a row of 5120..20480 values fits one block: read x once, write
    its fp8). As separate eager kernels it costs most of the fp8 gain (measured 0.64-1.01 vs 1.24-1.42 PFLOP/s)."""
    if not x.is_cuda:
        return quantize_rows(x, col_scale)
    key = (x.dtype, col_scale is None)  # one graph each (dynamic shapes): no recompiles across layers
    if key not in _compiled:
        _compiled[key] = torch.compile(quantize_rows, dynamic=True)
    return _compiled[key](x.detach(), col_scale)  # detach: a Parameter (trainable W) would guard as another type


# The GEMMs are custom ops, opaque to torch.compile: traced as one node, they are recomputed like any op under
# activation checkpointing. (As an autograd.Function inside a compiled checkpointed block, the ops inside it were
# not recomputed but saved: 2B LoRA `block` + compile held 36.4 GiB of activations instead of 3.5 on an H200.)

@torch.library.custom_op("nanocosmos::fp8_linear", mutates_args=())
def fp8_linear(x: Tensor, w_fp8: Tensor, w_scale: Tensor) -> Tensor:
    """y = x W^T, W = w_scale * w_fp8 (per output channel): x [M, K], w_fp8 [N, K] e4m3, w_scale [N] fp32."""
    xq, x_scale = _quantize(x)
    # b must be column-major: w_fp8 is [N, K] row-major, so its transpose is a free column-major [K, N]
    return torch._scaled_mm(xq, w_fp8.t(), scale_a=x_scale, scale_b=w_scale.view(1, -1), out_dtype=x.dtype)


@torch.library.custom_op("nanocosmos::fp8_linear_dx", mutates_args=())
def fp8_linear_dx(grad: Tensor, w_fp8: Tensor, w_scale: Tensor) -> Tensor:
    """dx = grad W = (grad * s) w_fp8: the weight's per-output scale s is folded into the gradient before its row-wise
    quantisation (the contraction runs over N, where _scaled_mm's per-column scale cannot carry it)."""
    gq, g_scale = _quantize(grad, w_scale)
    ones = torch.ones(1, w_fp8.shape[1], dtype=torch.float32, device=grad.device)
    # w_fp8 [N, K] column-major: one transposed copy of this layer's fp8 weight, freed after
    return torch._scaled_mm(gq, w_fp8.t().contiguous().t(), scale_a=g_scale, scale_b=ones, out_dtype=grad.dtype)


@torch.library.custom_op("nanocosmos::fp8_linear_trainable", mutates_args=())
def fp8_linear_trainable(x: Tensor, w: Tensor) -> Tensor:
    """y = x W^T for a trainable W (x's dtype), quantised here per output channel."""
    w_fp8, w_scale = _quantize(w)
    return fp8_linear(x, w_fp8, w_scale.view(-1))


@torch.library.custom_op("nanocosmos::fp8_linear_trainable_dx", mutates_args=())
def fp8_linear_trainable_dx(grad: Tensor, w: Tensor) -> Tensor:
    w_fp8, w_scale = _quantize(w)  # again, rather than keeping every layer's fp8 copy until the backward
    return fp8_linear_dx(grad, w_fp8, w_scale.view(-1))


@fp8_linear.register_fake
def _(x, w_fp8, w_scale):
    return x.new_empty(x.shape[0], w_fp8.shape[0])


@fp8_linear_dx.register_fake
def _(grad, w_fp8, w_scale):
    return grad.new_empty(grad.shape[0], w_fp8.shape[1])


@fp8_linear_trainable.register_fake
def _(x, w):
    return x.new_empty(x.shape[0], w.shape[0])


@fp8_linear_trainable_dx.register_fake
def _(grad, w):
    return grad.new_empty(grad.shape[0], w.shape[1])


def _frozen_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[1], inputs[2])


def _frozen_backward(ctx, grad):
    w_fp8, w_scale = ctx.saved_tensors
    return (fp8_linear_dx(grad, w_fp8, w_scale) if ctx.needs_input_grad[0] else None), None, None


def _trainable_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)  # x and W, as F.linear saves them: no extra memory


def _trainable_backward(ctx, grad):
    x, w = ctx.saved_tensors
    grad_x = fp8_linear_trainable_dx(grad, w) if ctx.needs_input_grad[0] else None
    # dW = dy^T x as a bf16 GEMM of the exact input: e4m3's error stays out of the update itself
    grad_w = grad.t() @ x if ctx.needs_input_grad[1] else None
    return grad_x, grad_w


fp8_linear.register_autograd(_frozen_backward, setup_context=_frozen_setup)
fp8_linear_trainable.register_autograd(_trainable_backward, setup_context=_trainable_setup)
GEMM_OPS = (torch.ops.nanocosmos.fp8_linear, torch.ops.nanocosmos.fp8_linear_trainable)  # sac.py's save lists


class Fp8Linear(nn.Linear):
    """nn.Linear whose forward and input-gradient GEMMs run in fp8 (full fine-tuning); same parameters and keys."""

    def forward(self, x):
        out = fp8_linear_trainable(x.reshape(-1, x.shape[-1]), self.weight.to(x.dtype))
        out = out.view(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias.to(out.dtype)


def convert_trainable(linears):
    """Swap the Linears of `linears` ([(name, nn.Linear)]: lora.target_linears(model, lora.LORA_TARGETS)) to Fp8Linear
    in place; keys unchanged. Works on meta (before FSDP and compile). Returns how many were swapped."""
    check_features(linears)
    for _, module in linears:
        module.__class__ = Fp8Linear
    return len(linears)


def linear(x, w_fp8, w_scale, bias=None):
    """F.linear for an fp8 frozen weight: x [..., K] in bf16/fp32, w_fp8 [N, K] e4m3, w_scale [N] fp32."""
    out = fp8_linear(x.reshape(-1, x.shape[-1]), w_fp8, w_scale).view(*x.shape[:-1], w_fp8.shape[0])
    return out if bias is None else out + bias.to(out.dtype)


@torch.no_grad()
def quantize_weight(weight):
    """[N, K] float weight -> (w_fp8 [N, K] e4m3, w_scale [N] fp32), per output channel."""
    w_fp8, scale = quantize_rows(weight.detach())
    return w_fp8, scale.view(-1)


def check_features(linears):
    """torch._scaled_mm needs K and N multiples of 16 on CUDA: say which Linear breaks it, before any work."""
    bad = [f"{name} ({m.out_features}x{m.in_features})" for name, m in linears
           if m.in_features % 16 or m.out_features % 16]
    if bad:
        raise ValueError(f"--fp8: fp8 GEMMs need in/out features that are multiples of 16; {', '.join(bad[:4])} are "
                         "not: train this config without --fp8")


def stored_bytes(weight):
    """Bytes of a weight held as quantize_weight holds it: 1-byte e4m3 values and an fp32 scale per output row."""
    return weight.numel() + 4 * weight.shape[0]


def fp8_bytes(model):
    """Bytes held by the fp8 base weights and their scales."""
    return sum(b.numel() * b.element_size() for name, b in model.named_buffers()
               if name.endswith(("weight_fp8", "weight_scale")))
