"""`python bench.py --vs diffusers`: our training step and diffusers' on the same weights, in one process.

    python bench.py --vs diffusers --config v2w-2b --sac selective --compile        # one case: a table and a JSON line
    python bench.py --vs diffusers --config v2w-14b --lora 32 --sac block --compile --steps 3 --warmup 1
    python bench.py --vs diffusers-vae                                              # WanVAE vs AutoencoderKLWan
    python bench.py --vs diffusers --sweep --compile --timeout 1200   # the BENCHMARKS.md rows, a process each

diffusers (0.42.1) is a benchmark-only dependency, imported only here. The DiT case: bench.run measures our step
exactly as `python bench.py` does; then the same seed rebuilds our weights, which are handed (not copied) to a
`CosmosTransformer3DModel` through a key map, and `bench.train_step` drives it behind our DiT.forward signature
(PeerNet): the same batch (bench.make_batch), the same EDM preconditioning and rectified-flow loss (model.denoise),
forward + backward, no optimizer step, the median of --steps after --warmup by bench._timer, the peak by
max_memory_allocated after a reset. Before timing, one forward of each on the batch gives `parity` (same weights, same
inputs: the two networks are the same function up to kernel rounding). Their modes: gradient checkpointing
(`enable_gradient_checkpointing`, their only recompute) iff ours recomputes anything (--sac != none); --compile:
`compile_repeated_blocks(fullgraph=True)`, their regional compile, as ours compiles each block.
LoRA: their attention/FF Linears get our lora.LoRALinear adapters by the same class swap (add_lora), so the adapter
code is identical on both sides. The VAE case: vae.WanVAE vs `AutoencoderKLWan`, encode and decode of one random
video at --frames x --height x --width in --dtype, each side run as its pipeline does (ours: cfg.temporal_window
frames per encoder call; theirs: 4, clamped output), peak above the weights and input (as `vae.py --bench`).
--config tiny* also picks the tiny VAE (CPU tests); anything else the released architecture.

Deliberate differences from a stock diffusers model, each changing no cost:
- the padding-mask channel is handed in through `condition_mask` (built with concat_padding_mask=False and one more
  input channel: the same weights, the same concatenation). Their own path resizes the mask with torchvision, which
  neither nanocosmos nor diffusers requires.
- q/k RMSNorm eps 1e-6 (upstream Cosmos; diffusers' Attention defaults to 1e-5): the comparison is of one network.
- 0.42.1's CosmosTransformer3DModel lists no `_repeated_blocks`, so `compile_repeated_blocks` refuses; we name
  CosmosTransformerBlock on the instance and call their API.
What stays theirs: per-frame times go in as [B, 1, T, 1, 1], which they expand to every token (their adaLN MLPs
then run per token, ours per frame); attention through their dispatcher (PyTorch's SDPA choice; ours puts cuDNN first).

Contents, top to bottom: import -> key maps -> DiT: build, PeerNet -> VAE: build, encode/decode -> the two cases ->
table -> sweep -> main.
"""
import dataclasses
import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import bench
import cli
import sac
from lora import LoRALinear, add_lora
from model import DiT, denoise, get_config, is_p25
from vae import LATENT_MEAN, LATENT_STD, WanVAE, get_vae_config

MISSING = "bench.py --vs diffusers needs diffusers (pip install diffusers==0.42.1); it is a benchmark-only dependency"
CASES = ("diffusers", "diffusers-vae")


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
    """Hand `ours`' tensors to the meta-built `peer` (assign: no copy) after a full key and shape report; their
    requires_grad follows ours (frozen bases, trainable adapters)."""
    theirs = rename(ours.state_dict(), table)
    want = peer.state_dict()
    missing, unexpected = sorted(want.keys() - theirs.keys()), sorted(theirs.keys() - want.keys())
    shapes = [f"{k} {tuple(theirs[k].shape)} vs {tuple(want[k].shape)}" for k in sorted(want.keys() & theirs.keys())
              if theirs[k].shape != want[k].shape]
    if missing or unexpected or shapes:
        raise ValueError(f"our {type(ours).__name__} -> diffusers {type(peer).__name__}: {len(missing)} missing "
                         f"{missing[:4]}, {len(unexpected)} unexpected {unexpected[:4]}, {len(shapes)} shape "
                         f"mismatches {shapes[:4]}")
    peer.load_state_dict(theirs, assign=True)
    grad = rename({k: p.requires_grad for k, p in ours.named_parameters()}, table)
    for name, p in peer.named_parameters():
        p.requires_grad_(grad[name])
    left = [n for n, t in [*peer.named_parameters(), *peer.named_buffers()] if t.is_meta]
    if left:
        raise ValueError(f"diffusers {type(peer).__name__} kept meta tensors after the load: {left[:4]}")
    return peer


# -----------------------------------------------------------------------------
# The DiT


def transformer_kwargs(cfg):
    """CosmosTransformer3DModel's config for one of our Predict2 DiTConfigs; what it cannot express is refused."""
    if is_p25(cfg) or cfg.camera_channels or cfg.fp32_time_modulation:
        raise ValueError("--vs diffusers compares the Predict2 network (--config v2w-*, t2i-*, tiny): Predict2.5 "
                         "configs need fp32 time modulation and camera encoders that CosmosTransformer3DModel lacks")
    if not cfg.use_adaln_lora or cfg.extra_per_block_abs_pos_emb or cfg.crossattn_proj_in_channels != \
            cfg.crossattn_emb_channels:
        raise ValueError("--vs diffusers: this DiTConfig (no adaLN-LoRA, learnable positions or a text projection) "
                         "has no CosmosTransformer3DModel counterpart here; use v2w-*, t2i-* or tiny")
    pt, p = cfg.patch_temporal, cfg.patch_spatial
    return dict(in_channels=cfg.in_channels + int(cfg.video2world) + int(cfg.concat_padding_mask),
                out_channels=cfg.out_channels, num_attention_heads=cfg.num_heads, attention_head_dim=cfg.head_dim,
                num_layers=cfg.num_blocks, mlp_ratio=cfg.mlp_ratio, text_embed_dim=cfg.crossattn_emb_channels,
                adaln_lora_dim=cfg.adaln_lora_dim, max_size=(cfg.max_frames, cfg.max_img_h, cfg.max_img_w),
                patch_size=(pt, p, p), concat_padding_mask=False, extra_pos_embed_type=None,
                rope_scale=(cfg.rope_t_extrapolation_ratio, cfg.rope_h_extrapolation_ratio,
                            cfg.rope_w_extrapolation_ratio))


def to_diffusers(net):
    """A CosmosTransformer3DModel that holds `net`'s own tensors (no copy), LoRA adapters included."""
    from diffusers import CosmosTransformer3DModel
    table = dit_table(net.cfg)
    with torch.device("meta"):
        peer = CosmosTransformer3DModel(**transformer_kwargs(net.cfg))
    for name, module in peer.named_modules():
        if name.endswith((".norm_q", ".norm_k")):
            module.eps = 1e-6  # upstream's q/k RMSNorm eps (diffusers' Attention default: 1e-5)
    adapters = {name: m for name, m in net.named_modules() if isinstance(m, LoRALinear)}
    if adapters:
        settings = {(m.rank, m.scale * m.rank) for m in adapters.values()}
        if len(settings) != 1:
            raise ValueError(f"--vs diffusers: one LoRA rank and alpha for every adapter, got {sorted(settings)}")
        rank, alpha = settings.pop()
        targets = {_DIT_BLOCK[name.split(".", 2)[2]] for name in adapters}
        holder = nn.Module()  # add_lora adapts `blocks.N.<target>`: their blocks under that name, same class swap
        holder.blocks = peer.transformer_blocks
        add_lora(holder, rank, alpha, targets=tuple(sorted(targets)))
    return load_into(peer, net, table)


class PeerNet(nn.Module):
    """diffusers' transformer behind our DiT.forward signature, so model.denoise and bench.train_step drive it.

    It does what our forward does before the first layer and diffusers leaves to its pipelines: cast the inputs to
    the weights' dtype, build the condition and padding channels (handed over as their `condition_mask`), shape
    the times ([B] for one per sample, [B, 1, T, 1, 1] per latent frame)."""

    def __init__(self, peer, cfg):
        super().__init__()
        self.peer, self.cfg = peer, cfg

    def forward(self, x_B_C_T_H_W, t_B_T, crossattn_emb, condition_mask_B_1_T_H_W=None, fps=None,
                padding_mask_B_1_H_W=None, camera_B_T_Hp_Wp_C=None):
        cfg = self.cfg
        if camera_B_T_Hp_Wp_C is not None:
            raise ValueError("--vs diffusers: CosmosTransformer3DModel takes no camera map")
        dtype = self.peer.patch_embed.proj.weight.dtype
        B, _, T, H, W = x_B_C_T_H_W.shape
        x = x_B_C_T_H_W.to(dtype)
        channels = []
        if cfg.video2world:
            mask = condition_mask_B_1_T_H_W
            channels.append(torch.zeros_like(x[:, :1]) if mask is None else mask.to(dtype))
        if cfg.concat_padding_mask:
            pad = padding_mask_B_1_H_W
            if pad is None:
                pad = torch.zeros(B, 1, H, W, dtype=dtype, device=x.device)
            elif pad.shape[-2:] != (H, W):  # as our forward: legacy nearest
                pad = F.interpolate(pad.float(), size=(H, W), mode="nearest")
            channels.append(pad.to(dtype)[:, :, None].expand(B, 1, T, H, W))
        t = t_B_T if t_B_T.ndim == 2 else t_B_T[:, None]
        timestep = t[:, 0] if t.shape[1] == 1 else t.reshape(B, 1, -1, 1, 1)
        return self.peer(x, timestep, crossattn_emb.to(dtype), condition_mask=torch.cat(channels, 1) if channels
                         else None, fps=fps if cfg.rope_enable_fps_modulation else None, return_dict=False)[0]


def weights(b, cfg, device, dtype):
    """The DiT bench.build times, values only: the same meta build, LoRA and seeded init (so the same numbers),
    without checkpointing or compile (the handover to diffusers takes the tensors, not the module)."""
    with torch.device("meta"):
        net = DiT(cfg).to(dtype)
    if b.lora:
        add_lora(net, b.lora)
    net.to_empty(device=device)
    net.init_weights(generator=torch.Generator(device=device).manual_seed(b.seed))
    return net


def velocity(net, batch):
    """The network output of bench.train_step's Predict2 loss on `batch` (EDM preconditioning by model.denoise)."""
    x_sigma = batch["x0"] + batch["sigma"].view(-1, 1, 1, 1, 1) * batch["eps"]
    return denoise(net, x_sigma, batch["sigma"], batch["text"], gt_frames=batch["x0"],
                   condition_mask_B_1_T_H_W=batch["mask"])[1]


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
    """An AutoencoderKLWan that holds `ours`' tensors (no copy)."""
    from diffusers import AutoencoderKLWan
    with torch.device("meta"):
        peer = AutoencoderKLWan(**vae_kwargs(ours.cfg))
    return load_into(peer, ours, vae_table(ours.cfg)).eval()


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


def _gib(nbytes):
    return round(nbytes / 2**30, 2)


def _free(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def time_steps(model, batch, trainable, b, device):
    """bench.run's timing, for a model bench.run does not build: --warmup steps, a peak reset, median of --steps."""
    cuda = device.type == "cuda"
    try:
        for _ in range(b.warmup):
            bench.train_step(model, batch, trainable)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(b.steps):
            t = bench._timer(device)
            loss = bench.train_step(model, batch, trainable)
            times.append(t())
        if not torch.isfinite(loss):
            raise RuntimeError(f"non-finite loss {loss.item()}")
    except torch.OutOfMemoryError as e:
        return dict(status="OOM", error=str(e).split("\n")[0][:300],
                    peak_gib=_gib(torch.cuda.max_memory_allocated()) if cuda else None)
    return dict(status="ok", step_s=round(statistics.median(times), 4), step_times=[round(x, 4) for x in times],
                peak_gib=_gib(torch.cuda.max_memory_allocated()) if cuda else None,
                reserved_gib=_gib(torch.cuda.max_memory_reserved()) if cuda else None, loss=round(loss.item(), 5))


def run_dit(b):
    """Our step (bench.run), then diffusers' on the same weights and batch: one row."""
    diffusers = import_diffusers()
    device, dtype = torch.device(b.device), getattr(torch, b.dtype)
    cfg = get_config(b.config)
    transformer_kwargs(cfg)  # refuse before ours runs
    ours = bench.run(b)
    ours["mode"] = b.sac + (" + compile" if b.compile else "")
    _free(device)
    left_gib = _gib(torch.cuda.memory_allocated()) if device.type == "cuda" else None
    net = weights(b, cfg, device, dtype)
    batch = bench.make_batch(b, cfg, device, dtype)
    with torch.no_grad():
        ours_v = velocity(net, batch)
    peer = to_diffusers(net)
    del net
    wrapped = PeerNet(peer, cfg)
    with torch.no_grad():
        parity = compare(velocity(wrapped, batch), ours_v)
    del ours_v
    gc_on = b.sac != "none"
    if gc_on:
        peer.enable_gradient_checkpointing()
    if b.compile:
        peer._repeated_blocks = ["CosmosTransformerBlock"]  # unset in 0.42.1 (see the docstring)
        peer.compile_repeated_blocks(fullgraph=True)
    trainable = [p for p in peer.parameters() if p.requires_grad]
    theirs = time_steps(wrapped, batch, trainable, b, device)
    theirs.update(mode=("GC" if gc_on else "no GC") + (" + compile" if b.compile else ""),
                  trainable_params=sum(p.numel() for p in trainable), left_from_ours_gib=left_gib)
    ratio = round(theirs["step_s"] / ours["step_s"], 3) if ours["status"] == theirs["status"] == "ok" else None
    case = f"{b.config} {f'LoRA r={b.lora}' if b.lora else 'full FT'}, --sac {b.sac}"
    return dict(vs="diffusers", case=case, diffusers_version=diffusers.__version__, torch=torch.__version__,
                device=ours["gpu"], dtype=b.dtype, parity=parity, ratio=ratio, ours=ours, diffusers=theirs)


def _measure(fn, b, device):
    """(median seconds over --steps after --warmup calls, peak GiB above what was live before; None on CPU)."""
    cuda = device.type == "cuda"
    for _ in range(b.warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base, times = torch.cuda.memory_allocated() if cuda else 0, []
    for _ in range(b.steps):
        t = bench._timer(device)
        fn()  # the result is dropped at once: every call starts from the same live memory
        times.append(t())
    peak = _gib(torch.cuda.max_memory_allocated() - base) if cuda else None
    return dict(s=round(statistics.median(times), 4), times=[round(x, 4) for x in times], peak_gib=peak)


def run_vae(b):
    """Our WanVAE and AutoencoderKLWan on the same weights and video: encode and decode, one row."""
    diffusers = import_diffusers()
    device, dtype = torch.device(b.device), getattr(torch, b.dtype)
    name = "tiny" if b.config.startswith("tiny") else "real"
    torch.manual_seed(b.seed)
    with torch.device(device):
        ours = WanVAE(get_vae_config(name))  # default init: time and memory do not depend on the values
    ours = ours.to(dtype).eval().requires_grad_(False)
    peer = vae_to_diffusers(ours)
    g = torch.Generator(device=device).manual_seed(b.seed + 1)
    video = (torch.rand(1, 3, b.frames, b.height, b.width, device=device, generator=g) * 2 - 1).to(dtype)
    latent = ours.encode(video)
    parity = dict(encode=compare(their_encode(peer, video), latent),
                  decode=compare(their_decode(peer, latent), ours.decode(latent).clamp(-1, 1)))  # theirs clamps
    _free(device)
    window = ours.cfg.temporal_window
    sides = dict(ours=dict(encode=_measure(lambda: ours.encode(video), b, device),
                           decode=_measure(lambda: ours.decode(latent), b, device),
                           mode=f"{window} frames per encoder call"),
                 diffusers=dict(encode=_measure(lambda: their_encode(peer, video), b, device),
                                decode=_measure(lambda: their_decode(peer, latent), b, device),
                                mode="4 frames per encoder call"))
    ratio = {op: round(sides["diffusers"][op]["s"] / sides["ours"][op]["s"], 3) for op in ("encode", "decode")}
    case = f"Wan VAE ({name}) encode / decode {b.frames}x{b.height}x{b.width} {b.dtype}"
    return dict(vs="diffusers-vae", case=case, diffusers_version=diffusers.__version__, torch=torch.__version__,
                device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu", dtype=b.dtype,
                video=[1, 3, b.frames, b.height, b.width], latent=list(latent.shape), parity=parity, ratio=ratio,
                **sides)


# -----------------------------------------------------------------------------
# The table


def _cell(seconds, gib, mode=None):
    text = f"{seconds:.3f} s" + ("" if gib is None else f", {gib:.1f} GiB")
    return text + (f" ({mode})" if mode else "")


def _side(row, who):
    side = row[who]
    if row["vs"] == "diffusers-vae":
        return " / ".join(_cell(side[op]["s"], side[op]["peak_gib"]) for op in ("encode", "decode")) + \
            f" ({side['mode']})"
    if side["status"] != "ok":
        return f"{side['status']} ({side['mode']})"
    return _cell(side["step_s"], side["peak_gib"], side["mode"])


def table(rows):
    """The markdown ratio table (ratio = diffusers' time / ours: above 1, ours is faster)."""
    lines = ["| case | nanocosmos | diffusers | ratio |", "|---|---|---|---|"]
    for row in rows:
        if "vs" not in row:  # a sweep entry that produced no row
            lines.append(f"| {row['args']} | {row['status']} | {row['status']} | - |")
            continue
        ratio = row["ratio"]
        if isinstance(ratio, dict):
            ratio = " / ".join(f"{ratio[op]:.2f}x" for op in ("encode", "decode"))
        else:
            ratio = "-" if ratio is None else f"{ratio:.2f}x"
        lines.append(f"| {row['case']} | {_side(row, 'ours')} | {_side(row, 'diffusers')} | {ratio} |")
    return "\n".join(lines)


# -----------------------------------------------------------------------------
# Sweep: the BENCHMARKS.md rows, each in its own process (an OOM or a crash in one leaves the others running)

SWEEP = ["--config v2w-2b --sac selective",
         "--config v2w-2b --sac block",
         "--config v2w-14b --lora 32 --sac block --steps 3 --warmup 1",
         "--vs diffusers-vae"]


def sweep_commands(b):
    """One bench.py command line per SWEEP entry: the parent's other flags forwarded, the entry's winning."""
    skip = {"sweep", "out", "timeout", "vs", "config", "sac", "lora", "every"}  # the entries set these
    cmds = []
    for entry in SWEEP:
        drop = skip | ({"compile"} if "diffusers-vae" in entry else set())  # the VAE runs eager on both sides
        flags = []
        for f in dataclasses.fields(b):
            value = getattr(b, f.name)
            if f.name in drop or value == f.default:
                continue
            flag = cli.flag(f.name)
            flags += [flag if value else "--no-" + flag[2:]] if isinstance(value, bool) else [flag, str(value)]
        cmds.append([sys.executable, os.path.abspath(bench.__file__), "--vs", "diffusers", *flags, *entry.split()])
    return cmds


def sweep(b):
    rows = []
    for cmd in sweep_commands(b):
        args = " ".join(cmd[2:])
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=b.timeout)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            row = json.loads(lines[-1]) if lines else dict(args=args, status="error", rc=proc.returncode,
                                                           stderr=proc.stderr[-1500:])
        except subprocess.TimeoutExpired:
            row = dict(args=args, status="timeout", timeout_s=b.timeout)
        row["cmd"] = "python bench.py " + args
        bench.emit(row, b.out)
        rows.append(row)
    print(table(rows), flush=True)
    return rows


# -----------------------------------------------------------------------------
# main (bench.py --vs ...)


def check(b):
    """--vs takes bench.py's step flags; the flags of its other modes are refused."""
    if b.vs not in CASES:
        raise ValueError(f"--vs {b.vs!r}: valid: {', '.join(CASES)}")
    for flag, on in (("--world", b.world), ("--cp", b.cp != 1), ("--parity", b.parity), ("--ckpt-load", b.ckpt_load),
                     ("--profile", b.profile), ("--offload", b.offload), ("--every", b.every != 1),
                     ("--views", b.views != 1), ("--mem-budget", b.mem_budget), ("--fp8", b.fp8)):
        if on:
            raise ValueError(f"{flag} does nothing with --vs {b.vs} (diffusers has no counterpart): drop it")
    if b.sac == "auto":
        raise ValueError("--sac auto does nothing with --vs (diffusers has one recompute mode to set against ours): "
                         "pick none | block | mm | attn | selective")
    sac.validate(b.sac, b.every)
    bench.latent_shape(b)
    if b.steps < 1 or b.warmup < 0:
        raise ValueError(f"--steps {b.steps} must be >= 1 and --warmup {b.warmup} >= 0")
    if b.vs == "diffusers-vae" and (b.lora or b.compile):
        raise ValueError("--lora and --compile do nothing with --vs diffusers-vae (the VAE runs eager, frozen): "
                         "drop them")
    if b.vs == "diffusers":
        transformer_kwargs(get_config(b.config))


def main(b):
    """bench.py's entry for --vs: the sweep, or one case (a table, then its JSON line)."""
    check(b)
    import_diffusers()  # the one-line refusal before any work
    if b.sweep:
        return sweep(b)
    row = run_dit(b) if b.vs == "diffusers" else run_vae(b)
    print(table([row]), flush=True)
    bench.emit(row, b.out)
    return row

