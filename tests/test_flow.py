"""nets/flow.py: Predict2.5's rectified-flow draws, loss, UniPC grids and steps, and the CFG sampling loop, against the
upstream reference vectors (tests/data/flow_ref.safetensors: a subset of the Predict2.5 reference tensors made by the
upstream code at cosmos-predict2.5 7e5ffc83 on CPU in fp32: p25_unipc_ref, p25_training_ref, p25_sampler_ref) and
the p25_v2w_proj network they were made with (tests/data/flow_p25_v2w_proj.weights.safetensors), plus properties."""
import math
import os
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import ckpt
from base import inits
from base.inits import DiTConfig
from condition import Condition, condition_mask, multiview_condition_mask
from model import DiT
from nets import flow

DROPOUT = SimpleNamespace(text_dropout=0.2)  # the TrainConfig field flow.training_loss reads

DATA = os.path.join(os.path.dirname(__file__), "data")
REF = load_file(os.path.join(DATA, "flow_ref.safetensors"))
WEIGHTS = os.path.join(DATA, "flow_p25_v2w_proj.weights.safetensors")  # the whole net (1.5 MB)
# the p25_v2w_proj network: upstream MinimalV1LVGDiT with the 2.5 options at D=96, crossattn_proj 120 -> 64
P25_V2W_PROJ = DiTConfig(model_channels=96, num_blocks=2, num_heads=2, adaln_lora_dim=16, crossattn_emb_channels=64,
                         crossattn_proj_in_channels=120, rope_h_extrapolation_ratio=3.0,
                         rope_w_extrapolation_ratio=3.0, max_img_h=240, max_img_w=240, max_frames=128,
                         timestep_scale=0.001, fp32_time_modulation=True)


@pytest.fixture(scope="module")
def net():
    with torch.device("meta"):
        model = DiT(P25_V2W_PROJ)
    model = model.to_empty(device="cpu")
    model.init_weights()
    ckpt.load(model, WEIGHTS, verbose=False)
    return model.float().eval()


# ---------------------------------------------------------------------------------------------- training draws

def test_shifted_timesteps_bit_equal_to_upstream_draws():
    timesteps, sigma = flow.shifted_timesteps(REF["training.time.normal_draws_S_B"])
    assert torch.equal(timesteps, REF["training.time.timesteps_S_B"])
    assert torch.equal(sigma, REF["training.time.sigma_S_B"])


def test_shifted_timesteps_distribution():
    _, sigma = flow.shifted_timesteps(torch.randn(200_000, generator=torch.Generator().manual_seed(0)))
    assert abs(float(sigma.median()) - 5 * 0.5 / 3) < 3e-3  # median u = 1/2 -> 5/6
    assert 0.78 < float(sigma.mean()) < 0.81 and 0.26 < float((sigma > 0.9).float().mean()) < 0.30
    assert float(sigma.min()) > 0 and float(sigma.max()) < 1


def test_num_conditional_frames_probabilities_and_image_rule():
    u = torch.rand(40_000, generator=torch.Generator().manual_seed(1))
    counts = np.bincount([flow.num_conditional_frames(x, 4) for x in u], minlength=3) / len(u)
    assert np.allclose(counts, flow.CONDITIONAL_FRAMES_PROBS, atol=0.01), counts
    assert [flow.num_conditional_frames(x, 4) for x in (0.0, 0.4999, 0.5, 0.7499, 0.75, 0.9999)] == [0, 0, 1, 1, 2, 2]
    assert flow.num_conditional_frames(0.9, 1) == 0  # an image batch has no conditional frame


def test_draw_sample_is_a_function_of_the_seed():
    latent = torch.zeros(16, 3, 2, 2)
    a, b = flow.draw_sample(latent, 7, 0.2), flow.draw_sample(latent, 7, 0.2)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2:] == b[2:]
    assert not torch.equal(a[1], flow.draw_sample(latent, 8, 0.2)[1])
    assert flow.draw_sample(latent, 7, 1.0)[3] and not flow.draw_sample(latent, 7, 0.0)[3]


# ---------------------------------------------------------------------------------------------- loss

@pytest.mark.parametrize("run,cft", [("pretrain_cfts_minus1", -1.0), ("edm_ckpt_cfts_0p1", 0.1)])
def test_loss_given_recorded_draws(net, run, cft):
    p = f"training.loss.{run}."
    x0, u = REF[p + "in.x0_B_C_T_H_W"], REF[p + "draw.u_B"]
    timesteps = 5 * u / (1 + 4 * u) * 1000
    assert torch.equal(timesteps, REF[p + "out.timesteps_B_1"][:, 0])
    mask = condition_mask(x0, REF[p + "draw.n_cond_B"])
    assert torch.equal(flow.net_time(timesteps, mask, cft) / flow.TIMESTEP_SCALE, REF[p + "out.net_input_timesteps"])
    with torch.no_grad():
        cond = Condition(REF[p + "draw.crossattn_emb_after_dropout"], condition_mask=mask,
                         conditional_frame_timestep=cft)
        per_sample = flow.loss_given_draws(net, x0, cond, REF[p + "draw.epsilon_B_C_T_H_W"], timesteps)
    torch.testing.assert_close(per_sample, REF[p + "out.per_instance_loss_B"], rtol=1e-5, atol=0)
    torch.testing.assert_close(per_sample.mean(), REF[p + "out.loss"][0], rtol=1e-5, atol=0)


def test_conditional_frames_add_exact_zeros(net):
    x0 = torch.randn(2, 16, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    eps = torch.randn_like(x0)
    mask = condition_mask(x0, torch.tensor([1, 2]))
    text = torch.randn(2, 12, 120)
    with torch.no_grad():
        v = flow.velocity(net, eps * 0.7 + x0 * 0.3, torch.tensor([700.0, 700.0]),
                          Condition(text, gt_frames=x0, condition_mask=mask, conditional_frame_timestep=0.1), eps)
    assert torch.equal((v - (eps - x0)) * mask, torch.zeros_like(v))
    with pytest.raises(ValueError, match="gt_frames"):
        flow.velocity(net, x0, torch.tensor([1.0, 1.0]), Condition(text, condition_mask=mask))


def test_training_loss_seeded_and_differentiable(net):
    latent = torch.randn(2, 16, 3, 4, 4, generator=torch.Generator().manual_seed(3))
    text = torch.randn(2, 12, 120)
    a = flow.training_loss(net, latent, Condition(text), [11, 12], DROPOUT)
    b = flow.training_loss(net, latent, Condition(text), [11, 12], DROPOUT)
    assert torch.equal(a, b) and a.requires_grad  # a graph to train through
    assert not torch.equal(a, flow.training_loss(net, latent, Condition(text), [11, 13], DROPOUT))


# ---------------------------------------------------------------------------------------------- sampler

@pytest.mark.parametrize("grid", ["shift5", "karras"])
@pytest.mark.parametrize("n", [35, 10, 8, 4])
def test_grids(grid, n):
    sigmas, timesteps = flow.time_grid("shift" if grid == "shift5" else "karras", n)
    assert torch.equal(timesteps, REF[f"unipc.grid.{grid}_N{n}.timesteps_int64"])  # exact
    torch.testing.assert_close(sigmas, REF[f"unipc.grid.{grid}_N{n}.sigmas_fp32"], rtol=0, atol=1e-7)
    assert len(timesteps) == (n if grid == "shift5" else n + 1) and float(sigmas[-1]) == 0.0


def test_grid_refused():
    with pytest.raises(ValueError, match="grid='edm'"):
        flow.time_grid("edm", 10)


@pytest.mark.parametrize("grid", ["shift5", "karras"])
def test_unipc_states(grid):
    p = f"unipc.step.{grid}_N35."
    sigmas, _ = flow.time_grid("shift" if grid == "shift5" else "karras", 35)
    states = {}
    out = flow.unipc(lambda x, i: REF[p + f"in.velocity_step{i}"], REF[p + "in.sample0"], sigmas,
                     callback=lambda i, x, x0: states.__setitem__(i, x))
    assert len(states) == len(sigmas) - 1
    for i, x in states.items():
        torch.testing.assert_close(x, REF[p + f"out.sample_after_step{i}"], rtol=0, atol=1e-5)
    assert torch.equal(out, states[len(states) - 1])


def test_unipc_is_exact_for_a_constant_velocity():
    """x_sigma = (1 - sigma) x0 + sigma eps has the constant velocity eps - x0: every step must stay on that line."""
    x0, eps = torch.randn(1, 16, 2, 2, 2), torch.randn(1, 16, 2, 2, 2)
    sigmas, _ = flow.time_grid("shift", 10)
    states = {}
    out = flow.unipc(lambda x, i: eps - x0, (1 - sigmas[0]) * x0 + sigmas[0] * eps, sigmas,
                     callback=lambda i, x, _: states.__setitem__(i, x))
    for i, x in states.items():
        torch.testing.assert_close(x, (1 - sigmas[i + 1]) * x0 + sigmas[i + 1] * eps, rtol=0, atol=1e-6)
    torch.testing.assert_close(out, x0, rtol=0, atol=1e-6)  # fp32 rounding only


def test_checkpoint_defaults_follow_the_spec_table():
    assert inits.checkpoint_defaults("p25-2b-post", "p25-2b") == ("karras", 0.1)
    post = "/ckpt/81edfebe-bd6a-4039-8c1d-737df1a790bf_ema_bf16.pt"  # a local copy of the 2B post-trained file
    assert inits.checkpoint_defaults(post, "p25-2b") == ("karras", 0.1)
    for init in ("p25-2b-pre", "p25-14b-pre", "p25-14b-post", "random"):
        assert inits.checkpoint_defaults(init, "p25-2b") == ("shift", -1.0)
    assert inits.checkpoint_defaults("p25-2b-agibot", "p25-2b-agibot") == ("shift", 0.1)  # frame-init sampler


def test_initial_noise_is_numpy_unit_variance():
    assert torch.equal(flow.initial_noise((1, 16, 2, 2, 2), 0), REF["unipc.step.shift5_N35.in.sample0"])


@pytest.mark.parametrize("run,grid,steps,cft", [("shift5_N10", "shift", 10, -1.0), ("karras_N8", "karras", 8, 0.1)])
def test_sampler_parity(net, run, grid, steps, cft):
    x0 = REF["sampler.in.x0_latent_B_C_T_H_W"]
    mask = condition_mask(x0, 1)
    noise = flow.initial_noise(tuple(x0.shape), 0)
    states = {}
    cond = Condition(REF["sampler.in.crossattn_emb"], REF["sampler.in.neg_crossattn_emb"], x0, mask,
                     conditional_frame_timestep=cft)
    out = flow.sample(net, noise, cond, 7.0, grid, steps, callback=lambda i, x, _: states.__setitem__(i, x))
    for i in (0, 1, 2):
        torch.testing.assert_close(states[i], REF[f"sampler.{run}.step{i}.latents_after"], rtol=0, atol=3e-4)
    final = REF[f"sampler.{run}.final_latents"]
    torch.testing.assert_close(out * (1 - mask), final * (1 - mask), rtol=0, atol=3e-4)
    # upstream leaves (1 - sigma_0) noise + sigma_0 gt on the conditional frames; we put gt back
    sigma_0 = float(flow.time_grid(grid, steps)[0][0])
    torch.testing.assert_close(final * mask, ((1 - sigma_0) * noise + sigma_0 * x0) * mask, rtol=0, atol=1e-6)
    assert torch.equal(out * mask, x0 * mask)


def test_sampler_velocities_given_the_stored_latents(net):
    x0 = REF["sampler.in.x0_latent_B_C_T_H_W"]
    noise = flow.initial_noise(tuple(x0.shape), 0)
    with torch.no_grad():
        for name, emb in (("v_cond", "crossattn_emb"), ("v_uncond", "neg_crossattn_emb")):
            cond = Condition(REF[f"sampler.in.{emb}"], gt_frames=x0, condition_mask=condition_mask(x0, 1))
            v = flow.velocity(net, noise, torch.tensor([999]), cond, noise)
            torch.testing.assert_close(v, REF[f"sampler.shift5_N10.step0.{name}"], rtol=0, atol=2e-5)


# ---------------------------------------------------------------------------------------------- multi-view

def test_multiview_condition_mask():
    latent = torch.zeros(2, 16, 6, 4, 6)  # 3 views x 2 latents
    mask = multiview_condition_mask(latent, 3, 1)
    assert mask.shape == (2, 1, 6, 4, 6)
    assert mask[0, 0, :, 0, 0].tolist() == [1, 0, 1, 0, 1, 0]  # the agibot reference's frame-init mask
    per_sample = multiview_condition_mask(torch.zeros(2, 16, 9, 2, 2), 3, torch.tensor([0, 2]))
    assert per_sample[0, 0, :, 0, 0].tolist() == [1, 0, 0, 0, 0, 0, 0, 0, 0]
    assert per_sample[1, 0, :, 0, 0].tolist() == [1, 0, 0, 1, 1, 0, 1, 1, 0]  # view 0 keeps only latent 0
    with pytest.raises(ValueError, match="not 3 views"):
        multiview_condition_mask(torch.zeros(1, 16, 7, 2, 2), 3, 1)


def test_multiview_initial_noise_is_one_draw_per_view():
    noise = flow.multiview_initial_noise((1, 16, 6, 2, 3), 3, 4)
    one = flow.initial_noise((1, 16, 2, 2, 3), 4)
    assert all(torch.equal(noise[:, :, 2 * v: 2 * v + 2], one) for v in range(3))
    with pytest.raises(ValueError, match="not 4 views"):
        flow.multiview_initial_noise((1, 16, 6, 2, 3), 4, 0)


def test_camera_reaches_the_net():
    seen = {}

    def fake_net(x, t, cond):
        seen.update(camera=cond.camera)
        return torch.zeros_like(x[:, :16])
    camera = torch.ones(1, 2, 1, 1, 1536)
    flow.velocity(fake_net, torch.zeros(1, 16, 2, 2, 2), torch.tensor([500]), Condition(None, camera=camera))
    assert seen["camera"] is camera
    seen.clear()
    flow.velocity(fake_net, torch.zeros(1, 16, 2, 2, 2), torch.tensor([500]), Condition(None))
    assert seen == {"camera": None}


def test_multiview_camera_loss_and_sampler_run_on_a_camera_net():
    """p25-tiny-agibot: views stacked on time, the frame-init mask, a camera map per latent frame; the camera moves
    the loss (it reaches every block), and a missing camera is refused by the net."""
    from base.inits import get_config
    from model import build_model
    torch.manual_seed(0)
    cam_net = build_model(get_config("p25-tiny-agibot"))
    with torch.no_grad():
        for block in cam_net.blocks:
            block.cam_encoder.weight.normal_(0, 0.02)
    latent = torch.randn(1, 16, 6, 4, 6)  # 3 views x 2 latents
    text = torch.randn(1, 8, 96)
    camera = torch.randn(1, 6, 2, 3, 1536)
    mask_fn = lambda x, n: multiview_condition_mask(x, 3, n)  # noqa: E731
    with torch.no_grad():
        cond = Condition(text, conditional_frame_timestep=0.1, camera=camera)
        no_dropout = SimpleNamespace(text_dropout=0.0)  # the camera selects the views' frame-init mask (mask_fn's)
        a = flow.training_loss(cam_net, latent, cond, [5], no_dropout)
        b = flow.training_loss(cam_net, latent, replace(cond, camera=camera * 2), [5], no_dropout)
        assert torch.isfinite(a) and a != b
        cond = replace(cond, neg_crossattn_emb=torch.zeros_like(text), gt_frames=latent,
                       condition_mask=mask_fn(latent, 1))
        out = flow.sample(cam_net, flow.initial_noise((1, 16, 6, 4, 6), 0), cond, 7.0, "shift", 2)
    assert torch.equal(out[:, :, [0, 2, 4]], latent[:, :, [0, 2, 4]])  # the views' first latents are kept
    with pytest.raises(ValueError, match="camera"):
        flow.velocity(cam_net, latent, torch.tensor([500]), Condition(text))


# ---------------------------------------------------------------------------------------------- GRPO step

def test_rf_step_mean_is_the_ddim_form():
    x0, eps = torch.randn(4, 8).double(), torch.randn(4, 8).double()
    sigma, sigma_next = 0.8, 0.6
    x = (1 - sigma) * x0 + sigma * eps
    for alpha in (sigma_next, 0.3, 0.0):  # x0_hat, eps_hat exact: mean = (1 - s') x0 + alpha eps
        torch.testing.assert_close(flow.mean_from_x0(x, x0, sigma, sigma_next, alpha), (1 - sigma_next) * x0 + alpha * eps)
    assert math.isclose(flow.edm_sigma(0.5), 1.0)
