"""Generate the action-conditioned DiT's reference tensors by running UPSTREAM's class on the CPU (fp32, 1 thread).

    python tests/check_reference_action.py UPSTREAM [OUT]     # OUT defaults to tests/data/action

UPSTREAM is a checkout of nvidia-cosmos/cosmos-predict2 (the folder holding cosmos_predict2/ and imaginaire/; made
from commit 661da4774b0ca41d082a0ecbeb47550bcf07e03f, the one of tests/data/reference). Needs einops (upstream
imports it; not a dependency of nanocosmos). Nothing of upstream is copied into this repository: the script imports
upstream's own files from UPSTREAM, with stubs only for what they import and cannot run here (below, STUBS).
tests/test_action.py checks our network against what this writes (<= 2e-5) and the release key table.

Writes to OUT:
  action_dit.weights.safetensors  the state_dict of ActionConditionedMinimalV1LVGDiT at a small shape (seeded random
                                   weights, upstream's key names, incl. the stubbed TE norms' uint8 _extra_state)
  action_dit.io.safetensors        in.* inputs, out.* outputs (per-frame and per-clip timesteps, a second action),
                                   dbg.* the two action embeddings and the normed time embedding upstream computes
  action_dit.json                  constructor kwargs, the calls, blob SHA1s of the upstream files imported, stubs
  action_released_keys.json        every state_dict key/shape/kind of upstream's class built on the meta device at the
                                   released 2B kwargs (_PREDICT2_ACTION_CONDITIONED_NET_2B, parsed from upstream's
                                   config file with ast), and its parameter count
"""
import ast
import enum
import hashlib
import json
import os
import pickle
import sys
import types

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

CONFIG_FILE = "cosmos_predict2/configs/action_conditioned/config.py"
NET_SYMBOL = "_PREDICT2_ACTION_CONDITIONED_NET_2B"
# The small case: the released structure (adaLN-LoRA, rope3d, padding mask, video2world) at a CPU-fast width, the
# released clip (13 frames -> 4 latent frames, 12 transitions of 7-dim actions: action_dim 84), upstream's "torch"
# attention backend (SDPA; the released "minimal_a2a" needs a GPU and changes no parameter)
SMALL = dict(max_img_h=64, max_img_w=64, max_frames=32, in_channels=16, out_channels=16, patch_spatial=2,
             patch_temporal=1, concat_padding_mask=True, model_channels=64, num_blocks=2, num_heads=2,
             atten_backend="torch", crossattn_emb_channels=32, crossattn_proj_in_channels=32, pos_emb_cls="rope3d",
             pos_emb_learnable=True, pos_emb_interpolation="crop", use_adaln_lora=True, adaln_lora_dim=16,
             rope_h_extrapolation_ratio=3.0, rope_w_extrapolation_ratio=3.0, rope_t_extrapolation_ratio=1.0,
             extra_per_block_abs_pos_emb=False, rope_enable_fps_modulation=False, action_dim=7 * 12)
STUBS = {
    "transformer_engine.pytorch.RMSNorm": "pure torch: x * rsqrt(mean(x^2) + eps) * weight in fp32, cast back; "
                                          "_extra_state = uint8(pickle.dumps({})) as TE >= 1.13 norms write it",
    "transformer_engine.pytorch.attention.apply_rotary_pos_emb": "pure torch, TE's fused non-interleaved rotate-half "
                                                                "for bshd: freqs [S,1,1,d] -> [1,S,1,d], fp32",
    "transformer_engine.pytorch.attention.DotProductAttention": "refuses to be built (the case uses the torch "
                                                                "backend)",
    "torchvision.transforms.functional.resize": "F.interpolate(mode='nearest') (NEAREST on tensors)",
    "imaginaire.utils.log / graph / distributed, imaginaire.auxiliary.text_encoder": "inert (logging no-ops, "
        "EMBED_DIM 1024); create_cuda_graph refuses",
    "cosmos_predict2.conditioner": "only its DataType enum, lifted from upstream's conditioner.py with ast",
}


class _TERMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5, **_):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def reset_parameters(self):
        nn.init.ones_(self.weight)

    def forward(self, x):
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)

    def get_extra_state(self):
        return torch.frombuffer(bytearray(pickle.dumps({})), dtype=torch.uint8)

    def set_extra_state(self, state):
        pass


def _rope(t, freqs, tensor_format="sbhd", fused=False, **_):
    f = freqs.transpose(0, 1) if tensor_format == "bshd" else freqs  # [S,1,1,d] -> [1,S,1,d]
    d = f.shape[-1]
    x, rest = t[..., :d].float(), t[..., d:]
    rotated = torch.cat([-x[..., d // 2:], x[..., : d // 2]], dim=-1)
    out = x * torch.cos(f.float()) + rotated * torch.sin(f.float())
    return torch.cat([out.to(t.dtype), rest], dim=-1)


class _NoDotProductAttention(nn.Module):
    def __init__(self, *args, **kwargs):
        raise RuntimeError("the stubbed TE DotProductAttention cannot run: use atten_backend='torch'")


def _module(name, **attrs):
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


def install_stubs(upstream):
    """sys.modules entries for what upstream's DiT imports but cannot run on this CPU (STUBS)."""
    te = _module("transformer_engine")
    te.pytorch = _module("transformer_engine.pytorch", RMSNorm=_TERMSNorm)
    te.pytorch.attention = _module("transformer_engine.pytorch.attention", DotProductAttention=_NoDotProductAttention,
                                   apply_rotary_pos_emb=_rope)
    interpolation = enum.Enum("InterpolationMode", {"NEAREST": "nearest"})
    functional = _module("torchvision.transforms.functional",
                         resize=lambda x, size, interpolation=None: F.interpolate(x, size=list(size), mode="nearest"))
    transforms = _module("torchvision.transforms", functional=functional, InterpolationMode=interpolation)
    _module("torchvision", transforms=transforms)
    noop = lambda *a, **k: None  # noqa: E731
    _module("imaginaire.utils.log", **{k: noop for k in ("debug", "info", "warning", "error", "critical", "success")})
    _module("imaginaire.utils.graph", create_cuda_graph=lambda *a, **k: (_ for _ in ()).throw(
        RuntimeError("CUDA graphs are not stubbed")))
    _module("imaginaire.utils.distributed", get_rank=lambda *a: 0, get_world_size=lambda *a: 1)
    _module("imaginaire.auxiliary.text_encoder",
            CosmosTextEncoderConfig=type("CosmosTextEncoderConfig", (), {"EMBED_DIM": 1024, "NUM_TOKENS": 512}))
    source = open(os.path.join(upstream, "cosmos_predict2/conditioner.py"), encoding="utf-8").read()
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "DataType")
    conditioner = _module("cosmos_predict2.conditioner", Enum=enum.Enum)
    exec(compile(ast.Module([node], []), "conditioner.py:DataType", "exec"), conditioner.__dict__)


def released_kwargs(upstream):
    """The released net's constructor kwargs, parsed from upstream's config file (the sac_config call dropped)."""
    tree = ast.parse(open(os.path.join(upstream, CONFIG_FILE), encoding="utf-8").read())
    assign = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == NET_SYMBOL)
    call = assign.value  # L(ActionConditionedMinimalV1LVGDiT)(...)
    return {k.arg: constant(k.value) for k in call.keywords if k.arg != "sac_config"}


def constant(node):
    """The value of a constant expression (upstream writes action_dim=7 * 12), nothing that could call code."""
    allowed = (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop, ast.Tuple, ast.List, ast.Load)
    if not all(isinstance(n, allowed) for n in ast.walk(node)):
        raise ValueError(f"{CONFIG_FILE}: {ast.unparse(node)} is not a constant expression")
    return eval(compile(ast.Expression(node), CONFIG_FILE, "eval"), {"__builtins__": {}})


def randomize(net, seed):
    """Seeded random values for every float parameter (scaled by fan-in), so no output depends on upstream's init."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(net.named_parameters()):
            scale = 0.5 / max(1, p.shape[-1]) ** 0.5 if p.ndim > 1 else 0.1
            p.copy_(torch.randn(p.shape, generator=gen) * scale + (1.0 if name.endswith("norm.weight") else 0.0))


def blob_sha1(path):
    data = open(path, "rb").read()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def key_table(net):
    # named_parameters() sees the SAC wrappers (blocks.N._checkpoint_wrapped_module....); state_dict() strips them
    params = {k.replace("_checkpoint_wrapped_module.", "") for k, _ in net.named_parameters()}
    return [[k, list(v.shape), str(v.dtype).replace("torch.", ""),
             "parameter" if k in params else "extra_state" if k.endswith("_extra_state") else "buffer"]
            for k, v in net.state_dict().items()]


def main(argv):
    if not argv or argv[0] in ("-h", "--help") or not os.path.isdir(os.path.join(argv[0], "cosmos_predict2")):
        print(__doc__)
        return 2
    upstream, out = os.path.abspath(argv[0]), argv[1] if len(argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "data", "action")
    torch.set_num_threads(1)
    sys.path.insert(0, upstream)
    install_stubs(upstream)
    from cosmos_predict2.conditioner import DataType
    from cosmos_predict2.models.video2world_action_dit import ActionConditionedMinimalV1LVGDiT

    net = ActionConditionedMinimalV1LVGDiT(**SMALL).eval()
    randomize(net, seed=0)
    gen = torch.Generator().manual_seed(1)
    B, T, H, W = 2, 4, 8, 8  # 13 pixel frames -> 4 latent frames
    io = {"in.x_B_C_T_H_W": torch.randn(B, 16, T, H, W, generator=gen),
          "in.timesteps_B_T": torch.rand(B, T, generator=gen), "in.timesteps_B": torch.rand(B, generator=gen),
          "in.crossattn_emb": torch.randn(B, 6, 32, generator=gen),
          "in.padding_mask": (torch.rand(B, 1, 16, 16, generator=gen) > 0.7).float(),
          "in.action": torch.randn(B, 12, 7, generator=gen), "in.action_2": torch.randn(B, 12, 7, generator=gen)}
    mask = torch.zeros(B, 1, T, H, W)
    mask[:, :, 0] = 1.0  # one conditioning latent frame (the released recipe's 1 conditioning frame)
    io["in.condition_video_input_mask_B_C_T_H_W"] = mask
    seen = {}
    hooks = [net.action_embedder_B_D.register_forward_hook(lambda m, a, o: seen.__setitem__("action_emb_B_D", o)),
             net.action_embedder_B_3D.register_forward_hook(lambda m, a, o: seen.__setitem__("action_emb_B_3D", o)),
             net.t_embedding_norm.register_forward_hook(lambda m, a, o: seen.__setitem__("t_embedding_norm_out", o))]
    calls = {"out.y_B_C_T_H_W": ("in.timesteps_B_T", "in.action"), "out.y_timesteps_B": ("in.timesteps_B", "in.action"),
             "out.y_action_2": ("in.timesteps_B_T", "in.action_2")}
    with torch.no_grad():
        for name, (timesteps, action) in calls.items():
            io[name] = net(io["in.x_B_C_T_H_W"], io[timesteps], io["in.crossattn_emb"],
                           condition_video_input_mask_B_C_T_H_W=mask, padding_mask=io["in.padding_mask"],
                           data_type=DataType.VIDEO, action=io[action])
            if name == "out.y_B_C_T_H_W":
                io.update({f"dbg.{k}": v.clone() for k, v in seen.items()})
    for h in hooks:
        h.remove()
    os.makedirs(out, exist_ok=True)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()},
              os.path.join(out, "action_dit.weights.safetensors"))
    save_file({k: v.contiguous() for k, v in io.items()}, os.path.join(out, "action_dit.io.safetensors"))
    files = sorted({os.path.relpath(m.__file__, upstream) for m in list(sys.modules.values())
                    if getattr(m, "__file__", None) and m.__file__.startswith(upstream)} | {CONFIG_FILE})
    meta = {"config": {"class": "ActionConditionedMinimalV1LVGDiT", "kwargs": SMALL},
            "calls": {name: {"x_B_C_T_H_W": "in.x_B_C_T_H_W", "timesteps_B_T": t, "crossattn_emb": "in.crossattn_emb",
                             "condition_video_input_mask_B_C_T_H_W": "in.condition_video_input_mask_B_C_T_H_W",
                             "padding_mask": "in.padding_mask", "data_type": "DataType.VIDEO", "action": a}
                      for name, (t, a) in calls.items()},
            "upstream": {"files_git_blob_sha1": {f: blob_sha1(os.path.join(upstream, f)) for f in files}},
            "stubs": STUBS, "environment": {"torch": torch.__version__, "threads": 1, "dtype": "float32"},
            "weights_note": "seeded random values (randomize, seed 0), not upstream's init", "keys": key_table(net)}
    with open(os.path.join(out, "action_dit.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)

    kwargs = released_kwargs(upstream)
    with torch.device("meta"):
        big = ActionConditionedMinimalV1LVGDiT(**kwargs)
    released = {"symbol": NET_SYMBOL, "file": CONFIG_FILE, "class": "ActionConditionedMinimalV1LVGDiT",
                "kwargs": kwargs, "num_parameters": sum(p.numel() for p in big.parameters()), "keys": key_table(big)}
    with open(os.path.join(out, "action_released_keys.json"), "w", encoding="utf-8") as f:
        json.dump(released, f, indent=0)
    print(f"wrote {out}: {len(net.state_dict())} small-case keys, released {NET_SYMBOL}: {len(released['keys'])} keys,"
          f" {released['num_parameters']:,} parameters; out.y vs out.y_action_2 max-abs "
          f"{(io['out.y_B_C_T_H_W'] - io['out.y_action_2']).abs().max():.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
