"""Weight-free rewards for 2x2 robot-grid videos, for GRPO (docs/grpo.md), and the --reward plug-in mechanism.

Grid layout: top-left exterior camera 1, top-right exterior camera 2, bottom-left wrist camera, bottom-right black.
Input: decoded videos [B, 3, F, H, W] in [-1, 1] (what vae.decode returns), F >= 3, H x W >= 64 x 64. Internally
I = clamp((V+1)/2, 0, 1) and luma Y = 0.299 R + 0.587 G + 0.114 B; each view is cropped by a 4 px margin (the VAE
bleeds across the seams) and the wrist view to its top 2/3 (the gripper at the bottom never moves in it).

The default reward is a weighted geometric mean of six components r_k = exp(-x_k) in (0, 1], 0 <= x_k <= 50:

    reward = prod_k r_k ** (w_k / sum w) = exp(-sum_k w_k x_k / sum w)      w: static 1, smooth 1, black 0.5,
                                                                               flicker 0.5, activity 1, motion 1
quality (temperatures tau: set to the median statistic of the initial policy's rollouts by `calibrated`):
- static   (TL, TR): the exterior cameras are fixed. x = J/tau_J + D/tau_D + lambda_v (1 - V): mean jitter J
           (px/frame), worst drift D from frame 0 (px), V the fraction of tiles with texture and a clear peak.
- smooth   (BL): the wrist camera moves, smoothly. x = A/tau_A + lambda_v (1 - V_wrist): mean |acceleration| A of
           its global shift (px/frame^2), V_wrist its textured fraction (a flat wrist view cannot score).
- black    (BR): x = max(0, mean intensity - b0) / tau_B, b0 the VAE's black level.
- flicker  (TL, TR, BL): x = mean |second difference| of the per-frame mean luma / tau_F.
robot activity (bounded ratios min(1, statistic / ref): every honest clip saturates them, so more motion gains
nothing; none at all gives exp(-50), a factor exp(-50 * 1/5) ~ 5e-5 on the reward):
- activity (TL, TR): the arm acting. Mean over the two views of min(1, coherent_motion / activity_ref), where
           coherent_motion is 0 for a frozen view, sensor grain, noise, brightness ramps, flicker, camera shake, a
           jump between two held frames and alternating frames (see the function).
- motion   (BL): min(1, S / motion_ref), S the wrist camera's speed over 4-frame windows, % of the quadrant height
           per frame, from the phase correlation (grain does not translate, and its shift noise does not add up).

Why (an outside trial found the old reward, an arithmetic mean of static, smooth, black and flicker times a
guard on the wrist's |frame difference|, won by a frozen robot with a flat, grainy wrist view at 0.9997):
- a frozen clip maximises static, smooth and flicker at once, and nothing rewarded the robot doing something;
- grain passed the |frame difference| guard and counted as texture. Texture and change are now measured on
  average-pooled tiles (grain of std s drops to s / pool, texture survives), motion only where it persists;
- an arithmetic mean keeps 1 - w_k / sum w when a component fails completely (0.83 with a white bottom-right
  quadrant), so a broken clip that excels elsewhere could beat an honest one. In the geometric mean every
  component is necessary: the white quadrant alone costs a factor exp(-50 * 0.5 / 5) ~ 7e-3.
Measured (tests/test_reward.py, 9 plausible robot clips against 28 degenerate ones): every plausible clip wins by
>= 0.085 at 9x64x64, 0.13 at 9x64x112, 0.14 at 33x216x384, 0.19 at 93x432x768 (30 ms for 8 clips, H200).

Global shifts: tiled phase correlation (a global one locks onto the arm), a Gaussian low-pass on the cross-power
(grain), one refinement step, the median over the stiller half of the tiles (those the arm crosses are pulled).

Batched torch under no_grad; a clip's values do not depend on its batch. grid_rewards returns the raw statistics
too (logging, `calibrated`); `extra={"name": (fn, weight)}` adds a component fn(video) -> [B] in (0, 1].

Plug-ins (train.py --reward SPEC): `parse_rewards("default,mymod:fn=0.5")` imports and checks the terms at
start-up; a term's function names the inputs it needs (INPUTS: the sample as video or latent, and where a true clip
exists, the truth and its actions: world-model rewards, clips/fidelity.py); `needs_pixels(terms)` says whether to
decode; `score(terms, video=, latent=, ...)` returns the weighted sum, every term and every component.

Contents, top to bottom: config; pixels -> views; tiled phase correlation; coherent motion; the components;
grid_rewards and calibrated; plug-ins (RewardTerm, parse_rewards, needs_pixels, score).
"""
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from base.cli import load_function

# -----------------------------------------------------------------------------
# Config


@dataclass(frozen=True)
class RewardConfig:
    margin: int = 4  # px cut from every quadrant edge: the VAE bleeds across the seams
    tile_grid: tuple = (4, 6)  # tile = (quadrant_h // 4, quadrant_w // 6): 54 x 64 px at 432 x 768
    wrist_top: float = 2 / 3  # fraction of the wrist view used (the static gripper at the bottom pins shifts at 0)
    min_tile_std: float = 0.02  # a tile needs this much luma std, after average pooling, in both frames
    min_peak: float = 0.3  # ... and a phase-correlation peak at least this high (1 = a perfect match)
    shift_lowpass: float = 0.125  # cycles/px: Gaussian weight on the cross-power spectrum (peak std 1.3 px)
    min_tile: int = 12  # px: smaller tiles (tiny test videos) are enlarged to this
    tau_jitter: float = 1.0  # px per frame
    tau_drift: float = 4.0  # px
    texture_weight: float = 2.0  # lambda_v: penalty per unit of untextured (unmeasurable) view
    tau_accel: float = 1.0  # px per frame^2
    black_level: float = 0.0  # b0: mean of a VAE round trip of an all-black quadrant (measure once per VAE)
    tau_black: float = 0.02  # ~5/255
    tau_flicker: float = 0.01
    activity_rows: int = 24  # exteriors are average-pooled to ~this many rows of cells before measuring activity
    min_growth: float = 1.5  # coherent motion: two frames must change the view >= 1.5x more than one frame
    activity_ref: float = 0.005  # coherent luma change per frame (cells) that saturates r_activity; calibrate
    motion_ref: float = 0.1  # wrist speed (% of the quadrant height per frame) that saturates r_motion; calibrate
    w_static: float = 1.0
    w_smooth: float = 1.0
    w_black: float = 0.5
    w_flicker: float = 0.5
    w_activity: float = 1.0
    w_motion: float = 1.0


MAX_EXPONENT = 50.0  # exp(-50) ~ 2e-22: every reward stays strictly positive (and finite in fp32)
COMPONENTS = ("static", "smooth", "black", "flicker", "activity", "motion")


def sample_mean(x):
    """Mean over all but the batch dim, in float64: the value must not depend on what else is in the batch."""
    return x.reshape(x.shape[0], -1).double().mean(dim=1).float()


def bounded(x):
    """exp(-min(50, x)) for x >= 0: a reward in (0, 1]."""
    return torch.exp(-x.clamp(min=0, max=MAX_EXPONENT))


def ratio(stat, ref):
    """min(1, stat / ref), kept >= exp(-50): a reward in (0, 1] that saturates, so it cannot be over-won."""
    return (stat / ref).clamp(min=math.exp(-MAX_EXPONENT), max=1.0)


# -----------------------------------------------------------------------------
# Pixels -> views


def to_intensity(video_B_3_F_H_W):
    """[-1, 1] video -> clamped [0, 1] intensity, fp32."""
    if video_B_3_F_H_W.dim() != 5 or video_B_3_F_H_W.shape[1] != 3:
        raise ValueError(f"expected video [B, 3, F, H, W] in [-1, 1], got {tuple(video_B_3_F_H_W.shape)}")
    return ((video_B_3_F_H_W.float() + 1) / 2).clamp(0, 1)


def luma(intensity_B_3_F_H_W):
    r, g, b = intensity_B_3_F_H_W.unbind(1)
    return 0.299 * r + 0.587 * g + 0.114 * b  # [B, F, H, W]


def quadrant_boxes(H, W, cfg: RewardConfig):
    """Interior crop boxes (top, bottom, left, right) of the four views, plus the tile size."""
    if H % 2 or W % 2:
        raise ValueError(f"grid video {H}x{W}: height and width must be even (2x2 quadrants)")
    h, w, m = H // 2, W // 2, cfg.margin
    tile = (max(h // cfg.tile_grid[0], cfg.min_tile), max(w // cfg.tile_grid[1], cfg.min_tile))
    if h - 2 * m < tile[0] or w - 2 * m < tile[1]:
        raise ValueError(f"grid video {H}x{W}: quadrant {h}x{w} (margin {m}) too small for tiles {tile}: use a "
                         f"video of at least 64x64 or a smaller RewardConfig.min_tile than {cfg.min_tile}")
    wrist_rows = int((h - 2 * m) * cfg.wrist_top)
    if wrist_rows < tile[0]:
        raise ValueError(f"wrist crop of {wrist_rows} rows holds no {tile[0]}-row tile (wrist_top={cfg.wrist_top})")
    boxes = {
        "ext1": (m, h - m, m, w - m),
        "ext2": (m, h - m, w + m, 2 * w - m),
        "wrist": (h + m, h + m + wrist_rows, m, w - m),
        "black": (h + m, 2 * h - m, w + m, 2 * w - m),
    }
    return boxes, tile


def crop(x, box):
    top, bottom, left, right = box
    return x[..., top:bottom, left:right]


# -----------------------------------------------------------------------------
# Robust global shift between consecutive frames: tiled phase correlation, median over tiles


def to_tiles(x_B_F_h_w, tile):
    """[B, F, h, w] -> [B, F, n_tiles, th, tw] non-overlapping tiles (the remainder at the bottom/right is dropped)."""
    th, tw = tile
    B, n_frames, h, w = x_B_F_h_w.shape
    ny, nx = h // th, w // tw
    x = x_B_F_h_w[:, :, : ny * th, : nx * tw].reshape(B, n_frames, ny, th, nx, tw)
    return x.permute(0, 1, 2, 4, 3, 5).reshape(B, n_frames, ny * nx, th, tw)


def pooled_tiles(tiles_B_F_n_th_tw):
    """Every tile average-pooled by max(2, th // 8), flattened: [B, F, n, cells]. I.i.d. grain of std s drops to
    s / pool while texture coarser than the pool survives, so texture and change measured here ignore grain."""
    B, n_frames, n, th, tw = tiles_B_F_n_th_tw.shape
    k = max(2, th // 8)
    pooled = F.avg_pool2d(tiles_B_F_n_th_tw.reshape(B * n_frames * n, 1, th, tw), k)
    return pooled.reshape(B, n_frames, n, -1)


def gaussian_peak(r_minus, r_0, r_plus):
    """Sub-pixel offset of a Gaussian peak from its 3 samples (a parabola through their logs): the peak of the
    Gaussian-weighted phase correlation below is a Gaussian of std 1 / (2 pi shift_lowpass) px (up to the window)."""
    lm, l0, lp = (r.clamp(min=1e-6).log() for r in (r_minus, r_0, r_plus))
    curvature = lm - 2 * l0 + lp
    offset = 0.5 * (lm - lp) / torch.where(curvature < 0, curvature, torch.full_like(curvature, -1e-6))
    return offset.clamp(-0.5, 0.5)


def correlation_peak(cross, lowpass):
    """Peak of the Gaussian-weighted phase correlation of a cross-power spectrum [..., th, tw]: (shift [..., 2]
    wrapped to +-size/2 with its sub-pixel part, peak height [...], 1 at a perfect match)."""
    th, tw = cross.shape[-2:]
    corr = torch.fft.ifft2(lowpass * cross / (cross.abs() + 1e-8)).real.flatten(-2) / lowpass.mean()
    peak, index = corr.max(dim=-1)
    py, px = index // tw, index % tw

    def at(iy, ix):
        return corr.gather(-1, ((iy % th) * tw + ix % tw).unsqueeze(-1)).squeeze(-1)

    dy = torch.where(py > th // 2, py - th, py) + gaussian_peak(at(py - 1, px), peak, at(py + 1, px))
    dx = torch.where(px > tw // 2, px - tw, px) + gaussian_peak(at(py, px - 1), peak, at(py, px + 1))
    return torch.stack([dy, dx], dim=-1), peak


def tile_shifts(y_B_F_h_w, tile, cfg: RewardConfig):
    """Shift of every tile from frame f to f+1: shifts [B, F-1, n, 2], valid [B, F-1, n] (texture in both frames
    and a clear peak) and change [B, F-1, n] (mean squared difference of the pooled tiles).

    Phase correlation weighs every frequency alike, so sensor grain, which dominates the high frequencies of a
    VAE-blurred frame, scatters the peak (0.35 px of false jitter per frame with a 1 px blur and 1% grain); a
    Gaussian low-pass on the cross-power spectrum keeps the frequencies where the picture is (0.15 px) and makes
    the peak a Gaussian. The low frequencies it favours are the ones the fixed Hann window biases towards 0
    (-4% of the shift), so the estimate is refined once: frame f+1 is shifted back by it (Fourier), and the
    residual shift is measured and added (max error 0.006 px on sub-pixel shifts).
    """
    tiles = to_tiles(y_B_F_h_w, tile)
    pooled = pooled_tiles(tiles)
    textured = pooled.std(dim=-1, correction=0) > cfg.min_tile_std  # [B, F, n]
    change = (pooled[:, 1:] - pooled[:, :-1]).square().mean(dim=-1)
    tiles = tiles - tiles.mean(dim=(-2, -1), keepdim=True)
    th, tw = tile
    dev = tiles.device
    window = (torch.hann_window(th, periodic=False, device=dev)[:, None]
              * torch.hann_window(tw, periodic=False, device=dev)[None, :])
    fy, fx = torch.fft.fftfreq(th, device=dev)[:, None], torch.fft.fftfreq(tw, device=dev)[None, :]
    lowpass = torch.exp(-(fy ** 2 + fx ** 2) / (2 * cfg.shift_lowpass ** 2))

    before = torch.fft.fft2(tiles[:, :-1] * window).conj()
    d, peak = correlation_peak(torch.fft.fft2(tiles[:, 1:] * window) * before, lowpass)
    ramp = (torch.exp(2j * math.pi * fy * d[..., 0, None, None])  # separable: [.., th, 1] x [.., 1, tw]
            * torch.exp(2j * math.pi * fx * d[..., 1, None, None]))
    after_back = torch.fft.ifft2(torch.fft.fft2(tiles[:, 1:]) * ramp).real  # frame f+1 moved back by d
    residual, _ = correlation_peak(torch.fft.fft2(after_back * window) * before, lowpass)
    valid = textured[:, 1:] & textured[:, :-1] & (peak > cfg.min_peak)
    return d + residual, valid, change


def frame_shifts(y_B_F_h_w, tile, cfg: RewardConfig):
    """Global shift d_f = (dy, dx) from frame f to f+1, with b(y, x) ~ a(y - dy, x - dx).

    Returns (shift [B, F-1, 2], valid fraction [B, F-1]). The shift is the component-wise median over the
    stiller half of the valid tiles (change <= the median change of valid tiles; 0 where no tile is valid).
    With grain, a median over all tiles leans towards the arm by a fraction of the still tiles' noise, every
    frame, the same way (2-3 px of false drift over 33 frames with blur and 1% grain), since the tiles the arm
    crosses read shifts pulled towards its motion. Those tiles change most; the stiller half is the background.
    A shaking camera changes every tile alike, so the selection then costs nothing.
    """
    shifts, valid, change = tile_shifts(y_B_F_h_w, tile, cfg)
    change = change.masked_fill(~valid, float("nan"))
    still = valid & (change <= torch.nanquantile(change, 0.5, dim=2, keepdim=True))
    median = torch.nanquantile(shifts.masked_fill(~still.unsqueeze(-1), float("nan")), 0.5, dim=2)
    return torch.where(median.isnan(), torch.zeros_like(median), median), valid.float().mean(dim=2)


# -----------------------------------------------------------------------------
# Coherent motion: something in the view moves, persistently, in a way grain, flicker and cuts cannot fake


def coherent_motion(y_B_F_h_w, cfg: RewardConfig):
    """RMS luma change per frame that comes from persistent motion, [B] (0 if none).

    1. Average-pool to ~activity_rows rows of cells (grain std drops by the pool size; resolution-free units).
    2. Affine-align every frame to the clip's mean frame (least squares gain and offset): a global brightness
       ramp or flicker then changes nothing.
    3. e1_f = mean |X_{f+1} - X_f|^2, e2_f = mean |X_{f+2} - X_f|^2, b_f = e2_f - min_growth max(e1_f, e1_{f+1}).
       Something moving steadily sweeps more in two frames than in one: e2 ~ 2 e1 (an edge sweeping area) to
       4 e1 (sub-pixel motion), b > 0. Temporally white grain, independent noise frames, a shaking camera:
       e2 = e1 in expectation, b < 0; min_growth = 1.5 rather than 1 keeps their sampling noise from ever
       reading as motion at 64x64. A jump between two held frames (teleport): e2 = max e1, b < 0. Alternating
       frames: e2 = 0.
    Returns sqrt(max(0, mean_f b_f)): luma per frame, in pooled cells.
    """
    B, n_frames, h, w = y_B_F_h_w.shape
    p = max(2, h // cfg.activity_rows)
    x = F.avg_pool2d(y_B_F_h_w.reshape(B * n_frames, 1, h, w), p).reshape(B, n_frames, -1).double()
    x = x - x.mean(dim=-1, keepdim=True)
    ref = x.mean(dim=1, keepdim=True)
    gain = (x * ref).mean(dim=-1, keepdim=True) / ((x * x).mean(dim=-1, keepdim=True) + 1e-12)
    x = gain * x
    e1 = (x[:, 1:] - x[:, :-1]).square().mean(dim=-1)
    e2 = (x[:, 2:] - x[:, :-2]).square().mean(dim=-1)
    b = e2 - cfg.min_growth * torch.maximum(e1[:, 1:], e1[:, :-1])
    return b.mean(dim=1).clamp(min=0).sqrt().float()


# -----------------------------------------------------------------------------
# The components


def exterior_stillness(y_ext1, y_ext2, tile, cfg: RewardConfig):
    """R_static and its raw statistics (jitter J px/frame, drift D px, texture V)."""
    jitter, drift, valid = [], [], []
    for y in (y_ext1, y_ext2):
        d, v = frame_shifts(y, tile, cfg)
        jitter.append(d.norm(dim=-1).mean(dim=1))
        drift.append(d.cumsum(dim=1).norm(dim=-1).amax(dim=1))
        valid.append(v.mean(dim=1))
    J, D, V = (torch.stack(s).mean(dim=0) for s in (jitter, drift, valid))
    x = J / cfg.tau_jitter + D / cfg.tau_drift + cfg.texture_weight * (1 - V)
    return bounded(x), {"jitter": J, "drift": D, "texture": V}


def wrist_smoothness(d, valid, cfg: RewardConfig):
    """R_smooth from the wrist's global shifts d [B, F-1, 2]: acceleration A (px/frame^2) and texture V_wrist."""
    A = (d[:, 1:] - d[:, :-1]).norm(dim=-1).mean(dim=1)
    V = valid.mean(dim=1)
    return bounded(A / cfg.tau_accel + cfg.texture_weight * (1 - V)), {"accel": A, "wrist_texture": V}


def black_fidelity(intensity_black, cfg: RewardConfig):
    """R_black and the mean intensity e of the black quadrant's interior."""
    e = sample_mean(intensity_black)
    return bounded((e - cfg.black_level).clamp(min=0) / cfg.tau_black), {"black_level": e}


def flicker(y_views, cfg: RewardConfig):
    """R_flicker and Fl = mean |second difference| of per-frame mean luma over the given views."""
    means = torch.stack([y.mean(dim=(-2, -1)) for y in y_views], dim=1)  # [B, views, F]
    Fl = (means[..., 2:] - 2 * means[..., 1:-1] + means[..., :-2]).abs().mean(dim=(1, 2))
    return bounded(Fl / cfg.tau_flicker), {"flicker": Fl}


def robot_activity(y_ext1, y_ext2, cfg: RewardConfig):
    """R_activity = mean over the exteriors of min(1, coherent_motion / activity_ref): both views should see the
    arm act, and neither can make up for the other."""
    acts = [coherent_motion(y, cfg) for y in (y_ext1, y_ext2)]
    r = sum(ratio(a, cfg.activity_ref) for a in acts) / 2
    return r, {"activity": (acts[0] + acts[1]) / 2}


def wrist_motion(d, quadrant_h, cfg: RewardConfig):
    """R_motion = min(1, S / motion_ref). S = mean wrist speed over windows of 4 frames, from the phase
    correlation's shifts, in % of the quadrant height per frame (one motion_ref serves every resolution).
    Over a window, a pan adds up and the per-frame noise of the shifts (grain) does not (it grows as sqrt(4)).
    """
    k = min(4, d.shape[1])
    path = torch.cat([torch.zeros_like(d[:, :1]), d.cumsum(dim=1)], dim=1)  # position at every frame
    S = 100 * ((path[:, k:] - path[:, :-k]).norm(dim=-1) / k).mean(dim=1) / quadrant_h
    return ratio(S, cfg.motion_ref), {"wrist_speed": S}


@torch.no_grad()
def grid_rewards(video_B_3_F_H_W, cfg: RewardConfig = RewardConfig(), extra=None):
    """All rewards of a batch of 2x2 grid videos in [-1, 1]. Needs >= 3 frames and >= 64x64 pixels.

    Returns a dict of [B] fp32 tensors: "reward" (the weighted geometric mean of the components, in (0, 1]), each
    component as "r_<name>" (static, smooth, black, flicker, activity, motion), and the raw statistics (jitter,
    drift, texture, accel, wrist_texture, black_level, flicker, activity, wrist_speed).
    `extra`: {name: (fn, weight)} with fn(video) -> [B] in (0, 1], joining the geometric mean.
    """
    intensity = to_intensity(video_B_3_F_H_W)
    B, _, n_frames, H, W = intensity.shape
    if n_frames < 3:
        raise ValueError(f"{n_frames} frames: the smoothness, flicker and activity rewards need at least 3")
    boxes, tile = quadrant_boxes(H, W, cfg)
    y = luma(intensity)
    ext1, ext2, wrist = (crop(y, boxes[name]) for name in ("ext1", "ext2", "wrist"))
    d_wrist, valid_wrist = frame_shifts(wrist, tile, cfg)

    components, raw = {}, {}
    for name, (r, stats) in {
        "static": exterior_stillness(ext1, ext2, tile, cfg),
        "smooth": wrist_smoothness(d_wrist, valid_wrist, cfg),
        "black": black_fidelity(crop(intensity, boxes["black"]), cfg),
        "flicker": flicker([ext1, ext2, wrist], cfg),
        "activity": robot_activity(ext1, ext2, cfg),
        "motion": wrist_motion(d_wrist, H // 2, cfg),
    }.items():
        components[name] = r
        raw.update(stats)
    weights = {name: getattr(cfg, f"w_{name}") for name in components}
    for name, (fn, weight) in (extra or {}).items():
        if name in components:
            raise ValueError(f"extra reward {name!r} clashes with a built-in reward")
        r = torch.as_tensor(fn(video_B_3_F_H_W), dtype=torch.float32, device=intensity.device).reshape(-1)
        if r.shape != (B,) or not bool(((r > 0) & (r <= 1)).all()):
            raise ValueError(f"extra reward {name!r} must return [B={B}] values in (0, 1], got {r.tolist()}")
        components[name], weights[name] = r, float(weight)
    total_weight = sum(weights.values())
    if total_weight <= 0 or min(weights.values()) < 0:
        raise ValueError(f"reward weights must be >= 0 and sum to > 0, got {weights}")
    # in log space: each log r_k >= -50, so the weighted mean exponent stays in [-50, 0] and nothing underflows
    exponent = sum(weights[name] * r.double().log() for name, r in components.items()) / total_weight
    out = {"reward": exponent.exp().float()}
    out.update({f"r_{name}": r for name, r in components.items()})
    out.update(raw)
    return out


def calibrated(raw_stats, cfg: RewardConfig = RewardConfig()):
    """Temperatures set to the median raw statistic over rollouts of the initial policy (each quality component
    starts near 1/e); activity_ref and motion_ref to half the median (the guards bite only on clips with less
    than half the usual motion: they stop a frozen robot, they are not an incentive to move more).

    raw_stats: the dicts returned by grid_rewards for those rollouts. Returns a new RewardConfig.
    """
    def median(key):
        return float(torch.cat([s[key].reshape(-1) for s in raw_stats]).median())

    return replace(cfg, tau_jitter=max(median("jitter"), 1e-3), tau_drift=max(median("drift"), 1e-3),
                   tau_accel=max(median("accel"), 1e-3), tau_flicker=max(median("flicker"), 1e-5),
                   activity_ref=max(median("activity") / 2, 1e-5), motion_ref=max(median("wrist_speed") / 2, 1e-3))


# -----------------------------------------------------------------------------
# Plug-ins: train.py --reward SPEC


@dataclass(frozen=True)
class RewardTerm:
    name: str  # "default", the function's name, or module.function where that would be ambiguous
    fn: Callable  # called with only the inputs it names, as keywords
    weight: float
    inputs: tuple  # of INPUTS: the parameters it names


# What a term may name: the generated clip decoded [B, 3, F, H, W] float32 in [-1, 1] (video) or as the sampler's
# clean x0 [B, 16, T, H/8, W/8] (latent); where it exists (RL rollouts, held-out evaluations, not stand-ins), the true
# clip the sample was generated from, laid out like them: truth (its first frame is the conditioning frame, as
# video's) and truth_latent; and that clip's actions in the dataset's raw units, action [B, steps, A].
INPUTS = ("video", "latent", "truth", "truth_latent", "action")
PIXELS = ("video", "truth")  # inputs that need decoding


def parse_rewards(spec, cfg: RewardConfig = RewardConfig()):
    """'default,mymod:fn=0.5' -> [RewardTerm]: imports and checks every term now, before any model is built.

    A term is `default` (grid_rewards with cfg) or `module:function`, importable from the working directory,
    optionally `=WEIGHT` (a float >= 0, default 1). The function names the inputs it needs as parameters (INPUTS).
    Raises ValueError, one line naming the term and the fix, for anything that would fail later.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"--reward {spec!r} is empty: give 'default' and/or module:function terms, comma-separated, "
                         f"each optionally =WEIGHT (e.g. 'default,mymod:fn=0.5')")
    parsed = []  # (target, module, function name, fn, weight, inputs)
    for text in spec.split(","):
        term = text.strip()
        if not term:
            raise ValueError(f"--reward {spec!r} has an empty term (a stray comma?)")
        target, has_weight, weight_text = (part.strip() for part in term.partition("="))
        weight = parse_weight(term, weight_text) if has_weight else 1.0
        if target == "default":
            def default(video):
                return grid_rewards(video, cfg)
            parsed.append((target, None, "default", default, weight, ("video",)))
            continue
        module, colon, name = target.partition(":")
        if not colon or not name.isidentifier() or not all(part.isidentifier() for part in module.split(".")):
            raise ValueError(f"--reward term {term!r}: expected 'default' or module:function with Python names, "
                             f"optionally =WEIGHT (e.g. mymod:fn=0.5)")
        fn = load_function(f"--reward term {term!r}", module, name)
        parsed.append((target, module, name, fn, weight, inputs_of(term, fn)))
    targets = [p[0] for p in parsed]
    for target in targets:
        if targets.count(target) > 1:
            raise ValueError(f"--reward {spec!r}: {target!r} appears {targets.count(target)} times; give each term "
                             f"once, with its total weight")
    names = [p[2] for p in parsed if p[1] is not None]
    terms = []
    for target, module, name, fn, weight, inputs in parsed:
        # plain function names unless two plug-ins share one, or it would shadow "default" or the total "reward"
        ambiguous = module is not None and (names.count(name) > 1 or name in ("default", "reward"))
        terms.append(RewardTerm(name=f"{module}.{name}" if ambiguous else name, fn=fn, weight=weight, inputs=inputs))
    return terms


def parse_weight(term, text):
    try:
        weight = float(text)
    except ValueError:
        raise ValueError(f"--reward term {term!r}: weight {text!r} is not a number (e.g. mymod:fn=0.5)") from None
    if not math.isfinite(weight) or weight < 0:
        raise ValueError(f"--reward term {term!r}: weight {weight} must be finite and >= 0 (0 logs the term "
                         f"without optimising it)")
    return weight


def inputs_of(term, fn):
    """The INPUTS fn's parameters name; every other parameter must have a default."""
    params = inspect.signature(fn).parameters
    shown = f"{getattr(fn, '__name__', term)}({', '.join(params)})"
    if not any(name in params for name in INPUTS[:2]):
        raise ValueError(f"--reward term {term!r}: {shown} names neither 'video' nor 'latent': name the input it "
                         f"needs, e.g. def fn(video): ... (decoded [B, 3, F, H, W] in [-1, 1]) or def fn(latent): "
                         f"... (clean x0 [B, 16, T, H/8, W/8]), and truth, truth_latent or action where it needs them")
    for p in params.values():
        if p.name in INPUTS and p.kind == p.POSITIONAL_ONLY:
            raise ValueError(f"--reward term {term!r}: {shown}: {p.name!r} is positional-only; inputs are passed "
                             f"by name")
        if p.name not in INPUTS and p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ValueError(f"--reward term {term!r}: {shown}: parameter {p.name!r} has no default; a reward "
                             f"gets only {', '.join(INPUTS)}")
    return tuple(name for name in INPUTS if name in params)


def wrist_brightness(video):
    """The tiny default's RL target (`--reward reward:wrist_brightness`): the mean intensity in [0, 1] of the grid's
    wrist view (bottom-left quadrant). A toy, chosen because anyone can see it in the samples and the policy can
    change it; nothing a real run should optimise. [B]"""
    H, W = video.shape[-2:]
    return ((video[:, :, :, H // 2:, : W // 2].float().clamp(-1, 1) + 1) / 2).mean(dim=(1, 2, 3, 4))


def needs_pixels(terms):
    """Whether any term needs decoded frames, the sample's or the truth's (decode only then)."""
    return any(name in PIXELS for term in terms for name in term.inputs)


def needs_truth(terms):
    """The names of the terms that need the true clip or its actions: refused where there is none (a stand-in)."""
    return [term.name for term in terms if set(term.inputs) & {"truth", "truth_latent", "action"}]


@torch.no_grad()
def score(terms, video=None, latent=None, **truth):
    """Every term on a batch: {"reward": weighted sum [B] fp32, "<term>": [B], "<term>/<component>": [B]}.

    video: decoded [B, 3, F, H, W] float32 in [-1, 1] (needed iff needs_pixels(terms)); latent: the clean x0
    [B, 16, T, H/8, W/8]; truth: truth, truth_latent and action where they exist (INPUTS), each of B rows or 1. A term returns a [B] tensor or a dict with "reward": [B] and other named [B] components
    (the default term: its r_* components and raw statistics). Each value must be a real floating [B] tensor on the
    inputs' device, finite. Each term gets its own copy of the inputs (one that writes into them changes nothing the
    others or the caller see); a term that raises is named in a ValueError.
    """
    given = {name: x for name, x in (("video", video), ("latent", latent)) if x is not None}
    truth = {name: x for name, x in truth.items() if x is not None}
    if not terms or not given:
        raise ValueError(f"score needs reward terms (parse_rewards) and a video or latent batch; got {len(terms)} "
                         f"terms and {sorted(given) or 'no inputs'}")
    sizes = {name: x.shape[0] for name, x in given.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"score: video and latent batches differ in size: {sizes}")
    B, device = next(iter(sizes.values())), next(iter(given.values())).device
    out, total = {}, torch.zeros(B, dtype=torch.float64, device=device)
    for term in terms:
        kwargs = {}
        for name in term.inputs:
            if name not in given and name not in truth:
                raise ValueError(f"reward term {term.name!r} needs the {name}, but score got none (" + (
                    "decode when needs_pixels(terms) is True)" if name in INPUTS[:2] else "there is no true clip "
                    "here: a world-model reward runs where rollouts start from data, in RL and evaluate.py)"))
            kwargs[name] = (given[name] if name in given else truth[name]).clone()  # its own copy to write into
        try:
            result = term.fn(**kwargs)
        except Exception as e:
            raise ValueError(f"reward term {term.name!r} ({getattr(term.fn, '__module__', '?')}."
                             f"{getattr(term.fn, '__qualname__', term.name)}) raised {type(e).__name__}: {e}") from e
        parts = result if isinstance(result, dict) else {"reward": result}
        if "reward" not in parts:
            raise ValueError(f"reward term {term.name!r} returned a dict without 'reward' (keys {sorted(parts)}): "
                             f"return a [B] tensor or {{'reward': [B], 'name': [B], ...}}")
        for key, value in parts.items():
            label = term.name if key == "reward" else f"{term.name}/{key}"
            out[label] = checked(term.name, label, value, B, device)
        total += term.weight * out[term.name].double()
    return {"reward": total.float(), **out}


def checked(term, label, value, B, device):
    """value as [B] fp32, or a ValueError naming the term, what is wrong and the fix."""
    what = "its reward" if label == term else f"its component {label!r}"
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"reward term {term!r}: {what} is a {type(value).__name__}; return a torch tensor of shape "
                         f"[B={B}]")
    if not value.is_floating_point():  # bool, int, complex: a comparison or an index left unconverted
        raise ValueError(f"reward term {term!r}: {what} is a {value.dtype} tensor; return real floating values "
                         f"(e.g. x.float())")
    if value.device != device:
        raise ValueError(f"reward term {term!r}: {what} is on {value.device}, its inputs on {device}: compute it "
                         f"on the inputs' device (or return x.to(video.device))")
    if tuple(value.shape) != (B,):
        raise ValueError(f"reward term {term!r}: {what} has shape {tuple(value.shape)}, expected [B={B}] (one value "
                         f"per clip): reduce every other dim, e.g. x.mean(dim=(1, 2, 3, 4))")
    value = value.detach().float()
    if not bool(torch.isfinite(value).all()):
        raise ValueError(f"reward term {term!r}: {what} is not finite: {value.tolist()}; a NaN/Inf reward would "
                         f"poison the advantages: guard divisions and logs")
    return value
