"""reward.py on synthetic 2x2 grid videos with known answers (camera jitter/drift, arm motion, wrist smoothness,
black quadrant, flicker), plausible robot clips against every degenerate clip we could build, and the plug-ins."""
import math
import sys

import pytest
import torch
import torch.nn.functional as F

import reward
from dist_utils import run_dist

FRAMES, H, W = 9, 216, 384  # quadrants 108 x 192 -> tiles 27 x 32, 3 x 5 tiles per exterior view
STILL = [(0, 0)] * FRAMES


def texture(h, w, seed):
    """Smooth random texture in [0.2, 0.8] (low-res noise upsampled plus a little fine grain)."""
    g = torch.Generator().manual_seed(seed)
    low = torch.rand(1, 1, h // 8 + 2, w // 8 + 2, generator=g)
    t = F.interpolate(low, size=(h + 16, w + 16), mode="bicubic", align_corners=False)[0, 0, 8:8 + h, 8:8 + w]
    t = t + 0.15 * torch.rand(h, w, generator=g)
    return 0.2 + 0.6 * (t - t.min()) / (t.max() - t.min())


def camera(h, w, positions, seed, pad=24):
    """Frames of a camera looking at a fixed texture; content of frame f is shifted by positions[f] = (dy, dx)."""
    scene = texture(h + 2 * pad, w + 2 * pad, seed)
    return torch.stack([scene[pad - dy: pad - dy + h, pad - dx: pad - dx + w] for dy, dx in positions])


def grid_video(ext1=STILL, ext2=STILL, wrist=None, black=0.0, seed=0):
    """[1, 3, F, H, W] grey video in [-1, 1]; each view is a camera path (list of integer content offsets)."""
    wrist = wrist if wrist is not None else [(0, f) for f in range(len(ext1))]  # a smooth 1 px/frame pan
    n, h, w = len(ext1), H // 2, W // 2
    intensity = torch.zeros(n, H, W)
    intensity[:, :h, :w] = camera(h, w, ext1, seed)
    intensity[:, :h, w:] = camera(h, w, ext2, seed + 1)
    intensity[:, h:, :w] = camera(h, w, wrist, seed + 2)
    intensity[:, h:, w:] = black
    return (2 * intensity - 1)[None, None].expand(1, 3, n, H, W).clone()


def scores(video, cfg=reward.RewardConfig()):
    return {k: v[0].item() for k, v in reward.grid_rewards(video, cfg).items()}


# -----------------------------------------------------------------------------
# Robot clips: still textured exteriors with a textured arm moving smoothly in both, a wrist camera panning
# smoothly over texture, a black bottom-right quadrant. Sub-pixel motion is rendered by Fourier shifts, as a
# camera sees it (rounding to whole pixels would make slow motion a series of 1 px jumps).


def fourier_shift(image, dy, dx):
    """image [h, w] moved by (dy, dx) px, periodically: out(y, x) = image(y - dy, x - dx). dy, dx may be
    sequences: then [len, h, w], one FFT for all."""
    h, w = image.shape[-2:]
    dy, dx = torch.as_tensor(dy, dtype=torch.float64), torch.as_tensor(dx, dtype=torch.float64)
    ky, kx = torch.fft.fftfreq(h, dtype=torch.float64)[:, None], torch.fft.fftfreq(w, dtype=torch.float64)[None, :]
    phase = torch.exp(-2j * math.pi * ky * dy[..., None, None]) * torch.exp(-2j * math.pi * kx * dx[..., None, None])
    return torch.fft.ifft2(torch.fft.fft2(image.double()) * phase).real.float()


def soft_box(h, w, top, left, height, width, edge=0.7):
    """Anti-aliased rectangle mask in [0, 1] at a sub-pixel position."""
    y, x = torch.arange(h, dtype=torch.float32)[:, None], torch.arange(w, dtype=torch.float32)[None, :]
    return (torch.sigmoid((y - top) / edge) * torch.sigmoid((top + height - y) / edge)
            * torch.sigmoid((x - left) / edge) * torch.sigmoid((left + width - x) / edge))


def exterior(n, h, w, seed, travel, start=(0.3, 0.2), shake=None, pad=8):
    """A still camera on a textured scene with a textured arm (~12% of the view) moving by `travel` = (dy, dx)
    fractions of the view over the clip, with a smooth start and stop; shake: per-frame integer camera offsets."""
    H_, W_ = h + 2 * pad, w + 2 * pad
    scene = texture(H_, W_, seed)
    s = [(1 - math.cos(math.pi * f / (n - 1))) / 2 for f in range(n)]
    moved = fourier_shift(0.45 + 0.5 * texture(H_, W_, seed + 100), [v * travel[0] * h for v in s],
                          [v * travel[1] * w for v in s])
    frames = []
    for f in range(n):
        top, left = (start[0] + s[f] * travel[0]) * h + pad, (start[1] + s[f] * travel[1]) * w + pad
        mask = soft_box(H_, W_, top, left, 0.35 * h, 0.35 * w)
        frame = scene * (1 - mask) + moved[f] * mask
        oy, ox = shake[f] if shake is not None else (0, 0)
        frames.append(frame[pad + oy: pad + oy + h, pad + ox: pad + ox + w])
    return torch.stack(frames)


def pan(n, h, w, seed, velocity, jitter=None, pad=32):
    """A camera panning over a textured scene at `velocity` px/frame (sub-pixel), plus optional per-frame jitter."""
    scene = texture(h + 2 * pad, w + 2 * pad, seed)
    jitter = jitter if jitter is not None else [(0.0, 0.0)] * n
    moved = fourier_shift(scene, [velocity[0] * f + jitter[f][0] for f in range(n)],
                          [velocity[1] * f + jitter[f][1] for f in range(n)])
    return moved[:, pad: pad + h, pad: pad + w]


def robot(n, size, seed=0, speed=1.0, wrist_velocity=(0.3, 1.0), shake=None, wrist_jitter=None):
    """[n, H, W] intensity of a plausible robot clip. speed 1: the arm crosses 1% of the view width per frame on
    average (a third of it in 33 frames, 2 s at 16 fps); the wrist pans wrist_velocity px/frame in a 108-row view
    (scaled with the view)."""
    Hg, Wg = size
    h, w = Hg // 2, Wg // 2
    out = torch.zeros(n, Hg, Wg)
    travel = 0.01 * speed * (n - 1)
    out[:, :h, :w] = exterior(n, h, w, seed, (0.5 * travel, travel), shake=shake)
    out[:, :h, w:] = exterior(n, h, w, seed + 1, (0.6 * travel, -travel), start=(0.25, 0.55), shake=shake)
    scale = h / 108  # the wrist pans at the same speed in view-relative units at every size
    v = (wrist_velocity[0] * scale, wrist_velocity[1] * scale)
    out[:, h:, :w] = pan(n, h, w, seed + 2, v, jitter=wrist_jitter)
    return out


def as_video(intensity_F_H_W):
    """[F, H, W] intensity -> [1, 3, F, H, W] grey video in [-1, 1]."""
    v = 2 * intensity_F_H_W.clamp(0, 1) - 1
    return v[None, None].expand(1, 3, *v.shape).clone()


def blur(intensity, sigma):
    k = torch.arange(-3 * math.ceil(sigma), 3 * math.ceil(sigma) + 1, dtype=torch.float32)
    k = torch.exp(-k ** 2 / (2 * sigma ** 2))
    k = k / k.sum()
    r = len(k) // 2
    x = F.pad(intensity[:, None], (r, r, r, r), mode="replicate")
    return F.conv2d(F.conv2d(x, k.view(1, 1, 1, -1)), k.view(1, 1, -1, 1))[:, 0]


def grain(intensity, sigma, seed):
    """Per-frame sensor grain on the three camera views (the bottom-right quadrant is not a camera)."""
    g = torch.Generator().manual_seed(seed)
    noisy = intensity + sigma * torch.randn(intensity.shape, generator=g)
    h, w = intensity.shape[-2] // 2, intensity.shape[-1] // 2
    noisy[..., h:, w:] = intensity[..., h:, w:]
    return noisy


def quads(size):
    Hg, Wg = size
    h, w = Hg // 2, Wg // 2
    return {"ext1": (slice(0, h), slice(0, w)), "ext2": (slice(0, h), slice(w, Wg)),
            "wrist": (slice(h, Hg), slice(0, w)), "black": (slice(h, Hg), slice(w, Wg))}


def plausible_clips(n, size):
    """name -> [n, H, W] intensity of honest robot clips."""
    base = robot(n, size)
    return {
        "robot": base,
        "slow arm": robot(n, size, speed=0.5),
        "fast arm": robot(n, size, speed=2.0),
        "other textures": robot(n, size, seed=7),
        "slow wrist": robot(n, size, seed=3, wrist_velocity=(0.0, 0.5)),
        "fast wrist": robot(n, size, seed=4, wrist_velocity=(1.5, 2.5)),
        "VAE-like blur": blur(base, 1.0),
        "sensor noise": grain(base, 0.01, seed=1),
        "blur + noise": grain(blur(robot(n, size, seed=5), 1.0), 0.01, seed=2),
    }


def degenerate_clips(n, size):
    """name -> [n, H, W] intensity of clips that must never beat an honest one."""
    base = robot(n, size)
    q = quads(size)
    g = torch.Generator().manual_seed(11)
    frozen = base[:1].expand_as(base).clone()
    clips = {
        "frozen robot": frozen,
        "frozen + grain 0.02": grain(frozen, 0.02, seed=3),
        "frozen + grain 0.05": grain(frozen, 0.05, seed=4),
        "pure noise": torch.rand(base.shape, generator=g),
        "all grey": torch.full_like(base, 0.5),
        "all black": torch.zeros_like(base),
        "all white": torch.ones_like(base),
    }
    flat_wrist = frozen.clone()
    flat_wrist[:, q["wrist"][0], q["wrist"][1]] = 0.6
    clips["frozen ext + flat wrist + grain"] = grain(flat_wrist, 0.02, seed=5)
    for view, level, name in (("ext1", 0.5, "grey"), ("ext2", 1.0, "white"), ("ext1", 0.0, "black"),
                              ("wrist", 0.5, "grey"), ("wrist", 1.0, "white"), ("wrist", 0.0, "black"),
                              ("black", 0.5, "grey"), ("black", 1.0, "white")):
        clip = base.clone()
        clip[:, q[view][0], q[view][1]] = level
        clips[f"{view} {name}"] = clip
    for view in ("ext1", "wrist"):  # contrast / 10 around a bright level, plus grain
        clip = base.clone()
        ys, xs = q[view]
        clip[:, ys, xs] = 0.85 + 0.1 * (clip[:, ys, xs] - 0.5)
        clips[f"{view} washed out + grain"] = grain(clip, 0.01, seed=6)
    wrist_flat = base.clone()
    wrist_flat[:, q["wrist"][0], q["wrist"][1]] = 0.5
    clips["wrist flat + grain"] = grain(wrist_flat, 0.02, seed=7)
    gain = torch.tensor([1.0 if f % 2 == 0 else 1.06 for f in range(n)])
    clips["flicker"] = base * gain[:, None, None]
    shake = [tuple(int(v) for v in torch.randint(-2, 3, (2,), generator=g)) for _ in range(n)]
    clips["exterior camera shake"] = robot(n, size, shake=shake)
    jitter = [tuple(float(v) for v in 1.5 * torch.randn(2, generator=g)) for _ in range(n)]
    clips["wrist jitter"] = robot(n, size, wrist_jitter=jitter)
    ramp = torch.linspace(0.7, 1.15, n)
    clips["one frame, brightness ramp"] = frozen * ramp[:, None, None]
    clips["one frame, ramp + grain"] = grain(frozen * ramp[:, None, None] + 0.1 * ramp[:, None, None] - 0.1, 0.02, 8)
    clips["teleport: alternating"] = torch.stack([base[0] if f % 2 == 0 else base[-1] for f in range(n)])
    clips["teleport: jump once"] = torch.stack([base[0] if f < n // 2 else base[-1] for f in range(n)])
    return clips


# -----------------------------------------------------------------------------
# Known answers


def test_still_cameras_and_smooth_wrist_score_one_but_no_arm_is_a_frozen_robot():
    s = scores(grid_video())  # still exteriors without an arm, wrist panning 1 px/frame
    assert s["jitter"] < 1e-3 and s["drift"] < 1e-3 and s["texture"] == 1.0 and s["wrist_texture"] == 1.0
    assert s["accel"] < 0.01 and s["r_static"] > 0.999 and s["r_smooth"] > 0.99
    assert abs(s["wrist_speed"] - 100 / 108) < 0.01  # % of the 108-row quadrant per frame
    assert s["r_black"] == 1.0 and s["r_motion"] == 1.0
    assert s["activity"] == 0.0 and s["r_activity"] == pytest.approx(math.exp(-50), rel=1e-4)
    assert s["reward"] < math.exp(-50 * 1 / 5) * 1.01  # the activity guard: w_activity 1 of 5, at exp(-50)
    s = scores(as_video(robot(FRAMES, (H, W))))  # the same with an arm moving in both exteriors
    assert s["r_activity"] == 1.0 and s["r_motion"] == 1.0 and s["reward"] > 0.98


def test_shift_sign_convention_and_subpixel_accuracy():
    # content moving by (+1, +2) px per frame reads as d = (1, 2): b(y, x) = a(y - 1, x - 2)
    frames = camera(100, 184, [(f, 2 * f) for f in range(3)], seed=5)[None]
    d, valid = reward.frame_shifts(frames, (27, 32), reward.RewardConfig())
    torch.testing.assert_close(d, torch.tensor([[[1.0, 2.0], [1.0, 2.0]]]), atol=0.01, rtol=0)
    assert bool((valid == 1).all())
    # Fourier (sub-pixel) shifts of a periodic scene, measured on non-circular crops
    scene = texture(160, 240, seed=6)
    for shift in ((0.3, -0.6), (0.1, 0.45), (-0.25, 0.05), (0.5, 0.5)):
        pair = torch.stack([scene, fourier_shift(scene, *shift)])[None, :, 20:120, 20:204]
        d, _ = reward.frame_shifts(pair, (27, 32), reward.RewardConfig())
        assert (d[0, 0] - torch.tensor(shift)).abs().max() < 0.01, (shift, d)


def test_exterior_jitter_and_drift():
    jitter = [(0, 0) if f % 2 == 0 else (2, 0) for f in range(FRAMES)]  # TL alternates 0 / 2 px
    s = scores(grid_video(ext1=jitter))
    assert abs(s["jitter"] - 1.0) < 0.02 and abs(s["drift"] - 1.0) < 0.02  # means over the two exteriors
    assert s["r_static"] < 0.35
    drift = [(3 * f, -2 * f) for f in range(5)]  # TL drifts to (12, -8) px
    s = scores(grid_video(ext1=drift, ext2=STILL[:5]))
    assert abs(s["drift"] - math.hypot(12, 8) / 2) < 0.1


def test_moving_arm_on_still_camera_is_not_penalised():
    """An arm (~16% of the view) moving 2 px/frame: the tiled median ignores it, so freezing the arm gains nothing."""
    video = grid_video()
    arm = 0.5 + 0.5 * texture(40, 80, seed=7)
    moving = (video + 1) / 2
    for f in range(FRAMES):
        moving[:, :, f, 30:70, 40 + 2 * f: 120 + 2 * f] = arm
    moving = 2 * moving - 1
    frozen = moving[:, :, :1].expand_as(moving).clone()
    frozen[:, :, :, H // 2:, : W // 2] = video[:, :, :, H // 2:, : W // 2]  # only the arm freezes
    s_moving, s_frozen = scores(moving), scores(frozen)
    assert s_moving["jitter"] < 0.05 and s_moving["drift"] < 0.2
    assert s_moving["r_static"] >= s_frozen["r_static"] - 0.01
    assert s_moving["activity"] > 0.01 and s_frozen["activity"] == 0.0  # ... and the arm's motion is the activity


def test_grain_tilts_neither_the_shifts_nor_the_still_half():
    """1% grain on a blurred scene with a moving arm: no false drift (the median of all tiles would lean towards
    the arm every frame: 2-3 px over 33 frames), and the shift noise stays well under tau_jitter."""
    clip = grain(blur(robot(33, (H, W)), 1.0), 0.01, seed=2)
    s = scores(as_video(clip))
    assert s["jitter"] < 0.2 and s["drift"] < 1.5 and s["texture"] == 1.0


def test_wrist_smooth_vs_jerky():
    s = scores(grid_video(wrist=[(f, f) for f in range(FRAMES)]))  # constant velocity
    assert s["accel"] < 0.01
    s = scores(grid_video(wrist=[(0, f % 2) for f in range(FRAMES)]))  # alternating +1 px
    assert abs(s["accel"] - 2.0) < 0.02 and s["r_smooth"] < 0.2
    assert s["wrist_speed"] < 0.25 * 100 / 108  # over 4-frame windows it hardly moves: jitter is not motion


@pytest.mark.parametrize("grey", [0.0, 0.01, 0.04])
def test_black_vs_grey_quadrant(grey):
    s = scores(grid_video(black=grey))
    assert abs(s["black_level"] - grey) < 1e-6
    assert abs(s["r_black"] - math.exp(-grey / 0.02)) <= 1e-3 * math.exp(-grey / 0.02)


def test_flicker_closed_form():
    video = grid_video()
    intensity = (video + 1) / 2
    gain = torch.tensor([1.0 if f % 2 == 0 else 1.05 for f in range(FRAMES)])
    flickering = 2 * (intensity * gain[None, None, :, None, None]) - 1
    cfg = reward.RewardConfig()
    boxes, _ = reward.quadrant_boxes(H, W, cfg)
    y = reward.luma(reward.to_intensity(flickering))
    means = torch.stack([reward.crop(y, boxes[v]).mean(dim=(-2, -1))[0] for v in ("ext1", "ext2", "wrist")])
    expected = (means[:, 2:] - 2 * means[:, 1:-1] + means[:, :-2]).abs().mean()
    s = scores(flickering)
    assert abs(s["flicker"] - float(expected)) < 1e-6 and s["flicker"] > 0.02
    assert abs(s["r_flicker"] - math.exp(-float(expected) / cfg.tau_flicker)) < 1e-5


def test_coherent_motion_ignores_grain_brightness_flicker_and_cuts():
    cfg = reward.RewardConfig()
    still = texture(100, 184, seed=3)[None].expand(17, -1, -1)
    moving = exterior(17, 100, 184, seed=3, travel=(0.08, 0.16))
    g = torch.Generator().manual_seed(0)
    ramp = torch.linspace(0.6, 1.2, 17)[:, None, None]
    cases = {
        "still": still,
        "still + grain": still + 0.02 * torch.randn(still.shape, generator=g),
        "noise frames": torch.rand(17, 100, 184, generator=g),
        "brightness ramp": still * ramp + 0.2 * ramp,
        "flicker": still * torch.tensor([1.0, 1.1] * 8 + [1.0])[:, None, None],
        "alternating frames": torch.stack([moving[0] if f % 2 else moving[-1] for f in range(17)]),
        "jump once": torch.stack([moving[0] if f < 8 else moving[-1] for f in range(17)]),
    }
    for name, clip in cases.items():
        assert float(reward.coherent_motion(clip[None], cfg)) < 1e-6, name
    assert float(reward.coherent_motion(moving[None], cfg)) > 2 * cfg.activity_ref
    noisy = moving + 0.01 * torch.randn(moving.shape, generator=g)
    assert float(reward.coherent_motion(noisy[None], cfg)) > 2 * cfg.activity_ref


def test_texture_and_wrist_speed_ignore_grain():
    cfg = reward.RewardConfig()
    g = torch.Generator().manual_seed(1)
    flat = 0.5 + 0.02 * torch.randn(1, 9, 100, 184, generator=g)
    _, valid = reward.frame_shifts(flat, (27, 32), cfg)
    assert float(valid.max()) == 0.0  # a flat field with grain has no texture, so no shift and no speed
    frozen = grain(robot(33, (H, W))[:1].expand(33, -1, -1), 0.01, seed=4)
    s = scores(as_video(frozen))
    assert s["wrist_speed"] < 0.5 * cfg.motion_ref and s["activity"] == 0.0


# -----------------------------------------------------------------------------
# Plausible robot clips against every degenerate clip we could build

MARGIN = 0.05  # every plausible clip beats every degenerate one by at least this much (measured: >= 0.085)


@pytest.mark.parametrize("n,size", [(33, (216, 384)), (9, (64, 112)), (9, (64, 64))])
def test_every_plausible_clip_beats_every_degenerate_clip(n, size):
    def score(clips):
        return {name: reward.grid_rewards(as_video(clip))["reward"].item() for name, clip in clips.items()}

    plausible, degenerate = score(plausible_clips(n, size)), score(degenerate_clips(n, size))
    table = "\n".join(f"  {'plausible' if name in plausible else 'degenerate':10s} {name:34s} {r:.4g}"
                      for name, r in {**plausible, **degenerate}.items())
    worst, best_hack = min(plausible, key=plausible.get), max(degenerate, key=degenerate.get)
    assert plausible[worst] > degenerate[best_hack] + MARGIN, (
        f"{n}x{size}: plausible {worst!r} {plausible[worst]:.4f} vs degenerate {best_hack!r} "
        f"{degenerate[best_hack]:.4f}\n{table}")
    assert all(r > 0.75 for r in plausible.values()), table


def test_geometric_mean_every_component_is_necessary():
    """One failed component drags the whole reward down; in an arithmetic mean a white bottom-right quadrant
    would still keep 1 - 0.5 / 5 of it."""
    clip = robot(FRAMES, (H, W))
    clip[:, H // 2:, W // 2:] = 1.0
    s = scores(as_video(clip))
    assert s["r_black"] == pytest.approx(math.exp(-50), rel=1e-4)
    others = sum(getattr(reward.RewardConfig(), f"w_{k}") * math.log(s[f"r_{k}"]) for k in reward.COMPONENTS
                 if k != "black")
    assert s["reward"] == pytest.approx(math.exp((others - 0.5 * 50) / 5), rel=1e-4) and s["reward"] < 0.01


# -----------------------------------------------------------------------------
# Batching, extras, calibration, errors


def test_batch_matches_single_and_all_black_is_finite():
    videos = [grid_video(), grid_video(ext1=[(0, 0) if f % 2 == 0 else (2, 0) for f in range(FRAMES)], black=0.03),
              as_video(robot(FRAMES, (H, W))), -torch.ones(1, 3, FRAMES, H, W)]
    batch = reward.grid_rewards(torch.cat(videos))
    for b, video in enumerate(videos):
        single = reward.grid_rewards(video)
        for key, value in single.items():
            torch.testing.assert_close(batch[key][b], value[0], atol=1e-5, rtol=1e-5)
    black = {k: v[3].item() for k, v in batch.items()}
    assert all(math.isfinite(v) for v in black.values())
    assert all(0 < black[k] <= 1 for k in black if k == "reward" or k.startswith("r_"))


def test_extra_reward_joins_the_weighted_geometric_mean():
    video = torch.cat([as_video(robot(FRAMES, (H, W))), grid_video(black=0.04)])
    base = reward.grid_rewards(video)
    out = reward.grid_rewards(video, extra={"mine": (lambda v: torch.full((v.shape[0],), 0.5), 2.0)})
    cfg = reward.RewardConfig()
    weights = {name: getattr(cfg, f"w_{name}") for name in reward.COMPONENTS}
    log_sum = sum(w * base[f"r_{n}"].double().log() for n, w in weights.items()) + 2.0 * math.log(0.5)
    torch.testing.assert_close(out["reward"], (log_sum / (sum(weights.values()) + 2.0)).exp().float())
    assert torch.equal(out["r_mine"], torch.full((2,), 0.5))
    with pytest.raises(ValueError, match="in \\(0, 1\\]"):
        reward.grid_rewards(video, extra={"bad": (lambda v: torch.zeros(v.shape[0]), 1.0)})


def test_calibrated_sets_temperatures_to_medians_and_guards_to_half():
    stats = [reward.grid_rewards(as_video(robot(FRAMES, (H, W), seed=s, speed=1 + s))) for s in range(3)]
    cfg = reward.calibrated(stats)

    def median(key):
        return float(torch.cat([s[key] for s in stats]).median())
    assert cfg.tau_accel == max(median("accel"), 1e-3) and cfg.tau_flicker == max(median("flicker"), 1e-5)
    assert cfg.activity_ref == pytest.approx(median("activity") / 2) and cfg.motion_ref == median("wrist_speed") / 2
    assert reward.grid_rewards(as_video(robot(FRAMES, (H, W), seed=1, speed=2)), cfg)["r_activity"].item() == 1.0


def test_too_small_video_is_an_error():
    with pytest.raises(ValueError, match="32x32.*too small"):
        reward.grid_rewards(torch.zeros(1, 3, 5, 32, 32))
    with pytest.raises(ValueError, match="2 frames"):
        reward.grid_rewards(torch.zeros(1, 3, 2, 64, 64))


# -----------------------------------------------------------------------------
# Plug-ins: parse_rewards, needs_pixels, score

BROKEN = '''
import torch

NOT_CALLABLE = 3


def black_latent(latent):  # same name as tests.reward_plugins.black_latent
    return latent.mean(dim=(1, 2, 3, 4))


def no_inputs(x):
    return x


def extra_arg(video, scale):
    return video.mean(dim=(1, 2, 3, 4)) * scale


def wrong_shape(video):
    return video.mean(dim=(1, 2, 3))


def nan_reward(latent):
    return latent.mean(dim=(1, 2, 3, 4)) * float("nan")


def no_reward_key(latent):
    return {"energy": latent.square().mean(dim=(1, 2, 3, 4))}


def not_a_tensor(video):
    return [0.5] * video.shape[0]


def mutates(latent):  # writes into its input: the terms after it must still see the sampler's latent
    return latent.zero_().mean(dim=(1, 2, 3, 4)) + 1


def on_meta(latent):
    return latent.mean(dim=(1, 2, 3, 4)).to("meta")


def a_comparison(latent):
    return latent.mean(dim=(1, 2, 3, 4)) > 0


def raises(latent):
    return {}["missing"]
'''


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """A working directory holding tmp_plugins.py, not on sys.path: parse_rewards must put it there itself."""
    (tmp_path / "tmp_plugins.py").write_text(BROKEN)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    yield tmp_path
    sys.modules.pop("tmp_plugins", None)


def batch():
    video = torch.cat([as_video(robot(FRAMES, (64, 112), seed=s)) for s in range(2)])
    latent = torch.randn(2, 16, 3, 8, 14, generator=torch.Generator().manual_seed(0))
    return video, latent


def test_score_weighs_terms_and_names_components():
    terms = reward.parse_rewards("default, tests.reward_plugins:wrist_brightness=0.5,"
                                 "tests.reward_plugins:black_latent=2")
    assert [(t.name, t.weight, t.inputs) for t in terms] == [
        ("default", 1.0, ("video",)), ("wrist_brightness", 0.5, ("video",)), ("black_latent", 2.0, ("latent",))]
    assert reward.needs_pixels(terms)
    video, latent = batch()
    out = reward.score(terms, video=video, latent=latent)
    grid = reward.grid_rewards(video)
    from tests import reward_plugins
    torch.testing.assert_close(out["default"], grid["reward"])
    torch.testing.assert_close(out["black_latent"], reward_plugins.black_latent(latent))
    torch.testing.assert_close(out["wrist_brightness"], reward_plugins.wrist_brightness(video)["reward"])
    expected = out["default"].double() + 0.5 * out["wrist_brightness"].double() + 2 * out["black_latent"].double()
    torch.testing.assert_close(out["reward"], expected.float())
    assert out["reward"].dtype == torch.float32 and out["reward"].shape == (2,)
    assert set(out) == ({"reward", "default", "wrist_brightness", "wrist_brightness/top", "wrist_brightness/bottom",
                         "black_latent"} | {f"default/{k}" for k in grid if k != "reward"})
    torch.testing.assert_close(out["default/r_activity"], grid["r_activity"])
    torch.testing.assert_close(out["default/wrist_speed"], grid["wrist_speed"])


def test_latent_only_spec_needs_no_pixels(plugin_dir):
    terms = reward.parse_rewards("tests.reward_plugins:black_latent,tmp_plugins:no_reward_key=0")
    assert not reward.needs_pixels(terms)
    _, latent = batch()
    with pytest.raises(ValueError, match="'no_reward_key' returned a dict without 'reward'"):
        reward.score(terms, latent=latent)
    terms = reward.parse_rewards("tests.reward_plugins:black_latent=0.5,tmp_plugins:black_latent")
    assert [t.name for t in terms] == ["tests.reward_plugins.black_latent", "tmp_plugins.black_latent"]
    out = reward.score(terms, latent=latent)
    torch.testing.assert_close(out["reward"], 0.5 * out[terms[0].name] + out[terms[1].name])
    with pytest.raises(ValueError, match="needs the video, but score got none"):
        reward.score(reward.parse_rewards("default"), latent=latent)


@pytest.mark.parametrize("spec,message", [
    ("", "is empty"),
    ("default,,tests.reward_plugins:black_latent", "empty term"),
    ("reward_plugins_typo:fn", "no module 'reward_plugins_typo': it must be importable from the working directory"),
    ("tests.reward_plugins", "expected 'default' or module:function"),
    ("tests.reward_plugins:fn-1", "expected 'default' or module:function"),
    ("tests.reward_plugins:missing", "has no function 'missing'"),
    ("tmp_plugins:NOT_CALLABLE", "tmp_plugins.NOT_CALLABLE is a int, not a function"),
    ("tmp_plugins:no_inputs", r"no_inputs\(x\) names neither 'video' nor 'latent'"),
    ("tmp_plugins:extra_arg", "parameter 'scale' has no default"),
    ("default,default=2", "'default' appears 2 times"),
    ("default=abc", "weight 'abc' is not a number"),
    ("default=-1", "must be finite and >= 0"),
    ("default=nan", "must be finite and >= 0"),
    ("tmp_plugins:black_latent=inf", "must be finite and >= 0"),
])
def test_bad_specs_fail_at_parse_time_naming_the_term(plugin_dir, spec, message):
    with pytest.raises(ValueError, match=message):
        reward.parse_rewards(spec)


@pytest.mark.parametrize("fn,message", [
    ("wrong_shape", r"'wrong_shape': its reward has shape \(2, 112\), expected \[B=2\] \(one value per clip\)"),
    ("nan_reward", r"'nan_reward': its reward is not finite: \[nan, nan\]"),
    ("not_a_tensor", "'not_a_tensor': its reward is a list; return a torch tensor"),
    ("on_meta", "'on_meta': its reward is on meta, its inputs on cpu: compute it on the inputs' device"),
    ("a_comparison", r"'a_comparison': its reward is a torch.bool tensor; return real floating values"),
    ("raises", r"'raises' \(tmp_plugins.raises\) raised KeyError: 'missing'"),
])
def test_bad_results_fail_naming_the_term_and_the_fix(plugin_dir, fn, message):
    video, latent = batch()
    with pytest.raises(ValueError, match=message):
        reward.score(reward.parse_rewards(f"tmp_plugins:{fn}"), video=video, latent=latent)


def test_each_term_sees_its_own_copy_of_the_inputs(plugin_dir):
    video, latent = batch()
    before = latent.clone()
    out = reward.score(reward.parse_rewards("tmp_plugins:mutates,tests.reward_plugins:black_latent"), latent=latent)
    assert torch.equal(latent, before) and torch.equal(out["mutates"], torch.ones(2))
    torch.testing.assert_close(out["black_latent"], -latent[:, :, :, 4:, 7:].square().mean(dim=(1, 2, 3, 4)))


def _names_on_two_ranks(rank, world):
    """rl.agreed_names when rank 1's term returned another component: refused on both ranks, no rank left
    in the gather."""
    from engine import rl
    scores = [{"reward": torch.ones(2), "energy" if rank == 0 else "energy_v2": torch.ones(2)}]
    try:
        rl.agreed_names(scores)
    except ValueError as e:
        return str(e)
    return None


def test_reward_component_names_are_agreed_between_clips_and_ranks():
    from engine import rl
    assert rl.agreed_names([{"reward": 1, "b": 2, "a": 3}] * 2) == ["a", "b", "reward"]
    with pytest.raises(ValueError, match=r"rank 0: \['a', 'reward'\] / \['reward'\]\): every reward term must"):
        rl.agreed_names([{"reward": 1, "a": 2}, {"reward": 1}])  # a component only some clips return
    messages = run_dist(_names_on_two_ranks, 2, 120)
    assert messages[0] == messages[1] and "rank 0: ['energy', 'reward']; rank 1: ['energy_v2', 'reward']" in \
        messages[0]


def test_a_plugins_own_missing_import_is_not_blamed_on_the_spec(plugin_dir):
    (plugin_dir / "tmp_needs_dep.py").write_text("import a_package_that_is_not_installed\n")
    with pytest.raises(ImportError, match="importing 'tmp_needs_dep' failed: No module named 'a_package_that"):
        reward.parse_rewards("tmp_needs_dep:fn")
    sys.modules.pop("tmp_needs_dep", None)
