"""model.py: parity with the upstream reference tensors, released key tables, LoRA, gradients, numerics."""
import glob
import os

import pytest
import torch

import check_reference
from base.inits import get_config
from condition import Condition, condition_mask
from model import DiT, build_model, num_params
from nets.edm import denoise
from nets.lora import LoRALinear, add_lora, fold_lora_, merged_state_dict, set_lora_enabled

REF = os.path.join(os.path.dirname(__file__), "data", "reference")
DIT_CASES = sorted(p for p in glob.glob(os.path.join(REF, "*.json"))
                   if os.path.exists(p[: -len(".json")] + ".weights.safetensors") and "vae_" not in p)


def assert_within(results):
    bad = [(label, err, bound) for label, err, bound in results if not err <= bound]
    assert not bad, bad


@pytest.mark.parametrize("case", DIT_CASES, ids=lambda p: os.path.basename(p))
def test_reference_case(case):
    results = check_reference.check_dit_case(case)
    assert any(label.startswith("out.") for label, _, _ in results)
    assert_within(results)


def test_sampler_and_components_reference():
    assert_within(check_reference.check_sampler(REF))
    assert_within(check_reference.check_sampler_step(os.path.join(REF, "sampler_step_ref.safetensors")))
    assert_within(check_reference.check_components(os.path.join(REF, "components_ref.json")))


def test_released_key_tables():
    results = check_reference.check_released_keys(os.path.join(REF, "released_configs_keys.json"))
    assert len(results) == 10
    assert_within(results)


@pytest.mark.parametrize("name,count", [("v2w-2b", 1_956_413_440), ("v2w-14b", 14_265_285_632),
                                        ("t2i-0.6b", 597_536_000), ("t2i-2b", 1_956_405_248),
                                        ("t2i-14b", 14_265_265_152)])
def test_named_config_parameter_counts(name, count):
    with torch.device("meta"):
        net = DiT(get_config(name))
    assert num_params(net) == count


def test_lora_14b_preset_counts_exactly():
    with torch.device("meta"):
        net = DiT(get_config("v2w-14b"))
    base_keys = set(net.state_dict())
    params = add_lora(net, rank=32)
    assert sum(p.numel() for p in params) == 143_917_056
    assert num_params(net, trainable_only=True) == 143_917_056
    keys = set(net.state_dict())
    assert base_keys <= keys  # base weights keep their exact keys
    assert all(".lora_a." in k or ".lora_b." in k for k in keys - base_keys)


def tiny_inputs(cfg, B=2, T=3, H=8, W=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, cfg.in_channels, T, H, W, generator=g)
    t = torch.rand(B, T, generator=g)
    ctx = torch.randn(B, 7, cfg.crossattn_emb_channels, generator=g)
    return x, t, ctx


def test_no_wrapper_segments_and_gradients_reach_every_parameter():
    torch.manual_seed(0)
    net = build_model(get_config("tiny"))
    x, t, ctx = tiny_inputs(net.cfg)
    net(x, t, Condition(ctx, condition_mask=condition_mask(x, 1))).square().mean().backward()
    names = [n for n, _ in net.named_parameters()] + list(net.state_dict())
    assert not [n for n in names if "_checkpoint_wrapped_module" in n or "_orig_mod" in n or n.startswith("module.")]
    no_grad = [n for n, p in net.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert not no_grad, no_grad


def test_lora_trains_only_adapters_and_starts_at_base():
    torch.manual_seed(0)
    net = build_model(get_config("tiny"))
    x, t, ctx = tiny_inputs(net.cfg)
    with torch.no_grad():
        base = net(x, t, Condition(ctx))
    params = add_lora(net, rank=4, alpha=8)
    assert isinstance(net.blocks[0].mlp.layer1, LoRALinear)
    with torch.no_grad():
        assert torch.equal(net(x, t, Condition(ctx)), base)  # lora_b starts at zero
    net(x, t, Condition(ctx)).square().mean().backward()
    got = {n for n, p in net.named_parameters() if p.grad is not None}
    assert got == {n for n, p in net.named_parameters() if p.requires_grad}
    assert all(".lora_" in n for n in got)
    assert any(p.grad.abs().sum() > 0 for p in params)
    with torch.no_grad():
        for p in params:
            p.add_(0.1)
        moved = net(x, t, Condition(ctx))
        set_lora_enabled(net, False)
        assert torch.equal(net(x, t, Condition(ctx)), base)  # adapters off = the reference policy
        set_lora_enabled(net, True)
        assert not torch.equal(moved, base)


def test_folding_the_adapters_in_computes_the_same_network():
    """policyeval.py samples a LoRA run with its adapters folded into the weights: the same outputs (fp32 rounding
    apart), the adapters switched off, the weights merged_state_dict's."""
    torch.manual_seed(0)
    net = build_model(get_config("tiny"))
    x, t, ctx = tiny_inputs(net.cfg)
    add_lora(net, rank=4, alpha=8)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, LoRALinear):
                m.lora_b.weight.normal_(0, 0.05)
        set_lora_enabled(net, False)
        base = net(x, t, Condition(ctx))
        set_lora_enabled(net, True)
        unfolded, merged = net(x, t, Condition(ctx)), merged_state_dict(net)
        fold_lora_(net)
        folded = net(x, t, Condition(ctx))
    assert not any(m.lora_enabled for m in net.modules() if isinstance(m, LoRALinear))
    assert (unfolded - base).abs().max() > 1e-3  # the adapters matter
    assert (folded - unfolded).abs().max() < 1e-5 * unfolded.abs().max()
    state = net.state_dict()
    assert all(torch.equal(state[k], v) for k, v in merged.items())


def test_bf16_model_rope_equals_fp32_and_output_close():
    torch.manual_seed(0)
    net = build_model(get_config("tiny"))
    net16 = build_model(get_config("tiny"))
    net16.load_state_dict(net.state_dict())
    net16 = net16.to(torch.bfloat16)
    assert net16.pos_embedder.seq.dtype == torch.bfloat16  # buffers got cast, the angles must not care
    a32 = net.pos_embedder.angles(24, 27, 48, None, "cpu")
    a16 = net16.pos_embedder.angles(24, 27, 48, None, "cpu")
    assert a16.dtype == torch.float32 and torch.equal(a16, a32)
    x, t, ctx = tiny_inputs(net.cfg)
    with torch.no_grad():
        y32, y16 = net(x, t, Condition(ctx)), net16(x, t, Condition(ctx))
    assert y16.dtype == torch.bfloat16
    assert (y16.float() - y32).abs().max() < 0.1 * y32.abs().max()


def test_denoise_replaces_conditioning_frames_and_is_velocity_parameterised():
    torch.manual_seed(0)
    net = build_model(get_config("tiny"))
    x0, t, ctx = tiny_inputs(net.cfg)
    sigma = torch.tensor([0.5, 3.0])
    eps = torch.randn_like(x0)
    x_sigma = x0 + sigma.view(-1, 1, 1, 1, 1) * eps
    mask = condition_mask(x0, torch.tensor([1, 2]))
    with torch.no_grad():
        x0_hat, velocity = denoise(net, x_sigma, sigma, Condition(ctx, gt_frames=x0, condition_mask=mask))
    assert torch.equal(x0_hat[0, :, :1], x0[0, :, :1]) and torch.equal(x0_hat[1, :, :2], x0[1, :, :2])
    t_ = (sigma / (1 + sigma)).view(-1, 1, 1, 1, 1)
    expected = (1 - t_) * x_sigma - t_ * velocity
    assert torch.allclose(x0_hat[0, :, 1:], expected[0, :, 1:], atol=1e-6)


def test_bad_inputs_are_clear_errors():
    net = build_model(get_config("tiny"))
    x, t, ctx = tiny_inputs(net.cfg, H=9)
    with pytest.raises(ValueError, match="not divisible by patch"):
        net(x, t[:, :1], Condition(ctx))
    x, t, ctx = tiny_inputs(net.cfg)
    with pytest.raises(ValueError, match="timesteps"):
        net(x, torch.rand(2, 2), Condition(ctx))
    with pytest.raises(ValueError, match="unknown DiT config"):
        get_config("v2w-3b")
    with pytest.raises(ValueError, match="not understood"):
        check_reference.config_from_upstream("MiniTrainDIT", {"model_channels": 64, "bogus": 1})


def test_condition_survives_fsdp2_input_handling():
    """FSDP2's root pre-forward hook rebuilds dataclass inputs field by field (torch.distributed.utils.
    _apply_to_tensors: the mixed-precision cast when cast_forward_inputs is on): tensors are cast, None fields,
    the fps float and the key tuple stay, and the net's output is that of the cast inputs."""
    from functools import partial

    from torch.distributed.fsdp._fully_shard._fsdp_common import _cast_fp_tensor
    from torch.distributed.utils import _apply_to_tensors
    net = build_model(get_config("tiny"))
    x, t, ctx = tiny_inputs(net.cfg)
    cond = Condition(ctx, condition_mask=condition_mask(x, 1), fps=24.0, key=("episode", 3))
    cast = _apply_to_tensors(partial(_cast_fp_tensor, torch.bfloat16), cond)
    assert isinstance(cast, Condition) and cast is not cond
    assert cast.crossattn_emb.dtype == cast.condition_mask.dtype == torch.bfloat16
    assert (cast.gt_frames, cast.camera, cast.fps, cast.key) == (None, None, 24.0, ("episode", 3))
    with torch.no_grad():
        want = net(x, t, Condition(ctx.bfloat16(), condition_mask=condition_mask(x, 1).bfloat16(), fps=24.0))
        assert torch.equal(net(x, t, cast), want)


def test_compiled_build_never_falls_back_to_eager_and_compile_seconds_counts():
    """engine/build.py's --compile: GRPO's block variants fit under the recompile limit, and past it dynamo raises instead
    of running eager in silence; compile_seconds (train.py's s_compile) grows on a compile and not on a cache hit."""
    from engine import build
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=False, recompile_limit=8):  # restored on exit
        net = build.build(build.NetSpec(config="tiny", compile=True), torch.device("cpu"))
        assert torch._dynamo.config.fail_on_recompile_limit_hit
        assert torch._dynamo.config.recompile_limit >= build.RECOMPILE_LIMIT
    assert all(block._compiled_call_impl is not None for block in net.blocks)  # nn.Module.compile, in place
    fn = torch.compile(lambda x: torch.sin(x) * 2, backend="eager")  # no inductor: a second, not a minute, on CPU
    before = build.compile_seconds()
    fn(torch.ones(3))
    compiled = build.compile_seconds()
    fn(torch.ones(3))
    assert compiled > before and build.compile_seconds() == compiled
