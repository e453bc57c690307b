"""Cosmos-Predict2.5 networks: parity with upstream (CI subsets in tests/data/p25_*), released key tables and parameter
counts, the camera map, the fp32 time/modulation policy, and clear errors. The full reference cases run in
tests/check_reference.py."""
import json
import os
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

import check_reference
from base.camera import fallback_cameras, plucker_map
from base.inits import config_from_upstream, get_config, is_p25
from condition import Condition, condition_mask
from model import DiT, build_model, num_params
from nets.flops import model_flops
from nets.lora import add_lora

DATA = os.path.join(os.path.dirname(__file__), "data")
ATOL = 2e-5  # the reference README's bound for network outputs (other CPU kernels move them 2.4e-6)


def subset_case(case):
    """check_reference.subset_case on tests/data/<case>: ({dbg/out name: (ours, theirs)}, net)."""
    return check_reference.subset_case(os.path.join(DATA, case))


@pytest.mark.parametrize("case,expected", [
    ("p25_v2w_proj", {"dbg.x_embedder_out_B_T_H_W_D", "dbg.t_embedder_in_B_T", "dbg.t_embedder_emb_B_T_D",
                      "dbg.adaln_lora_B_T_3D", "dbg.t_embedding_norm_out_B_T_D", "dbg.crossattn_proj_out_B_N_Dc",
                      "dbg.final_layer_out_B_T_H_W_O", "dbg.rope_emb_L_1_1_D", "out.y_B_C_T_H_W"}),
    ("p25_mv_agibot", {"dbg.x_embedder_out_B_T_H_W_D", "dbg.t_embedder_in_B_T", "dbg.t_embedder_emb_B_T_D",
                       "dbg.adaln_lora_B_T_3D", "dbg.t_embedding_norm_out_B_T_D", "dbg.crossattn_proj_out_B_N_Dc",
                       "dbg.block0_out_B_T_H_W_D",
                       "dbg.final_layer_out_B_T_H_W_O", "dbg.rope_emb_L_1_1_D", "out.y_B_C_T_H_W"})])
def test_upstream_parity_on_ci_subsets(case, expected):
    pairs, net = subset_case(case)
    assert expected <= set(pairs), expected - set(pairs)  # every piece was observed, none silently skipped
    errors = {name: check_reference.max_abs(ours, theirs) for name, (ours, theirs) in pairs.items()}
    assert all(err <= ATOL for err in errors.values()), errors
    assert is_p25(net.cfg) and net.cfg.fp32_time_modulation


def test_net_time_is_upstream_timesteps_times_0_001_bit_exactly():
    io = load_file(os.path.join(DATA, "p25_v2w_proj.io.safetensors"))
    t = io["in.timesteps_B_1"].float() * 0.001  # int64 999 and 840: not 999/1000 (1 ulp apart for 584 of 1001)
    assert io["in.timesteps_B_1"].dtype == torch.int64 and torch.equal(t, io["dbg.t_embedder_in_B_T"])


def test_plucker_map_parity_and_layout():
    io = load_file(os.path.join(DATA, "p25_mv_agibot.io.safetensors"))
    cam = io["in.camera_B_T_Hp_Wp_1536"]
    ours = plucker_map(io["in.extrinsics_w2c_B_T_3_4"], io["in.intrinsics_fx_fy_cx_cy_B_T_4"], 32, 48)
    assert ours.dtype == torch.float32 and ours.shape == cam.shape == (1, 6, 2, 3, 1536)
    assert check_reference.max_abs(ours, cam) <= 1e-6
    rays = ours.reshape(1, 6, 2, 3, 16, 16, 6)  # channel (p1*16 + p2)*6 + c
    d = rays[..., 3:]
    assert torch.allclose(d.norm(dim=-1), torch.ones(()), atol=1e-6)
    assert (rays[..., :3] * d).sum(-1).abs().max() < 1e-5  # the moment o x d is orthogonal to d
    with pytest.raises(ValueError, match="multiple of the patch"):
        plucker_map(io["in.extrinsics_w2c_B_T_3_4"], io["in.intrinsics_fx_fy_cx_cy_B_T_4"], 30, 48)
    with pytest.raises(ValueError, match=r"\[\.\.\., 3, 4\]"):
        plucker_map(io["in.extrinsics_w2c_B_T_3_4"][..., :3], io["in.intrinsics_fx_fy_cx_cy_B_T_4"], 32, 48)


def test_fallback_cameras_are_static_distinct_and_centred():
    w2c, intrinsics = fallback_cameras(3, 4, 432, 768)
    assert w2c.shape == (3, 4, 3, 4) and intrinsics.shape == (3, 4, 4)
    assert torch.equal(w2c, w2c[:, :1].expand_as(w2c)) and torch.equal(intrinsics, intrinsics[:1, :1].expand_as(intrinsics))
    assert torch.equal(intrinsics[0, 0], torch.tensor([384.0, 384.0, 384.0, 216.0]))  # 90 degree horizontal fov
    centres = -w2c[:, 0, :, 3]  # R = I: c = -t
    assert torch.equal(centres[1], torch.zeros(3))  # the middle view (agibot's head) at the origin
    assert torch.allclose(centres[2] - centres[1], torch.tensor([0.5, 0.0, 0.0]))
    maps = plucker_map(w2c, intrinsics, 432, 768)
    assert maps.shape == (3, 4, 27, 48, 1536) and torch.isfinite(maps).all()
    assert not torch.equal(maps[0], maps[1]) and not torch.equal(maps[1], maps[2])  # views tell apart
    with pytest.raises(ValueError, match="all >= 1"):
        fallback_cameras(0, 4, 432, 768)


@pytest.mark.parametrize("name,count", [("p25-2b", 2_059_174_912), ("p25-14b", 14_368_047_104),
                                        ("p25-2b-agibot", 2_147_255_296)])
def test_released_parameter_counts(name, count):
    with torch.device("meta"):
        net = DiT(get_config(name))
    assert num_params(net) == count and is_p25(net.cfg)
    expected_cam = 28 * 2048 * 1536 if name.endswith("agibot") else 0
    assert sum(p.numel() for n, p in net.named_parameters() if "cam_encoder" in n) == expected_cam


def test_released_key_tables():
    results = check_reference.check_released_keys(os.path.join(DATA, "p25_released_configs_keys.json"))
    assert len(results) == 5 * 5  # 2B pre/post, 14B pre/post, agibot: keys, count, kinds, extra_state, named init
    bad = [r for r in results if not r[1] <= r[2]]
    assert not bad, bad


def test_config_from_upstream_understands_and_refuses_2p5_options():
    kwargs = json.load(open(os.path.join(DATA, "p25_mv_agibot.json")))["config"]["kwargs"]
    cfg = config_from_upstream("CameraMiniTrainDITwithConditionalMask", kwargs)
    assert cfg.camera_channels == 1536 and cfg.video2world and cfg.fp32_time_modulation and cfg.timestep_scale == 0.001
    assert not config_from_upstream("MinimalV1LVGDiT", {**kwargs, "use_wan_fp32_strategy": False}).fp32_time_modulation
    assert not is_p25(config_from_upstream("MinimalV1LVGDiT", {k: v for k, v in kwargs.items() if k != "timestep_scale"}))
    with pytest.raises(ValueError, match="timestep_scale"):
        config_from_upstream("MinimalV1LVGDiT", {**kwargs, "timestep_scale": 0.01})
    with pytest.raises(ValueError, match="use_crossattn_projection"):
        config_from_upstream("MinimalV1LVGDiT", {**kwargs, "crossattn_proj_in_channels": 32})
    # no projection: upstream ignores the in-width, and so do we
    assert not hasattr(DiT(config_from_upstream("MinimalV1LVGDiT", {**kwargs, "use_crossattn_projection": False})),
                       "crossattn_proj")


def tiny_batch(cfg, camera=True, T=3, H=4, W=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 16, T, H, W, generator=g)
    t = torch.rand(1, T, generator=g)
    text = torch.randn(1, 5, cfg.crossattn_proj_in_channels, generator=g)
    cam = None
    if camera:
        w2c, intrinsics = fallback_cameras(1, T, H * 8, W * 8)
        cam = plucker_map(w2c, intrinsics, H * 8, W * 8)
    return x, t, text, cam


def test_camera_is_required_exactly_when_the_config_has_a_cam_encoder():
    agibot, base = build_model(get_config("p25-tiny-agibot")), build_model(get_config("p25-tiny"))
    x, t, text, cam = tiny_batch(agibot.cfg)
    with pytest.raises(ValueError, match="camera_channels=1536"):
        agibot(x, t, Condition(text))
    with pytest.raises(ValueError, match="camera_channels=0"):
        base(x, t, Condition(text, camera=cam))
    with pytest.raises(ValueError, match=r"expected \(1, 3, 2, 3, 1536\)"):
        agibot(x, t, Condition(text, camera=cam[:, :2]))
    w2c, intrinsics = fallback_cameras(2, 3, 32, 48)
    rig = plucker_map(w2c, intrinsics, 32, 48)  # two cameras 0.5 apart
    with torch.no_grad():
        y = agibot(x, t, Condition(text, camera=rig[:1]))
        moved = agibot(x, t, Condition(text, camera=rig[1:]))
    assert y.shape == x.shape and not torch.equal(y, moved)  # the camera reaches the output


def test_every_parameter_gets_gradient_and_lora_keeps_the_camera_frozen():
    torch.manual_seed(0)
    net = build_model(get_config("p25-tiny-agibot"))
    x, t, text, cam = tiny_batch(net.cfg)
    net(x, t, Condition(text, condition_mask=condition_mask(x, 1), camera=cam)).square().mean().backward()
    no_grad = [n for n, p in net.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert not no_grad, no_grad
    add_lora(net, rank=2)
    assert not any(p.requires_grad for n, p in net.named_parameters() if "cam_encoder" in n or "crossattn_proj" in n)


def test_fp32_time_modulation_runs_the_time_path_in_fp32_in_a_bf16_model():
    """With the flag a bf16 model's time embedding and adaLN-LoRA bias (what every block receives) are bit-equal to
    those of an fp32 model holding the same (bf16-rounded) weights, and the final layer returns fp32; without it they
    are bf16."""
    torch.manual_seed(0)
    net16 = build_model(get_config("p25-tiny-agibot"), dtype=torch.bfloat16)
    net32 = build_model(get_config("p25-tiny-agibot"))
    net32.load_state_dict(net16.state_dict())
    x, t, text, cam = tiny_batch(net32.cfg)

    def block_inputs(net):
        seen = {}
        h = net.blocks[0].register_forward_pre_hook(lambda m, args: seen.update(emb=args[1], lora=args[4]))
        with torch.no_grad():
            y = net(x, t, Condition(text, camera=cam))
        h.remove()
        return y, seen["emb"], seen["lora"]

    y32, emb32, lora32 = block_inputs(net32)
    y16, emb16, lora16 = block_inputs(net16)
    assert emb16.dtype == lora16.dtype == y16.dtype == torch.float32
    assert torch.equal(emb16, emb32) and torch.equal(lora16, lora32)
    assert (y16 - y32).abs().max() < 0.05 * y32.abs().max()
    off = build_model(replace(get_config("p25-tiny-agibot"), fp32_time_modulation=False), dtype=torch.bfloat16)
    off.load_state_dict(net16.state_dict())
    y_off, emb_off, _ = block_inputs(off)
    assert emb_off.dtype == y_off.dtype == torch.bfloat16


def test_model_flops_count_the_text_projection_and_the_camera_encoder():
    latent, S = (1, 16, 24, 88, 160), 512
    base, agibot = get_config("p25-2b"), get_config("p25-2b-agibot")
    L = 24 * 44 * 80
    assert model_flops(agibot, latent, S)[0] - model_flops(base, latent, S)[0] == 28 * 2 * L * 1536 * 2048
    v2w = get_config("v2w-2b")
    assert model_flops(base, latent, S)[0] - model_flops(v2w, latent, S)[0] == 2 * S * 100352 * 1024


def test_tiny_configs_are_cpu_sized_predict25_nets():
    for name in ("p25-tiny", "p25-tiny-agibot"):
        cfg = get_config(name)
        assert is_p25(cfg) and cfg.crossattn_proj_in_channels == 96 and cfg.crossattn_emb_channels == 32
        assert num_params(build_model(cfg)) < 1_000_000
    assert not is_p25(get_config("tiny")) and not is_p25(get_config("v2w-14b"))


def test_check_reference_without_arguments_runs_its_folders_ci_subsets_included(tmp_path, monkeypatch, capsys):
    """`python tests/check_reference.py` (no argument, as README shows it) checks tests/data/reference and tests/data;
    a CI subset there (p25_mv_agibot: block 0 only) is checked as a subset, not refused by the strict load."""
    import shutil
    for ext in (".json", ".io.safetensors", ".weights.safetensors"):
        shutil.copy(os.path.join(DATA, "p25_mv_agibot" + ext), tmp_path)
    defaults = [os.path.relpath(d, check_reference.ROOT) for d in check_reference.DEFAULT_DIRS]
    assert defaults == ["tests/data/reference", "tests/data"]
    monkeypatch.setattr(check_reference, "DEFAULT_DIRS", (str(tmp_path),))
    assert check_reference.main([]) == 0
    out = capsys.readouterr().out
    assert "ok   p25_mv_agibot (CI subset): out.y_B_C_T_H_W" in out and "0 failed" in out
