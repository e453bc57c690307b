"""sac.py: every mode is validated, keeps keys, reproduces the `none` gradients bit for bit, and recomputes
exactly what its name says (counted with a TorchDispatchMode). Plus bench.py's FLOP formula and a CPU smoke run.

Bitwise equality holds here because recomputation re-runs the same CPU kernels on the same shapes and, in fp32,
those kernels are deterministic; on the GPU the same holds only under torch.use_deterministic_algorithms
(docs/memory.md, "Recompute and determinism").
"""
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

import bench
import sac
from base.inits import get_config
from condition import Condition, condition_mask
from model import build_model
from nets.edm import denoise
from nets.flops import model_flops
from nets.lora import add_lora


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.counts = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def tiny_model(num_blocks=2, lora=0):
    torch.manual_seed(0)
    model = build_model(get_config("tiny", num_blocks=num_blocks))
    if lora:
        add_lora(model, lora)
        with torch.no_grad():  # lora_b starts at zero; make the adapters matter for the comparison
            for n, p in model.named_parameters():
                if ".lora_b." in n:
                    p.normal_(std=0.05)
    return model


def batch():
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(1, 16, 2, 8, 8, generator=g)
    eps = torch.randn(1, 16, 2, 8, 8, generator=g)
    return x0, eps, torch.randn(1, 7, 1024, generator=g), condition_mask(x0, 1)


def step(model, mode, every=1):
    """One loss.backward() under `mode`; returns (output, grads by name, op counts during backward)."""
    sac.apply(model, mode, every)
    model.zero_grad(set_to_none=True)
    x0, eps, text, mask = batch()
    sigma = torch.tensor([0.8])
    _, velocity = denoise(model, x0 + sigma * eps, sigma, Condition(text, gt_frames=x0, condition_mask=mask))
    loss = ((velocity - (eps - x0)) ** 2 * (1 - mask)).mean()
    with OpCounter() as counter:
        loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return velocity.detach(), grads, counter.counts


SDPA_CPU = "_scaled_dot_product_flash_attention_for_cpu"


def test_unknown_mode_and_bad_every_raise():
    with pytest.raises(ValueError, match="valid: none, block, mm, attn, selective"):
        sac.make_checkpoint_fn("block_wise")
    with pytest.raises(ValueError, match="valid"):
        sac.apply(tiny_model(), "mm_only")
    for every in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="every"):
            sac.apply(tiny_model(), "block", every)


@pytest.mark.parametrize("mode", sac.MODES)
def test_every_mode_has_a_callable_context_fn(mode):
    ctx = sac.context_fn(mode)
    assert ctx is not None and callable(ctx)
    pair = ctx()
    assert len(pair) == 2 and all(hasattr(c, "__enter__") and hasattr(c, "__exit__") for c in pair)
    fn = sac.make_checkpoint_fn(mode)
    if mode == "none":
        assert fn is None
    else:
        assert callable(fn) and fn.keywords["use_reentrant"] is False and fn.keywords["preserve_rng_state"] is True
        assert fn.keywords.get("context_fn", "left out") is not None  # upstream's block_wise crash: None here


@pytest.mark.parametrize("mode,every", [(m, 1) for m in sac.MODES[1:]] + [("selective", 2), ("block", 2)])
def test_grads_bitwise_equal_to_none(mode, every):
    model = tiny_model(num_blocks=3)
    out0, grads0, _ = step(model, "none")
    out, grads, _ = step(model, mode, every)
    assert torch.equal(out, out0)
    assert grads.keys() == grads0.keys() and len(grads) == len(list(model.parameters()))
    bad = [n for n in grads if not torch.equal(grads[n], grads0[n])]
    assert not bad, bad


def test_recompute_counts_per_mode():
    """Backward-pass op counts: what each mode recomputes on top of `none`'s backward (2 blocks, 16 mm each)."""
    model = tiny_model(num_blocks=2)
    counts = {mode: step(model, mode)[2] for mode in sac.MODES}
    mm = {mode: c["mm"] + c["addmm"] for mode, c in counts.items()}
    sdpa = {mode: c[SDPA_CPU] for mode, c in counts.items()}
    ln = {mode: c["native_layer_norm"] for mode, c in counts.items()}
    per_block_mm = 16  # 6 adaLN-LoRA, self q/k/v/o, cross q/k/v/o, mlp layer1/layer2
    assert mm["mm"] == mm["selective"] == mm["none"]  # matmul outputs kept: no matmul recomputed
    assert mm["attn"] == mm["block"] == mm["none"] + 2 * per_block_mm  # every matmul recomputed
    assert sdpa["none"] == sdpa["attn"] == sdpa["selective"] == 0  # attention kept (or never dropped)
    assert sdpa["mm"] == sdpa["block"] == 2 * 2  # self + cross attention, per block
    assert ln["none"] == 0 and all(ln[m] == 2 * 3 for m in ("block", "mm", "attn", "selective"))
    assert all(c[SDPA_CPU + "_backward"] == 4 for c in counts.values())


def test_every_n_pattern_and_counters():
    model = tiny_model(num_blocks=5)
    assert sac.apply(model, "attn", every=2) == [0, 2, 4]
    assert [b.checkpoint_fn is not None for b in model.blocks] == [True, False, True, False, True]
    _, _, counts = step(model, "attn", every=2)
    assert sac.check_first_step("attn") == {"mm": 0, "attn": 2 * 3}  # 2 SDPA calls in each of 3 blocks
    assert counts[SDPA_CPU] == 0 and counts["mm"] + counts["addmm"] > 0
    assert sac.apply(model, "none") == [] and all(b.checkpoint_fn is None for b in model.blocks)


@pytest.mark.parametrize("mode", sac.MODES)
def test_keys_and_parameter_names_unchanged(mode):
    model = tiny_model()
    keys, names = list(model.state_dict()), [n for n, _ in model.named_parameters()]
    sac.apply(model, mode)
    for block in model.blocks:
        block.compile()  # bench.py --compile: compiled in place, lazily; no _orig_mod segment anywhere
    assert list(model.state_dict()) == keys
    assert [n for n, _ in model.named_parameters()] == names
    assert not any("_checkpoint_wrapped_module" in k or "_orig_mod" in k for k in keys)


def test_full_recompute_runs_with_and_without_grad():
    """The former crash case: upstream's block_wise passed context_fn=None and died at the first forward."""
    model = tiny_model()
    sac.apply(model, "block")
    x0, eps, text, mask = batch()
    with torch.no_grad():
        _, v_nograd = denoise(model, x0, torch.tensor([0.5]), Condition(text, gt_frames=x0, condition_mask=mask))
    _, v = denoise(model, x0, torch.tensor([0.5]), Condition(text, gt_frames=x0, condition_mask=mask))
    v.square().mean().backward()
    assert torch.equal(v.detach(), v_nograd)
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("mode", ["block", "attn", "selective"])
def test_lora_with_sac(mode):
    model = tiny_model(lora=4)
    _, grads0, _ = step(model, "none")
    _, grads, _ = step(model, mode)
    assert grads.keys() == grads0.keys() and all(".lora_" in n for n in grads)
    assert all(torch.equal(grads[n], grads0[n]) for n in grads)


def test_check_first_step_catches_a_save_list_without_the_kernel(monkeypatch):
    model = tiny_model()
    step(model, "selective")
    assert sac.check_first_step("selective") == {"mm": 2 * 16, "attn": 2 * 2}
    sac.check_first_step("block")  # nothing to check for full recompute or none
    # kernel-name drift: the attention kernel that runs is not in the save list
    monkeypatch.setattr(sac, "OP_GROUP", {op: g for op, g in sac.OP_GROUP.items() if g != "attn"})
    step(model, "attn")
    with pytest.raises(RuntimeError, match=f"no attn op was saved.*{SDPA_CPU}"):
        sac.check_first_step("attn")


def test_dropout_is_refused():
    model = tiny_model()
    model.blocks[0].drop = torch.nn.Dropout(0.1)
    with pytest.raises(ValueError, match="dropout"):
        sac.apply(model, "selective")
    sac.apply(model, "none")


def test_flop_formula_matches_flop_counter():
    """nets/flops.model_flops' matmul terms equal torch's FlopCounterMode on the forward (attention counted apart)."""
    cfg = get_config("tiny")
    model = build_model(cfg)
    x0, _, text, mask = batch()
    with FlopCounterMode(display=False) as fc:
        model(x0, torch.tensor([[0.1, 0.5]]), Condition(text, condition_mask=mask))  # per-frame t, as denoise()
    counted = fc.get_total_flops()
    fwd, step_3x, needed = model_flops(cfg, tuple(x0.shape), text.shape[1])
    L, S, D = 2 * 4 * 4, text.shape[1], cfg.model_channels
    attn = cfg.num_blocks * (4 * L * L * D + 4 * L * S * D)
    assert counted in (fwd - attn, fwd)  # FlopCounterMode skips the CPU SDPA op (infra.md §4.4)
    assert step_3x == needed == 3 * fwd
    _, lora_3x, lora_needed = model_flops(cfg, tuple(x0.shape), text.shape[1], lora_rank=4)
    assert lora_needed < lora_3x
    # a batch of 3 costs 3 samples (the world benchmarks' MFU at batch 8 once counted one)
    x3 = torch.cat([x0] * 3)
    with FlopCounterMode(display=False) as fc:
        model(x3, torch.tensor([[0.1, 0.5]] * 3),
              Condition(text.expand(3, -1, -1), condition_mask=mask.expand(3, -1, -1, -1, -1)))
    assert fc.get_total_flops() == 3 * counted
    assert model_flops(cfg, tuple(x3.shape), text.shape[1], lora_rank=4) == tuple(
        3 * f for f in model_flops(cfg, tuple(x0.shape), text.shape[1], lora_rank=4))


def test_bench_cpu_smoke(tmp_path):
    b = bench.parse_args(["--device", "cpu", "--dtype", "float32", "--config", "tiny", "--frames", "5", "--height",
                          "64", "--width", "64", "--text-len", "8", "--sac", "selective", "--steps", "1",
                          "--warmup", "1", "--profile", str(tmp_path / "prof.txt")])
    res = bench.run(b)
    assert res["status"] == "ok" and res["saved"]["attn"] > 0 and res["step_s"] > 0
    assert res["latent"] == [1, 16, 2, 8, 8] and res["tokens"] == 32
    assert (tmp_path / "prof.txt").read_text().startswith("# kernel time")
    with pytest.raises(SystemExit):
        bench.parse_args(["--no_such_key", "1"])


# -----------------------------------------------------------------------------
# auto: plan_auto on synthetic costs against brute force, apply_per_block, measure_block_costs on CPU

GB = 2**30
# per block: saved, peak (saved + recompute + backward workspace), seconds; the shape of the H200 measurements
SYNTHETIC = {"none": sac.BlockCost(8 * GB, 10 * GB, 1.00), "selective": sac.BlockCost(4 * GB, 7 * GB, 1.05),
             "mm": sac.BlockCost(4 * GB, 7 * GB, 1.20), "attn": sac.BlockCost(1 * GB, 5 * GB, 1.12),
             "block": sac.BlockCost(GB // 4, 11 * GB, 1.30)}


def true_peak(modes, costs, fixed):
    """The peak of one concrete block sequence: block i's backward runs while blocks < i still hold their saves."""
    return fixed + max(sum(costs[m].saved_bytes for m in modes[:i]) + costs[modes[i]].peak_bytes
                       for i in range(len(modes)))


def test_plan_auto_is_the_fastest_feasible_sequence():
    """Against every one of the 5^4 sequences of 4 blocks, in every order: plan_auto's mix is as fast as the fastest
    sequence that fits, and its own order fits (the ordering rule is checked, not assumed)."""
    import itertools
    fixed, n = 3 * GB, 4
    seqs = list(itertools.product(sac.AUTO_MODES, repeat=n))
    for budget in [x * GB for x in (14, 15, 16, 18, 20, 24, 28, 40, 60)]:
        feasible = [s for s in seqs if true_peak(s, SYNTHETIC, fixed) <= budget]
        best = min(sum(SYNTHETIC[m].seconds for m in s) for s in feasible)
        plan = sac.plan_auto(SYNTHETIC, budget, fixed, n)
        assert len(plan.modes) == n and plan.seconds == pytest.approx(best)
        assert plan.peak_bytes == true_peak(plan.modes, SYNTHETIC, fixed) <= budget
        assert f"of the {budget / GB:.4g} GiB budget" in plan.why


def test_plan_auto_budget_monotone_and_mixes():
    fixed, n = 10 * GB, 12
    times, mixed = [], False
    for budget in (25, 30, 40, 60, 80, 100, 120):
        plan = sac.plan_auto(SYNTHETIC, budget * GB, fixed, n)
        assert plan.peak_bytes <= budget * GB and len(plan.modes) == n
        times.append(plan.seconds)
        mixed |= len(set(plan.modes)) > 1
    assert times == sorted(times, reverse=True) and times[-1] == pytest.approx(n * 1.00)  # all `none` at the end
    assert mixed  # between the uniform modes' needs the plan really mixes


def test_plan_auto_refuses_an_impossible_budget():
    import itertools
    least = min(true_peak(s, SYNTHETIC, 3 * GB) for s in itertools.product(sac.AUTO_MODES, repeat=4))
    assert least < true_peak(["block"] * 4, SYNTHETIC, 3 * GB)  # the leanest is a mix, not all-`block`
    sac.plan_auto(SYNTHETIC, least, 3 * GB, 4)
    with pytest.raises(ValueError, match=r"--mem-budget 10 GiB: no checkpointing mix fits; the smallest needs "
                                         f"{least / GB:.4g} GiB per rank"):
        sac.plan_auto(SYNTHETIC, 10 * GB, 3 * GB, 4)
    with pytest.raises(ValueError, match="plan_auto needs costs"):
        sac.plan_auto({"blockwise": SYNTHETIC["block"]}, 40 * GB, 0, 36)
    partial = {m: c for m, c in SYNTHETIC.items() if m != "none"}  # `none` ran out of memory while measured
    plan = sac.plan_auto(partial, 60 * GB, 3 * GB, 4)
    assert "none" not in plan.modes and "no cost for none" in plan.why


def test_apply_per_block_equals_uniform_modes():
    model = tiny_model(num_blocks=3)
    out0, grads0, _ = step(model, "none")
    modes = ["block", "selective", "none"]
    assert sac.apply_per_block(model, modes) == [0, 1]
    model.zero_grad(set_to_none=True)
    x0, eps, text, mask = batch()
    sigma = torch.tensor([0.8])
    _, velocity = denoise(model, x0 + sigma * eps, sigma, Condition(text, gt_frames=x0, condition_mask=mask))
    ((velocity - (eps - x0)) ** 2 * (1 - mask)).mean().backward()
    assert torch.equal(velocity.detach(), out0)
    assert all(torch.equal(p.grad, grads0[n]) for n, p in model.named_parameters())
    assert sac.check_first_step(modes) == {"mm": 16, "attn": 2}  # only the selective block saves
    with pytest.raises(ValueError, match="2 activation-checkpointing modes for 3 blocks"):
        sac.apply_per_block(model, ["block", "none"])
    with pytest.raises(ValueError, match="valid"):
        sac.apply_per_block(model, ["block", "none", "auto"])


def test_measure_block_costs_on_cpu():
    """CPU memory is LiveBytes: deterministic, and `block` keeps exactly the block's output (the next one's input)."""
    model = tiny_model(num_blocks=1)
    captured = {}
    model.blocks[0].register_forward_pre_hook(lambda m, args: captured.setdefault("args", args))
    x0, _, text, mask = batch()
    with torch.no_grad():
        denoise(model, x0, torch.tensor([0.5]), Condition(text, gt_frames=x0, condition_mask=mask))
    costs = sac.measure_block_costs(model.blocks[0], captured["args"], reps=1)
    again = sac.measure_block_costs(model.blocks[0], captured["args"], reps=1)
    assert [c.saved_bytes for c in costs.values()] == [c.saved_bytes for c in again.values()]
    saved = {m: c.saved_bytes for m, c in costs.items()}
    assert saved["block"] == captured["args"][0].nbytes
    assert saved["none"] > saved["selective"] > saved["attn"] > saved["block"] and saved["mm"] < saved["selective"]
    assert all(c.peak_bytes >= c.saved_bytes and c.seconds > 0 for c in costs.values())
    assert model.blocks[0].checkpoint_fn is None  # left as it was
