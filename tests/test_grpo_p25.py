"""grpo.py on Predict2.5 (rectified flow, shift-5 grid, velocity CFG; docs/grpo.md §10): the SDE step coefficients,
the first update's ratio 1 bitwise, and eta 0 as the RF Euler sampler. Split from test_grpo.py (the Predict2 math)."""
import math

import pytest
import torch
from test_grpo import LATENT

import grpo
from base.inits import get_config
from condition import Condition, condition_mask
from engine.rollout import rollout_group, step_coefficients
from model import build_model
from nets import flow
from nets.lora import add_lora


def p25_policy(seed=0, rank=4):
    torch.manual_seed(seed)
    net = build_model(get_config("p25-tiny"))
    return net, add_lora(net, rank)


def p25_condition(seed=0, cft=-1.0):
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(2, 8, get_config("p25-tiny").crossattn_proj_in_channels, generator=g)
    gt = torch.randn(1, *LATENT, generator=g)
    return Condition(crossattn_emb=emb[:1], neg_crossattn_emb=emb[1:], gt_frames=gt,
                          condition_mask=condition_mask(gt, 1), key=("ep0", "pick"), conditional_frame_timestep=cft)


def test_p25_coefficients_preserve_the_noise_level_and_end_on_x0():
    sig = [float(s) for s in flow.time_grid("shift", 8)[0]]
    for sde, eta in (("ddim_eta", 0.5), ("ddim_eta", 1.0), ("cps", 0.7)):
        for i in range(7):
            a, b = step_coefficients(sde, sig[i], sig[i + 1], eta, flow)
            assert b > 0 and math.isclose(a * a + b * b, sig[i + 1] ** 2, rel_tol=1e-12)
        assert step_coefficients(sde, sig[7], 0.0, eta, flow) == (0.0, 0.0)  # the step onto x0
    # eta 1 is the exact posterior of the RF interpolation, i.e. the EDM one in s = sigma / (1 - sigma), scaled
    s, s_next = flow.edm_sigma(sig[2]), flow.edm_sigma(sig[3])
    _, b = step_coefficients("ddim_eta", sig[2], sig[3], 1.0, flow)
    assert math.isclose(b, (1 - sig[3]) * s_next * math.sqrt(1 - (s_next / s) ** 2), rel_tol=1e-12)
    with pytest.raises(ValueError, match="sigma < 1"):
        step_coefficients("ddim_eta", 1.5, 0.5, 0.5, flow)


@pytest.mark.parametrize("cft", [-1.0, 0.1])
def test_p25_rollout_first_ratio_is_one_bitwise(cft):
    net, params = p25_policy()
    cfg = grpo.GRPOConfig(data_coef=0.0, num_steps=4, kl_coef=0.004)
    ro = rollout_group(net, p25_condition(cft=cft), LATENT, cfg, torch.Generator().manual_seed(0))
    sigmas, timesteps = flow.time_grid("shift", 4)
    assert ro.sigmas == [float(s) for s in sigmas] and ro.timesteps == timesteps.tolist()
    assert ro.train_steps == [0, 1, 2] and ro.betas[3] == 0.0 and torch.isfinite(ro.log_probs[:, :3]).all()
    assert torch.equal(ro.x0_final[:, :, 1:], ro.states[:, 4, :, 1:])  # the last step lands on x0
    assert torch.equal(ro.x0_final[:, :, :1], ro.cond.gt_frames[:, :, :1].expand(2, -1, -1, -1, -1))
    opt = grpo.lora_optimizer(net, params, cfg)
    stats = grpo.grpo_update(net, opt, params, [ro], [torch.tensor([1.0, -1.0])], cfg)
    assert stats["first_logp_equal"] and stats["first_max_abs_dlogp"] == 0.0 and stats["first_ratio"] == 1.0
    assert stats["micro_steps"] == 6 and stats["opt_steps"] == 1 and stats["grads_outside_params"] == [0]
    assert math.isfinite(stats["grad_norm"][0]) and stats["grad_norm"][0] > 0 and stats["kl"] == 0.0


def test_p25_eta_zero_rollout_is_the_rf_euler_sampler():
    """eta = 0: x' = x + (sigma' - sigma) v_guided, the Euler step of the probability-flow ODE, ending on x0."""
    net, _ = p25_policy()
    cfg = grpo.GRPOConfig(num_steps=4, eta=0.0)
    cond = p25_condition(cft=0.1)
    ro = rollout_group(net, cond, LATENT, cfg, torch.Generator().manual_seed(0))
    assert ro.train_steps == [] and torch.isnan(ro.log_probs).all()
    x = noise = ro.states[0, :1]
    with torch.no_grad():
        for i in range(4):
            assert cond.conditional_frame_timestep == 0.1
            v = flow.guided_velocity(net, x, torch.tensor([ro.timesteps[i]]), cond, cfg.guidance, noise=noise)
            x = x + (ro.sigmas[i + 1] - ro.sigmas[i]) * v
            torch.testing.assert_close(ro.states[0, i + 1: i + 2], x, atol=1e-5, rtol=1e-5)
