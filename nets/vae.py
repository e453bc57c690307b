"""The Wan2.1 video VAE, Cosmos-Predict2's video tokenizer, in plain PyTorch.

A causal 3-D convolutional autoencoder: time x4 (causal: T = 4k+1 frames -> k+1 latents), space x8, 3 -> 16 channels,
then a fixed per-channel normalisation. 93 frames at 432x768 become a [16, 24, 54, 96] latent.

Parameter names are exactly those of upstream `VAE_`, so the released `tokenizer.pth` (== `Wan2.1_VAE.pth`, a plain
state_dict of 194 tensors) loads strictly with no key mapping. Shapes and conventions: docs/predict2.md. Checked
against tensors produced by the upstream code (tests/ref_vae.py). Layout names: B batch, C channels,
T/H/W frames/rows/cols.

Video is processed in time chunks: the first frame alone, then `temporal_window` frames at a time. Every causal
convolution keeps the last frames it saw in a cache (a dict shared by one encode/decode call), so chunked execution
computes the same function as one pass over the whole clip while holding only one chunk of activations.
Activations are kept channels-last (NDHWC), the layout cuDNN's tensor-core convolutions want.

Contents, top to bottom: config -> building blocks -> encoder / decoder -> WanVAE (encode / decode) -> LinearCodec.
Built (and loaded) by engine/build.py's build_vae; timed by benchmarks/vae_bench.py.
"""
import math
from dataclasses import dataclass, fields, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

# -----------------------------------------------------------------------------
# Config

# Per-channel statistics of the Wan2.1 latent (upstream VAE.__init__ literals): latent = (mu - mean) / std.
LATENT_MEAN = [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
               0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921]
LATENT_STD = [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
              3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160]


def latent_frames(frames):
    """Latent frames of a `frames`-frame video: the first frame alone, then one per 4 (the tokenizers' time factor)."""
    return 1 + (frames - 1) // 4


def check_window(window, time_factor=4):
    # every chunk must hold whole groups of `time_factor` frames, or the stride-2 time convolutions lose their phase
    if not isinstance(window, int) or window <= 0 or window % time_factor:
        raise ValueError(f"temporal_window={window!r}: must be a positive multiple of {time_factor}")


@dataclass(frozen=True)
class VAEConfig:
    dim: int = 96  # base width; stage widths are dim * dim_mult
    z_dim: int = 16  # latent channels (the encoder head emits 2 * z_dim: mean and log-variance)
    dim_mult: tuple = (1, 2, 4, 4)
    num_res_blocks: int = 2  # per encoder stage; the decoder uses one more
    temporal_downsample: tuple = (False, True, True)  # per encoder stage; the decoder upsamples in reverse
    temporal_window: int = 16  # frames per encoder call after the first frame (Cosmos uses 16, Wan upstream 4)

    def __post_init__(self):
        if self.z_dim != len(LATENT_MEAN):
            raise ValueError(f"z_dim={self.z_dim}: the Wan2.1 latent normalisation has {len(LATENT_MEAN)} channels")
        if len(self.temporal_downsample) != len(self.dim_mult) - 1:
            raise ValueError(f"temporal_downsample {self.temporal_downsample} needs {len(self.dim_mult) - 1} entries "
                             f"(one per downsampling stage of dim_mult {self.dim_mult})")
        check_window(self.temporal_window, self.time_factor)

    @property
    def time_factor(self):  # 4 for the released model
        return 2 ** sum(self.temporal_downsample)

    @property
    def space_factor(self):  # 8 for the released model
        return 2 ** (len(self.dim_mult) - 1)


VAE_CONFIGS = {
    "real": VAEConfig(),  # the released tokenizer.pth: 126,892,531 parameters
    "tiny": VAEConfig(dim=8),  # CPU tests and the built-in tiny default (= reference case vae_image_and_video_t13)
}


def get_vae_config(name, **overrides):
    if name not in VAE_CONFIGS:
        raise ValueError(f"unknown VAE config {name!r}; valid: {sorted(VAE_CONFIGS)}")
    return replace(VAE_CONFIGS[name], **overrides)


def vae_config_from_upstream(kwargs):
    """Map upstream `VAE_(**kwargs)` constructor args (as in the reference jsons) to a VAEConfig; unknowns raise."""
    kwargs = dict(kwargs)
    if kwargs.pop("attn_scales", []):
        raise ValueError(f"attention inside the stages (attn_scales={kwargs.get('attn_scales')}) is not implemented: "
                         "the released checkpoint has none")
    if kwargs.pop("dropout", 0.0) != 0.0:
        raise ValueError("dropout != 0 is not implemented: the VAE is a frozen tokenizer")
    kwargs["temporal_downsample"] = kwargs.pop("temperal_downsample", VAEConfig.temporal_downsample)  # upstream spelling
    unknown = set(kwargs) - {f.name for f in fields(VAEConfig)}
    if unknown:
        raise ValueError(f"upstream VAE_ kwargs not understood by VAEConfig: {sorted(unknown)}")
    for key in ("dim_mult", "temporal_downsample"):
        kwargs[key] = tuple(kwargs[key])
    return VAEConfig(**kwargs)


# -----------------------------------------------------------------------------
# Building blocks. Every block takes (x [B, C, T, H, W], cache); the cache is a dict keyed by module.


def to_frames(x):
    """[B, C, T, H, W] -> [B*T, C, H, W] channels-last (a free view when x is channels_last_3d)."""
    B, C, T, H, W = x.shape
    return x.permute(0, 2, 3, 4, 1).reshape(B * T, H, W, C).permute(0, 3, 1, 2)


def from_frames(x, B):
    """[B*T, C, H, W] -> [B, C, T, H, W] channels_last_3d (a free view when x is channels-last)."""
    N, C, H, W = x.shape
    return x.permute(0, 2, 3, 1).reshape(B, N // B, H, W, C).permute(0, 4, 1, 2, 3)


class CausalConv3d(nn.Conv3d):
    """Conv3d padded 'same' in space and only on the past side in time (kernel_t - 1 frames of left context).

    The left context is the previous chunk's last input frames, taken from the cache, or zeros at the start of
    the clip, so running a clip chunk by chunk equals one causal convolution over the whole clip.
    forward(x, cache, norm) = conv(pad(x, cache, norm)); the two halves are public so that a caller can drop
    its reference to x between them (ResidualBlock does: it saves one chunk-sized tensor at the peak).
    """

    def __init__(self, in_dim, out_dim, kernel_size):
        kt, kh, kw = (kernel_size,) * 3 if isinstance(kernel_size, int) else kernel_size
        super().__init__(in_dim, out_dim, (kt, kh, kw), padding=(0, kh // 2, kw // 2))
        self.context = kt - 1

    def pad(self, x, cache, norm=None):
        """[B, C, T, H, W] -> [B, C, k+T, H, W]: the k cached past frames, then x (or silu(norm(x)), written
        straight into the buffer: no chunk-sized norm temporaries or torch.cat copy). Updates the cache."""
        B, C, T, H, W = x.shape
        k = self.context
        buf = torch.empty(B, C, k + T, H, W, dtype=x.dtype, device=x.device, memory_format=torch.channels_last_3d)
        past = cache.get(self)
        if past is None:
            buf[:, :, :k].zero_()
        else:
            buf[:, :, :k] = past
        if norm is None:
            buf[:, :, k:] = x
        else:
            F.silu(norm(x, out=buf[:, :, k:]), inplace=True)
        cache[self] = buf[:, :, -k:].clone()  # clone: don't keep the whole chunk alive
        return buf

    def conv(self, padded):
        return super().forward(padded)

    def forward(self, x, cache, norm=None):
        return self.conv(self.pad(x, cache, norm))


class RMSNorm(nn.Module):
    """x / ||x||_channels * sqrt(C) * gamma: an L2 norm over channels, no mean subtraction, no bias."""

    def __init__(self, dim, gamma_dims=3):
        super().__init__()
        # upstream stores gamma as (C,1,1,1) for video tensors and (C,1,1) inside attention (applied to frames)
        self.gamma = nn.Parameter(torch.ones(dim, *[1] * gamma_dims))
        self.scale = dim ** 0.5

    def forward(self, x, out=None):
        # F.normalize's formula, written out so that the result can go into `out`
        norm = x.norm(2, dim=1, keepdim=True).clamp_min_(1e-12)
        return torch.div(x, norm, out=out).mul_(self.gamma.view(-1, 1, 1, 1) * self.scale)


class ResidualBlock(nn.Module):
    """x + conv(silu(norm(conv(silu(norm(x)))))); a 1x1x1 conv shortcut when the width changes."""

    def __init__(self, in_dim, out_dim):
        super().__init__()
        # a Sequential only for upstream's key names: residual.{0,2,3,6}; SiLU and Dropout(0) hold indices 1, 4, 5
        self.residual = nn.Sequential(
            RMSNorm(in_dim), nn.SiLU(), CausalConv3d(in_dim, out_dim, 3),
            RMSNorm(out_dim), nn.SiLU(), nn.Dropout(0.0), CausalConv3d(out_dim, out_dim, 3))
        self.shortcut = nn.Conv3d(in_dim, out_dim, 1) if in_dim != out_dim else nn.Identity()

    def forward(self, x, cache):
        norm1, _, conv1, norm2, _, _, conv2 = self.residual
        h = conv1(x, cache, norm1)
        h = conv2.pad(h, cache, norm2)  # rebinding h frees conv1's output before conv2 allocates its own
        return conv2.conv(h).add_(self.shortcut(x))


class AttentionBlock(nn.Module):
    """Single-head self-attention over the H*W positions of each frame (spatial only, so no cache)."""

    def __init__(self, dim):
        super().__init__()
        self.norm = RMSNorm(dim, gamma_dims=2)
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1)  # 1x1 convs (upstream's key shapes), applied as linear layers
        self.proj = nn.Conv2d(dim, dim, 1)

    def forward(self, x, cache):
        B, C, T, H, W = x.shape
        tokens = self.norm(x).permute(0, 2, 3, 4, 1).reshape(B * T, H * W, C)
        qkv = F.linear(tokens, self.to_qkv.weight.flatten(1), self.to_qkv.bias)
        q, k, v = qkv.unsqueeze(1).chunk(3, dim=-1)  # [B*T, 1 head, H*W, C] each
        out = F.scaled_dot_product_attention(q, k, v).squeeze(1)
        out = F.linear(out, self.proj.weight.flatten(1), self.proj.bias)
        return out.reshape(B, T, H, W, C).permute(0, 4, 1, 2, 3).add_(x)


class Resample(nn.Module):
    """x2 down/upsampling of each frame in space; the *3d modes also halve/double time.

    Time runs after space when downsampling and before it when upsampling (upstream's order).
    """

    def __init__(self, dim, mode):
        super().__init__()
        self.mode = mode
        if mode.startswith("downsample"):
            # pad right/bottom only, then a stride-2 3x3 conv: output pixel i sees input pixels 2i..2i+2
            self.resample = nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)), nn.Conv2d(dim, dim, 3, stride=2))
        elif mode.startswith("upsample"):
            # nearest x2 is an exact copy, so it runs in the model dtype (upstream detours through fp32)
            self.resample = nn.Sequential(nn.Upsample(scale_factor=2.0, mode="nearest-exact"),
                                          nn.Conv2d(dim, dim // 2, 3, padding=1))
        else:
            raise ValueError(f"unknown Resample mode {mode!r}")
        if mode == "downsample3d":
            # frame 0 passes through; later frames j = conv(frames 2j-2, 2j-1, 2j): stride 2, no padding
            self.time_conv = nn.Conv3d(dim, dim, (3, 1, 1), stride=(2, 1, 1))
        elif mode == "upsample3d":
            # each latent frame after the first becomes two: the two channel halves of a causal time conv
            self.time_conv = CausalConv3d(dim, dim * 2, (3, 1, 1))

    def forward(self, x, cache):
        if self.mode == "upsample3d":
            if self in cache:
                two = self.time_conv(x, cache)
                x = torch.stack(two.chunk(2, dim=1), dim=3).flatten(2, 3)  # [B,C,T,2,H,W] -> [B,C,2T,H,W]
            else:
                # first decoder call = latent frame 0 -> one frame: skip the time conv. Its causal context for
                # latent frame 1 is therefore zeros, not frame 0 (upstream's "Rep" cache sentinel).
                cache[self] = True
        x = from_frames(self.resample(to_frames(x)), x.shape[0])
        if self.mode == "downsample3d":
            previous = cache.get(self)
            cache[self] = x[:, :, -1:].clone()  # the stride-2 windows overlap by one frame across chunks
            if previous is not None:  # first chunk = frame 0, which passes through
                x = self.time_conv(torch.cat([previous, x], dim=2))
        return x


# -----------------------------------------------------------------------------
# Encoder and decoder: one chunk per call, state in the cache


class Encoder3d(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        dims = [cfg.dim * m for m in (1, *cfg.dim_mult)]  # real: 96, 96, 192, 384, 384
        self.conv1 = CausalConv3d(3, dims[0], 3)
        blocks = []
        for i, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:])):
            for _ in range(cfg.num_res_blocks):
                blocks.append(ResidualBlock(in_dim, out_dim))
                in_dim = out_dim
            if i < len(cfg.temporal_downsample):
                blocks.append(Resample(out_dim, "downsample3d" if cfg.temporal_downsample[i] else "downsample2d"))
        self.downsamples = nn.ModuleList(blocks)
        C = dims[-1]
        self.middle = nn.ModuleList([ResidualBlock(C, C), AttentionBlock(C), ResidualBlock(C, C)])
        self.head = nn.ModuleList([RMSNorm(C), nn.SiLU(), CausalConv3d(C, 2 * cfg.z_dim, 3)])

    def forward(self, x, cache):
        x = self.conv1(x, cache)
        for block in [*self.downsamples, *self.middle]:
            x = block(x, cache)
        norm, _, conv = self.head
        return conv(x, cache, norm)


class Decoder3d(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        dims = [cfg.dim * m for m in (cfg.dim_mult[-1], *cfg.dim_mult[::-1])]  # real: 384, 384, 384, 192, 96
        temporal_upsample = cfg.temporal_downsample[::-1]
        self.conv1 = CausalConv3d(cfg.z_dim, dims[0], 3)
        self.middle = nn.ModuleList([ResidualBlock(dims[0], dims[0]), AttentionBlock(dims[0]),
                                     ResidualBlock(dims[0], dims[0])])
        blocks = []
        for i, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:])):
            if i > 0:
                in_dim //= 2  # the previous stage's upsampling conv halved the channels
            for _ in range(cfg.num_res_blocks + 1):
                blocks.append(ResidualBlock(in_dim, out_dim))
                in_dim = out_dim
            if i < len(temporal_upsample):
                blocks.append(Resample(out_dim, "upsample3d" if temporal_upsample[i] else "upsample2d"))
        self.upsamples = nn.ModuleList(blocks)
        self.head = nn.ModuleList([RMSNorm(dims[-1]), nn.SiLU(), CausalConv3d(dims[-1], 3, 3)])

    def forward(self, x, cache):
        x = self.conv1(x, cache)
        for block in [*self.middle, *self.upsamples]:
            x = block(x, cache)
        norm, _, conv = self.head
        return conv(x, cache, norm)


# -----------------------------------------------------------------------------
# The VAE


class WanVAE(nn.Module):
    """Upstream `VAE_` plus the latent normalisation of upstream `VAE`. Frozen: encode/decode run under no_grad.

    Computes in the dtype of its weights (cast the module, e.g. `.to(torch.bfloat16)` as Cosmos does) and returns
    results in the dtype of the input.
    """

    def __init__(self, cfg: VAEConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder3d(cfg)
        self.conv1 = nn.Conv3d(2 * cfg.z_dim, 2 * cfg.z_dim, 1)  # -> mean | log-variance
        self.conv2 = nn.Conv3d(cfg.z_dim, cfg.z_dim, 1)
        self.decoder = Decoder3d(cfg)

    def _latent_stats(self, dtype, device):
        # plain tensors, not buffers: buffers would either enter the state_dict (breaking strict loading of
        # tokenizer.pth) or stay on the meta device after a meta build + load_state_dict(assign=True)
        mean = torch.tensor(LATENT_MEAN, dtype=dtype, device=device).view(1, -1, 1, 1, 1)
        inv_std = 1.0 / torch.tensor(LATENT_STD, dtype=dtype, device=device).view(1, -1, 1, 1, 1)
        return mean, inv_std  # upstream's scale = [mean, 1/std], both in the model dtype

    @torch.no_grad()
    def encode(self, video, temporal_window=None):
        """video [B, 3, T, H, W] in [-1, 1], T = 4k+1, H and W multiples of 8 -> latent [B, 16, k+1, H/8, W/8].

        Deterministic: the normalised posterior mean. temporal_window (default cfg.temporal_window) only trades
        memory for speed; windows 4 and 16 agree to ~1e-6 in fp32.
        """
        window = self.cfg.temporal_window if temporal_window is None else temporal_window
        tf, sf = self.cfg.time_factor, self.cfg.space_factor
        check_window(window, tf)
        if video.dim() != 5 or video.shape[1] != 3:
            raise ValueError(f"expected video [B, 3, T, H, W], got shape {tuple(video.shape)}")
        if not video.is_floating_point():
            raise ValueError(f"expected a float video in [-1, 1], got dtype {video.dtype} (uint8: x / 127.5 - 1)")
        B, _, T, H, W = video.shape
        if T < 1 or (T - 1) % tf:
            raise ValueError(f"T={T} frames: the VAE needs T = {tf}k+1 (1, {tf + 1}, {2 * tf + 1}, ..., 93); "
                             f"nearest valid: {max(1, 1 + (T - 1) // tf * tf)} or {1 + -(-(T - 1) // tf) * tf}")
        if H % sf or W % sf:
            raise ValueError(f"H x W = {H} x {W}: both must be multiples of {sf} (the VAE downsamples space {sf}x)")
        dtype = self.conv1.weight.dtype
        cache = {}
        # frame 0 alone (it becomes latent 0 by itself), then `window` frames per call
        bounds = [(0, 1)] + [(s, min(s + window, T)) for s in range(1, T, window)]
        feats = [self.encoder(video[:, :, a:b].to(dtype=dtype, memory_format=torch.channels_last_3d), cache)
                 for a, b in bounds]
        mu, _log_var = self.conv1(torch.cat(feats, dim=2)).chunk(2, dim=1)  # log-var unused: no sampling
        mean, inv_std = self._latent_stats(dtype, mu.device)
        return ((mu - mean) * inv_std).to(video.dtype).contiguous()

    @torch.no_grad()
    def decode(self, latent):
        """latent [B, 16, t, h, w] (as returned by encode) -> video [B, 3, 4(t-1)+1, 8h, 8w], roughly in [-1, 1].

        One decoder call per latent frame; the output is not clamped.
        """
        z_dim, tf, sf = self.cfg.z_dim, self.cfg.time_factor, self.cfg.space_factor
        if latent.dim() != 5 or latent.shape[1] != z_dim:
            raise ValueError(f"expected latent [B, {z_dim}, t, h, w], got shape {tuple(latent.shape)}")
        if not latent.is_floating_point():
            raise ValueError(f"expected a float latent, got dtype {latent.dtype}")
        B, _, t, h, w = latent.shape
        dtype = self.conv1.weight.dtype
        mean, inv_std = self._latent_stats(dtype, latent.device)
        z = latent.to(dtype=dtype, memory_format=torch.channels_last_3d) / inv_std + mean
        x = self.conv2(z)
        video = torch.empty(B, 3, 1 + tf * (t - 1), h * sf, w * sf, dtype=latent.dtype, device=latent.device)
        cache = {}
        for i in range(t):  # latent 0 -> pixel frame 0; latent i >= 1 -> pixel frames tf(i-1)+1 .. tf*i
            start = 0 if i == 0 else 1 + tf * (i - 1)
            frames = self.decoder(x[:, :, i:i + 1], cache)
            video[:, :, start:start + frames.shape[2]] = frames
        return video


# -----------------------------------------------------------------------------
# The tiny default's tokenizer: a fixed linear codec with the VAE's interface


# (colour, time, y, x) frequencies of the 16 channels: cosine patterns over an 8x8 cell and its 4 frames. Luma
# (R+G+B) gets 9 spatial patterns and 1 temporal one, the two chroma axes (R-G, R+G-2B) 3 spatial patterns each.
CODEC_PATTERNS = tuple((0, 0, y, x) for y, x in ((0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (2, 0), (1, 2), (2, 1),
                                                  (2, 2))) + ((0, 1, 0, 0),) \
    + tuple((c, 0, y, x) for c in (1, 2) for y, x in ((0, 0), (0, 1), (1, 0)))
CODEC_COLOURS = ((1.0, 1.0, 1.0), (1.0, -1.0, 0.0), (1.0, 1.0, -2.0))  # orthogonal colour axes
CODEC_GAIN = 4.0  # latent = 4 x the pattern amplitude: the tiny grid videos then have latents of std ~0.8


class LinearCodec(nn.Module):
    """The tiny default's tokenizer (`build_vae("tiny")`): the Wan VAE's shapes (time x4, causal first frame, space
    x8, 16 channels), but each latent element is the amplitude of one fixed cosine pattern (CODEC_PATTERNS) over
    its 8x8 cell, on frame 0 alone or on 4 frames. The patterns are orthogonal, so decode(encode(video)) is the
    video's projection onto them (a blurred copy) and encode(decode(latent)) == latent: the decoded video shows
    exactly what the DiT generated, which a random VAE does not (RL with a pixel reward needs that), and it costs
    two matrix products instead of seconds of 3-D convolutions on a CPU. No weights, the same in every process.
    Not a model of real video: for pipelines, tests and RL on a laptop; the real tokenizer is WanVAE."""

    def __init__(self, time_factor=4, space_factor=8):
        super().__init__()
        self.time_factor, self.space_factor = time_factor, space_factor
        self.z_dim = len(CODEC_PATTERNS)
        # [16, 3, tf, s, s] for frames 1.. (frame 0: the tf = 0 slice, renormalised); a frozen parameter, so the
        # codec moves with .to() and reports its dtype like WanVAE (next(vae.parameters()).dtype)
        self.basis = nn.Parameter(torch.stack([self.pattern(p, time_factor) for p in CODEC_PATTERNS]),
                                  requires_grad=False)

    def pattern(self, freqs, frames):
        colour, ft, fy, fx = freqs
        cos = lambda k, n: torch.cos(math.pi * k * (torch.arange(n, dtype=torch.float64) + 0.5) / n)  # noqa: E731
        c = torch.tensor(CODEC_COLOURS[colour], dtype=torch.float64)
        s = self.space_factor
        return torch.einsum("c,t,y,x->ctyx", c, cos(ft, frames), cos(fy, s), cos(fx, s)).float()

    def cells(self, frames):
        """The basis for a group of `frames` frames (1: frame 0, whose temporal pattern is dropped: all zero)."""
        basis = self.basis if frames == self.time_factor else self.basis[:, :, :1]
        if frames == 1:
            basis = basis * (torch.tensor([p[1] == 0 for p in CODEC_PATTERNS], device=basis.device)[:, None, None,
                                                                                                   None, None])
        norm = basis.square().sum(dim=(1, 2, 3, 4)).clamp(min=1e-12)  # the amplitude of each pattern
        return basis, norm

    @torch.no_grad()
    def encode(self, video, temporal_window=None):
        """video [B, 3, T, H, W] in [-1, 1], T = 4k+1, H, W multiples of 8 -> latent [B, 16, k+1, H/8, W/8]."""
        tf, s = self.time_factor, self.space_factor
        if video.dim() != 5 or video.shape[1] != 3 or not video.is_floating_point():
            raise ValueError(f"expected a float video [B, 3, T, H, W] in [-1, 1], got {tuple(video.shape)} "
                             f"{video.dtype}")
        B, _, T, H, W = video.shape
        if (T - 1) % tf or H % s or W % s:
            raise ValueError(f"video {T}x{H}x{W}: the codec needs T = {tf}k+1 frames and H, W multiples of {s}")
        x = video.to(self.basis.dtype)
        groups = [x[:, :, :1]] + ([x[:, :, 1:]] if T > 1 else [])
        out = []
        for g in groups:
            n = g.shape[2] // (1 if g.shape[2] == 1 else tf)
            frames = 1 if g.shape[2] == 1 else tf
            cells = g.reshape(B, 3, n, frames, H // s, s, W // s, s)
            basis, norm = self.cells(frames)
            out.append(torch.einsum("bcnthywx,zctyx->bznhw", cells, basis) / norm.view(1, -1, 1, 1, 1))
        return (torch.cat(out, dim=2) * CODEC_GAIN).to(video.dtype).contiguous()

    @torch.no_grad()
    def decode(self, latent):
        """latent [B, 16, t, h, w] -> video [B, 3, 4(t-1)+1, 8h, 8w]: the sum of the patterns (not clamped)."""
        tf, s = self.time_factor, self.space_factor
        if latent.dim() != 5 or latent.shape[1] != self.z_dim or not latent.is_floating_point():
            raise ValueError(f"expected a float latent [B, {self.z_dim}, t, h, w], got {tuple(latent.shape)}")
        B, _, t, h, w = latent.shape
        z = latent.to(self.basis.dtype) / CODEC_GAIN
        frames = []
        for part, n in ((z[:, :, :1], 1), (z[:, :, 1:], tf)):
            if part.shape[2]:
                basis, _ = self.cells(n)
                cells = torch.einsum("bzkhw,zctyx->bckthywx", part, basis)
                frames.append(cells.reshape(B, 3, part.shape[2] * n, h * s, w * s))
        return torch.cat(frames, dim=2).to(latent.dtype)


# Names of the dtypes a VAE runs in (cache.py, benchmarks/vae_bench.py)
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
