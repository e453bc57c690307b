"""nft.py: DiffusionNFT's loss (its on-policy gradient and optimum), the old policy, the update and its skips, FSDP."""
import dataclasses

import pytest
import torch
from rl_utils import LATENT, latent_reward, perturb, tiny_condition, tiny_policy

import grpo
import nft
from condition import condition_mask
from engine import rl
from nets.family import family_of
from nets.lora import set_lora_enabled


def test_config_refuses_what_cannot_work():
    for bad in (dict(group_size=1), dict(timesteps=0), dict(timesteps=11), dict(beta=0.0), dict(beta=1.5),
                dict(decay_max=1.0), dict(adv_clip=0.0), dict(std_ddof=2), dict(lr=0.0)):
        with pytest.raises(ValueError):
            nft.NFTConfig(**bad)
    assert nft.decay_at(nft.NFTConfig(), 0) == 0.0 and nft.decay_at(nft.NFTConfig(), 10_000) == 0.5


def test_optimality_maps_advantages_to_probabilities():
    r = nft.optimality(torch.tensor([-9.0, -5.0, 0.0, 2.5, 5.0, 9.0]), nft.NFTConfig())
    assert torch.equal(r, torch.tensor([0.0, 0.0, 0.5, 0.75, 1.0, 1.0]))


def test_on_policy_gradient_is_advantage_weighted_flow_matching():
    """v_old = v.detach(): d loss / d v = A_max / beta * beta (2r - 1) d|t (v - u)|^2 / w = (A / A_max) ... exactly,
    whatever beta; and at r = 1/2 (a tie) the gradient is 0."""
    g = torch.Generator().manual_seed(0)
    u = torch.randn(1, *LATENT, generator=g)
    gen = 1 - condition_mask(u, 1)
    for beta in (1.0, 0.3):
        cfg = nft.NFTConfig(beta=beta, adaptive_weight=False)
        for r in (0.0, 0.5, 0.9):
            v = torch.randn(1, *LATENT, generator=g, requires_grad=True)
            nft.nft_loss(v, v.detach(), u, 0.7, r, gen, cfg).backward()
            v2 = v.detach().clone().requires_grad_(True)  # the advantage-weighted flow-matching loss
            (cfg.adv_clip * (2 * r - 1) * rl.masked_mean((0.7 * (v2 - u)).square(), gen)).backward()
            torch.testing.assert_close(v.grad, v2.grad, rtol=1e-5, atol=1e-7)
            if r == 0.5:
                assert v.grad.abs().max() < 1e-6


def test_minimiser_moves_towards_the_positive_samples():
    """Docs §2: at one point with the old velocity v_old = E[u], the loss over a set of targets u_k with optimality
    r_k is minimised by v* = v_old + (2 alpha / beta)(v+ - v_old), v+ = sum r u / sum r, alpha = mean r."""
    g = torch.Generator().manual_seed(0)
    u = torch.randn(6, 1, *LATENT, generator=g)
    r = torch.tensor([1.0, 0.9, 0.6, 0.3, 0.2, 0.0])
    gen = torch.ones(1, 1, *LATENT[1:])
    v_old = u.mean(0)
    for beta in (1.0, 0.5):
        cfg = nft.NFTConfig(beta=beta, adaptive_weight=False)
        v = v_old.clone().requires_grad_(True)
        opt = torch.optim.LBFGS([v], lr=1, max_iter=200, tolerance_grad=1e-12, tolerance_change=1e-14)

        def closure():
            opt.zero_grad()
            loss = sum(nft.nft_loss(v, v_old, u[k], 1.0, float(r[k]), gen, cfg) for k in range(6))
            loss.backward()
            return loss
        opt.step(closure)
        positive = (r.view(-1, 1, 1, 1, 1, 1) * u).sum(0) / r.sum()
        expected = v_old + 2 * r.mean() / beta * (positive - v_old)
        torch.testing.assert_close(v.detach(), expected, rtol=1e-4, atol=1e-4)


def test_adapters_swap_in_and_back_out():
    net, params = tiny_policy()
    perturb(params)
    old = [p.detach().clone() + 0.1 for p in params]
    before = [p.detach().clone() for p in params]
    with nft.adapters(net, params, old):
        assert all(torch.equal(p, o) for p, o in zip(params, old))
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    nft.update_old(old, params, 0.25)
    torch.testing.assert_close(old[0], 0.25 * (before[0] + 0.1) + 0.75 * before[0])


@pytest.mark.parametrize("config,cft", [("tiny", None), ("p25-tiny", 0.1)])
def test_rollout_is_the_deterministic_sampler_and_the_update_trains_lora_only(config, cft):
    net, params = tiny_policy(config=config)
    cond = tiny_condition(config=config, cft=cft)
    cfg = nft.NFTConfig(group_size=3, num_steps=4, timesteps=2, kl_coef=0.1, data_coef=0.5)
    x0 = nft.sample_group(net, cond, LATENT, cfg, torch.Generator().manual_seed(0))
    again = nft.sample_group(net, cond, LATENT, cfg, torch.Generator().manual_seed(0))
    assert x0.shape == (3, *LATENT) and torch.equal(x0, again) and torch.isfinite(x0).all()
    assert torch.equal(x0[:, :, :1], cond.gt_frames[:, :, :1].expand(3, -1, -1, -1, -1))  # the conditioning frame
    opt = grpo.lora_optimizer(net, params, cfg)
    frozen = {n: p.detach().clone() for n, p in net.named_parameters() if not p.requires_grad}
    before = [p.detach().clone() for p in params]
    stats = nft.nft_update(net, opt, params, [p.detach().clone() for p in params], [cond], [x0],
                           [torch.tensor([1.0, 0.0, -1.0])], cfg, torch.Generator().manual_seed(1), True)
    assert stats["micro_steps"] == 3 * 2 + 1 and stats["nonfinite_steps"] == 0 and stats["grad_norm"] > 0
    assert stats["kl"] == 0.0  # B = 0: the adapted net is the base
    assert any(not torch.equal(b, p) for b, p in zip(before, params))
    assert all(torch.equal(p, frozen[n]) for n, p in net.named_parameters() if not p.requires_grad)


def test_old_velocities_are_the_old_adapters_and_on_policy_reuses_the_forward():
    """old_is_current=True must equal an explicit old forward with old == theta (the saved forward is exact)."""
    results = []
    for old_is_current in (True, False):
        net, params = tiny_policy()
        perturb(params)
        cond = tiny_condition()
        cfg = nft.NFTConfig(group_size=2, num_steps=4)
        x0 = nft.sample_group(net, cond, LATENT, cfg, torch.Generator().manual_seed(0))
        opt = grpo.lora_optimizer(net, params, cfg)
        nft.nft_update(net, opt, params, [p.detach().clone() for p in params], [cond], [x0],
                       [torch.tensor([1.0, -1.0])], cfg, torch.Generator().manual_seed(1), old_is_current)
        results.append([p.detach().clone() for p in params])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_all_tie_update_skips_and_weight_zero_control_stays_the_base():
    net, params = tiny_policy()
    cond = tiny_condition()
    cfg = nft.NFTConfig(group_size=2, num_steps=4)
    opt = grpo.lora_optimizer(net, params, cfg)
    old = [p.detach().clone() for p in params]
    before = [p.detach().clone() for p in params]
    score = latent_reward(lambda latent: torch.zeros(len(latent)))
    stats, metrics = nft.train_step(net, opt, params, old, [cond], LATENT, cfg, score, 0, 0)
    assert stats["skipped"] == 1 and metrics["skipped_updates"] == 1 and metrics["adv_std"] == 0
    assert all(torch.equal(b, p) for b, p in zip(before, params))
    assert opt.state == {}  # no optimizer step at all


def test_train_step_refreshes_the_old_policy_by_the_schedule():
    net, params = tiny_policy()
    cond = tiny_condition()
    cfg = nft.NFTConfig(group_size=2, num_steps=4, decay_rate=0.25, decay_max=0.5)
    opt = grpo.lora_optimizer(net, params, cfg)
    old = [p.detach().clone() for p in params]
    score = latent_reward(lambda latent: latent[:, 0].mean(dim=(1, 2, 3)))
    _, m0 = nft.train_step(net, opt, params, old, [cond], LATENT, cfg, score, 0, 0)
    assert m0["old_decay"] == 0.0 and all(torch.equal(o, p) for o, p in zip(old, params))  # exact copy
    before_old = [o.clone() for o in old]
    _, m1 = nft.train_step(net, opt, params, old, [cond], LATENT, cfg, score, 1, 1)
    assert m1["old_decay"] == 0.25
    torch.testing.assert_close(old[1], 0.25 * before_old[1] + 0.75 * params[1].detach())
    assert m1["old_deviation"] == 0.0  # update 1 sampled with old == theta (refreshed by copy after update 0)
    _, m2 = nft.train_step(net, opt, params, old, [cond], LATENT, cfg, score, 2, 2)
    assert m2["old_deviation"] > 0  # old lags theta: its own forward


def test_kl_reference_is_the_lora_disabled_base():
    net, params = tiny_policy()
    perturb(params)
    cond = tiny_condition()
    x0 = torch.randn(1, *LATENT)
    eps = torch.randn(1, *LATENT)
    level = family_of(net.cfg).training_levels(4)[1]
    set_lora_enabled(net, False)
    base, _, _ = nft.forward_velocity(net, cond, x0, eps, level)
    set_lora_enabled(net, True)
    ref = nft.frozen_velocities(net, [cond], [[level]], [x0], [[[(0, eps)]]])
    assert not torch.equal(ref[0][0][0], base)  # adapters on: not the base
    set_lora_enabled(net, False)
    ref = nft.frozen_velocities(net, [cond], [[level]], [x0], [[[(0, eps)]]])
    set_lora_enabled(net, True)
    assert torch.equal(ref[0][0][0], base)


# -----------------------------------------------------------------------------
# Under FSDP2 (2 gloo ranks): the old-policy swap reaches every unit, and both ranks step alike


def _fsdp_nft(rank, ws):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    net, params = tiny_policy(seed=0)
    perturb(params)  # before sharding: the same full values on every rank
    mesh = init_device_mesh("cpu", (ws,))
    last = len(net.blocks) - 1
    for i, block in enumerate(net.blocks):  # collectives.shard_model's layout: the last block, final layer and root stay
        fully_shard(block, mesh=mesh, reshard_after_forward=i < last)  # unsharded after a forward
    fully_shard(net.final_layer, mesh=mesh, reshard_after_forward=False)
    fully_shard(net, mesh=mesh, reshard_after_forward=False)
    params = [p for p in net.parameters() if p.requires_grad]  # the sharded parameters, before any forward
    cfg = nft.NFTConfig(group_size=2, num_steps=4)
    opt = grpo.lora_optimizer(net, params, cfg)  # (after a forward FSDP2 registers some units' unsharded copies)
    cond = tiny_condition(seed=rank)
    x0 = nft.sample_group(net, cond, LATENT, cfg, torch.Generator().manual_seed(rank))
    with torch.no_grad():
        old = [p.detach().clone() * 0 for p in params]  # the base (B = 0 and A = 0): its velocity differs
    with nft.adapters(net, params, old):
        swapped = nft.frozen_velocities(net, [cond], [family_of(net.cfg).training_levels(4)], [x0[:1]],
                                        [[[(1, torch.ones(1, *LATENT))]]])[0][0][0]
    set_lora_enabled(net, False)
    with torch.no_grad():
        base = nft.forward_velocity(net, cond, x0[:1], torch.ones(1, *LATENT), family_of(net.cfg).training_levels(4)[1])[0]
    set_lora_enabled(net, True)
    stats = nft.nft_update(net, opt, params, old, [cond], [x0], [torch.tensor([1.0, -1.0])], cfg,
                           torch.Generator().manual_seed(rank), False, net.set_requires_gradient_sync)
    return torch.equal(swapped, base), stats["grad_norm"], [p.detach().full_tensor() for p in params]


def test_fsdp_old_policy_swap_and_update_stay_in_step():
    from dist_utils import run_dist
    (same0, g0, p0), (same1, g1, p1) = run_dist(_fsdp_nft, 2, 300)
    assert same0 and same1  # every unit, also those FSDP keeps unsharded after a forward, ran the old adapters
    assert g0 == g1 and all(torch.equal(a, b) for a, b in zip(p0, p1))


# -----------------------------------------------------------------------------
# The fast path (docs/nft.md §4): rollout layouts, the fp8 base in the rollouts, compiled updates without recompiles


def test_rollout_layouts_draw_the_same_noise():
    """rollout_batch n: K / n calls a step from the group's one noise draw; n = K is the default layout bit for bit,
    smaller n the same samples up to rounding. A layout that would leave an uneven last call is refused."""
    net, _ = tiny_policy()
    cond = tiny_condition()
    cfg = nft.NFTConfig(group_size=4, num_steps=3)
    ref = nft.sample_group(net, cond, LATENT, cfg, torch.Generator().manual_seed(0))
    for n in (1, 2, 4):
        got = nft.sample_group(net, cond, LATENT, dataclasses.replace(cfg, rollout_batch=n),
                               torch.Generator().manual_seed(0))
        assert torch.equal(got, ref) if n == 4 else torch.allclose(got, ref, rtol=0, atol=1e-5), n
    for bad in (-1, 3):
        with pytest.raises(ValueError, match=f"rollout_batch={bad}: 0 .* or a divisor of group_size=4"):
            nft.NFTConfig(group_size=4, rollout_batch=bad)


def test_fp8_base_runs_every_rollout_call(monkeypatch):
    """--fp8 with LoRA holds the frozen base in e4m3 only (lora.quantize_base): every Linear of every rollout call
    runs fp8.linear (there is no bf16 copy to fall back on), and the update trains the adapters through it."""
    from base import fp8
    from nets.lora import adapted_linears, quantize_base
    net, params = tiny_policy()
    quantize_base(net)
    calls, fp8_linear = [], fp8.linear
    monkeypatch.setattr(fp8, "linear", lambda *a, **k: calls.append(a[0].shape[0]) or fp8_linear(*a, **k))
    cond = tiny_condition()
    cfg = nft.NFTConfig(group_size=2, num_steps=3)
    net_calls = []
    hook = net.register_forward_pre_hook(lambda module, args: net_calls.append(args[0].shape[0]))
    x0 = nft.sample_group(net, cond, LATENT, cfg, torch.Generator().manual_seed(0))
    hook.remove()
    assert net_calls == [2] * (3 + 1)  # Predict2: 3 AB2 steps and the clean pass, the K = 2 samples in one call
    assert len(calls) == len(net_calls) * len(adapted_linears(net)) > 0
    opt = grpo.lora_optimizer(net, params, cfg)
    stats = nft.nft_update(net, opt, params, [p.detach().clone() for p in params], [cond], [x0],
                           [torch.tensor([1.0, -1.0])], cfg, torch.Generator().manual_seed(1), True)
    assert stats["grad_norm"] > 0 and stats["nonfinite_steps"] == 0


def test_compiled_updates_do_not_recompile():
    """--compile (each block; aot_eager here, inductor in train.py) in train.py's order: the held-out evaluation's
    B = 1 no-grad calls, then updates. Update 0 compiles the rollout's B = K calls and the trained forward and
    backward; update 2, the first off-policy one (decay 0.25 after update 1), adds the old policy's no-grad forwards,
    which are the evaluation's variant: no update after the first compiles anything (dynamo's own counters), and the
    recompile limit is never reached (it raises here instead of falling back to eager)."""
    from torch._dynamo.utils import counters

    import sac
    torch._dynamo.reset()
    counters.clear()
    net, params = tiny_policy()
    sac.apply_per_block(net, sac.block_modes("block", 1, len(net.blocks)))  # the 14B recipe's --sac block
    for block in net.blocks:
        block.compile(backend="aot_eager")
    cond = tiny_condition()
    cfg = nft.NFTConfig(group_size=2, num_steps=2, decay_rate=0.25, decay_max=0.5)
    opt = grpo.lora_optimizer(net, params, cfg)
    old = [p.detach().clone() for p in params]
    family = family_of(net.cfg)
    score = latent_reward(lambda latent: latent[:, 0].mean(dim=(1, 2, 3)))
    graphs = []
    with torch._dynamo.config.patch(recompile_limit=8, fail_on_recompile_limit_hit=True):
        with torch.no_grad():  # the held-out evaluation before update 1 (engine/rl.py: the family's sampler, B = 1)
            family.sample(net, family.initial_state(torch.randn(1, *LATENT)), cond, 0.0, family.ROLLOUT_GRID, 2)
        for update in range(4):
            _, metrics = nft.train_step(net, opt, params, old, [cond], LATENT, cfg, score, update,
                                        update)
            graphs.append((counters["stats"]["unique_graphs"], counters["stats"]["calls_captured"]))
            assert (metrics["old_deviation"] > 0) == (update >= 2), (update, metrics["old_deviation"])
    assert graphs[0][0] > 1 and graphs == [graphs[0]] * 4, graphs
