"""Run every upstream reference case found in the given folders through OUR code and print the max-abs errors.

    python tests/check_reference.py [DIR ...]      # default: tests/data/reference and tests/data (the CI subsets)

A model case is `<case>.json` + `<case>.weights.safetensors` + `<case>.io.safetensors` (the format of
tests/data/reference/, described in its README.md and in docs/predict2.md): the json's upstream constructor kwargs
are mapped to our DiTConfig, the weights go through ckpt.load (the project's strict key handling), and every
`out.*` tensor (and `dbg.*` intermediate we can observe) is compared. Also checked when present: the denoiser +
35-step sampler, the sampler step, RoPE/timestep components, the released configs' key tables, and Wan2.1 VAE
cases (tests/ref_vae.py).
Predict2.5 cases (`p25_*`, the format of the predict25 reference folder): the networks are fed our time
t = timesteps.float() * timestep_scale (upstream's net input is 1000 t, scaled by 0.001 inside: bit-exact); also the
extra calls, the RF velocity around them (flow.velocity), the Reason1 normalise+concat of fake hidden states
(t5.reason1_normalize_concat), the Pluecker camera map (camera.plucker_map) and the released 2.5 key tables; the
training draws and RF loss, UniPC grids and steps and the full CFG sampler (p25_training_ref, p25_unipc_ref,
p25_sampler_ref) in full through nets/flow.py, in tests/check_reference_p25.py.
CI subsets (a json with `weights_kept`, e.g. tests/data/p25_*: some blocks' weights only) run as tests/test_p25.py
runs them: the blocks in the file, the final layer fed upstream's last block output.
Exit status 1 if any error exceeds its bound (2e-5 for the DiT and sampler) or a checked piece of our code is
MISSING (never counted as passing).
"""
import glob
import json
import os
import sys
from dataclasses import replace

import torch
from safetensors.torch import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ckpt  # noqa: E402
from base.camera import plucker_map  # noqa: E402
from base.inits import config_from_upstream, get_config  # noqa: E402
from condition import Condition, condition_mask  # noqa: E402
from model import DiT, Timesteps
from nets import edm  # noqa: E402
from nets.edm import denoise  # noqa: E402

BOUND = 2e-5
CAMERA_BOUND = 1e-6  # the reference README: fp64 from-formula Pluecker rays differ by 3.8e-7
MISSING = float("inf")  # a piece of our code the check needs does not exist yet: reported MISSING, never passing
# Upstream reads RoPE exponents from buffers that released files store bf16-rounded; we compute them exactly in fp32
# by design (model.RopePositions). Where a case provides both outputs, the exact-RoPE one is the target and the
# rounded-buffer one is reported with this looser, documented bound (the case itself measured 2.85e-4 between them).
ROUNDED_ROPE_BOUND = 1e-3

# upstream forward kwarg -> ours: the latent, the time, or a condition.Condition field
KWARG_MAP = {"x_B_C_T_H_W": "x_B_C_T_H_W", "timesteps_B_T": "t_B_T", "crossattn_emb": "crossattn_emb",
             "condition_video_input_mask_B_C_T_H_W": "condition_mask", "fps": "fps",
             "padding_mask": "padding_mask", "camera": "camera"}
# io-file input names -> upstream kwarg, for cases whose json describes the call in words
INPUT_PREFIXES = {"in.x_": "x_B_C_T_H_W", "in.timesteps": "timesteps_B_T", "in.crossattn_emb": "crossattn_emb",
                  "in.condition_video_input_mask": "condition_video_input_mask_B_C_T_H_W", "in.fps": "fps",
                  "in.padding_mask": "padding_mask"}


def max_abs(a, b):
    if tuple(a.shape) != tuple(b.shape):
        if a.numel() * b.shape[0] == b.numel():  # ours shared over the batch, theirs repeated per sample
            a = a.reshape(1, *b.shape[1:]).expand(b.shape)
        a = a.reshape(b.shape)
    return (a.double() - b.double()).abs().max().item()


def build_dit_case(case_json, weights_path):
    cfg = config_from_upstream(case_json["config"]["class"], case_json["config"]["kwargs"])
    with torch.device("meta"):
        net = DiT(cfg)
    net = net.to_empty(device="cpu")
    net.init_weights()
    ckpt.load(net, weights_path, verbose=False)
    return net.float().eval()


def call_kwargs(spec, io, cfg):
    if isinstance(spec, str):  # described in words ("identical to ... (video call)"): infer from the inputs
        spec = {}
        for name in io:
            for prefix, kwarg in INPUT_PREFIXES.items():
                if name.startswith(prefix) and "image_" not in name:
                    spec[kwarg] = name
    kwargs = {}
    for upstream_name, tensor_name in spec.items():
        if upstream_name == "data_type":
            continue
        if upstream_name not in KWARG_MAP:
            raise ValueError(f"forward kwarg {upstream_name!r} not understood")
        kwargs[KWARG_MAP[upstream_name]] = None if tensor_name is None else io[tensor_name]
    # upstream 2.5 nets take 1000 t and scale it by 0.001 inside (an fp32 multiply): the same op gives our t exactly
    kwargs["t_B_T"] = kwargs["t_B_T"].float() * cfg.timestep_scale
    if spec.get("data_type") == "DataType.IMAGE":  # image batches carry an all-zero condition channel
        kwargs["condition_mask"] = None
    return kwargs


def forward(net, kwargs):
    """net(x, t, Condition) from call_kwargs' dict: the latent, the time and the record's fields."""
    fields = {k: v for k, v in kwargs.items() if k not in ("x_B_C_T_H_W", "t_B_T")}
    return net(kwargs["x_B_C_T_H_W"], kwargs["t_B_T"], Condition(**fields))


def observe(net):
    """Forward hooks that record our intermediates under the reference's dbg.* names."""
    seen, handles = {}, []

    def keep(name, fn=lambda out: out):
        return lambda module, args, out: seen.__setitem__(name, fn(out).detach())

    def keep_input(name, index):
        return lambda module, args: seen.__setitem__(name, args[index].detach())

    handles.append(net.x_embedder.register_forward_hook(keep("x_embedder_out")))
    for i, block in enumerate(net.blocks):
        handles.append(block.register_forward_hook(keep(f"block{i}_out")))
        if hasattr(block, "cam_encoder"):
            handles.append(block.cam_encoder.register_forward_hook(keep(f"block{i}_cam_encoder_out")))
    handles.append(net.final_layer.register_forward_hook(keep("final_layer_out")))
    # the normed time embedding is what every block and the final layer receive (fp32_time_modulation normalises it
    # functionally, so no hook on t_embedding_norm would see it)
    handles.append(net.final_layer.register_forward_pre_hook(keep_input("t_embedding_norm_out", 1)))
    handles.append(net.t_embedder[0].register_forward_pre_hook(keep_input("t_embedder_in", 0)))
    handles.append(net.t_embedder[0].register_forward_hook(keep("sinusoid")))
    handles.append(net.t_embedder[1].register_forward_hook(keep("t_mlp")))
    if hasattr(net, "crossattn_proj"):
        handles.append(net.crossattn_proj.register_forward_hook(keep("crossattn_proj_out")))
    if hasattr(net, "extra_pos_embedder"):
        handles.append(net.extra_pos_embedder.register_forward_hook(keep("extra_pos_emb")))
    return seen, handles


def dbg_target(name, seen, net, io):
    """Our tensor for a reference dbg.* name, or None if we do not observe it."""
    key = name[len("dbg."):]
    for ours in seen:
        if key.startswith(ours + "_") or key == ours:
            return seen[ours]
    if key.startswith("t_embedder_emb"):  # with adaLN-LoRA upstream's "emb" is the raw sinusoid
        return seen["sinusoid"] if net.cfg.use_adaln_lora else seen["t_mlp"]
    if key.startswith("adaln_lora"):
        return seen["t_mlp"]
    if key.startswith("rope_emb"):
        x = io["in.x_B_C_T_H_W"]
        cfg = net.cfg
        T, H, W = (x.shape[2] // cfg.patch_temporal, x.shape[3] // cfg.patch_spatial, x.shape[4] // cfg.patch_spatial)
        return net.pos_embedder.angles(T, H, W, io.get("in.fps_B"), x.device)
    return None


def check_dit_case(json_path):
    stem = json_path[: -len(".json")]
    case = json.load(open(json_path))
    io = load_file(stem + ".io.safetensors")
    net = build_dit_case(case, stem + ".weights.safetensors")
    call = case.get("call", {})
    results = []
    outputs = [k for k in io if k.startswith("out.")]
    exact_rope_target = "out.y_if_rope_buffers_recomputed_fp32" in outputs
    with torch.no_grad():
        seen, handles = observe(net)
        video_out = forward(net, call_kwargs(call.get("forward_kwargs", ""), io, net.cfg))
        for h in handles:
            h.remove()
        produced = {"out.y_B_C_T_H_W": video_out, "out.y_if_rope_buffers_recomputed_fp32": video_out}
        if "image_call_forward_kwargs" in call:
            produced["out.image_y_B_C_1_H_W"] = forward(net, call_kwargs(call["image_call_forward_kwargs"], io, net.cfg))
        for extra in case.get("extra_calls", []):
            produced[extra["output"]] = forward(net, call_kwargs(extra["forward_kwargs"], io, net.cfg))
        if "out.y_with_bf16_camera_B_C_T_H_W" in outputs:  # the network on upstream's bf16-rounded map
            kwargs = call_kwargs(call["forward_kwargs"], io, net.cfg)
            kwargs["camera"] = io["out.camera_bf16_B_T_Hp_Wp_1536"].float()
            produced["out.y_with_bf16_camera_B_C_T_H_W"] = forward(net, kwargs)
        p25_denoise(net, io, produced)
    for name in outputs:
        if name == "out.camera_bf16_B_T_Hp_Wp_1536":  # our map is checked in fp32 below
            print(f"    {name}: upstream's bf16-rounded map, used as the input of out.y_with_bf16_camera")
            continue
        if name not in produced:
            print(f"    {name}: not computed by this checker")
            continue
        bound = BOUND
        label = name
        if exact_rope_target and name == "out.y_B_C_T_H_W":
            bound, label = ROUNDED_ROPE_BOUND, name + " (upstream's bf16-rounded RoPE buffers; ours exact)"
        if produced[name] is None:
            results.append((label + " (flow.velocity does not exist)", MISSING, bound))
        else:
            results.append((label, max_abs(produced[name], io[name]), bound))
    if "in.extrinsics_w2c_B_T_3_4" in io:
        cam = io["in.camera_B_T_Hp_Wp_1536"]
        ours_cam = plucker_map(io["in.extrinsics_w2c_B_T_3_4"], io["in.intrinsics_fx_fy_cx_cy_B_T_4"],
                               cam.shape[2] * 16, cam.shape[3] * 16)
        results.append(("camera.plucker_map vs in.camera_B_T_Hp_Wp_1536", max_abs(ours_cam, cam), CAMERA_BOUND))
    if "in.text_hidden_states_Lp1_B_N_W" in io:
        results.append(reason1_check(io))
    for name in sorted(k for k in io if k.startswith("dbg.")):
        ours = dbg_target(name, seen, net, io)
        if ours is None:
            print(f"    {name}: not observed by this checker")
            continue
        results.append((name, max_abs(ours, io[name]), BOUND))
    return results


def p25_denoise(net, io, ours):
    """upstream Video2WorldModelRectifiedFlow.denoise around the case's calls, through flow.velocity: fills
    ours[out.denoise_velocity*] (None while nets/flow.py does not exist)."""
    if "in.denoise_noise_B_C_T_H_W" not in io:
        return
    try:
        from nets import flow
    except ModuleNotFoundError as e:
        if e.name != "flow":
            raise
        flow = None
    common = dict(gt_frames=io["in.denoise_gt_frames_B_C_T_H_W"],
                  condition_mask=io["in.condition_video_input_mask_B_1_T_H_W"], fps=io["in.fps_B"],
                  padding_mask=io["in.padding_mask_B_1_H_W"])
    if "in.denoise_xt_callA_B_C_T_H_W" in io:  # p25_v2w_proj: A at the shared timestep, B with conditional t 0.1
        calls = {"out.denoise_velocity_callA_B_C_T_H_W": ("in.denoise_xt_callA_B_C_T_H_W", "in.timesteps_B_1",
                                                          "in.crossattn_emb", -1.0),
                 "out.denoise_velocity_callB_B_C_T_H_W": ("in.denoise_xt_callB_B_C_T_H_W",
                                                          "in.denoise_timesteps_callB_B_1", "in.callB_crossattn_emb",
                                                          0.1)}
    else:  # p25_mv_agibot: one call, conditional t 0.1, with the camera map
        calls = {"out.denoise_velocity_B_C_T_H_W": ("in.denoise_xt_B_C_T_H_W", "in.denoise_timesteps_B_1",
                                                    "in.crossattn_emb", 0.1)}
        common["camera"] = io["in.camera_B_T_Hp_Wp_1536"]
    for out_name, (xt, timesteps, text, conditional_frame_timestep) in calls.items():
        cond = Condition(io[text], conditional_frame_timestep=conditional_frame_timestep, **common)
        ours[out_name] = None if flow is None else flow.velocity(net, io[xt], io[timesteps], cond,
                                                                 io["in.denoise_noise_B_C_T_H_W"])


def reason1_check(io):
    """The Reason1 per-layer normalise + concat (t5.reason1_normalize_concat) on the case's fake hidden states."""
    import t5
    label = "t5.reason1_normalize_concat(in.text_hidden_states_Lp1_B_N_W) vs in.crossattn_emb"
    if not hasattr(t5, "reason1_normalize_concat"):
        return label + " (t5.reason1_normalize_concat does not exist)", MISSING, BOUND
    return label, max_abs(t5.reason1_normalize_concat(io["in.text_hidden_states_Lp1_B_N_W"]), io["in.crossattn_emb"]), BOUND


def check_sampler(ref_dir):
    """Video2WorldPipeline.denoise and the full 35-step guided sampler, on the v2w_lora_cond network."""
    info = json.load(open(os.path.join(ref_dir, "diffusion_ref.json")))
    results = []
    for steps, sched in info["rf_ab2_sigma_schedule"].items():
        if steps.isdigit():
            ours = edm.karras_sigmas(int(steps))
            results.append((f"karras sigmas n={steps}", max_abs(ours, torch.tensor(sched["sigmas_float64"], dtype=torch.float64)),
                            1e-12))
    ref_path = os.path.join(ref_dir, "v2w_denoise_sampler_ref.safetensors")
    if not os.path.exists(ref_path):
        return results
    net_case = info["v2w_denoise_sampler_ref"]["network"].split(" ")[0]
    case = json.load(open(os.path.join(ref_dir, net_case + ".json")))
    net = build_dit_case(case, os.path.join(ref_dir, net_case + ".weights.safetensors"))
    ref = load_file(ref_path)
    gt = ref["in.gt_frames_B_C_T_H_W"]
    mask = condition_mask(gt, 1)
    cond = Condition(ref["in.crossattn_emb"], ref["samp.negative_crossattn_emb"], gt, mask, fps=ref["in.fps"],
                     padding_mask=ref["in.padding_mask"])
    with torch.no_grad():
        x0, velocity = denoise(net, ref["in.xt_B_C_T_H_W"], ref["in.sigma_B"], cond)
    sigma = ref["in.sigma_B"].view(-1, 1, 1, 1, 1)
    eps = (ref["in.xt_B_C_T_H_W"] - x0) / sigma
    results += [("denoise x0", max_abs(x0, ref["out.x0_pred"]), BOUND),
                ("denoise eps", max_abs(eps, ref["out.eps_pred"]), BOUND)]
    noise = edm.initial_noise(tuple(gt.shape), seed=0)
    results.append(("sampler initial noise", max_abs(noise, ref["samp.initial_sample"]), 0.0))
    x0_fn = edm.guided_x0_fn(net, cond, 7.0)
    steps = {}

    def record(i, x, x0_pred):
        steps[i] = (x, x0_pred)

    final = edm.sample_x0(x0_fn, noise, num_steps=35, callback=record)
    # The guided x0 = (1+g) x0_cond - g x0_uncond amplifies each network call's fp32 rounding (ours and upstream's
    # outputs are each 2-4e-6 from an fp64 evaluation of the same net) by up to 1+g; the bound scales with it.
    guided_bound = BOUND * (1 + 7.0)
    for i in (0, 1, 2, 34):
        results.append((f"sampler x0 step {i} (guided, bound x(1+g))", max_abs(steps[i][1], ref[f"samp.x0_pred_step{i}"]),
                        guided_bound))
        results.append((f"sampler state after step {i}", max_abs(steps[i][0], ref[f"samp.sample_after_step{i}"]), BOUND))
    results.append(("sampler final x0 (guided)", max_abs(final, ref["samp.final_x0"]), guided_bound))
    return results


def check_sampler_step(path):
    ref = load_file(path)
    sigmas = ref["sigmas_35_float64"]
    x, x0_prev, results = ref["in.sample0"], None, []
    for i in range(3):
        x, x0_prev = edm.sampler_step(ref[f"in.x0_pred_step{i}"], i, x, x0_prev, sigmas)
        results.append((f"step {i} sample", max_abs(x, ref[f"out.sample_after_step{i}"]), BOUND))
        results.append((f"step {i} x0_prev", max_abs(x0_prev, ref[f"out.x0_prev_after_step{i}"]), BOUND))
    return results


def check_components(json_path):
    from base.inits import DiTConfig
    from model import RopePositions
    info = json.load(open(json_path))
    ref = load_file(json_path[: -len(".json")] + ".safetensors")
    results = []
    for name, spec in info.get("rope", {}).items():
        kw = spec["kwargs"]
        d = kw["head_dim"]
        cfg = DiTConfig(model_channels=d, num_heads=1, max_img_h=kw["len_h"] * 2, max_img_w=kw["len_w"] * 2,
                        max_frames=kw["len_t"], rope_h_extrapolation_ratio=kw["h_extrapolation_ratio"],
                        rope_w_extrapolation_ratio=kw["w_extrapolation_ratio"],
                        rope_t_extrapolation_ratio=kw["t_extrapolation_ratio"],
                        rope_enable_fps_modulation=kw["enable_fps_modulation"])
        T, H, W = spec["grid_T_H_W"]
        ours = RopePositions(cfg).angles(T, H, W, None, "cpu")
        results.append((f"rope.{name}.fp32", max_abs(ours, ref[f"rope.{name}.fp32"]), BOUND))
        # upstream in bf16 computes these angles in bf16; ours stay exact whatever the module dtype
        ours_bf16 = RopePositions(cfg).to(torch.bfloat16).angles(T, H, W, None, "cpu")
        results.append((f"rope.{name} bf16 module == fp32 (ours)", max_abs(ours_bf16, ours), 0.0))
    fps_spec = info.get("rope_fps_example")
    if fps_spec:
        B, T, H, W, d = fps_spec["shape_B_T_H_W_C"]
        cfg = DiTConfig(model_channels=d, num_heads=1, rope_enable_fps_modulation=True)
        ours = RopePositions(cfg).angles(T, H, W, torch.full((B,), float(fps_spec["fps"])), "cpu")
        key = [k for k in ref if k.startswith("rope.fps_mod")][0]
        results.append((key, max_abs(ours, ref[key]), BOUND))
    if "timesteps.in_t" in ref:
        t = ref["timesteps.in_t"]
        dim = ref["timesteps.D128.fp32"].shape[-1]
        results.append(("timesteps fp32", max_abs(Timesteps(dim)(t), ref["timesteps.D128.fp32"]), BOUND))
        # upstream returns the sinusoid in the input dtype; our DiT casts it to the model dtype, bf16 here
        ours_bf16 = Timesteps(dim)(t.bfloat16()).to(torch.bfloat16)
        results.append(("timesteps bf16 input", max_abs(ours_bf16, ref["timesteps.D128.bf16_input"]), BOUND))
    return results


def released_key_report(json_path, config, label):
    """(table, model entries, file entries, ckpt report) of an action release's key table (check_reference_action's,
    check_reference_p25_action's): upstream's kwargs parsed equal `config`, the meta-device build's parameter count
    equal the table's, and the table's keys loaded as a released file holds them (net. keys, bf16) into it."""
    table = json.load(open(json_path))
    cfg = get_config(config)
    assert config_from_upstream(table["class"], table["kwargs"]) == cfg  # upstream's released kwargs, parsed
    with torch.device("meta"):
        net = DiT(cfg)
    assert sum(p.numel() for p in net.parameters()) == table["num_parameters"]
    dtypes = {"uint8": torch.uint8, "int64": torch.int64, "float32": torch.bfloat16}
    entries = {f"net.{key}": (tuple(shape), dtypes[dtype]) for key, shape, dtype, kind in table["keys"]}
    model = {k: (shape, torch.bfloat16, trainable) for k, (shape, _, trainable) in ckpt.model_entries(net).items()}
    report, _ = ckpt.build_report(model, entries, label)
    return table, model, entries, report


def check_released_keys(json_path):
    """Meta-device builds of the released configs: keys, shapes and parameter counts equal upstream's.
    Predict2.5 entries (net_class/net_kwargs) also: state_dict key counts by kind, every `_extra_state` key ignorable
    by ckpt.py, and the named init of the registry file (ckpt.NAMED_INITS) naming a config equal to upstream's."""
    results = []
    for symbol, spec in json.load(open(json_path))["configs"].items():
        cfg = config_from_upstream(spec.get("class") or spec["net_class"], spec.get("kwargs") or spec["net_kwargs"])
        with torch.device("meta"):
            net = DiT(cfg)
        ours = {k: tuple(v.shape) for k, v in net.state_dict().items()}
        table = spec[[k for k in spec if k.startswith("keys_nonblock_and_block0")][0]]
        theirs = {k: tuple(s) for k, s, _, kind in table if kind != "extra_state" and not ckpt.is_ignorable(k)}
        ours_b0 = {k: v for k, v in ours.items() if not k.startswith("blocks.") or k.startswith("blocks.0.")}
        wrong = len(set(ours_b0.items()) ^ set(theirs.items()))
        n_params = sum(p.numel() for p in net.parameters())
        results.append((f"{symbol} key/shape differences", float(wrong), 0.0))
        results.append((f"{symbol} parameter count {n_params} vs {spec['num_parameters']}",
                        float(abs(n_params - spec["num_parameters"])), 0.0))
        if "net_class" not in spec:
            continue
        kinds = spec["num_keys_by_kind"]
        n_params_keys = len(dict(net.named_parameters()))
        counters = len(ckpt.IGNORABLE_KEYS)  # upstream's accum_* buffers, which we do not keep
        results.append((f"{symbol} parameter keys {n_params_keys} vs {kinds['parameter']}, buffer keys"
                        f" {len(ours) - n_params_keys} + {counters} counters vs {kinds['buffer']}",
                        float(abs(n_params_keys - kinds["parameter"]) + abs(len(ours) - n_params_keys + counters
                                                                            - kinds["buffer"])), 0.0))
        not_ignorable = [k for k in spec["extra_state_keys"] if not ckpt.is_ignorable(k)]
        results.append((f"{symbol} _extra_state keys ckpt.py cannot ignore {not_ignorable}", float(len(not_ignorable)),
                        0.0))
        inits = [n for n, url in ckpt.NAMED_INITS.items() if spec["registry"]["files"][0] in url]
        named = [ckpt.INIT_CONFIGS[n] for n in inits]
        same = len(inits) == 1 and get_config(named[0]) == cfg
        results.append((f"{symbol} named init {inits} -> config {named} equals the upstream kwargs' config",
                        0.0 if same else 1.0, 0.0))
    return results


def subset_case(stem):
    """Our net on a CI subset (`stem`.json lists weights_kept): the blocks in the file (cam_encoder outputs taken from
    upstream's), the final layer fed upstream's last block output. Returns ({dbg/out name: (ours, theirs)}, net)."""
    meta = json.load(open(stem + ".json"))
    io = load_file(stem + ".io.safetensors")
    blocks = len({k.split(".")[1] for k in meta["weights_kept"] if k.startswith("blocks.")})
    upstream_blocks = meta["config"]["kwargs"]["num_blocks"]
    cfg = replace(config_from_upstream(meta["config"]["class"], meta["config"]["kwargs"]), num_blocks=blocks)
    with torch.device("meta"):
        net = DiT(cfg)
    net = net.to_empty(device="cpu")
    net.init_weights()
    report = ckpt.load(net, stem + ".weights.safetensors", allow_missing=(r"^blocks\.\d+\.cam_encoder\.weight$",),
                       verbose=False)
    if len(report.allowed_missing) != (blocks if cfg.camera_channels else 0):
        raise ckpt.CheckpointError(f"{stem}: missing {report.allowed_missing}, expected only cam_encoder weights")
    seen, handles = observe(net)
    for i, block in enumerate(net.blocks):
        if cfg.camera_channels:  # upstream's cam_encoder output; where it enters the block is under test
            stored = io[f"dbg.block{i}_cam_encoder_out_B_T_H_W_D"]
            handles.append(block.cam_encoder.register_forward_hook(
                lambda m, args, out, stored=stored: stored.reshape(out.shape)))
    last = io[f"dbg.block{upstream_blocks - 1}_out_B_T_H_W_D"]
    handles.append(net.final_layer.register_forward_pre_hook(
        lambda m, args: (last.reshape(args[0].shape), *args[1:])))
    with torch.no_grad():
        out = forward(net, call_kwargs(meta["call"]["forward_kwargs"], io, cfg))
    for h in handles:
        h.remove()
    pairs = {"out.y_B_C_T_H_W": (out, io["out.y_B_C_T_H_W"])}
    for name in (k for k in io if k.startswith("dbg.") and "cam_encoder" not in k):  # those are inputs here
        ours = dbg_target(name, seen, net, io)
        if ours is not None:
            pairs[name] = (ours, io[name])
    return pairs, net


def run_dir(ref_dir):
    results = []
    for json_path in sorted(glob.glob(os.path.join(ref_dir, "*.json"))):
        name = os.path.basename(json_path)[: -len(".json")]
        stem = json_path[: -len(".json")]
        if "weights_kept" in json.load(open(json_path)):  # a CI subset: not every block's weights are in the file
            pairs, _ = subset_case(stem)
            results += [(name + " (CI subset)", label, max_abs(ours, theirs), BOUND)
                        for label, (ours, theirs) in pairs.items()]
        elif os.path.exists(stem + ".weights.safetensors") and os.path.exists(stem + ".io.safetensors"):
            kind = json.load(open(json_path)).get("config", {}).get("class", "")
            if "DiT" in kind or "DIT" in kind:
                results += [(name, *r) for r in check_dit_case(json_path)]
            else:
                import ref_vae  # the Wan2.1 VAE cases
                results += [(name, *r) for r in ref_vae.run_vae_case(json_path)]
        elif name == "diffusion_ref":
            results += [(name, *r) for r in check_sampler(ref_dir)]
        elif name == "components_ref":
            results += [(name, *r) for r in check_components(json_path)]
        elif name in ("released_configs_keys", "p25_released_configs_keys"):
            results += [(name, *r) for r in check_released_keys(json_path)]
        elif name in ("p25_unipc_ref", "p25_training_ref", "p25_sampler_ref"):
            import check_reference_p25  # nets/flow.py's draws, loss, UniPC and sampler, every tensor of the file
            results += [(name, *r) for r in check_reference_p25.check_file(json_path)]
        elif name.startswith("p25_"):  # said, so a folder never looks fully checked when it is not
            print(f"    {name}.json: not a Predict2.5 reference file this script knows")
        elif name != "MANIFEST":
            print(f"    {name}.json: not a reference case this script knows")
    step_path = os.path.join(ref_dir, "sampler_step_ref.safetensors")
    if os.path.exists(step_path):
        results += [("sampler_step_ref", *r) for r in check_sampler_step(step_path)]
    return results


DEFAULT_DIRS = (os.path.join(ROOT, "tests", "data", "reference"), os.path.join(ROOT, "tests", "data"))


def main(dirs):
    if dirs[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    dirs = dirs or DEFAULT_DIRS
    torch.manual_seed(0)
    all_results = []
    for d in dirs:
        if not os.path.isdir(d):
            print(f"not a directory: {d}")
            return 2
        all_results += run_dir(d)
    if not all_results:
        print("no reference cases found")
        return 1
    failed = 0
    for case, label, err, bound in all_results:
        ok = err <= bound
        failed += not ok
        if err == MISSING:
            print(f"MISSING {case}: {label}: not checked, counted as failed")
            continue
        print(f"{'ok  ' if ok else 'FAIL'} {case}: {label}: max-abs {err:.3g} (bound {bound:g})")
    print(f"{len(all_results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
