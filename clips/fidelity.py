"""Fidelity: how close a generated video is to the true one, weight-free. Per-camera PSNR and SSIM of the frames after
the conditioning frame, on Path B's 2x2 grid (cut into its cameras) or Path A's views, each view brought to one size.
evaluate.py (runs compared after training) and engine/rl.py (every RL run's held-out evaluation) both score with these
functions, on the same frames, so a run's logged eval_psnr and evaluate.py's number for its checkpoint are one number.

Contents: PSNR and SSIM -> cameras of a grid or views video -> the per-camera metrics and the reward's frames ->
world-model rewards (--reward plug-ins that read the true clip: fidelity to the true continuation).
"""
import torch
import torch.nn.functional as F

import reward
from base import camera
from clips import data

CAMERAS = ("ext_1", "ext_2", "wrist")  # stitch.py's grid cells: top-left, top-right, bottom-left (bottom-right black)
SSIM_WINDOW, SSIM_SIGMA, SSIM_C1, SSIM_C2 = 11, 1.5, 0.01 ** 2, 0.03 ** 2  # Wang et al. 2004, intensities in [0, 1]

# -----------------------------------------------------------------------------
# PSNR and SSIM: batched, videos [B, 3, T, H, W] in [-1, 1]


def to_unit(video):
    """[-1, 1] -> intensities in [0, 1], float32 (values outside are clamped, as an mp4 would store them)."""
    return (video.float().clamp(-1, 1) + 1) / 2


def check_pair(pred, target, what):
    if pred.shape != target.shape or pred.ndim != 5 or pred.shape[1] != 3:
        raise ValueError(f"{what}: pred {tuple(pred.shape)} and target {tuple(target.shape)}: need two videos of one "
                         "shape [B, 3, T, H, W]")


def psnr(pred, target):
    """PSNR in dB, [B] float64: 10 log10(1 / MSE) of each frame's [0, 1] intensities, averaged over the frames (an
    identical frame gives inf, and so does its mean)."""
    check_pair(pred, target, "psnr")
    mse = (to_unit(pred).double() - to_unit(target).double()).square().mean(dim=(1, 3, 4))  # [B, T]
    return (10 * torch.log10(1 / mse)).mean(dim=1)


def gaussian_window(size=SSIM_WINDOW, sigma=SSIM_SIGMA):
    """[size, size] float64 Gaussian weights summing to 1."""
    x = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-x.square() / (2 * sigma ** 2))
    return torch.outer(g, g) / g.sum() ** 2


def ssim(pred, target):
    """SSIM, [B] float64: the standard SSIM of Wang et al. 2004 (Gaussian window 11, sigma 1.5, C1 = 0.01^2,
    C2 = 0.03^2 on [0, 1] intensities; the map over every window that fits inside the frame), per RGB channel and
    frame, averaged over pixels and channels, then over the frames."""
    check_pair(pred, target, "ssim")
    B, C, T, H, W = pred.shape
    if min(H, W) < SSIM_WINDOW:
        raise ValueError(f"ssim: frames of {H}x{W} are smaller than the {SSIM_WINDOW}x{SSIM_WINDOW} window")
    # float64: in float32, E[x^2] - mu^2 cancels to errors of ~1e-7, a 1e-4 error against C2 in flat regions
    x, y = (to_unit(v).double().transpose(1, 2).reshape(B * T, C, H, W) for v in (pred, target))
    window = gaussian_window().to(x)[None, None].expand(C, 1, SSIM_WINDOW, SSIM_WINDOW)

    def blur(v):  # each channel on its own
        return F.conv2d(v, window, groups=C)
    mu_x, mu_y = blur(x), blur(y)
    var_x, var_y, cov = blur(x * x) - mu_x * mu_x, blur(y * y) - mu_y * mu_y, blur(x * y) - mu_x * mu_y
    s = (2 * mu_x * mu_y + SSIM_C1) * (2 * cov + SSIM_C2) / ((mu_x * mu_x + mu_y * mu_y + SSIM_C1)
                                                              * (var_x + var_y + SSIM_C2))
    return s.mean(dim=(1, 2, 3)).view(B, T).mean(dim=1)


def resize(video, size):
    """[B, 3, T, h, w] -> [B, 3, T, *size] frame by frame, by area averaging (a downscale: each source pixel counts
    once, so fine detail is averaged away alike in a grid cell and a full-size view)."""
    B, C, T, h, w = video.shape
    if (h, w) == tuple(size):
        return video
    frames = F.interpolate(video.float().transpose(1, 2).reshape(B * T, C, h, w), size=tuple(size), mode="area")
    return frames.reshape(B, T, C, *size).transpose(1, 2)


def camera_views(video, layout, size=None):
    """{"ext_1", "ext_2", "wrist"} -> [B, 3, T, h, w]: the cells of a 2x2 grid video [B, 3, T, H, W] (layout "grid";
    the black bottom-right cell is no camera), or the views of [B, V, 3, T, H, W] in data.VIEW_ORDER (layout
    "views"); resized to size (h, w) when given."""
    if layout == "grid" and video.ndim == 5 and video.shape[1] == 3:
        h, w = video.shape[-2] // 2, video.shape[-1] // 2
        views = {"ext_1": video[..., :h, :w], "ext_2": video[..., :h, w: 2 * w], "wrist": video[..., h: 2 * h, :w]}
    elif layout == "views" and video.ndim == 6 and video.shape[1:3] == (len(data.VIEW_ORDER), 3):
        views = {name: video[:, i] for i, name in enumerate(data.VIEW_ORDER)}
    else:
        raise ValueError(f"camera_views: a {layout!r} video of shape {tuple(video.shape)}; need layout 'grid' with "
                         f"[B, 3, T, H, W] or 'views' with [B, {len(data.VIEW_ORDER)}, 3, T, H, W]")
    return {c: views[c] if size is None else resize(views[c], size) for c in CAMERAS}


def view_metrics(pred, truth, layout, size):
    """{"<camera>/psnr", "<camera>/ssim", "psnr", "ssim" (the means over cameras)}: [B] each, on frames 1.. of pred
    against truth (frame 0 conditions the generation), both cut into camera views of size (h, w)."""
    pred, truth = camera_views(pred, layout, size), camera_views(truth, layout, size)
    out = {}
    for c in CAMERAS:
        out[f"{c}/psnr"] = psnr(pred[c][:, :, 1:], truth[c][:, :, 1:])
        out[f"{c}/ssim"] = ssim(pred[c][:, :, 1:], truth[c][:, :, 1:])
    for name in ("psnr", "ssim"):
        out[name] = torch.stack([out[f"{c}/{name}"] for c in CAMERAS]).mean(dim=0)
    return out


def reward_video(video, layout):
    """Frames 1.. of a grid video [B, 3, T, H, W], or of views [B, V, 3, T, H, W] put into Path B's 2x2 grid, as
    rl.Scoring.decode scores a views run's rollouts."""
    if layout == "views":
        video = torch.cat([camera.grid_from_views(v, data.VIEW_ORDER) for v in video])
    return video[:, :, 1:].float()


def score_sample(video, truth, x0, views, size, terms, truth_latent=None, action=None):
    """(per-camera PSNR/SSIM {name: [1]}, rewards {name: [1]}) of one held-out generation against its truth:
    generate.from_first_frame's video and latent x0 (a camera net: video and truth [V, 3, T, H, W], one sample of V
    views), on frames 1..; the video rewards on the 2x2 grid, the latent ones on x0. What evaluate.py and every RL
    run's held-out evaluation (rl.evaluate) score. World-model rewards read the truth's frames 1.., and where given
    its latent and its raw actions."""
    layout = "views" if views else "grid"
    shaped = (video[None], truth[None]) if views else (video, truth)
    pixels = reward.needs_pixels(terms)
    rewards = reward.score(terms, video=reward_video(shaped[0], layout) if pixels else None, latent=x0,
                           truth=reward_video(shaped[1], layout) if pixels else None, truth_latent=truth_latent,
                           action=action)
    return view_metrics(*shaped, layout, size), rewards


# -----------------------------------------------------------------------------
# World-model rewards: how close a rollout is to the truth it started from (--reward clips.fidelity:truth_psnr, ...)


def truth_psnr(video, truth):
    """[B] PSNR in dB of the generated frames against the true clip's, over every frame given (in an RL rollout the
    conditioning frame 0 is the truth's own in both and adds no error; in a held-out evaluation frames 1.. are
    given): 10 log10(1 / MSE) of [0, 1] intensities over the whole clip, finite unless the two are identical."""
    check_pair(video, truth.expand_as(video), "truth_psnr")
    mse = (to_unit(video).double() - to_unit(truth.expand_as(video)).double()).square().mean(dim=(1, 2, 3, 4))
    return (10 * torch.log10(1 / mse.clamp_min(1e-10))).float()


def truth_latent_mse(latent, truth_latent):
    """[B] minus the mean squared error of the generated latent against the true clip's (no decoding; the
    conditioning latent frame, the truth's own in both, adds none)."""
    return -(latent.float() - truth_latent.float().expand_as(latent)).square().mean(dim=(1, 2, 3, 4))
