"""The Cosmos-Predict2 diffusion transformer ("MiniTrainDIT" / video2world "MinimalV1LVGDiT") in plain PyTorch.

Parameter and buffer names are exactly upstream's, so released checkpoints load without any key mapping.
docs/predict2.md has the conventions (and where we deliberately differ from upstream); everything below is
checked against tensors produced by the upstream code (tests/check_reference.py). Layout names: B batch,
C channels, T/H/W latent frames/rows/cols, L tokens, D model width, d head width.

Cosmos-Predict2.5 (configs p25-*) is the same network plus the Reason1 text projection (crossattn_proj), and for
robot/multiview-agibot a per-block cam_encoder fed by camera.plucker_map (t: see DiTConfig.timestep_scale).
fp32_time_modulation is upstream's "Wan fp32 strategy" written as explicit fp32 GEMMs (linear_fp32) instead of a CUDA
fp32 autocast: the time embedding, the adaLN modulations and the whole final layer run in fp32 in a bf16 model (its
output is then fp32), shift/scale/gate are cast to the activation dtype; on any device (upstream cannot run a bf16
model on CPU at all), a no-op in an fp32 model. Its other part, q/k in fp32 for RoPE, is what apply_rope always does.

Context parallelism (--cp, base/cp.py): under cp.enable a DiT computes its rank's share of the latent frames, and each
self-attention exchanges q, k, v and its output with the other ranks of the cp group (Ulysses all-to-all).

Contents, top to bottom: blocks -> DiT. Its input record: condition.py; DiTConfig: base/inits.py; LoRA: nets/lora.py;
the denoisers (the net as an x0 or velocity prediction): nets/edm.py (Predict2), nets/flow.py (Predict2.5); FLOPs
and the matmul peak: nets/flops.py.
"""
import math
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from base import cp
from base.inits import DiTConfig
from condition import Condition, action_layout, check_action

# -----------------------------------------------------------------------------
# Building blocks


class Patchify(nn.Module):
    """[B, C, T*pt, H*p, W*p] -> [B, T, H, W, C*pt*p*p], features ordered (c, pt, p, p) like upstream."""

    def __init__(self, patch_temporal, patch_spatial):
        super().__init__()
        self.pt, self.p = patch_temporal, patch_spatial

    def forward(self, x):
        B, C, T, H, W = x.shape
        pt, p = self.pt, self.p
        if T % pt or H % p or W % p:
            raise ValueError(f"latent T,H,W = {T},{H},{W} not divisible by patch ({pt},{p},{p})")
        x = x.view(B, C, T // pt, pt, H // p, p, W // p, p).permute(0, 2, 4, 6, 1, 3, 5, 7)
        return x.reshape(B, T // pt, H // p, W // p, C * pt * p * p)


class PatchEmbed(nn.Module):
    def __init__(self, in_channels, dim, patch_temporal, patch_spatial):
        super().__init__()
        # index 0 holds no parameters; the Linear must sit at index 1 for the key x_embedder.proj.1.weight
        self.proj = nn.Sequential(Patchify(patch_temporal, patch_spatial),
                                  nn.Linear(in_channels * patch_temporal * patch_spatial ** 2, dim, bias=False))

    def forward(self, x):
        return self.proj(x)


class RopePositions(nn.Module):
    """3-D RoPE for (t, h, w). The persistent buffers exist only so released checkpoints load key for key.

    Deliberate difference from upstream: the angles are always computed in fp32 from exact exponents. Upstream
    reads them from these buffers, which `.to(bfloat16)` rounds (angle errors up to 0.28 rad at 720p), and the
    released .pt files store them rounded. A bf16 model here gets exactly the fp32 model's RoPE.
    """

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        d = cfg.head_dim
        self.d_hw = 2 * (d // 6)  # an even share for h and w each; t gets the rest
        self.d_t = d - 2 * self.d_hw
        if self.d_hw <= 2:
            raise ValueError(f"head dim {d} too small for 3-D RoPE (needs >= 18)")
        len_h, len_w = cfg.max_img_h // cfg.patch_spatial, cfg.max_img_w // cfg.patch_spatial
        len_t = cfg.max_frames // cfg.patch_temporal
        self.len_h, self.len_w, self.len_t = len_h, len_w, len_t
        self.register_buffer("seq", torch.empty(max(len_h, len_w, len_t)))
        self.register_buffer("dim_spatial_range", torch.empty(self.d_hw // 2))
        self.register_buffer("dim_temporal_range", torch.empty(self.d_t // 2))
        # NTK-style base scaling per axis
        self.ntk_h = cfg.rope_h_extrapolation_ratio ** (self.d_hw / (self.d_hw - 2))
        self.ntk_w = cfg.rope_w_extrapolation_ratio ** (self.d_hw / (self.d_hw - 2))
        self.ntk_t = cfg.rope_t_extrapolation_ratio ** (self.d_t / (self.d_t - 2))
        self.fps_modulation = cfg.rope_enable_fps_modulation
        self.reset_buffers()

    @torch.no_grad()
    def reset_buffers(self):
        if self.seq.is_meta:
            return
        self.seq.copy_(torch.arange(self.seq.numel(), dtype=torch.float32))
        self.dim_spatial_range.copy_(self._exponents(self.d_hw, self.seq.device))
        self.dim_temporal_range.copy_(self._exponents(self.d_t, self.seq.device))

    @staticmethod
    def _exponents(n, device):
        return torch.arange(0, n, 2, dtype=torch.float32, device=device)[: n // 2] / n

    def angles(self, T, H, W, fps, device):
        """fp32 angles [T*H*W, d] in (t h w) token order: [t | h | w] frequencies, concatenated twice."""
        if H > self.len_h or W > self.len_w:
            raise ValueError(f"patch grid {H}x{W} exceeds the RoPE table {self.len_h}x{self.len_w} (max_img_h/w)")
        if T > self.len_t:
            raise ValueError(f"{T} patched frames exceed the RoPE table length {self.len_t} (max_frames)")
        seq = torch.arange(max(T, H, W), dtype=torch.float32, device=device)
        freq_h = 1.0 / ((10000.0 * self.ntk_h) ** self._exponents(self.d_hw, device))
        freq_w = 1.0 / ((10000.0 * self.ntk_w) ** self._exponents(self.d_hw, device))
        freq_t = 1.0 / ((10000.0 * self.ntk_t) ** self._exponents(self.d_t, device))
        pos_t = seq[:T]
        if self.fps_modulation and T > 1:
            if fps is None:
                raise ValueError("rope_enable_fps_modulation needs fps for videos with T > 1")
            fps = torch.as_tensor(fps, dtype=torch.float32, device=device).reshape(-1)
            if fps.numel() > 1 and not torch.all(fps == fps[0]):
                raise ValueError(f"fps-modulated RoPE needs one fps per batch, got {fps.tolist()}")
            pos_t = pos_t / fps[:1] * 24.0  # positions in units of 24-fps frames
        ang_t = torch.outer(pos_t, freq_t)[:, None, None, :].expand(T, H, W, -1)
        ang_h = torch.outer(seq[:H], freq_h)[None, :, None, :].expand(T, H, W, -1)
        ang_w = torch.outer(seq[:W], freq_w)[None, None, :, :].expand(T, H, W, -1)
        half = torch.cat([ang_t, ang_h, ang_w], dim=-1)
        return torch.cat([half, half], dim=-1).reshape(T * H * W, -1)


def apply_rope(x_B_L_h_d, cos_L_1_d, sin_L_1_d):
    """Non-interleaved rotate-half RoPE, evaluated in fp32 and cast back (what TE's fused kernel does)."""
    x = x_B_L_h_d.float()
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x * cos_L_1_d + rotated * sin_L_1_d).to(x_B_L_h_d.dtype)


class LearnablePosEmb(nn.Module):
    """Optional absolute per-axis embedding (off in all releases), RMS-normalised, added at every block input."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        D = cfg.model_channels
        self.pos_emb_h = nn.Parameter(torch.empty(cfg.max_img_h // cfg.patch_spatial, D))
        self.pos_emb_w = nn.Parameter(torch.empty(cfg.max_img_w // cfg.patch_spatial, D))
        self.pos_emb_t = nn.Parameter(torch.empty(cfg.max_frames // cfg.patch_temporal, D))

    def forward(self, T, H, W):
        emb = self.pos_emb_t[:T, None, None] + self.pos_emb_h[None, :H, None] + self.pos_emb_w[None, None, :W]
        norm = torch.linalg.vector_norm(emb, dim=-1, keepdim=True, dtype=torch.float32)
        norm = 1e-6 + norm * math.sqrt(1.0 / emb.shape[-1])
        return (emb / norm.to(emb.dtype)).reshape(1, T, H * W, -1)


class Timesteps(nn.Module):
    """Sinusoidal embedding of the rectified-flow time t in (0,1): [cos | sin], computed in fp32."""

    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, t_B_T):
        half = self.dim // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t_B_T.device) / half)
        arg = t_B_T.float()[..., None] * freqs
        return torch.cat([torch.cos(arg), torch.sin(arg)], dim=-1)


def linear_fp32(linear, x):
    """linear(x) as an fp32 GEMM whatever the weights' dtype (fp32_time_modulation; upstream: CUDA fp32 autocast)."""
    if type(linear) is not nn.Linear:
        raise ValueError(f"fp32_time_modulation runs the time/adaLN/final layers as plain fp32 Linears, found a"
                         f" {type(linear).__name__}: adapters on them are not supported")
    return F.linear(x.float(), linear.weight.float(), None if linear.bias is None else linear.bias.float())


class TimestepEmbedding(nn.Module):
    def __init__(self, dim, use_adaln_lora, fp32=False):
        super().__init__()
        self.fp32 = fp32
        self.linear_1 = nn.Linear(dim, dim, bias=not use_adaln_lora)
        self.linear_2 = nn.Linear(dim, 3 * dim if use_adaln_lora else dim, bias=False)

    def forward(self, sinusoid):
        if self.fp32:
            return linear_fp32(self.linear_2, F.silu(linear_fp32(self.linear_1, sinusoid)))
        return self.linear_2(F.silu(self.linear_1(sinusoid)))


def modulation(dim, chunks, lora_dim):
    """adaLN modulation MLP: SiLU -> Linear (D -> chunks*D), or a rank-`lora_dim` factorisation when set."""
    if lora_dim:
        return nn.Sequential(nn.SiLU(), nn.Linear(dim, lora_dim, bias=False), nn.Linear(lora_dim, chunks * dim, bias=False))
    return nn.Sequential(nn.SiLU(), nn.Linear(dim, chunks * dim, bias=False))


def run_modulation(mlp, emb, fp32):
    """A modulation() MLP on the time embedding; with fp32 its GEMMs run in fp32 (the embedding is fp32 then)."""
    if not fp32:
        return mlp(emb)
    x = F.silu(emb.float())
    for linear in mlp[1:]:
        x = linear_fp32(linear, x)
    return x


def attention(q_B_L_h_d, k_B_S_h_d, v_B_S_h_d):
    """softmax(q k^T / sqrt(d)) v per head, no mask (upstream lets zero-padded text tokens take softmax mass)."""
    q, k, v = (t.transpose(1, 2) for t in (q_B_L_h_d, k_B_S_h_d, v_B_S_h_d))
    # On Hopper cuDNN's fused attention is ~1.8x flash at 31k tokens; the list is a priority order, so any
    # shape cuDNN rejects falls back to flash, then memory-efficient, then math.
    ctx = sdpa_kernel(_CUDA_SDPA_ORDER, set_priority=True) if q.is_cuda else nullcontext()
    with ctx:
        out = F.scaled_dot_product_attention(q, k, v)
    return out.transpose(1, 2)


_CUDA_SDPA_ORDER = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                    SDPBackend.MATH]


class Attention(nn.Module):
    def __init__(self, dim, context_dim, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=1e-6)
        self.k_proj = nn.Linear(context_dim, dim, bias=False)
        self.k_norm = nn.RMSNorm(self.head_dim, eps=1e-6)
        self.v_proj = nn.Linear(context_dim, dim, bias=False)
        self.output_proj = nn.Linear(dim, dim, bias=False)
        self.cp_group = None  # self-attention under --cp: cp.enable sets the group (tokens split over its ranks)

    def forward(self, x_B_L_D, context_B_S_D, rope_cos_sin=None):
        B, L, _ = x_B_L_D.shape
        S = context_B_S_D.shape[1]
        q = self.q_norm(self.q_proj(x_B_L_D).view(B, L, self.num_heads, self.head_dim))
        k = self.k_norm(self.k_proj(context_B_S_D).view(B, S, self.num_heads, self.head_dim))
        v = self.v_proj(context_B_S_D).view(B, S, self.num_heads, self.head_dim)
        if rope_cos_sin is not None:
            q, k = apply_rope(q, *rope_cos_sin), apply_rope(k, *rope_cos_sin)
        if self.cp_group is not None:  # Ulysses (base/cp.py): one all-to-all to all tokens x my heads, SDPA, and back
            q, k, v = cp.seq_to_heads(torch.stack([q, k, v]), self.cp_group).unbind(0)
            out = cp.heads_to_seq(attention(q, k, v), self.cp_group)
        else:
            out = attention(q, k, v)
        return self.output_proj(out.reshape(B, L, -1))


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.layer1 = nn.Linear(dim, hidden, bias=False)
        self.layer2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.layer2(F.gelu(self.layer1(x)))


def layer_norm(x):
    return F.layer_norm(x, x.shape[-1:], eps=1e-6)


class Block(nn.Module):
    """x += gate * op(LN(x) * (1 + scale) + shift) for self-attention, cross-attention and the MLP.

    Tokens are held as [B, T, H*W, D] so the per-frame adaLN modulations [B, T or 1, 1, D] broadcast over space.
    `checkpoint_fn` is set by sac.apply(); it wraps `_forward` here, inside the block, so no wrapper module (and no
    `_checkpoint_wrapped_module` segment) ever appears in parameter names or state_dict keys.
    """

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        D, lora = cfg.model_channels, cfg.adaln_lora_dim if cfg.use_adaln_lora else 0
        self.self_attn = Attention(D, D, cfg.num_heads)
        self.cross_attn = Attention(D, cfg.crossattn_emb_channels, cfg.num_heads)
        self.mlp = FeedForward(D, int(D * cfg.mlp_ratio))
        self.adaln_modulation_self_attn = modulation(D, 3, lora)
        self.adaln_modulation_cross_attn = modulation(D, 3, lora)
        self.adaln_modulation_mlp = modulation(D, 3, lora)
        if cfg.camera_channels:  # robot/multiview-agibot: Pluecker rays of each token's pixels, into self-attention
            self.cam_encoder = nn.Linear(cfg.camera_channels, D, bias=False)
        self.fp32 = cfg.fp32_time_modulation
        self.checkpoint_fn = None

    def forward(self, x_B_T_S_D, emb_B_T_D, crossattn_emb_B_N_D, rope_cos_sin, adaln_lora_B_T_3D=None, extra_pos=None,
                camera_B_T_S_C=None):
        args = (x_B_T_S_D, emb_B_T_D, crossattn_emb_B_N_D, rope_cos_sin, adaln_lora_B_T_3D, extra_pos, camera_B_T_S_C)
        if self.checkpoint_fn is not None and torch.is_grad_enabled():
            return self.checkpoint_fn(self._forward, *args)
        return self._forward(*args)

    def _forward(self, x, emb, crossattn_emb, rope_cos_sin, adaln_lora, extra_pos, camera):
        B, T, S, D = x.shape
        if extra_pos is not None:
            x = x + extra_pos

        def modulate(mlp):
            m = run_modulation(mlp, emb, self.fp32)
            if adaln_lora is not None:
                m = m + adaln_lora
            return [c.unsqueeze(2).to(x.dtype) for c in m.chunk(3, dim=-1)]  # shift, scale, gate: [B, T|1, 1, D]

        shift, scale, gate = modulate(self.adaln_modulation_self_attn)
        h = layer_norm(x) * (1 + scale) + shift
        if camera is not None:  # added to the self-attention input only (upstream: q, k and v all see it)
            h = h + self.cam_encoder(camera)
        h = h.view(B, T * S, D)
        x = x + gate * self.self_attn(h, h, rope_cos_sin).view(B, T, S, D)
        shift, scale, gate = modulate(self.adaln_modulation_cross_attn)
        h = (layer_norm(x) * (1 + scale) + shift).view(B, T * S, D)
        x = x + gate * self.cross_attn(h, crossattn_emb).view(B, T, S, D)
        shift, scale, gate = modulate(self.adaln_modulation_mlp)
        return x + gate * self.mlp(layer_norm(x) * (1 + scale) + shift)


class ActionEmbedder(nn.Module):
    """Upstream's action Mlp: Linear(A -> hidden) -> tanh-approximated GELU -> Linear(hidden -> out), with biases
    (hidden: 4D, or Predict2.5's hidden_dim_in_action_embedder, DiTConfig.action_hidden_dim)."""

    def __init__(self, action_dim, hidden, out):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(action_dim, hidden), nn.Linear(hidden, out)

    def forward(self, action_B_1_A):
        return self.fc2(F.gelu(self.fc1(action_B_1_A), approximate="tanh"))


class FinalLayer(nn.Module):
    def __init__(self, cfg: DiTConfig):
        super().__init__()
        D = cfg.model_channels
        out = cfg.patch_spatial ** 2 * cfg.patch_temporal * cfg.out_channels
        self.linear = nn.Linear(D, out, bias=False)
        self.adaln_modulation = modulation(D, 2, cfg.adaln_lora_dim if cfg.use_adaln_lora else 0)
        self.fp32 = cfg.fp32_time_modulation

    def forward(self, x_B_T_S_D, emb_B_T_D, adaln_lora_B_T_3D=None):
        m = run_modulation(self.adaln_modulation, emb_B_T_D, self.fp32)
        if adaln_lora_B_T_3D is not None:
            m = m + adaln_lora_B_T_3D[..., : m.shape[-1]]
        shift, scale = (c.unsqueeze(2) for c in m.chunk(2, dim=-1))
        if self.fp32:  # the whole layer in fp32, output included (as upstream)
            return linear_fp32(self.linear, layer_norm(x_B_T_S_D.float()) * (1 + scale) + shift)
        return self.linear(layer_norm(x_B_T_S_D) * (1 + scale) + shift)


# -----------------------------------------------------------------------------
# The network


def adapter_seed(generator=None):
    """The LoRA adapters' base seed (lora.add_lora, DiT.init_weights), one draw from `generator` (default: torch's
    global CPU generator); adapter i gets seed + i, so the values follow the seed alone."""
    return int(torch.randint(2 ** 62, (), generator=generator, device=generator.device if generator else "cpu"))


class DiT(nn.Module):
    """forward(x [B,16,T,H,W], timesteps [B] or [B,T'], crossattn_emb [B,N,Dc]) -> velocity [B,16,T,H,W]."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.cfg = cfg
        D = cfg.model_channels
        if D % cfg.num_heads:
            raise ValueError(f"model_channels {D} not divisible by num_heads {cfg.num_heads}")
        in_ch = cfg.in_channels + int(cfg.video2world) + int(cfg.concat_padding_mask)
        self.x_embedder = PatchEmbed(in_ch, D, cfg.patch_temporal, cfg.patch_spatial)
        self.pos_embedder = RopePositions(cfg)
        if cfg.extra_per_block_abs_pos_emb:
            self.extra_pos_embedder = LearnablePosEmb(cfg)
        self.t_embedder = nn.Sequential(Timesteps(D), TimestepEmbedding(D, cfg.use_adaln_lora, cfg.fp32_time_modulation))
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.num_blocks)])
        self.final_layer = FinalLayer(cfg)
        if cfg.crossattn_proj_in_channels != cfg.crossattn_emb_channels:
            self.crossattn_proj = nn.Sequential(
                nn.Linear(cfg.crossattn_proj_in_channels, cfg.crossattn_emb_channels, bias=True), nn.GELU())
        self.t_embedding_norm = nn.RMSNorm(D, eps=1e-6)
        if cfg.action_after_norm and not cfg.action_dim:
            raise ValueError("action_after_norm without action_dim: there is no action embedding to add")
        if cfg.action_dim:  # ActionConditionedMinimalV1LVGDiT (per clip) or ActionChunk... (per latent frame,
            # action_per_frame): upstream registers them last, so they come last here
            if not cfg.use_adaln_lora:
                raise ValueError(f"action_dim={cfg.action_dim} needs use_adaln_lora (upstream adds to its input)")
            hidden = cfg.action_hidden_dim or 4 * D
            self.action_embedder_B_D = ActionEmbedder(cfg.action_dim, hidden, D)
            self.action_embedder_B_3D = ActionEmbedder(cfg.action_dim, hidden, 3 * D)
        self.cp_group = None  # --cp: cp.enable(net, group) splits each sample's latent frames over the group
        if not self.t_embedding_norm.weight.is_meta:
            self.init_weights()

    @torch.no_grad()
    def init_weights(self, generator=None):
        """Random init (for `--init random` and after `to_empty`); loaded checkpoints overwrite all of it."""
        # drawn first: the draws below consume the generator by each rank's shard size
        adapters = adapter_seed(generator)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=module.in_features ** -0.5, generator=generator)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.RMSNorm):
                nn.init.ones_(module.weight)
        # start small: adaLN up-projections (residual branches nearly closed, yet all get gradient) and the action
        # MLPs' outputs (at full size a random action drowns the time sinusoid it is added to: docs/actions.md)
        small = [c[-1] for m in [*self.blocks, self.final_layer] for n, c in m.named_children() if "adaln_mod" in n]
        for layer in small + [m.fc2 for m in self.modules() if isinstance(m, ActionEmbedder)]:
            nn.init.normal_(layer.weight, std=0.02, generator=generator)
        if self.cfg.extra_per_block_abs_pos_emb:
            for p in self.extra_pos_embedder.parameters():
                nn.init.normal_(p, std=0.02, generator=generator)
        self.pos_embedder.reset_buffers()
        # LoRA adapters (nets/lora.py), if any were added before materialising: adapter i from seed + i, as add_lora draws
        for i, module in enumerate(m for m in self.modules() if hasattr(m, "reset_lora")):
            module.reset_lora(adapters + i)

    def forward(self, x_B_C_T_H_W, t_B_T, cond: Condition):
        """The velocity [B, C, T, H, W] at net time t_B_T ([B], [B,1] or [B,T'] in (0, 1)) given the record `cond`
        (its crossattn_emb, condition_mask, padding_mask, fps, camera; the denoiser's fields are not read here)."""
        cfg = self.cfg
        dtype = self.x_embedder.proj[1].weight.dtype
        B, _, T, H, W = x_B_C_T_H_W.shape
        x = x_B_C_T_H_W.to(dtype)
        if cfg.video2world:  # no mask = no conditioning frames (image batches, unconditional generation)
            mask = cond.condition_mask
            x = torch.cat([x, torch.zeros_like(x[:, :1]) if mask is None else mask.to(dtype)], dim=1)
        if cfg.concat_padding_mask:
            pad = cond.padding_mask
            if pad is None:  # the pipelines and datasets always pass zeros
                pad = torch.zeros(B, 1, H, W, dtype=dtype, device=x.device)
            elif pad.shape[-2:] != (H, W):  # legacy nearest: src = floor(dst * in / out)
                pad = F.interpolate(pad.float(), size=(H, W), mode="nearest")
            x = torch.cat([x, pad.to(dtype)[:, :, None].expand(B, 1, T, H, W)], dim=1)
        Tp, Hp, Wp = T // cfg.patch_temporal, H // cfg.patch_spatial, W // cfg.patch_spatial
        group = self.cp_group  # --cp: this rank computes its 1/N of the latent frames (base/cp.py)
        if group is not None:
            n = dist.get_world_size(group)
            if Tp % n or T % cfg.patch_temporal:
                raise ValueError(f"--cp {n}: {T} latent frames do not split evenly over {n} ranks; use a --cp that "
                                 f"divides the latent frames (1 + (frames - 1) / 4, times the views)")
            cp.check_replicated([x_B_C_T_H_W, t_B_T, cond.crossattn_emb, cond.condition_mask, cond.camera,
                                 cond.action], group, "inputs (latent, time, text, mask, camera, action)")
            x = cp.local_frames(x, group, 2)
        x = self.x_embedder(x)  # [B, T', H', W', D] (T'/N frames under --cp)
        Tl, D = x.shape[1], x.shape[-1]
        x = x.view(B, Tl, Hp * Wp, D)

        angles = self.pos_embedder.angles(Tp, Hp, Wp, cond.fps, x.device)[:, None, :]  # fp32 [L, 1, d]
        extra_pos = self.extra_pos_embedder(Tp, Hp, Wp) if cfg.extra_per_block_abs_pos_emb else None
        camera = self._camera(cond.camera, (B, Tp, Hp, Wp), dtype)
        if t_B_T.ndim == 1:
            t_B_T = t_B_T[:, None]
        if t_B_T.shape[1] not in (1, Tp):
            raise ValueError(f"timesteps {tuple(t_B_T.shape)}: need [B], [B,1] or [B,{Tp}] (patched frames)")
        if group is not None:  # every per-frame input: this rank's frames only
            angles = cp.local_frames(angles.view(Tp, Hp * Wp, 1, -1), group, 0).flatten(0, 1)
            extra_pos = None if extra_pos is None else cp.local_frames(extra_pos, group, 1)
            camera = None if camera is None else cp.local_frames(camera, group, 1)
            t_B_T = t_B_T if t_B_T.shape[1] == 1 else cp.local_frames(t_B_T, group, 1)
        rope_cos_sin = (torch.cos(angles), torch.sin(angles))
        fp32 = cfg.fp32_time_modulation  # then the time embedding stays fp32 down to the modulations
        sinusoid = self.t_embedder[0](t_B_T)
        sinusoid = sinusoid if fp32 else sinusoid.to(dtype)
        t_mlp = self.t_embedder[1](sinusoid)
        # with adaLN-LoRA the raw sinusoid drives the per-block modulations and the MLP output is the shared bias
        emb, adaln_lora = (sinusoid, t_mlp) if cfg.use_adaln_lora else (t_mlp, None)
        action = self._action(cond.action, B, T, dtype)  # [B, 1, A] per clip, or [B, Tp - 1, A] per latent frame
        if action is not None:
            action_emb, action_adaln = self.action_embedder_B_D(action), self.action_embedder_B_3D(action)
            if cfg.action_per_frame:  # frame 0's zero, the conditioning frames' masked; this rank's frames
                action_emb, action_adaln = (self._per_frame(e, cond.condition_mask, group)
                                            for e in (action_emb, action_adaln))
            emb, adaln_lora = emb if cfg.action_after_norm else emb + action_emb, adaln_lora + action_adaln
        if fp32:  # the functional form: the module's weight may be bf16
            norm = self.t_embedding_norm
            emb = F.rms_norm(emb.float(), norm.normalized_shape, norm.weight.float(), norm.eps)
        else:
            emb = self.t_embedding_norm(emb)
        if action is not None and cfg.action_after_norm:  # DiTConfig.action_after_norm: past the norm, not before it
            emb = emb + action_emb.to(emb.dtype)

        crossattn_emb = cond.crossattn_emb.to(dtype)
        if hasattr(self, "crossattn_proj"):
            crossattn_emb = self.crossattn_proj(crossattn_emb)
        for block in self.blocks:
            x = block(x, emb, crossattn_emb, rope_cos_sin, adaln_lora, extra_pos, camera)
        x = self.final_layer(x, emb, adaln_lora)  # [B, T', H'*W', p*p*pt*C]
        if group is not None:  # every cp rank gets the whole output: the loss code is the same as without CP
            x = cp.gather_frames(x, group, 1)

        p, pt, C = cfg.patch_spatial, cfg.patch_temporal, cfg.out_channels
        x = x.view(B, Tp, Hp, Wp, p, p, pt, C).permute(0, 7, 1, 6, 2, 4, 3, 5)  # unpatchify: channel innermost
        return x.reshape(B, C, Tp * pt, Hp * p, Wp * p)

    def _camera(self, camera, grid_B_T_H_W, dtype):
        """The camera map as [B, T', H'*W', C] tokens, or None; required iff the config has camera_channels."""
        C = self.cfg.camera_channels
        if camera is None and C:
            raise ValueError(f"this config has camera_channels={C} (robot/multiview-agibot): pass Condition.camera"
                             " [B, T', H', W', C] per latent frame (camera.plucker_map, or camera.fallback_cameras)")
        if camera is None:
            return None
        if not C:
            raise ValueError("Condition.camera given, but this config has camera_channels=0 (no cam_encoder): use a"
                             " camera config such as p25-2b-agibot, or drop the camera")
        if tuple(camera.shape) != (*grid_B_T_H_W, C):
            raise ValueError(f"Condition.camera {tuple(camera.shape)}: expected {(*grid_B_T_H_W, C)} (one map per"
                             " latent frame, one 16x16-pixel patch per token)")
        B, T, H, W = grid_B_T_H_W
        return camera.to(dtype).reshape(B, T, H * W, C)

    def _action(self, action, B, T, dtype):
        """The MLPs' input: the action chunk [B, transitions, dims] checked (action_layout), flattened per clip
        [B, 1, action_dim], or (action_per_frame) per latent frame after the first [B, T - 1, action_dim], or None;
        required iff the config has action_dim."""
        A, per_frame = self.cfg.action_dim, self.cfg.action_per_frame
        if (action is None) != (not A):
            raise ValueError(f"this config has action_dim={A}: pass Condition.action [B, transitions, dims]" if A else
                             "Condition.action given, but this config has action_dim=0: use an action config such as"
                             " v2w-2b-action or tiny-action, or drop the action")
        if action is None:
            return None
        check_action(action, action_layout(self.cfg, B, T), "Condition.action", f"; the network's action_dim is {A}" +
                     (" (4 transitions x dims a latent frame)" if per_frame else " (transitions x dims)"))
        return action.reshape(B, T - 1 if per_frame else 1, A).to(dtype)

    @staticmethod
    def _per_frame(action_emb_B_T_C, mask_B_1_T_H_W, group):
        """A per-latent-frame action embedding [B, T - 1, C] as upstream adds it: a zero row for latent frame 0, the
        conditioning frames' rows zeroed (the mask's first pixel of each frame), then this rank's frames (--cp)."""
        emb = torch.cat([torch.zeros_like(action_emb_B_T_C[:, :1]), action_emb_B_T_C], dim=1)
        if mask_B_1_T_H_W is not None:
            emb = emb * (1 - mask_B_1_T_H_W[:, 0, :, 0, 0]).unsqueeze(-1).to(emb.dtype)
        return emb if group is None else cp.local_frames(emb, group, 1)


def build_model(cfg: DiTConfig, device=None, dtype=None):
    with torch.device(device or "cpu"):
        model = DiT(cfg)
    return model.to(dtype) if dtype is not None else model


def num_params(model, trainable_only=False):
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
