"""base/fp8.py: the frozen LoRA base in fp8 (torch._scaled_mm runs on the CPU too): GEMM numerics, the module swap, GRPO's
ratio = 1 on the fp8 path, train.py's --fp8 checks, and LoRA adapters that do not depend on the FSDP layout."""
import pytest
import torch
import torch.nn.functional as F
from rl_utils import LATENT, perturb, rollout, tiny_policy

import grpo
import train
from base import collectives, fp8
from base.inits import get_config
from condition import Condition, condition_mask
from dist_utils import run_dist
from model import build_model
from nets import lora
from nets.lora import LoRALinear, add_lora


def rel(a, b):
    return float((a.detach().float() - b.detach().float()).norm() / b.detach().float().norm())


def test_gemm_and_input_gradient_within_e4m3_error():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 40, 256, generator=g, requires_grad=True)
    w = torch.randn(128, 256, generator=g) * torch.linspace(0.01, 3, 128)[:, None]  # per-channel scales differ
    grad = torch.randn(3, 40, 128, generator=g) * torch.linspace(5, 0.1, 128)
    w_fp8, w_scale = fp8.quantize_weight(w)
    assert w_fp8.dtype == torch.float8_e4m3fn and w_scale.shape == (128,)
    y = fp8.linear(x, w_fp8, w_scale)
    (dx,) = torch.autograd.grad(y, x, grad)
    y_ref = F.linear(x, w)
    (dx_ref,) = torch.autograd.grad(y_ref, x, grad)
    # e4m3 (3 mantissa bits): ~3-4% per element, averaged down over K; a silent bf16/fp32 path would give ~0
    assert 1e-3 < rel(y, y_ref) < 0.04 and 1e-3 < rel(dx, dx_ref) < 0.04
    assert y.shape == (3, 40, 128) and dx.shape == x.shape
    # the backward folds the weight's per-channel scale into dy: without it dx would be off by those scales
    dx_unscaled = torch.autograd.grad(F.linear(x, w_fp8.float()), x, grad)[0]
    assert rel(dx_unscaled, dx_ref) > 0.5


def test_zero_rows_and_large_values_stay_finite():
    x = torch.zeros(4, 32)
    x[1] = 1e4
    w_fp8, w_scale = fp8.quantize_weight(torch.randn(16, 32))
    y = fp8.linear(x, w_fp8, w_scale)
    assert torch.isfinite(y).all() and torch.equal(y[0], torch.zeros(16))


def test_quantize_base_swaps_the_frozen_weights_only():
    net, params = tiny_policy()
    perturb(params)
    keys = set(net.state_dict())
    base = {n for n, m in net.named_modules() if isinstance(m, LoRALinear)}
    x = torch.randn(1, *LATENT)
    t = torch.full((1, LATENT[1]), 0.5)
    text = torch.randn(1, 8, 1024)
    mask = condition_mask(x, 1)
    out_ref = net(x, t, Condition(text, condition_mask=mask))
    out_ref.square().mean().backward()
    grads_ref = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    n = lora.quantize_base(net)
    assert n == len(base) == 20
    assert set(net.state_dict()) == keys - {f"{b}.weight" for b in base}  # adapters + the rest, unchanged keys
    assert fp8.fp8_bytes(net) == sum(m.weight_fp8.numel() + 4 * m.out_features for m in net.modules()
                                     if isinstance(m, LoRALinear))
    out = net(x, t, Condition(text, condition_mask=mask))
    out.square().mean().backward()
    assert 1e-4 < rel(out, out_ref) < 0.05
    # tiny widths (K = 64..256) average little of e4m3's per-element error: ~10% on the adapters' gradients here
    flat = torch.cat([p.grad.flatten() for p in params])
    assert rel(flat, torch.cat([g.flatten() for g in grads_ref])) < 0.15
    assert all(rel(p.grad, g) < 0.3 for p, g in zip(params, grads_ref))
    assert [p for p in net.parameters() if p.requires_grad] == params  # the adapters still train, nothing else
    assert lora.quantize_base(net) == 0  # idempotent: nothing left to swap


def test_trainable_base_and_bad_shapes_are_refused():
    net = build_model(get_config("tiny"))
    add_lora(net, 4)
    next(m for m in net.modules() if isinstance(m, LoRALinear)).weight.requires_grad_(True)
    with pytest.raises(ValueError, match="trainable"):
        lora.quantize_base(net)
    odd = torch.nn.Sequential()
    odd.blocks = torch.nn.ModuleList([torch.nn.Module()])
    odd.blocks[0].mlp = torch.nn.Module()
    odd.blocks[0].mlp.layer1 = torch.nn.Linear(24, 40, bias=False)
    add_lora(odd, 2, targets=("mlp.layer1",))
    with pytest.raises(ValueError, match="multiples of 16.*blocks.0.mlp.layer1 \\(40x24\\)"):
        lora.check_fp8_shapes(odd)


def test_grpo_first_ratio_is_exactly_one_on_the_fp8_path():
    net, params = tiny_policy()
    perturb(params)
    lora.quantize_base(net)  # rollout and training both run the fp8 base
    cfg = grpo.GRPOConfig(data_coef=0.0, num_steps=4, kl_coef=0.004)
    ro = rollout(net, cfg)
    opt = grpo.lora_optimizer(net, params, cfg)
    stats = grpo.grpo_update(net, opt, params, [ro], [torch.tensor([1.0, -1.0])], cfg)
    assert stats["first_logp_equal"] and stats["first_max_abs_dlogp"] == 0.0 and stats["first_ratio"] == 1.0
    assert stats["grads_outside_params"] == [0] and stats["grad_norm"][0] > 0


def test_trainable_linear_fp8_gemms_exact_weight_gradient():
    g = torch.Generator().manual_seed(1)
    lin = torch.nn.Linear(256, 128, bias=False)
    ref = torch.nn.Linear(256, 128, bias=False)
    ref.weight.data.copy_(lin.weight.data)
    ref.weight.data[:8] *= 40  # rows of very different scale
    lin.weight.data.copy_(ref.weight.data)
    model = torch.nn.Module()
    model.blocks = torch.nn.ModuleList([torch.nn.Module()])
    model.blocks[0].mlp = torch.nn.Module()
    model.blocks[0].mlp.layer1 = lin
    assert fp8.convert_trainable(lora.target_linears(model, ("mlp.layer1",))) == 1
    assert isinstance(lin, fp8.Fp8Linear)
    assert set(model.state_dict()) == {"blocks.0.mlp.layer1.weight"}
    x = torch.randn(2, 50, 256, generator=g)
    x_ref = x.clone().requires_grad_(True)
    x.requires_grad_(True)
    grad = torch.randn(2, 50, 128, generator=g)
    y, y_ref = lin(x), ref(x_ref)
    y.backward(grad)
    y_ref.backward(grad)
    assert 1e-3 < rel(y, y_ref) < 0.04 and 1e-3 < rel(x.grad, x_ref.grad) < 0.04
    # the weight gradient is the plain GEMM dy^T x of the exact input: no fp8 error in the update
    torch.testing.assert_close(lin.weight.grad, ref.weight.grad, rtol=1e-5, atol=1e-5)


def test_fp8_flags_run_through_bench_and_parse_in_train():
    import bench
    for flags in (["--fp8", "--sac", "auto", "--mem-budget", "1"], ["--lora", "4", "--fp8", "--sac", "block"]):
        res = bench.run(bench.parse_args(["--device", "cpu", "--dtype", "float32", "--config", "tiny", "--frames", "9",
                                          "--height", "32", "--width", "32", "--text-len", "8", "--steps", "1",
                                          "--warmup", "1", *flags]))
        assert res["status"] == "ok" and res["fp8"] and torch.isfinite(torch.tensor(res["loss"]))
    with pytest.raises(ValueError, match="--fp8 --lora with --world"):
        bench.main(["--fp8", "--lora", "4", "--world", "2", "--device", "cpu", "--dtype", "float32"])
    assert train.parse_config(["--fp8"]).fp8 and train.parse_config(["--fp8", "--lora", "4"]).fp8


def _sharded_lora(rank, ws):
    """LoRA A after FSDP2 sharding and init_weights: gathered whole (rank 0 returns it)."""
    from torch.distributed.tensor import DTensor
    torch.manual_seed(0)
    with torch.device("meta"):
        net = build_model(get_config("tiny"))
    add_lora(net, 4)
    collectives.shard_model(net, torch.device("cpu"))
    net.to_empty(device="cpu")
    torch.manual_seed(0)
    net.init_weights()
    return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
            for n, p in net.named_parameters() if "lora_" in n}


def test_lora_init_does_not_depend_on_the_sharding():
    """The same seed gives the same adapters on 1 process and sharded over 2 (before: each layout drew its own A)."""
    torch.manual_seed(0)
    with torch.device("meta"):
        net = build_model(get_config("tiny"))
    add_lora(net, 4)
    net.to_empty(device="cpu")
    torch.manual_seed(0)
    net.init_weights()
    whole = {n: p.detach() for n, p in net.named_parameters() if "lora_" in n}
    sharded = run_dist(_sharded_lora, 2, 120)[0]
    assert whole.keys() == sharded.keys() and all(torch.equal(whole[n], sharded[n]) for n in whole)
    assert any(whole[n].abs().sum() > 0 for n in whole if "lora_a" in n)


def test_auto_plan_counts_the_fp8_base_whole_on_every_rank():
    """train.py --fp8 keeps the frozen base out of FSDP (whole on each rank, 1 B per weight): --sac auto's fixed bytes
    must say so, or a plan at W = 8 would count 1/8 of it in bf16 and promise memory that is not there."""
    import sac
    from sac import shard_numel
    with torch.device("meta"):
        net = build_model(get_config("tiny"))
    add_lora(net, 4)
    args = (net, 8, torch.device("cpu"), torch.float32, (1, 16, 3, 8, 8), 8, 4, 1.0)
    fixed_bf16 = sac.auto_plan(*args)[2]
    fixed_fp8 = sac.auto_plan(*args, fp8_base=True)[2]
    base = [m.weight for m in net.modules() if isinstance(m, LoRALinear)]
    assert fixed_fp8 - fixed_bf16 == sum(p.numel() + 4 * p.shape[0] - shard_numel(p, 8, 0) * 4 for p in base) > 0
