"""diffusers' networks fed our weights: the key maps ours -> diffusers, the builds and the call adapter.

    peer = to_diffusers(net)                  # a diffusers-built CosmosTransformer3DModel, net's values copied in
    y = PeerNet(peer, net.cfg)(x, t, cond)    # behind our DiT.forward signature (cond: a condition.Condition)
    vae = vae_to_diffusers(ours)              # AutoencoderKLWan, likewise; their_encode / their_decode

Every diffusers model here is built by diffusers itself from its config, on the device and in the dtype it is used
in, so it owns contiguous parameters; our values are copied in through the key maps (load_state_dict after a full
key and shape report: no storage shared with ours). tests/test_peer.py checks that the two are the same function
(forward and gradients to fp32 rounding, LoRA adapters included). diffusers (and PEFT) are benchmark-only
dependencies, imported inside the functions that use them (peer.py, `bench.py --vs`).
"""
import importlib.util

import torch
import torch.nn as nn
import torch.nn.functional as F

from condition import Condition
from engine import build
from nets.edm import denoise
from nets.lora import LORA_TARGETS, LoRALinear, add_lora
from nets.vae import LATENT_MEAN, LATENT_STD

MISSING = "bench.py --vs diffusers needs diffusers (pip install diffusers==0.42.1); it is a benchmark-only dependency"


def import_diffusers():
    """The diffusers module, or the one-line refusal when it is not installed (its own import errors propagate)."""
    if importlib.util.find_spec("diffusers") is None:
        raise ValueError(MISSING)
    import diffusers
    return diffusers


# -----------------------------------------------------------------------------
# Key maps: our state_dict keys (upstream Cosmos names) -> diffusers'. A table maps module paths; a key takes the
# longest path that matches whole dotted segments and keeps its tail (weight, bias, lora_a.weight, ...).

_DIT_TOP = {"x_embedder.proj.1": "patch_embed.proj", "t_embedder.1": "time_embed.t_embedder",
            "t_embedding_norm": "time_embed.norm", "final_layer.adaln_modulation.1": "norm_out.linear_1",
            "final_layer.adaln_modulation.2": "norm_out.linear_2", "final_layer.linear": "proj_out",
            "pos_embedder": None}  # RoPE buffers: diffusers computes the angles in every call
_DIT_BLOCK = {"mlp.layer1": "ff.net.0.proj", "mlp.layer2": "ff.net.2"}
for _ours, _theirs in (("self_attn", "attn1"), ("cross_attn", "attn2")):
    _DIT_BLOCK.update({f"{_ours}.q_proj": f"{_theirs}.to_q", f"{_ours}.k_proj": f"{_theirs}.to_k",
                       f"{_ours}.v_proj": f"{_theirs}.to_v", f"{_ours}.output_proj": f"{_theirs}.to_out.0",
                       f"{_ours}.q_norm": f"{_theirs}.norm_q", f"{_ours}.k_norm": f"{_theirs}.norm_k"})
for _ours, _theirs in (("self_attn", "norm1"), ("cross_attn", "norm2"), ("mlp", "norm3")):
    _DIT_BLOCK.update({f"adaln_modulation_{_ours}.1": f"{_theirs}.linear_1",
                       f"adaln_modulation_{_ours}.2": f"{_theirs}.linear_2"})


def diffusers_lora_targets(targets=LORA_TARGETS):
    """Our LoRA target paths inside a block (lora.LORA_TARGETS) as diffusers' paths inside theirs, sorted."""
    return sorted(_DIT_BLOCK[t] for t in targets)


def dit_table(cfg):
    """Module paths of our DiT -> CosmosTransformer3DModel's (None: no counterpart, dropped)."""
    table = dict(_DIT_TOP)
    for i in range(cfg.num_blocks):
        table.update({f"blocks.{i}.{ours}": f"transformer_blocks.{i}.{theirs}" for ours, theirs in _DIT_BLOCK.items()})
    return table


def vae_table(cfg):
    """Module paths of our WanVAE (upstream VAE_ names) -> AutoencoderKLWan's."""
    table = {"conv1": "quant_conv", "conv2": "post_quant_conv"}
    for side in ("encoder", "decoder"):
        table.update({f"{side}.conv1": f"{side}.conv_in", f"{side}.head.0": f"{side}.norm_out",
                      f"{side}.head.2": f"{side}.conv_out", f"{side}.middle.0": f"{side}.mid_block.resnets.0",
                      f"{side}.middle.1": f"{side}.mid_block.attentions.0",
                      f"{side}.middle.2": f"{side}.mid_block.resnets.1"})
    stages = len(cfg.dim_mult)
    down = cfg.num_res_blocks * stages + stages - 1  # our encoder's flat list equals theirs, index for index
    table.update({f"encoder.downsamples.{k}": f"encoder.down_blocks.{k}" for k in range(down)})
    up = []  # our decoder's flat list, theirs grouped per stage
    for i in range(stages):
        up += [f"decoder.up_blocks.{i}.resnets.{j}" for j in range(cfg.num_res_blocks + 1)]
        if i < stages - 1:
            up.append(f"decoder.up_blocks.{i}.upsamplers.0")
    table.update({f"decoder.upsamples.{k}": name for k, name in enumerate(up)})
    for path, theirs in list(table.items()):  # inside a residual block (harmless where a path is none)
        for ours, name in (("residual.0", "norm1"), ("residual.2", "conv1"), ("residual.3", "norm2"),
                           ("residual.6", "conv2"), ("shortcut", "conv_shortcut")):
            table[f"{path}.{ours}"] = f"{theirs}.{name}"
    return table


def rename(state_dict, table):
    """{our key: tensor} -> {their key: the same tensor}; a key no table path covers is an error."""
    out = {}
    for key, value in state_dict.items():
        path = max((p for p in table if key == p or key.startswith(p + ".")), key=len, default=None)
        if path is None:
            raise ValueError(f"no diffusers counterpart for our key {key!r}: extend peer.py's key table")
        if table[path] is not None:
            out[table[path] + key[len(path):]] = value
    return out


def load_into(peer, ours, table):
    """Copy `ours`' values into `peer`'s own tensors (load_state_dict: no storage shared, the peer's dtypes kept)
    after a full key and shape report; their requires_grad follows ours (frozen bases, trainable adapters)."""
    theirs = rename(ours.state_dict(), table)
    want = peer.state_dict()
    missing, unexpected = sorted(want.keys() - theirs.keys()), sorted(theirs.keys() - want.keys())
    shapes = [f"{k} {tuple(theirs[k].shape)} vs {tuple(want[k].shape)}" for k in sorted(want.keys() & theirs.keys())
              if theirs[k].shape != want[k].shape]
    if missing or unexpected or shapes:
        raise ValueError(f"our {type(ours).__name__} -> diffusers {type(peer).__name__}: {len(missing)} missing "
                         f"{missing[:4]}, {len(unexpected)} unexpected {unexpected[:4]}, {len(shapes)} shape "
                         f"mismatches {shapes[:4]}")
    peer.load_state_dict(theirs)
    grad = rename({k: p.requires_grad for k, p in ours.named_parameters()}, table)
    for name, p in peer.named_parameters():
        p.requires_grad_(grad[name])
    return peer


# -----------------------------------------------------------------------------
# The DiT


def transformer_kwargs(cfg):
    """CosmosTransformer3DModel's config for one of our Predict2 DiTConfigs; what it cannot express is refused."""
    if cfg.camera_channels or cfg.fp32_time_modulation:  # Predict2.5 (fp32_time_modulation, agibot's cameras)
        raise ValueError("--vs diffusers compares the Predict2 network (--config v2w-*, t2i-*, tiny): Predict2.5 "
                         "configs need fp32 time modulation and camera encoders that CosmosTransformer3DModel lacks")
    if not cfg.use_adaln_lora or cfg.extra_per_block_abs_pos_emb or cfg.crossattn_proj_in_channels != \
            cfg.crossattn_emb_channels:
        raise ValueError("--vs diffusers: this DiTConfig (no adaLN-LoRA, learnable positions or a text projection) "
                         "has no CosmosTransformer3DModel counterpart here; use v2w-*, t2i-* or tiny")
    if cfg.action_dim:  # its blocks are v2w-2b's, but the action MLPs have no diffusers counterpart to compare
        raise ValueError(f"--vs diffusers: action_dim {cfg.action_dim}: CosmosTransformer3DModel takes no actions; "
                         "compare the network without them (v2w-2b, tiny)")
    pt, p = cfg.patch_temporal, cfg.patch_spatial
    return dict(in_channels=cfg.in_channels + int(cfg.video2world) + int(cfg.concat_padding_mask),
                out_channels=cfg.out_channels, num_attention_heads=cfg.num_heads, attention_head_dim=cfg.head_dim,
                num_layers=cfg.num_blocks, mlp_ratio=cfg.mlp_ratio, text_embed_dim=cfg.crossattn_emb_channels,
                adaln_lora_dim=cfg.adaln_lora_dim, max_size=(cfg.max_frames, cfg.max_img_h, cfg.max_img_w),
                patch_size=(pt, p, p), concat_padding_mask=False, extra_pos_embed_type=None,
                rope_scale=(cfg.rope_t_extrapolation_ratio, cfg.rope_h_extrapolation_ratio,
                            cfg.rope_w_extrapolation_ratio))


def build_stock(cfg, device, dtype):
    """CosmosTransformer3DModel built by diffusers from its config on `device` (its own init), cast to `dtype`."""
    from diffusers import CosmosTransformer3DModel
    with torch.device(device):
        model = CosmosTransformer3DModel.from_config(transformer_kwargs(cfg))
    return model.to(dtype)


def to_diffusers(net):
    """A diffusers-built CosmosTransformer3DModel with `net`'s values copied into its own parameters (net's device
    and base dtype), LoRA adapters included (our LoRALinear by the same class swap, fp32 as ours)."""
    base = next(p for name, p in net.named_parameters() if ".lora_" not in name)
    peer = build_stock(net.cfg, base.device, base.dtype)
    for name, module in peer.named_modules():
        if name.endswith((".norm_q", ".norm_k")):
            module.eps = 1e-6  # upstream's q/k RMSNorm eps (diffusers' Attention default: 1e-5)
    adapters = {name: m for name, m in net.named_modules() if isinstance(m, LoRALinear)}
    if adapters:
        settings = {(m.rank, m.scale * m.rank) for m in adapters.values()}
        if len(settings) != 1:
            raise ValueError(f"--vs diffusers: one LoRA rank and alpha for every adapter, got {sorted(settings)}")
        rank, alpha = settings.pop()
        targets = diffusers_lora_targets({name.split(".", 2)[2] for name in adapters})
        holder = nn.Module()  # add_lora adapts `blocks.N.<target>`: their blocks under that name, same class swap
        holder.blocks = peer.transformer_blocks
        add_lora(holder, rank, alpha, targets=tuple(targets))
    return load_into(peer, net, dit_table(net.cfg))


def diffusers_inputs(cfg, dtype, x_B_C_T_H_W, t_B_T, cond):
    """The keyword arguments of CosmosTransformer3DModel's forward for our DiT.forward's inputs: what our forward
    does before its first layer and diffusers leaves to its pipelines: the inputs cast to the weights' dtype, the
    condition and padding channels (handed over as their `condition_mask`), the times shaped ([B] for one per
    sample, [B, 1, T, 1, 1] per latent frame)."""
    B, _, T, H, W = x_B_C_T_H_W.shape
    x = x_B_C_T_H_W.to(dtype)
    channels = []
    if cfg.video2world:
        mask = cond.condition_mask
        channels.append(torch.zeros_like(x[:, :1]) if mask is None else mask.to(dtype))
    if cfg.concat_padding_mask:
        pad = cond.padding_mask
        if pad is None:
            pad = torch.zeros(B, 1, H, W, dtype=dtype, device=x.device)
        elif pad.shape[-2:] != (H, W):  # as our forward: legacy nearest
            pad = F.interpolate(pad.float(), size=(H, W), mode="nearest")
        channels.append(pad.to(dtype)[:, :, None].expand(B, 1, T, H, W))
    t = t_B_T if t_B_T.ndim == 2 else t_B_T[:, None]
    return dict(hidden_states=x, timestep=t[:, 0] if t.shape[1] == 1 else t.reshape(B, 1, -1, 1, 1),
                encoder_hidden_states=cond.crossattn_emb.to(dtype),
                condition_mask=torch.cat(channels, 1) if channels else None,
                fps=cond.fps if cfg.rope_enable_fps_modulation else None)


class PeerNet(nn.Module):
    """diffusers' transformer behind our DiT.forward signature, so model.denoise and benchstep.train_step drive it."""

    def __init__(self, peer, cfg):
        super().__init__()
        self.peer, self.cfg = peer, cfg

    def forward(self, x_B_C_T_H_W, t_B_T, cond: Condition):
        if cond.camera is not None:
            raise ValueError("--vs diffusers: CosmosTransformer3DModel takes no camera map")
        kwargs = diffusers_inputs(self.cfg, self.peer.patch_embed.proj.weight.dtype, x_B_C_T_H_W, t_B_T, cond)
        return self.peer(**kwargs, return_dict=False)[0]


def weights(b, device, dtype):
    """The DiT bench.build_net times, values only: the same build (engine/build.py), LoRA and seeded init (so the same
    numbers), without checkpointing or compile (the handover to diffusers takes the tensors, not the module)."""
    return build.build(build.NetSpec(config=b.config, lora=b.lora, dtype=dtype, seed=b.seed), device)


def velocity(net, batch):
    """The network output of benchstep.train_step's Predict2 loss on `batch` (EDM preconditioning by model.denoise)."""
    x_sigma = batch["x0"] + batch["sigma"].view(-1, 1, 1, 1, 1) * batch["eps"]
    return denoise(net, x_sigma, batch["sigma"], batch["cond"])[1]


def compare(theirs, ours):
    """Max abs difference and relative RMS difference, in fp32."""
    theirs, ours = theirs.float(), ours.float()
    return dict(max_abs=(theirs - ours).abs().max().item(),
                rel_rms=((theirs - ours).square().mean() / ours.square().mean()).sqrt().item())


# -----------------------------------------------------------------------------
# The VAE


def vae_kwargs(cfg):
    """AutoencoderKLWan's config for one of our VAEConfigs (their encoder takes 4 frames per call: time x4 only)."""
    if cfg.time_factor != 4:
        raise ValueError(f"--vs diffusers-vae: AutoencoderKLWan encodes 4 frames per call, so it needs time x4; "
                         f"this VAEConfig compresses time x{cfg.time_factor}")
    return dict(base_dim=cfg.dim, z_dim=cfg.z_dim, dim_mult=list(cfg.dim_mult), num_res_blocks=cfg.num_res_blocks,
                temperal_downsample=list(cfg.temporal_downsample), latents_mean=LATENT_MEAN, latents_std=LATENT_STD)


def vae_to_diffusers(ours):
    """An AutoencoderKLWan built by diffusers on `ours`' device, in its dtype, with `ours`' values copied in."""
    from diffusers import AutoencoderKLWan
    like = next(ours.parameters())
    with torch.device(like.device):
        peer = AutoencoderKLWan(**vae_kwargs(ours.cfg))
    return load_into(peer.to(like.dtype), ours, vae_table(ours.cfg)).eval()


def _latent_stats(peer, like):
    mean = torch.tensor(peer.config.latents_mean, dtype=like.dtype, device=like.device).view(1, -1, 1, 1, 1)
    std = torch.tensor(peer.config.latents_std, dtype=like.dtype, device=like.device).view(1, -1, 1, 1, 1)
    return mean, std


@torch.no_grad()
def their_encode(peer, video):
    """Their pipelines' encode: the posterior mean, normalised per channel (what our WanVAE.encode returns)."""
    mu = peer.encode(video.to(peer.dtype)).latent_dist.mode()
    mean, std = _latent_stats(peer, mu)
    return (mu - mean) / std


@torch.no_grad()
def their_decode(peer, latent):
    mean, std = _latent_stats(peer, latent)
    return peer.decode(latent.to(peer.dtype) * std + mean).sample


# -----------------------------------------------------------------------------
# The two cases
