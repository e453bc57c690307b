"""grpo.py: exact step log-probs, masking, advantages, the clipped loss, ratio == 1, LoRA-only gradients. Tests of
GRPO's own math set data_coef=0 (plain Flow-GRPO); the shipped data term has its own test."""
import math

import pytest
import torch
from rl_utils import LATENT, perturb, rollout, tiny_condition, tiny_policy

import grpo
from base import collectives
from condition import condition_mask
from engine import rl
from engine.rollout import LOG_SQRT_2PI, gaussian_log_prob, rollout_group, step_coefficients
from nets.edm import guided_x0_fn, karras_sigmas, step_mean
from nets.lora import set_lora_enabled

# -----------------------------------------------------------------------------
# Step coefficients and log-prob


def test_coefficients_preserve_the_noise_level():
    sig = karras_sigmas(8).tolist()
    for sde, eta in (("ddim_eta", 0.5), ("ddim_eta", 1.0), ("cps", 0.8)):
        for i in range(8):
            a, b = step_coefficients(sde, sig[i], sig[i + 1], eta)
            assert abs(a * a + b * b - sig[i + 1] ** 2) <= 1e-12 * sig[i + 1] ** 2
    a, _ = step_coefficients("ddim_eta", sig[2], sig[3], 1.0)  # eta 1: the exact VE posterior mean
    assert abs(a - sig[3] ** 2 / sig[2]) < 1e-12
    assert step_coefficients("ddim_eta", sig[2], sig[3], 0.0) == (sig[3], 0.0)


def test_log_prob_equals_torch_normal():
    g = torch.Generator().manual_seed(0)
    mean = 3 * torch.randn(2, *LATENT, generator=g)
    x_next = mean + 0.7 * torch.randn(2, *LATENT, generator=g)
    gen = 1 - condition_mask(mean[:1], 1)
    got = gaussian_log_prob(x_next, mean, 0.7, gen)
    ref = torch.distributions.Normal(mean.double(), 0.7).log_prob(x_next.double())
    ref = (ref * gen.double()).sum(dim=(1, 2, 3, 4)) / (gen.sum() * LATENT[0])
    assert got.dtype == torch.float32 and got.shape == (2,)
    torch.testing.assert_close(got.double(), ref, atol=1e-5, rtol=0)


def test_conditioning_elements_are_excluded_from_log_prob():
    g = torch.Generator().manual_seed(0)
    mean = torch.randn(1, *LATENT, generator=g)
    x_next = mean + 0.3 * torch.randn(1, *LATENT, generator=g)
    mask = condition_mask(mean, 1)
    gen = 1 - mask
    base = gaussian_log_prob(x_next, mean, 0.3, gen)
    changed = x_next + 100.0 * mask  # move only the conditioning frame
    assert torch.equal(gaussian_log_prob(changed, mean, 0.3, gen), base)
    # the divisor is |G| (generated elements), not all elements
    gen_only = ((x_next - mean)[:, :, 1:] ** 2).mean()
    expected = -gen_only / (2 * 0.3 ** 2) - math.log(0.3) - LOG_SQRT_2PI
    torch.testing.assert_close(base[0], expected, atol=1e-6, rtol=0)
    # gradient wrt the mean: (x' - mu) / (beta^2 |G|) on generated elements, 0 on conditioning ones
    mean_req = mean.clone().requires_grad_(True)
    gaussian_log_prob(x_next, mean_req, 0.3, gen).sum().backward()
    n_gen = gen.sum() * LATENT[0]
    torch.testing.assert_close(mean_req.grad, (x_next - mean) * gen / (0.3 ** 2 * n_gen), atol=1e-7, rtol=1e-5)
    assert torch.all(mean_req.grad[:, :, 0] == 0)


def test_log_prob_mean_matches_entropy_statistically():
    g = torch.Generator().manual_seed(0)
    mean = torch.randn(1, 16, 8, 32, 32, generator=g)
    beta = 0.05
    x_next = mean + beta * torch.randn(mean.shape, generator=g)
    gen = torch.ones(1, 1, 8, 32, 32)
    got = float(gaussian_log_prob(x_next, mean, beta, gen))
    n = mean.numel()
    assert abs(got - (-math.log(beta) - 1.4189385)) < 3 * 0.7071 / math.sqrt(n)


def test_deterministic_step_has_no_log_prob():
    with pytest.raises(ValueError, match="deterministic"):
        gaussian_log_prob(torch.zeros(1, *LATENT), torch.zeros(1, *LATENT), 0.0, torch.ones(1, 1, 3, 4, 4))


def test_eta_zero_rollout_is_predict2_euler_and_untrainable():
    net, _ = tiny_policy()
    cfg = grpo.GRPOConfig(num_steps=4, eta=0.0, guidance=0.0)
    ro = rollout(net, cfg)
    assert ro.train_steps == [] and torch.isnan(ro.log_probs).all() and torch.isfinite(ro.states).all()
    x = ro.states[0, 0:1]
    with torch.no_grad():
        x0 = guided_x0_fn(net, ro.cond, 0.0)(x, torch.full((1,), ro.sigmas[0]))
    r = ro.sigmas[1] / ro.sigmas[0]
    torch.testing.assert_close(ro.states[0, 1:2], r * x + (1 - r) * x0, atol=1e-5, rtol=1e-6)


# -----------------------------------------------------------------------------
# Rollout <-> training identity


def test_rollout_shapes_masks_and_conditioning_frames_untouched():
    net, _ = tiny_policy()
    cfg = grpo.GRPOConfig(num_steps=4)
    ro = rollout(net, cfg)
    assert ro.states.shape == (2, 5, *LATENT) and ro.log_probs.shape == (2, 4) and ro.x0_final.shape == (2, *LATENT)
    assert ro.train_steps == [0, 1, 2] and torch.isfinite(ro.log_probs).all()
    # no noise on the conditioning frame: its state follows the theta-independent deterministic path
    for i in range(4):
        c = ro.alphas[i] / ro.sigmas[i]
        expected = c * ro.states[:, i, :, :1] + (1 - c) * ro.cond.gt_frames[:, :, :1]
        torch.testing.assert_close(ro.states[:, i + 1, :, :1], expected, atol=1e-5, rtol=1e-6)
    assert torch.equal(ro.x0_final[:, :, :1], ro.cond.gt_frames[:, :, :1].expand(2, -1, -1, -1, -1))


def test_stored_log_prob_recomputes_bitwise_with_grad():
    net, params = tiny_policy()
    perturb(params)
    cfg = grpo.GRPOConfig(num_steps=4)
    ro = rollout(net, cfg)
    for k in range(2):
        for i in ro.train_steps:
            logp, _ = grpo.step_log_prob(net, ro, k, i, cfg)
            assert logp.requires_grad and logp.grad_fn is not None
            assert torch.equal(logp.detach()[0], ro.log_probs[k, i])
            loss, info = grpo.grpo_loss(net, ro, k, i, 1.0, cfg)
            assert float(info["ratio"]) == 1.0


def test_update_ratio_one_and_lora_only_gradients():
    net, params = tiny_policy()
    cfg = grpo.GRPOConfig(data_coef=0.0, num_steps=4, kl_coef=0.004)
    ro = rollout(net, cfg)
    base = {n: p.detach().clone() for n, p in net.named_parameters() if not p.requires_grad}
    opt = grpo.lora_optimizer(net, params, cfg)
    stats = grpo.grpo_update(net, opt, params, [ro], [torch.tensor([1.0, -1.0])], cfg)
    assert stats["first_logp_equal"] and stats["first_max_abs_dlogp"] == 0.0 and stats["first_ratio"] == 1.0
    assert stats["logp_requires_grad"] and stats["logp_has_grad_fn"]
    assert stats["micro_steps"] == 6 and stats["opt_steps"] == 1 and stats["grads_outside_params"] == [0]
    g = stats["grad_norm"][0]
    assert math.isfinite(g) and g > 0 and math.isfinite(stats["loss"])
    assert stats["kl"] == 0.0  # zero-init B: policy == reference exactly
    assert all(torch.equal(p, base[n]) for n, p in net.named_parameters() if n in base)
    assert all(p.grad is None for p in net.parameters())  # zeroed (set to None) after the step


def test_probe_cadence_skips_the_after_step_forwards():
    """--grpo-probe-every N: updates 0, N, 2N, ... probe (clipfrac, approx_kl); the others run none of its forwards
    and change nothing else (same gradient norm)."""
    assert [grpo.probes(grpo.GRPOConfig(probe_every=3), u) for u in range(5)] == [True, False, False, True, False]
    assert not any(grpo.probes(grpo.GRPOConfig(probe_every=0), u) for u in range(3))
    with pytest.raises(ValueError, match="probe_every=-1"):
        grpo.GRPOConfig(probe_every=-1)
    cfg = grpo.GRPOConfig(data_coef=0.0, num_steps=4, max_grad_norm=1e9)
    seen = {}
    for probe in (True, False):
        net, params = tiny_policy()
        ro = rollout(net, cfg)
        calls = []
        net.register_forward_hook(lambda *_: calls.append(1))
        stats = grpo.grpo_update(net, torch.optim.SGD(params, lr=0.0), params, [ro], [torch.tensor([1.0, -1.0])], cfg,
                                 probe=probe)
        seen[probe] = (len(calls), stats)
    (probed, a), (plain, b) = seen[True], seen[False]
    assert a["approx_kl"] is not None and b["approx_kl"] is None and b["clipfrac"] is None
    assert probed - plain == 3 * 2  # the probe: one forward per trained step of trajectory 0, cond and uncond
    assert a["grad_norm"] == b["grad_norm"] and a["opt_steps"] == b["opt_steps"] == 1


def test_offloaded_activations_give_identical_gradients():
    net, params = tiny_policy()
    perturb(params)
    grads = []
    for offload in (False, True):
        cfg = grpo.GRPOConfig(num_steps=4, offload_activations=offload)
        ro = rollout(net, cfg)
        loss, info = grpo.grpo_loss(net, ro, 1, 2, -0.7, cfg)
        loss.backward()
        assert float(info["ratio"]) == 1.0
        grads.append([p.grad.clone() for p in params])
        for p in params:
            p.grad = None
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_recompute_old_log_probs_reproduces_the_rollout():
    net, params = tiny_policy()
    perturb(params)
    cfg = grpo.GRPOConfig(num_steps=4, recompute_old_logp=True, opt_steps_per_update=2)
    ro = rollout(net, cfg)
    ro.old_log_probs.fill_(float("nan"))
    grpo.recompute_old_log_probs(net, ro, cfg)
    assert torch.equal(ro.old_log_probs[:, ro.train_steps], ro.log_probs[:, ro.train_steps])
    assert not ro.old_log_probs.requires_grad


def test_reused_uncond_is_the_recomputed_one():
    """The update reuses the rollout's uncond predictions while theta == theta_old: the same log-prob bit for bit."""
    net, params = tiny_policy()
    perturb(params)
    cfg = grpo.GRPOConfig(num_steps=4)
    ro = rollout(net, cfg)
    assert sorted(ro.uncond) == [(k, i) for k in range(2) for i in ro.train_steps]
    calls = []
    net.register_forward_hook(lambda *_: calls.append(1))
    for k, i in ro.uncond:
        fresh, _ = grpo.training_log_prob(net, ro, [k], i, cfg)
        assert len(calls) == 2
        reused, _ = grpo.training_log_prob(net, ro, [k], i, cfg, reuse_uncond=True)
        assert len(calls) == 3  # one forward: the cond branch
        assert torch.equal(fresh.detach(), reused.detach()) and torch.equal(reused.detach()[0], ro.log_probs[k, i])
        calls.clear()


def test_gradients_reach_lora_only_before_the_step():
    net, params = tiny_policy()
    perturb(params)
    cfg = grpo.GRPOConfig(num_steps=4)
    ro = rollout(net, cfg)
    loss, _ = grpo.grpo_loss(net, ro, 0, 1, 1.0, cfg)
    loss.backward()
    lora = {id(p) for p in params}
    assert all(p.grad is None for p in net.parameters() if id(p) not in lora)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in params)


def test_one_sgd_step_moves_log_probs_along_the_advantage():
    """Sign check: after one small step, sum_k A_k (logp_new - logp_old) > 0 (catches sign errors)."""
    net, params = tiny_policy()
    perturb(params)
    cfg = grpo.GRPOConfig(data_coef=0.0, num_steps=4, max_grad_norm=1e9)
    ro = rollout(net, cfg)
    adv = torch.tensor([1.0, -1.0])
    opt = torch.optim.SGD(params, lr=1e-3)
    grpo.grpo_update(net, opt, params, [ro], [adv], cfg)
    with torch.no_grad():
        gain = sum(float(adv[k]) * float(grpo.step_log_prob(net, ro, k, i, cfg)[0] - ro.log_probs[k, i])
                   for k in range(2) for i in ro.train_steps)
    assert gain > 0


def test_zero_advantages_skip_the_update():
    net, params = tiny_policy()
    cfg = grpo.GRPOConfig(data_coef=0.0, num_steps=4)
    ro = rollout(net, cfg)
    before = [p.detach().clone() for p in params]
    stats = grpo.grpo_update(net, grpo.lora_optimizer(net, params, cfg), params, [ro], [torch.zeros(2)], cfg)
    assert stats["trajectories"] == 0 and stats["opt_steps"] == 0
    assert all(torch.equal(a, b) for a, b in zip(before, params))
    # kept (same micro-step count on every FSDP rank): they run, with gradient sync on the last micro-step only
    cfg = grpo.GRPOConfig(data_coef=0.0, num_steps=4, drop_zero_advantage=False, opt_steps_per_update=2)
    syncs = []
    stats = grpo.grpo_update(net, grpo.lora_optimizer(net, params, cfg), params, [ro], [torch.zeros(2)], cfg,
                             set_grad_sync=syncs.append)
    assert stats["micro_steps"] == 6 and stats["opt_steps"] == 2 and stats["grad_norm"] == [0.0, 0.0]
    assert syncs == [False, False, True] * 2


def test_uncond_detach_same_value_different_gradient():
    net, params = tiny_policy()
    perturb(params)
    grads = []
    for uncond_grad in (False, True):
        cfg = grpo.GRPOConfig(num_steps=4, uncond_grad=uncond_grad)
        ro = rollout(net, cfg)
        logp, _ = grpo.training_log_prob(net, ro, [1], 2, cfg, reuse_uncond=True)  # uncond_grad: never reused
        logp.sum().backward()
        grads.append((logp.detach(), [p.grad.clone() for p in params]))
        for p in params:
            p.grad = None
    assert torch.equal(grads[0][0], grads[1][0])
    assert any(not torch.equal(a, b) for a, b in zip(grads[0][1], grads[1][1]))


def test_guidance_without_negative_prompt_is_an_error():
    net, _ = tiny_policy()
    cond = tiny_condition()
    cond.neg_crossattn_emb = None
    with pytest.raises(ValueError, match="neg_crossattn_emb"):
        rollout(net, grpo.GRPOConfig(num_steps=2), cond=cond)


def test_kl_to_reference_matches_normal_kl():
    net, params = tiny_policy()
    perturb(params)
    cfg = grpo.GRPOConfig(num_steps=4, kl_coef=1.0)
    ro = rollout(net, cfg)
    k, i = 1, 2
    _, mean = grpo.step_log_prob(net, ro, k, i, cfg)
    kl = grpo.reference_kl(net, ro, k, i, mean, cfg)
    with torch.no_grad():
        set_lora_enabled(net, False)
        _, mean_ref = grpo.step_log_prob(net, ro, k, i, cfg)
        set_lora_enabled(net, True)
    beta = ro.betas[i]
    ref = torch.distributions.kl_divergence(torch.distributions.Normal(mean.detach().double(), beta),
                                            torch.distributions.Normal(mean_ref.double(), beta))[:, :, 1:].mean()
    assert float(kl.detach()) > 0
    torch.testing.assert_close(kl.detach().double()[0], ref, rtol=1e-4, atol=1e-9)


# -----------------------------------------------------------------------------
# The clipped surrogate


@pytest.mark.parametrize("advantage", [1.5, -1.5])
def test_surrogate_at_ratio_one_and_outside_the_clip(advantage):
    eps = 1e-3
    old = torch.tensor(-2.0)
    logp = old.clone().requires_grad_(True)
    loss, ratio = grpo.clipped_surrogate(logp, old, advantage, eps)
    loss.backward()
    assert float(ratio.detach()) == 1.0 and float(logp.grad) == -advantage
    for shift, frozen_sign in ((math.log(1 + 2 * eps), 1), (math.log(1 - 2 * eps), -1)):
        logp = (old + shift).requires_grad_(True)
        loss, _ = grpo.clipped_surrogate(logp, old, advantage, eps)
        loss.backward()
        # PPO pessimism: moving further in the advantage's direction past the clip earns nothing
        if math.copysign(1, advantage) == frozen_sign:
            assert float(logp.grad) == 0.0
        else:
            assert float(logp.grad) != 0.0


# -----------------------------------------------------------------------------
# Advantages


def test_all_equal_rewards_give_zero_advantages():
    for global_std in (True, False):
        for ddof in (0, 1):
            adv = rl.group_advantages([0.1, 0.1, 0.1, 0.3, 0.3, 0.3], ["a"] * 3 + ["b"] * 3,
                                        global_std=global_std, ddof=ddof)
            assert torch.equal(adv, torch.zeros(6))
    adv = rl.group_advantages([0.7, 0.7], [("ep", "x")] * 2)
    assert torch.equal(adv, torch.zeros(2)) and not torch.isnan(adv).any()


def test_k2_advantage_conventions():
    d = 3e-3
    r = [0.5 + d, 0.5]
    a0 = rl.group_advantages(r, ["g", "g"], ddof=0, global_std=False)
    torch.testing.assert_close(a0, torch.tensor([1.0, -1.0], dtype=torch.float64) * (d / 2) / (d / 2 + 1e-4))
    a1 = rl.group_advantages(r, ["g", "g"], ddof=1, global_std=False)
    s = d / math.sqrt(2)
    torch.testing.assert_close(a1, torch.tensor([1.0, -1.0], dtype=torch.float64) * (d / 2) / (s + 1e-4))
    assert abs(float(a0.std(correction=0)) - (d / 2) / (d / 2 + 1e-4)) < 1e-12


def test_global_std_interleaved_keys_clip_and_failed_rewards():
    r = torch.tensor([0.1, 0.9, 0.4, 0.2, 0.8, 0.5])
    keys = [("e1", "t"), ("e2", "t"), ("e1", "t"), ("e2", "t"), ("e1", "t"), ("e2", "t")]
    adv = rl.group_advantages(r, keys, global_std=True, ddof=0)
    rd = r.double()
    sd = rd.std(correction=0)
    g1, g2 = rd[[0, 2, 4]], rd[[1, 3, 5]]
    expected = torch.empty(6, dtype=torch.float64)
    expected[[0, 2, 4]] = (g1 - g1.mean()) / (sd + 1e-4)
    expected[[1, 3, 5]] = (g2 - g2.mean()) / (sd + 1e-4)
    torch.testing.assert_close(adv, expected)
    # same instruction, different episodes: two groups, not one (the key is (episode, instruction))
    assert not torch.allclose(adv, rl.group_advantages(r, [("*", "t")] * 6, global_std=True))
    # sorted order gives the same advantages
    order = [0, 2, 4, 1, 3, 5]
    torch.testing.assert_close(rl.group_advantages(r[order], [keys[j] for j in order]), adv[order])
    # clipping and a failed (NaN) reward
    big = rl.group_advantages([0.0, 0.0, 0.0, 0.0, 0.0, 1.0], ["g"] * 6, eps=0.0, clip=2.0, global_std=False)
    assert float(big.max()) == 2.0
    nan = rl.group_advantages([0.2, float("nan"), 0.4], ["g"] * 3, global_std=False)
    assert float(nan[1]) == 0.0 and torch.isfinite(nan).all() and float(nan[0]) < 0 < float(nan[2])


# -----------------------------------------------------------------------------
# Config, windows, shared latents


def test_config_rejects_training_the_last_step_and_bad_windows():
    with pytest.raises(ValueError, match="never trained"):
        grpo.GRPOConfig(num_steps=4, train_steps=(1, 3))
    with pytest.raises(ValueError, match="window"):
        grpo.GRPOConfig(num_steps=4, window_size=2, window_range=(2, 4))
    with pytest.raises(ValueError, match="sde_type"):
        grpo.GRPOConfig(sde_type="flow_sde")


def test_fast_window_with_shared_latent():
    net, _ = tiny_policy()
    cfg = grpo.GRPOConfig(num_steps=6, window_size=2, window_range=(1, 5), same_latent=True, group_size=3)
    ro = rollout(net, cfg, seed=4)
    stochastic = [i for i, b in enumerate(ro.betas) if b > 0]
    assert len(stochastic) == 2 and stochastic[1] == stochastic[0] + 1 and 1 <= stochastic[0] <= 3
    assert ro.train_steps == stochastic
    start = stochastic[0]
    assert torch.equal(ro.states[1, : start + 1], ro.states[0, : start + 1])  # shared deterministic prefix
    assert not torch.equal(ro.states[1, start + 1], ro.states[0, start + 1])  # branches at the window
    assert torch.isfinite(ro.log_probs[:, stochastic]).all() and torch.isnan(ro.log_probs[:, [0, 5]]).all()
    # the prefix computed once equals the deterministic prefix walked again from the shared noise
    x = ro.states[2, 0:1]
    with torch.no_grad():
        for i in range(start):
            x0 = guided_x0_fn(net, ro.cond, cfg.guidance)(x, torch.full((1,), ro.sigmas[i]))
            x = step_mean(x, x0, ro.sigmas[i], ro.sigmas[i + 1], ro.alphas[i])
    assert torch.equal(x[0], ro.states[2, start])
    # a fixed window start (the same on every FSDP rank)
    fixed = rollout_group(net, ro.cond, LATENT, cfg, torch.Generator().manual_seed(5), window_start=2)
    assert fixed.train_steps == [2, 3]
    with pytest.raises(ValueError, match="window_start"):
        rollout_group(net, ro.cond, LATENT, cfg, torch.Generator(), window_start=4)


# -----------------------------------------------------------------------------
# The fast path: batched rollout calls, logp_old from the update's own forward, shared-state micro-steps


def grads_of(params):
    grads = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    return grads


@pytest.mark.parametrize("layout", ["cfg", "group"])
def test_batched_rollouts_draw_the_same_noise_and_need_recompute(layout):
    net, params = tiny_policy()
    perturb(params)
    exact = grpo.GRPOConfig(num_steps=4, group_size=3)
    with pytest.raises(ValueError, match="recompute_old_logp"):
        rollout(net, grpo.GRPOConfig(num_steps=4, rollout_batch=layout))
    fast = grpo.GRPOConfig(num_steps=4, group_size=3, rollout_batch=layout, recompute_old_logp=True)
    a, b = rollout(net, exact), rollout(net, fast)
    torch.testing.assert_close(b.states, a.states, rtol=1e-4, atol=1e-4)  # the same noise, other rounding
    torch.testing.assert_close(b.x0_final, a.x0_final, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(b.log_probs[:, :3], a.log_probs[:, :3], rtol=1e-5, atol=1e-5)
    # 3 trajectories x (4 steps + the clean pass) x 2 branches: 30 samples in 30, 15 or 5 calls
    assert (a.forwards, b.forwards) == (30, 30) and (a.calls, b.calls) == (30, {"cfg": 15, "group": 5}[layout])


@pytest.mark.parametrize("layout", ["none", "group"])
def test_old_log_probs_from_the_updates_own_forward(layout):
    """recompute_old_logp at one optimizer step: ratio exactly 1, no extra forward, the same gradient as the exact
    path's (which needs no recompute), and the gap to the sampler's log-probs reported."""
    runs = {}
    for recompute in (False, True):
        net, params = tiny_policy()
        perturb(params)
        cfg = grpo.GRPOConfig(data_coef=0.0, num_steps=4, recompute_old_logp=recompute, max_grad_norm=1e9,
                              rollout_batch=layout if recompute else "none")
        ro = rollout(net, cfg)
        calls = []
        net.register_forward_hook(lambda *_: calls.append(1))
        opt = torch.optim.SGD(params, lr=0.0)
        stats = grpo.grpo_update(net, opt, params, [ro], [torch.tensor([1.0, -0.5])], cfg)
        assert stats["first_ratio"] == 1.0 and stats["forwards"] == 6
        assert len(calls) == 6 + 3 * 2  # 6 training forwards (uncond reused) + the probe's 3 steps x 2 branches
        runs[recompute] = (stats, ro)
    (exact, _), (fast, ro_fast) = runs[False], runs[True]
    assert exact["first_logp_equal"] and exact["first_max_abs_dlogp"] == 0.0
    assert fast["first_max_abs_dlogp"] < 1e-4 and (layout == "group" or fast["first_logp_equal"])
    assert fast["grad_norm"][0] == pytest.approx(exact["grad_norm"][0], rel=1e-4)
    trained = ro_fast.train_steps
    assert torch.equal(ro_fast.old_log_probs[:, trained].isfinite(), torch.ones(2, len(trained), dtype=torch.bool))


def test_trajectories_sharing_a_state_train_in_one_forward():
    """same_latent: the window's first step starts every trajectory from one state, so the update runs it once
    for the group (K - 1 forwards fewer) with the summed loss; the gradient is the per-trajectory sum's."""
    net, params = tiny_policy()
    perturb(params)
    cfg = grpo.GRPOConfig(data_coef=0.0, num_steps=6, window_size=2, window_range=(1, 5), same_latent=True,
                          group_size=3, kl_coef=0.01, max_grad_norm=1e9)
    ro = rollout_group(net, tiny_condition(), LATENT, cfg, torch.Generator().manual_seed(4), window_start=2)
    assert ro.shared_until == 2 and ro.shares(2) and not ro.shares(3)
    # the rollout: steps 0..2 once (the shared prefix and the window's first step), 3..5 and the clean pass 3 times
    assert ro.forwards == 2 * (3 + 3 * 4)
    adv = torch.tensor([1.0, -0.5, 0.25])
    weights = grpo.step_weights(ro, cfg)
    for k in range(3):  # per (trajectory, step), as grpo_loss on one sample
        for i in ro.train_steps:
            loss, _ = grpo.grpo_loss(net, ro, k, i, float(adv[k]), cfg, weights[i], reuse_uncond=True)
            loss.backward()
    separate = grads_of(params)
    stats = grpo.grpo_update(net, torch.optim.SGD(params, lr=0.0), params, [ro], [adv], cfg,
                             set_grad_sync=lambda last: None)
    assert stats["micro_steps"] == 6 and stats["forwards"] == 4  # step 2 once, step 3 per trajectory
    assert stats["first_logp_equal"] and stats["first_ratio"] == 1.0
    norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in separate])))
    assert stats["grad_norm"][0] == pytest.approx(norm / 6, rel=1e-5)  # micro-steps scaled by 1 / (pairs)


def test_lora_optimizer_refuses_other_trainable_params():
    net, params = tiny_policy()
    net.final_layer.linear.weight.requires_grad_(True)
    with pytest.raises(ValueError, match="LoRA adapters only"):
        grpo.lora_optimizer(net, params, grpo.GRPOConfig())


# -----------------------------------------------------------------------------
# Under FSDP2 (2 gloo ranks): gathers into device buffers, and zero-advantage skipping that keeps ranks in step


def _fsdp_update(rank, ws, advantages_per_rank, opt_steps):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    net, params = tiny_policy(seed=0)
    perturb(params)
    mesh = init_device_mesh("cpu", (ws,))
    for block in net.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(net, mesh=mesh)
    params = [p for p in net.parameters() if p.requires_grad]
    cfg = grpo.GRPOConfig(data_coef=0.0, num_steps=4, opt_steps_per_update=opt_steps)
    ro = rollout(net, cfg, seed=rank)
    # buffers on the tensor's (group's) device
    gathered = collectives.gather_groups(torch.tensor([float(rank), 10.0 + rank]))
    opt = grpo.lora_optimizer(net, params, cfg)
    before = [p.detach().full_tensor().clone() for p in params]
    stats = grpo.grpo_update(net, opt, params, [ro], [torch.tensor(advantages_per_rank[rank])], cfg,
                             set_grad_sync=net.set_requires_gradient_sync)
    moved = any(not torch.equal(b, p.detach().full_tensor()) for b, p in zip(before, params))
    dist.barrier()
    return gathered, stats, moved


def _fsdp_updates(rank, ws, cases):
    """Both cases in one spawned job (a job costs each rank ~5 s of imports on 2 cores)."""
    return [_fsdp_update(rank, ws, *case) for case in cases]


def test_fsdp_ranks_with_uneven_zero_advantages_stay_in_step():
    from dist_utils import run_dist
    # 1. rank 0: both trajectories train (6 micro-steps); rank 1: an all-tie group, so it pads with 6 zero-weight ones
    # 2. every rank all-tie, 2 optimizer steps per update
    cases = [([[1.0, -1.0], [0.0, 0.0]], 1), ([[0.0, 0.0], [0.0, 0.0]], 2)]
    uneven, ties = zip(*run_dist(_fsdp_updates, 2, 300, cases))
    (g0, s0, m0), (g1, s1, m1) = uneven
    assert torch.equal(g0, torch.tensor([0.0, 10.0, 1.0, 11.0]))  # rank-major and torch.equal(g0, g1)
    assert (s0["micro_steps"], s0["padded_steps"], s1["micro_steps"], s1["padded_steps"]) == (6, 0, 0, 6)
    assert s0["opt_steps"] == s1["opt_steps"] == 1 and m0 and m1 and s0["grad_norm"] == s1["grad_norm"]
    assert s0["first_ratio"] == 1.0 and s1["first_ratio"] is None
    # every rank all-tie: nothing runs and nothing moves (no optimizer step: Adam would still move the weights)
    for _, stats, moved in ties:
        assert stats["opt_steps"] == 0 and stats["skipped_chunks"] == 2 and stats["micro_steps"] == 0 and not moved


def test_data_term_adds_the_flow_matching_gradient_once_per_group_and_syncs_last():
    """--grpo-data-coef: each trained chunk adds rl.data_loss on every group's real clip, weighted data_coef /
    groups, after the policy-gradient micro-steps; the gradient sync moves to the data term's last backward; the
    gradient is the zero-coefficient update's plus exactly that term's; all-tie groups still skip everything."""
    from nets.family import family_of
    net, params = tiny_policy()
    perturb(params)
    cfg = grpo.GRPOConfig(num_steps=4, max_grad_norm=1e9)
    ros = [rollout(net, cfg, seed=s, cond=tiny_condition(seed=s)) for s in (0, 1)]
    adv = [torch.tensor([1.0, -1.0]), torch.tensor([-0.5, 0.5])]

    def grads(coef, generator):
        for p in params:
            p.grad = None
        syncs, seen = [], []

        class Capture(torch.optim.SGD):  # the gradient the step sees (the step then zeroes it); lr 0: weights stay
            def step(self, closure=None):
                seen.append([p.grad.clone() for p in params])
                return super().step(closure)
        stats = grpo.grpo_update(net, Capture(params, lr=0.0), params, ros, adv,
                                 grpo.GRPOConfig(num_steps=4, max_grad_norm=1e9, data_coef=coef),
                                 set_grad_sync=syncs.append, data_generator=generator)
        return seen[0], syncs, stats

    plain, plain_syncs, _ = grads(0.0, None)
    with_data, syncs, stats = grads(0.7, torch.Generator().manual_seed(3))
    assert syncs == [False] * (len(plain_syncs) + 1) + [True] and plain_syncs[-1] is True
    assert stats["data_loss"] > 0 and stats["forwards"] == len(plain_syncs) + 2
    for p in params:
        p.grad = None
    g, levels = torch.Generator().manual_seed(3), family_of(net.cfg).training_levels(4)
    for ro in ros:
        (0.7 * rl.data_loss(net, ro.cond, levels, g) / 2).backward()
    for a, b, c in zip(plain, with_data, [p.grad for p in params]):
        torch.testing.assert_close(b, a + c, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="data_generator"):
        grads(0.7, None)
    stats = grpo.grpo_update(net, grpo.lora_optimizer(net, params, cfg), params, ros, [torch.zeros(2)] * 2,
                             grpo.GRPOConfig(num_steps=4, data_coef=0.7), data_generator=torch.Generator())
    assert stats["opt_steps"] == 0 and stats["data_loss"] == 0.0  # a paired control stays the base
