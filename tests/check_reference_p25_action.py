"""Generate the Predict2.5 action-chunk DiT's reference tensors by running UPSTREAM's class on the CPU (fp32, 1 thread).

    python tests/check_reference_p25_action.py UPSTREAM [OUT]     # OUT defaults to tests/data/p25_action

UPSTREAM is a checkout (or `git archive`) of nvidia-cosmos/cosmos-predict2.5, the folder holding cosmos_predict2/;
made from kechenliuuu3469/cosmos-predict2.5 at 6c296495f9b32a72dd45d1119867634a1e52fada (release 1.3.2, a public
mirror of upstream's history; its action network file is the one stored for nvidia-cosmos/cosmos-predict2.5 at
af689d486ae6118a1b4c39a8e9b45e24c87078bc), e.g. `git -C MIRROR archive 6c29649 cosmos_predict2 | tar -x -C UPSTREAM`.
The class is ActionChunkConditionedMinimalV1LVGDiT (cosmos_predict2/_src/predict2/action/networks/
action_conditioned_minimal_v1_lvg_dit.py), the network of the released nvidia/Cosmos-Predict2.5-2B/robot/action-cond
(experiment cosmos_predict2p5_2B_reason_embeddings_action_conditioned_rectified_flow_bridge_13frame_256x320, net
cosmos_v1_2B_action_chunk_conditioned). Needs einops (upstream imports it; `pip install einops`; not a dependency of
nanocosmos). Nothing of upstream is copied into this repository: the script imports upstream's own files from
UPSTREAM, with stubs only for what they import and cannot run here (below, STUBS).

Writes to OUT:
  p25_action.weights.safetensors  the state_dict at a small shape (seeded random weights for every parameter, the
                                   action MLPs included; upstream's key names, incl. the stubbed TE norms' uint8
                                   _extra_state)
  p25_action.io.safetensors        in.* inputs, out.* outputs of every call (the json's calls), dbg.*
                                   intermediates: for the main call the whole chain (x_embedder, RoPE,
                                   crossattn_proj, time embedding, both action MLPs' inputs/outputs, the
                                   padded+masked per-latent-frame action embeddings, time embedding + action, its
                                   RMSNorm, the adaLN-LoRA input of the blocks, every block's output, the final
                                   layer's output); for the other calls the action/time part (dbg.<call>.*)
  p25_action.json                  constructor kwargs, the calls, what every dbg tensor is, facts the calls show
                                   (which latent frames action_2 changes, exact zeros), blob SHA1s of the upstream
                                   files imported or parsed, stubs, the upstream commit
  p25_action_hidden.*              the small case again with hidden_dim_in_action_embedder 40 (not 4D): its weights,
                                   its output on the main call's inputs, its kwargs and key table
  p25_action_released_keys.json    every state_dict key/shape/dtype/kind of the class built on the meta device at the
                                   RELEASED 2B kwargs (the net node cosmos_v1_2B_action_chunk_conditioned of
                                   action_conditioned/net.py merged with the net overrides along the experiment's
                                   defaults chain, all parsed with ast), and its parameter count
"""
import ast
import copy
import enum
import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

# Predict2's action generator's stand-ins for TransformerEngine (its STUBS say what each does), seeded weights, key
# table and blob SHA1, shared
from check_reference_action import _module, _NoDotProductAttention, _rope, _TERMSNorm, blob_sha1, key_table, randomize

ACTION_FILE = "cosmos_predict2/_src/predict2/action/networks/action_conditioned_minimal_v1_lvg_dit.py"
NET_FILE = "cosmos_predict2/_src/predict2/action/configs/action_conditioned/net.py"
EXPERIMENT_FILE = ("cosmos_predict2/_src/predict2/action/configs/action_conditioned/experiment/"
                   "exp_2B_action_conditioned_rectify_flow.py")
CONDITIONER_FILE = "cosmos_predict2/_src/predict2/conditioner.py"
EXPERIMENT = "cosmos_predict2p5_2B_reason_embeddings_action_conditioned_rectified_flow_bridge_13frame_256x320"
NET_NODE = "cosmos_v1_2B_action_chunk_conditioned"
CLASS = "ActionChunkConditionedMinimalV1LVGDiT"
# blob SHA1 of ACTION_FILE -> where it comes from (the folder is usually a git archive: no .git to ask)
KNOWN_ACTION_FILES = {
    "5bc49d39aec7bed524017a2acb0e215b9610854b":
        "kechenliuuu3469/cosmos-predict2.5 6c296495f9b32a72dd45d1119867634a1e52fada (release 1.3.2); the same file "
        "is stored for nvidia-cosmos/cosmos-predict2.5 at af689d486ae6118a1b4c39a8e9b45e24c87078bc",
}

# The small case: the released structure (adaLN-LoRA, rope3d with the released (h,w,t) = (3,3,1) extrapolation, no
# fps modulation, padding mask concat, condition-mask channel, Reason1-style crossattn_proj Linear+GELU, timestep_scale
# 0.001, use_wan_fp32_strategy, per-latent-frame action MLPs with hidden 4D) at a CPU-fast width: D = 48 (2 heads of
# 24: the smallest head that nanocosmos' 3-D RoPE takes is 18), 2 blocks, adaLN-LoRA 16, text 96 -> 32. The released
# clip: 13 frames -> 4 latent frames, 12 actions of 7 dims, 4 per latent frame (temporal_compression_ratio 4).
# Attention: upstream's "torch" backend (SDPA). The released "minimal_a2a" changes no parameter and computes the same
# SDPA, but its attention() casts q, k, v to its default dtype=torch.bfloat16 whatever the input (harmless in the
# released bf16 model; in an fp32 model it is a bf16 attention whose output then meets fp32 weights), so it cannot
# give fp32 references. SAC off ("none"): activation checkpointing changes neither keys nor values.
SMALL = dict(max_img_h=240, max_img_w=240, max_frames=128, in_channels=16, out_channels=16, patch_spatial=2,
             patch_temporal=1, concat_padding_mask=True, model_channels=48, num_blocks=2, num_heads=2,
             atten_backend="torch", crossattn_emb_channels=32, use_crossattn_projection=True,
             crossattn_proj_in_channels=96, pos_emb_cls="rope3d", pos_emb_learnable=True,
             pos_emb_interpolation="crop", use_adaln_lora=True, adaln_lora_dim=16, rope_h_extrapolation_ratio=3.0,
             rope_w_extrapolation_ratio=3.0, rope_t_extrapolation_ratio=1.0, extra_per_block_abs_pos_emb=False,
             rope_enable_fps_modulation=False, timestep_scale=0.001, use_wan_fp32_strategy=True,
             sac_config={"mode": "none"}, action_dim=7, temporal_compression_ratio=4)
STUBS = {
    "cosmos_predict2 (package __init__)": "an empty package with upstream's __path__: the real __init__ imports "
                                          "cosmos_cuda (the CUDA extra) and raises without it",
    "transformer_engine (__version__ '2.8.0')": "only what the network touches, below",
    "transformer_engine.pytorch.RMSNorm": "pure torch: x * rsqrt(mean(x^2) + eps) * weight in fp32, cast back; "
                                          "_extra_state = uint8(pickle.dumps({})) as TE >= 1.13 norms write it",
    "transformer_engine.pytorch.attention(.rope).apply_rotary_pos_emb": "pure torch, TE's fused non-interleaved "
                                                                        "rotate-half for bshd: freqs [S,1,1,d] -> "
                                                                        "[1,S,1,d], fp32",
    "transformer_engine.pytorch.attention.DotProductAttention": "refuses to be built (the case uses the torch "
                                                                "backend)",
    "torchvision.transforms.functional.resize": "F.interpolate(mode='nearest') (what torchvision does for NEAREST on "
                                                "tensors)",
    "cosmos_predict2._src.imaginaire.utils.log": "logging no-ops",
    "cosmos_predict2._src.imaginaire.utils.distributed": "get_rank 0, get_world_size 1 (the real one imports pynvml, "
                                                         "megatron)",
    "cosmos_predict2._src.predict2.conditioner": "only its DataType enum, lifted from upstream's conditioner.py with "
                                                 "ast (the real module imports omegaconf, lazy_config, easy_io, ...)",
}
B, T, H, W = 2, 4, 6, 8  # 13 pixel frames -> 4 latent frames; a 48x64-pixel clip -> 6x8 latent -> 3x4 tokens a frame
N_ACTIONS, ACTION_DIM, PER_FRAME = 12, 7, 4
CHANGED_FRAME = 2  # the latent frame whose 4 actions (indices 4..7) in.action_2 changes


def install_stubs(upstream):
    """sys.modules entries for what upstream's network imports but cannot run on this CPU (STUBS)."""
    _module("cosmos_predict2", __path__=[os.path.join(upstream, "cosmos_predict2")])
    te = _module("transformer_engine", __version__="2.8.0")
    te.pytorch = _module("transformer_engine.pytorch", RMSNorm=_TERMSNorm)
    te.pytorch.attention = _module("transformer_engine.pytorch.attention", DotProductAttention=_NoDotProductAttention,
                                   apply_rotary_pos_emb=_rope, __path__=[])
    te.pytorch.attention.rope = _module("transformer_engine.pytorch.attention.rope", apply_rotary_pos_emb=_rope)
    interpolation = enum.Enum("InterpolationMode", {"NEAREST": "nearest"})
    functional = _module("torchvision.transforms.functional",
                         resize=lambda x, size, interpolation=None: F.interpolate(x, size=list(size), mode="nearest"))
    transforms = _module("torchvision.transforms", functional=functional, InterpolationMode=interpolation)
    _module("torchvision", transforms=transforms)
    noop = lambda *a, **k: None  # noqa: E731
    _module("cosmos_predict2._src.imaginaire.utils.log",
            **{k: noop for k in ("debug", "info", "warning", "error", "critical", "success")})
    _module("cosmos_predict2._src.imaginaire.utils.distributed", get_rank=lambda *a: 0, get_world_size=lambda *a: 1)
    source = open(os.path.join(upstream, CONDITIONER_FILE), encoding="utf-8").read()
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "DataType")
    conditioner = _module("cosmos_predict2._src.predict2.conditioner", Enum=enum.Enum)
    exec(compile(ast.Module([node], []), "conditioner.py:DataType", "exec"), conditioner.__dict__)


# -----------------------------------------------------------------------------
# The released kwargs, from upstream's config files (ast only: nothing of them runs)


def constant(node, where):
    """The value of a constant expression (24.0 / 24, 7 * 12, dict(mode=...), SACConfig()), nothing that calls code."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("dict", "SACConfig"):
        if node.args:
            raise ValueError(f"{where}: {ast.unparse(node)} has positional arguments")
        return {k.arg: constant(k.value, where) for k in node.keywords}  # SACConfig() -> {} (its defaults)
    allowed = (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop, ast.Tuple, ast.List, ast.Load)
    if not all(isinstance(n, allowed) for n in ast.walk(node)):
        raise ValueError(f"{where}: {ast.unparse(node)} is not a constant expression")
    return eval(compile(ast.Expression(node), where, "eval"), {"__builtins__": {}})


def merge(base, extra):
    out = copy.deepcopy(base)
    for k, v in extra.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def net_nodes(path):
    """{registered net name: (class name, kwargs)} of net.py: L(Class)(...) calls, copy.deepcopy(...) copies and
    SYMBOL.attr = value edits in file order, and the names register_net() stores them under."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    symbols = {}
    for stmt in tree.body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            target = stmt.targets[0] if isinstance(stmt, ast.Assign) else stmt.target
            value = stmt.value
            if isinstance(target, ast.Name) and isinstance(value, ast.Call):
                if isinstance(value.func, ast.Call) and getattr(value.func.func, "id", None) == "L":
                    symbols[target.id] = (value.func.args[0].id, {k.arg: constant(k.value, path)
                                                                  for k in value.keywords})
                elif ast.unparse(value.func) == "copy.deepcopy":
                    symbols[target.id] = copy.deepcopy(symbols[value.args[0].id])
            elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                symbols[target.value.id][1][target.attr] = constant(value, path)
    register = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "register_net")
    stored = {}
    for call in ast.walk(register):
        if isinstance(call, ast.Call) and ast.unparse(call.func) == "cs.store":
            kw = {k.arg: k.value for k in call.keywords}
            stored[kw["name"].value] = (kw["node"].id, symbols[kw["node"].id])
    return stored


def kwarg(call, name):
    return next((k.value for k in call.keywords if k.arg == name), None)


def experiments(path):
    """{job name: {'defaults': [...], 'net': {...}, 'model_config': {...}}} of the experiment file's LazyDict(dict(...))
    nodes; net and model_config hold the constant entries of model=dict(config=dict(...))."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    found = {}
    for stmt in tree.body:
        if not (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call)
                and getattr(stmt.value.func, "id", None) == "LazyDict"):
            continue
        body = stmt.value.args[0]
        job = kwarg(body, "job")
        name = constant(kwarg(job, "name"), path) if job is not None else None
        defaults = []
        for item in getattr(kwarg(body, "defaults"), "elts", []):
            if isinstance(item, ast.Constant):
                defaults.append(item.value)
            elif isinstance(item, ast.Dict):
                defaults.append({k.value: v.value for k, v in zip(item.keys, item.values)
                                 if isinstance(v, ast.Constant)})
        net, model_config = {}, {}
        model = kwarg(body, "model")
        config = kwarg(model, "config") if isinstance(model, ast.Call) else None
        if isinstance(config, ast.Call):
            for k in config.keywords:
                if k.arg == "net":
                    net = constant(k.value, path)
                else:
                    try:
                        model_config[k.arg] = constant(k.value, path)
                    except ValueError:
                        pass  # strings built from other configs, callables: not the network's
        found[name] = {"symbol": stmt.targets[0].id, "defaults": defaults, "net": net, "model_config": model_config}
    return found


def resolve(exps, name):
    """Hydra's composition for the network: the net group chosen by the last `override /net` along the defaults chain
    (parents first), its node's kwargs, then every experiment's model.config.net merged on top, parents first."""
    exp = exps[name]
    chain, net_group, net, model_config = [], None, {}, {}
    for item in exp["defaults"]:
        if isinstance(item, str) and item.startswith("/experiment/"):
            parent = resolve(exps, item[len("/experiment/"):])
            chain, net_group = parent["chain"], parent["net_group"]
            net, model_config = parent["net_overrides"], parent["model_config"]
        elif isinstance(item, dict) and "override /net" in item:
            net_group = item["override /net"]
    return {"chain": chain + [f"{exp['symbol']} ({name})"], "net_group": net_group,
            "net_overrides": merge(net, exp["net"]), "model_config": merge(model_config, exp["model_config"])}


def released(upstream):
    resolved = resolve(experiments(os.path.join(upstream, EXPERIMENT_FILE)), EXPERIMENT)
    if resolved["net_group"] != NET_NODE:
        raise ValueError(f"{EXPERIMENT}: net group {resolved['net_group']}, expected {NET_NODE}")
    symbol, (cls, node_kwargs) = net_nodes(os.path.join(upstream, NET_FILE))[NET_NODE]
    if cls != CLASS:
        raise ValueError(f"{NET_NODE} builds {cls}, expected {CLASS}")
    return {"experiment": EXPERIMENT, "defaults_chain": resolved["chain"], "net_group": NET_NODE,
            "net_symbol": symbol, "class": cls, "node_kwargs": node_kwargs,
            "experiment_net_overrides": resolved["net_overrides"], "kwargs": merge(node_kwargs,
                                                                                   resolved["net_overrides"]),
            "model_config_constants": resolved["model_config"]}


# -----------------------------------------------------------------------------


def build(cls, kwargs, sac_config_cls):
    kwargs = dict(kwargs)
    if "sac_config" in kwargs:
        kwargs["sac_config"] = sac_config_cls(**kwargs["sac_config"])
    return cls(**kwargs)


def upstream_commit(upstream):
    if os.path.exists(os.path.join(upstream, ".git")):  # not a folder inside some other repository
        try:
            out = subprocess.run(["git", "-C", upstream, "rev-parse", "HEAD"], capture_output=True, text=True,
                                 check=True)
            return {"commit": out.stdout.strip(), "how": "git rev-parse HEAD in UPSTREAM"}
        except (OSError, subprocess.CalledProcessError):
            pass
    sha = blob_sha1(os.path.join(upstream, ACTION_FILE))
    return {"commit": KNOWN_ACTION_FILES.get(sha, "unknown"),
            "how": f"UPSTREAM is not a git checkout: identified by the blob SHA1 {sha} of {ACTION_FILE}"}


class Recorder:
    """Forward hooks on upstream's modules; every value is the tensor upstream computed, cloned."""

    def __init__(self, net):
        self.seen, self.handles = {}, []

        def put(**tensors):  # returns None: a forward hook that returns something replaces the module's output
            self.seen.update(tensors)

        def hook(module, fn):
            self.handles.append(module.register_forward_hook(fn))

        hook(net.action_embedder_B_D, lambda m, a, o: put(action_mlp_in_B_T_28=a[0], action_mlp_B_D_out_B_T_D=o))
        hook(net.action_embedder_B_3D, lambda m, a, o: put(action_mlp_B_3D_out_B_T_3D=o))
        hook(net.t_embedder, lambda m, a, o: put(t_embedder_in_B_T=a[0], t_embedder_emb_B_T_D=o[0],
                                                 t_embedder_adaln_lora_B_T_3D=o[1]))
        self.handles.append(net.t_embedding_norm.register_forward_pre_hook(
            lambda m, a: put(t_embedding_plus_action_B_T_D=a[0])))
        hook(net.t_embedding_norm, lambda m, a, o: put(t_embedding_norm_out_B_T_D=o))
        self.handles.append(net.blocks[0].register_forward_pre_hook(
            lambda m, a, k: put(adaln_lora_B_T_3D=k["adaln_lora_B_T_3D"]), with_kwargs=True))
        hook(net.x_embedder, lambda m, a, o: put(x_embedder_out_B_T_H_W_D=o))
        hook(net.pos_embedder, lambda m, a, o: put(rope_emb_L_1_1_D=o))
        hook(net.crossattn_proj, lambda m, a, o: put(crossattn_proj_out_B_N_Dc=o))
        for i, block in enumerate(net.blocks):
            hook(block, lambda m, a, o, i=i: put(**{f"block{i}_out_B_T_H_W_D": o}))
        hook(net.final_layer, lambda m, a, o: put(final_layer_out_B_T_H_W_O=o))

    def take(self):
        seen = {k: v.detach().clone() for k, v in self.seen.items()}
        self.seen.clear()
        # the action embeddings upstream adds (after its zero pad for latent frame 0 and the condition-mask multiply)
        # are not a module output: recovered as (time embedding + action) - time embedding, fp32; the zeroed frames
        # come out exactly 0, the others within an ulp of the sum
        seen["action_emb_B_T_D"] = seen["t_embedding_plus_action_B_T_D"] - seen["t_embedder_emb_B_T_D"]
        seen["action_emb_B_T_3D"] = seen["adaln_lora_B_T_3D"] - seen["t_embedder_adaln_lora_B_T_3D"]
        return seen


ACTION_PART = ("action_mlp_in_B_T_28", "action_mlp_B_D_out_B_T_D", "action_mlp_B_3D_out_B_T_3D", "action_emb_B_T_D",
               "action_emb_B_T_3D", "t_embedder_in_B_T", "t_embedder_emb_B_T_D", "t_embedder_adaln_lora_B_T_3D",
               "t_embedding_plus_action_B_T_D", "t_embedding_norm_out_B_T_D", "adaln_lora_B_T_3D")


def main(argv):
    if not argv or argv[0] in ("-h", "--help") or not os.path.isfile(os.path.join(argv[0], ACTION_FILE)):
        print(__doc__)
        return 2
    upstream, out = os.path.abspath(argv[0]), argv[1] if len(argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "data", "p25_action")
    torch.set_num_threads(1)
    sys.path.insert(0, upstream)
    install_stubs(upstream)
    from cosmos_predict2._src.predict2.action.networks import action_conditioned_minimal_v1_lvg_dit as action_module
    from cosmos_predict2._src.predict2.conditioner import DataType
    from cosmos_predict2._src.predict2.networks.minimal_v4_dit import SACConfig

    Net = getattr(action_module, CLASS)
    net = build(Net, SMALL, SACConfig).eval()
    randomize(net, seed=0)

    gen = torch.Generator().manual_seed(1)
    io = {"in.x_B_C_T_H_W": torch.randn(B, 16, T, H, W, generator=gen),
          # the released sampler: int64 scheduler timesteps (1000 sigma of the shift-5 35-step UniPC grid, steps 0 and
          # 17), one per sample for all frames, [B, 1] (B = 1 there: torch.stack([t]).unsqueeze(0))
          "in.timesteps_B_1_int64": torch.tensor([[999], [840]], dtype=torch.int64),
          # training: float timesteps [B, 1] (rectified_flow.get_discrete_timestamp; the action model's denoise has no
          # conditional_frame_timestep, so every frame shares it)
          "in.timesteps_B_1_float": torch.tensor([[612.3456], [87.25]]),
          # per-frame float timesteps [B, T] (the network takes them; not what the released pipeline passes)
          "in.timesteps_B_T_float": torch.tensor([[100.0, 612.3456, 612.3456, 612.3456], [100.0, 87.25, 87.25, 87.25]]),
          # Reason1 FULL_CONCAT stand-in: 96 wide (released 100352 = 28 layers x 3584), projected to 32 (released 1024)
          "in.crossattn_emb": torch.randn(B, 5, 96, generator=gen),
          # at pixel resolution (upstream resizes it, nearest, to the latent's); the released pipeline passes zeros
          "in.padding_mask_B_1_H_W": (torch.rand(B, 1, 8 * H, 8 * W, generator=gen) > 0.7).float(),
          "in.fps_B": torch.tensor([16.0, 16.0]),
          "in.action_B_12_7": torch.randn(B, N_ACTIONS, ACTION_DIM, generator=gen)}
    action_2 = io["in.action_B_12_7"].clone()
    rows = slice((CHANGED_FRAME - 1) * PER_FRAME, CHANGED_FRAME * PER_FRAME)  # latent frame k <- actions 4(k-1)..4k-1
    action_2[:, rows] = torch.randn(B, PER_FRAME, ACTION_DIM, generator=gen)
    io["in.action_2_B_12_7"] = action_2
    mask = torch.zeros(B, 1, T, H, W)
    mask[:, :, 0] = 1.0  # the released recipe: 1 conditional latent frame (min = max = 1)
    io["in.condition_video_input_mask_B_1_T_H_W"] = mask
    mask2 = mask.clone()
    mask2[1, :, 1] = 1.0  # sample 1: 2 conditional latent frames -> its latent frame 1 action embedding is zeroed too
    io["in.condition_video_input_mask2_B_1_T_H_W"] = mask2

    # name: (timesteps, action, condition mask, dbg recorded)
    calls = {
        "main": ("in.timesteps_B_1_int64", "in.action_B_12_7", "in.condition_video_input_mask_B_1_T_H_W", "all"),
        "action_2": ("in.timesteps_B_1_int64", "in.action_2_B_12_7", "in.condition_video_input_mask_B_1_T_H_W",
                     "action"),
        "mask2": ("in.timesteps_B_1_int64", "in.action_B_12_7", "in.condition_video_input_mask2_B_1_T_H_W", "action"),
        "train": ("in.timesteps_B_1_float", "in.action_B_12_7", "in.condition_video_input_mask_B_1_T_H_W", "action"),
        "per_frame": ("in.timesteps_B_T_float", "in.action_B_12_7", "in.condition_video_input_mask_B_1_T_H_W",
                      "action"),
    }
    recorder = Recorder(net)
    with torch.no_grad():
        for name, (timesteps, action, cmask, record) in calls.items():
            y = net(io["in.x_B_C_T_H_W"], io[timesteps], io["in.crossattn_emb"],
                    condition_video_input_mask_B_C_T_H_W=io[cmask], fps=io["in.fps_B"],
                    padding_mask=io["in.padding_mask_B_1_H_W"], data_type=DataType.VIDEO, action=io[action])
            seen = recorder.take()
            if name == "main":
                io["out.y_B_C_T_H_W"] = y
                io.update({f"dbg.{k}": v for k, v in seen.items()})
            else:
                io[f"out.y_{name}_B_C_T_H_W"] = y
                io.update({f"dbg.{name}.{k}": seen[k] for k in ACTION_PART})
    for h in recorder.handles:
        h.remove()

    # what the calls show (computed from upstream's tensors, written to the json as facts, not as checks of ours)
    emb, emb_2 = io["dbg.action_emb_B_T_D"], io["dbg.action_2.action_emb_B_T_D"]
    changed = [int(t) for t in range(T) if not torch.equal(emb[:, t], emb_2[:, t])]
    facts = {
        "action_2 changes the action embedding of latent frames": changed,
        "latent frame 0 action embedding exactly zero (main, both MLPs)":
            bool((emb[:, 0] == 0).all() and (io["dbg.action_emb_B_T_3D"][:, 0] == 0).all()),
        "mask2: sample 1 latent frame 1 action embedding exactly zero":
            bool((io["dbg.mask2.action_emb_B_T_D"][1, :2] == 0).all()
                 and (io["dbg.mask2.action_emb_B_T_3D"][1, :2] == 0).all()),
        "max-abs action_emb_B_T_D[:, 1:] - action_mlp_B_D_out (main)":
            float((emb[:, 1:] - io["dbg.action_mlp_B_D_out_B_T_D"]).abs().max()),
        "action_mlp_in == action.reshape(B, 3, 28)":
            bool(torch.equal(io["dbg.action_mlp_in_B_T_28"], io["in.action_B_12_7"].reshape(B, 3, 28))),
        "t_embedder_in == timesteps x 0.001 in fp32 (main)":
            bool(torch.equal(io["dbg.t_embedder_in_B_T"], io["in.timesteps_B_1_int64"] * 0.001)),
        "max-abs out.y - out.y_action_2": float((io["out.y_B_C_T_H_W"] - io["out.y_action_2_B_C_T_H_W"]).abs().max()),
        "max-abs out.y - out.y_mask2": float((io["out.y_B_C_T_H_W"] - io["out.y_mask2_B_C_T_H_W"]).abs().max()),
    }

    os.makedirs(out, exist_ok=True)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()},
              os.path.join(out, "p25_action.weights.safetensors"))
    save_file({k: v.contiguous() for k, v in io.items()}, os.path.join(out, "p25_action.io.safetensors"))

    spec = released(upstream)
    with torch.device("meta"):
        big = build(Net, spec["kwargs"], SACConfig)
    files = sorted({os.path.relpath(m.__file__, upstream) for m in list(sys.modules.values())
                    if getattr(m, "__file__", None) and m.__file__.startswith(upstream)}
                   | {NET_FILE, EXPERIMENT_FILE, CONDITIONER_FILE})
    sha1s = {f: blob_sha1(os.path.join(upstream, f)) for f in files}
    source = {"upstream": upstream_commit(upstream), "files_git_blob_sha1": sha1s}
    meta = {
        "config": {"class": f"cosmos_predict2._src.predict2.action.networks.action_conditioned_minimal_v1_lvg_dit."
                            f"{CLASS}", "kwargs": SMALL},
        "calls": {name: {"forward_kwargs": {"x_B_C_T_H_W": "in.x_B_C_T_H_W", "timesteps_B_T": t,
                                            "crossattn_emb": "in.crossattn_emb",
                                            "condition_video_input_mask_B_C_T_H_W": m, "fps": "in.fps_B",
                                            "padding_mask": "in.padding_mask_B_1_H_W", "data_type": "DataType.VIDEO",
                                            "action": a},
                         "output": "out.y_B_C_T_H_W" if name == "main" else f"out.y_{name}_B_C_T_H_W",
                         "dbg": "dbg.*" if name == "main" else f"dbg.{name}.*"}
                  for name, (t, a, m, _) in calls.items()},
        "mode": "net.eval(); torch.no_grad(); fp32 CPU; 1 thread",
        "dbg": {
            "action_mlp_in_B_T_28": "input of both action MLPs: action [B,12,7] -> [B,3,28], latent frame k>=1 gets "
                                    "actions 4(k-1)..4k-1 concatenated (action-major, 7 dims minor)",
            "action_mlp_B_D_out_B_T_D": "action_embedder_B_D output [B,3,D]",
            "action_mlp_B_3D_out_B_T_3D": "action_embedder_B_3D output [B,3,3D]",
            "action_emb_B_T_D": "what is added to the time embedding [B,T,D]: zero for latent frame 0, the MLP "
                                "output for frames 1..3, times (1 - condition mask) per frame; recovered as "
                                "t_embedding_plus_action - t_embedder_emb (fp32), exact zeros where zeroed",
            "action_emb_B_T_3D": "what is added to the adaLN-LoRA vector [B,T,3D], same rule; adaln_lora - "
                                 "t_embedder_adaln_lora",
            "t_embedder_in_B_T": "the sinusoid's input: timesteps x timestep_scale (0.001), fp32",
            "t_embedder_emb_B_T_D": "t_embedder output 0: the raw sinusoid (adaLN-LoRA on), [B,1,D] for [B,1] times",
            "t_embedder_adaln_lora_B_T_3D": "t_embedder output 1: linear_2(silu(linear_1(sinusoid))), [B,1,3D]",
            "t_embedding_plus_action_B_T_D": "input of t_embedding_norm: sinusoid + action_emb_B_D, [B,T,D]",
            "t_embedding_norm_out_B_T_D": "t_embedding_norm output: the emb every block and the final layer get",
            "adaln_lora_B_T_3D": "the adaLN-LoRA input of every block and of the final layer: t_embedder_adaln_lora "
                                 "+ action_emb_B_3D, [B,T,3D]",
            "x_embedder_out_B_T_H_W_D": "patch embedding of [x, condition mask, padding mask] (18 channels)",
            "rope_emb_L_1_1_D": "pos_embedder output (RoPE angles)",
            "crossattn_proj_out_B_N_Dc": "crossattn_proj (Linear + GELU) output",
            "blockN_out_B_T_H_W_D": "block N output",
            "final_layer_out_B_T_H_W_O": "final layer output before unpatchify",
        },
        "facts": facts,
        "source": source,
        "stubs": STUBS,
        "environment": {"torch": torch.__version__, "threads": 1, "dtype": "float32"},
        "weights_note": "seeded random values for every parameter (randomize, seed 0; action MLPs non-zero), not "
                        "upstream's init (upstream leaves the action MLPs at nn.Linear's default init)",
        "keys": key_table(net),
    }
    with open(os.path.join(out, "p25_action.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)
    rel = {**spec, "files": {f: sha1s[f] for f in (NET_FILE, EXPERIMENT_FILE)}, "upstream": source["upstream"],
           "num_parameters": sum(p.numel() for p in big.parameters()),
           "num_parameters_action_mlps": sum(p.numel() for n, p in big.named_parameters() if n.startswith("action_")),
           "keys": key_table(big)}
    with open(os.path.join(out, "p25_action_released_keys.json"), "w", encoding="utf-8") as f:
        json.dump(rel, f, indent=0)
    print(f"wrote {out}: {len(net.state_dict())} small-case keys; released {NET_NODE}: {len(rel['keys'])} keys, "
          f"{rel['num_parameters']:,} parameters")
    for k, v in facts.items():
        print(f"  {k}: {v}")
    hidden_case(Net, SACConfig, DataType, io, out, source)
    return 0


HIDDEN = 40  # a non-default hidden_dim_in_action_embedder (the small case's default is 4 x 48 = 192)


def hidden_case(Net, sac_config_cls, data_type, io, out, source):
    """p25_action_hidden.{weights,io}.safetensors + .json: the small case built with hidden_dim_in_action_embedder
    HIDDEN (seeded weights, seed 0), its output on the main call's inputs (out.y_B_C_T_H_W; its in.* are
    p25_action.io's)."""
    kwargs = {**SMALL, "hidden_dim_in_action_embedder": HIDDEN}
    net = build(Net, kwargs, sac_config_cls).eval()
    randomize(net, seed=0)
    with torch.no_grad():
        y = net(io["in.x_B_C_T_H_W"], io["in.timesteps_B_1_int64"], io["in.crossattn_emb"],
                condition_video_input_mask_B_C_T_H_W=io["in.condition_video_input_mask_B_1_T_H_W"], fps=io["in.fps_B"],
                padding_mask=io["in.padding_mask_B_1_H_W"], data_type=data_type.VIDEO, action=io["in.action_B_12_7"])
    save_file({k: v.contiguous() for k, v in net.state_dict().items()},
              os.path.join(out, "p25_action_hidden.weights.safetensors"))
    save_file({"out.y_B_C_T_H_W": y.contiguous()}, os.path.join(out, "p25_action_hidden.io.safetensors"))
    meta = {"config": {"class": CLASS, "kwargs": kwargs}, "inputs": "p25_action.io.safetensors in.* (the main call)",
            "source": source, "keys": key_table(net)}
    with open(os.path.join(out, "p25_action_hidden.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)
    print(f"wrote the hidden_dim_in_action_embedder={HIDDEN} case: {len(net.state_dict())} keys")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
