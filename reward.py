"""Weight-free rewards for 2x2 robot-grid videos, for GRPO (../shared/specs/grpo.md section 7).

Grid layout: top-left exterior camera 1, top-right exterior camera 2, bottom-left wrist camera, bottom-right black.
Input: decoded videos [B, 3, F, H, W] in [-1, 1] (what vae.decode returns). Internally I = clamp((V+1)/2, 0, 1)
and luma Y = 0.299 R + 0.587 G + 0.114 B. Every reward is exp(-min(50, x)) with x >= 0, so it lies in (0, 1] and
equals 1 iff x = 0. All of it is batched torch under no_grad; the raw statistics are returned for logging and
for calibrating the temperatures (set each tau to the median raw statistic of ~32 rollouts of the initial policy).

- static  (exterior cameras TL, TR): the cameras are fixed, so any global image motion is an artefact.
          J = mean per-frame jitter (px), D = worst accumulated drift from frame 0 (px), V = fraction of tiles with
          enough texture to measure (stops "blur the background flat" from scoring).
- smooth  (wrist camera, top part of BL): the wrist moves, but smoothly. A = mean |acceleration| (px/frame^2).
- black   (BR): mean intensity above the VAE's black level b0.
- flicker (TL, TR, BL-top): second difference of the per-frame mean luma (ignores steady lighting trends).
- motion  guard against the frozen-video hack (a frozen video maximises static, smooth and flicker at once):
          R_motion = min(1, M / motion_ref), M = mean |frame difference| of the wrist view. It multiplies the total.

Global motion is measured by tiled phase correlation with a per-component median over tiles: a global phase
correlation locks onto the moving arm (~17% of a quadrant), which would reward freezing the robot.

Add your own reward: pass `extra={"name": (fn, weight)}` to grid_rewards, where fn(video [B,3,F,H,W] in [-1,1])
returns a [B] tensor in (0, 1]; it joins the weighted mean and is reported under its name.
"""
import math
from dataclasses import dataclass, replace

import torch

# -----------------------------------------------------------------------------
# Config


@dataclass(frozen=True)
class RewardConfig:
    margin: int = 4  # px cut from every quadrant edge: the VAE bleeds across the seams
    tile_grid: tuple = (4, 6)  # tile = (quadrant_h // 4, quadrant_w // 6): 54 x 64 px at 432 x 768
    wrist_top: float = 2 / 3  # fraction of the wrist view used (the static gripper at the bottom pins shifts at 0)
    min_tile_std: float = 0.02  # a tile needs this much luma std in both frames to be measured
    min_peak: float = 0.05  # ... and a phase-correlation peak at least this high
    tau_jitter: float = 1.0  # px per frame
    tau_drift: float = 4.0  # px
    texture_weight: float = 2.0  # lambda_v: penalty per unit of untextured (unmeasurable) exterior
    tau_accel: float = 1.0  # px per frame^2
    black_level: float = 0.0  # b0: mean of a VAE round trip of an all-black quadrant (measure once per VAE)
    tau_black: float = 0.02  # ~5/255
    tau_flicker: float = 0.01
    motion_ref: float = 0.005  # M_ref: wrist mean |dY| per frame below which the guard bites; calibrate on the base
    w_static: float = 1.0
    w_smooth: float = 1.0
    w_black: float = 0.5
    w_flicker: float = 0.5


MAX_EXPONENT = 50.0  # exp(-50) ~ 2e-22: every reward stays strictly positive (and finite in fp32)


def sample_mean(x):
    """Mean over all but the batch dim, in float64: the value must not depend on what else is in the batch."""
    return x.reshape(x.shape[0], -1).double().mean(dim=1).float()


def bounded(x):
    """exp(-min(50, x)) for x >= 0: a reward in (0, 1]."""
    return torch.exp(-x.clamp(min=0, max=MAX_EXPONENT))


# -----------------------------------------------------------------------------
# Pixels -> quadrant crops


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
    tile = (h // cfg.tile_grid[0], w // cfg.tile_grid[1])
    if min(tile) < 4 or h - 2 * m < tile[0] or w - 2 * m < tile[1]:
        raise ValueError(f"quadrant {h}x{w} (margin {m}) too small for tiles {tile}: use a larger video or "
                         f"a smaller tile_grid than {cfg.tile_grid}")
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
    B, F, h, w = x_B_F_h_w.shape
    ny, nx = h // th, w // tw
    x = x_B_F_h_w[:, :, : ny * th, : nx * tw].reshape(B, F, ny, th, nx, tw)
    return x.permute(0, 1, 2, 4, 3, 5).reshape(B, F, ny * nx, th, tw)


def subpixel(r_minus, r_0, r_plus):
    """3-point centroid with negative side lobes clamped: accurate to ~0.003 px on Fourier-shifted content."""
    lo, hi = r_minus.clamp(min=0), r_plus.clamp(min=0)
    return (hi - lo) / (lo + r_0 + hi)


def frame_shifts(y_B_F_h_w, tile, cfg: RewardConfig):
    """Global shift d_f = (dy, dx) from frame f to f+1, with b(y, x) ~ a(y - dy, x - dx).

    Returns (shift [B, F-1, 2], valid fraction [B, F-1]). The shift is the component-wise median over tiles with
    texture and a clear peak; 0 where no tile qualifies.
    """
    tiles = to_tiles(y_B_F_h_w, tile)
    tiles = tiles - tiles.mean(dim=(-2, -1), keepdim=True)
    textured = tiles.std(dim=(-2, -1), correction=0) > cfg.min_tile_std  # [B, F, n]
    th, tw = tile
    window = (torch.hann_window(th, periodic=False, device=tiles.device)[:, None]
              * torch.hann_window(tw, periodic=False, device=tiles.device)[None, :])
    spectra = torch.fft.fft2(tiles * window)
    cross = spectra[:, 1:] * spectra[:, :-1].conj()  # frame f+1 against frame f
    corr = torch.fft.ifft2(cross / (cross.abs() + 1e-8)).real  # [B, F-1, n, th, tw]

    peak, index = corr.flatten(-2).max(dim=-1)
    py, px = index // tw, index % tw

    def at(iy, ix):
        return corr.flatten(-2).gather(-1, ((iy % th) * tw + ix % tw).unsqueeze(-1)).squeeze(-1)

    dy = torch.where(py > th // 2, py - th, py) + subpixel(at(py - 1, px), peak, at(py + 1, px))
    dx = torch.where(px > tw // 2, px - tw, px) + subpixel(at(py, px - 1), peak, at(py, px + 1))
    valid = textured[:, 1:] & textured[:, :-1] & (peak > cfg.min_peak)

    shifts = torch.stack([dy, dx], dim=-1).masked_fill(~valid.unsqueeze(-1), float("nan"))
    median = torch.nanquantile(shifts, 0.5, dim=2)  # [B, F-1, 2]; NaN where no tile is valid
    any_valid = valid.any(dim=2, keepdim=True)
    return torch.where(any_valid, median, torch.zeros_like(median)), valid.float().mean(dim=2)


# -----------------------------------------------------------------------------
# The rewards


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


def wrist_smoothness(y_wrist, tile, cfg: RewardConfig):
    """R_smooth and the mean acceleration A (px/frame^2) of the wrist view's global motion."""
    d, _ = frame_shifts(y_wrist, tile, cfg)
    A = (d[:, 1:] - d[:, :-1]).norm(dim=-1).mean(dim=1)
    return bounded(A / cfg.tau_accel), {"accel": A}


def black_fidelity(intensity_black, cfg: RewardConfig):
    """R_black and the mean intensity e of the black quadrant's interior."""
    e = sample_mean(intensity_black)
    return bounded((e - cfg.black_level).clamp(min=0) / cfg.tau_black), {"black_level": e}


def flicker(y_views, cfg: RewardConfig):
    """R_flicker and Fl = mean |second difference| of per-frame mean luma over the given views."""
    means = torch.stack([y.mean(dim=(-2, -1)) for y in y_views], dim=1)  # [B, views, F]
    Fl = (means[..., 2:] - 2 * means[..., 1:-1] + means[..., :-2]).abs().mean(dim=(1, 2))
    return bounded(Fl / cfg.tau_flicker), {"flicker": Fl}


def motion_guard(y_wrist, cfg: RewardConfig):
    """R_motion = min(1, M / motion_ref) (kept >= exp(-50)), M = mean |frame difference| of the wrist view."""
    M = sample_mean((y_wrist[:, 1:] - y_wrist[:, :-1]).abs())
    return (M / cfg.motion_ref).clamp(min=math.exp(-MAX_EXPONENT), max=1.0), {"motion": M}


@torch.no_grad()
def grid_rewards(video_B_3_F_H_W, cfg: RewardConfig = RewardConfig(), extra=None):
    """All rewards of a batch of 2x2 grid videos in [-1, 1]. Needs >= 3 frames.

    Returns a dict of [B] fp32 tensors: "reward" (the weighted mean of the component rewards times the motion
    guard, in (0, 1]), each component reward as "r_<name>", and the raw statistics (jitter, drift, texture, accel,
    black_level, flicker, motion). `extra`: {name: (fn, weight)} with fn(video) -> [B] in (0, 1].
    """
    intensity = to_intensity(video_B_3_F_H_W)
    B, _, F, H, W = intensity.shape
    if F < 3:
        raise ValueError(f"{F} frames: the smoothness and flicker rewards need at least 3")
    boxes, tile = quadrant_boxes(H, W, cfg)
    y = luma(intensity)
    ext1, ext2, wrist = (crop(y, boxes[name]) for name in ("ext1", "ext2", "wrist"))

    components, raw = {}, {}
    for name, (r, stats) in {
        "static": exterior_stillness(ext1, ext2, tile, cfg),
        "smooth": wrist_smoothness(wrist, tile, cfg),
        "black": black_fidelity(crop(intensity, boxes["black"]), cfg),
        "flicker": flicker([ext1, ext2, wrist], cfg),
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
    if total_weight <= 0:
        raise ValueError(f"reward weights must sum to > 0, got {weights}")
    guard, stats = motion_guard(wrist, cfg)
    raw.update(stats)
    mixed = sum(weights[name] * r for name, r in components.items()) / total_weight
    out = {"reward": mixed * guard, "r_motion": guard}
    out.update({f"r_{name}": r for name, r in components.items()})
    out.update(raw)
    return out


def calibrated(raw_stats, cfg: RewardConfig = RewardConfig()):
    """Temperatures set to the median raw statistic over rollouts of the initial policy (rewards start near 1/e).

    raw_stats: the dicts returned by grid_rewards for those rollouts. Returns a new RewardConfig.
    """
    def median(key):
        return float(torch.cat([s[key].reshape(-1) for s in raw_stats]).median())

    return replace(cfg, tau_jitter=max(median("jitter"), 1e-3), tau_drift=max(median("drift"), 1e-3),
                   tau_accel=max(median("accel"), 1e-3), tau_flicker=max(median("flicker"), 1e-5),
                   motion_ref=max(median("motion"), 1e-5))
