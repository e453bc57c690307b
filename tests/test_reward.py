"""reward.py on synthetic 2x2 grid videos with known answers (camera jitter/drift, arm motion, wrist smoothness,
black quadrant, flicker, the frozen-video hack)."""
import math

import pytest
import torch
import torch.nn.functional as F

import reward

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


def test_static_exteriors_and_smooth_wrist_score_one():
    s = scores(grid_video())
    assert s["jitter"] < 1e-3 and s["drift"] < 1e-3 and s["texture"] == 1.0
    assert s["accel"] < 0.01 and s["r_static"] > 0.999 and s["r_smooth"] > 0.99
    assert s["r_black"] == 1.0 and s["r_motion"] == 1.0 and s["reward"] > 0.98


def test_shift_sign_convention_and_subpixel_accuracy():
    # content moving by (+1, +2) px per frame reads as d = (1, 2): b(y, x) = a(y - 1, x - 2)
    frames = camera(100, 184, [(f, 2 * f) for f in range(3)], seed=5)[None]
    d, valid = reward.frame_shifts(frames, (27, 32), reward.RewardConfig())
    torch.testing.assert_close(d, torch.tensor([[[1.0, 2.0], [1.0, 2.0]]]), atol=0.02, rtol=0)
    assert bool((valid == 1).all())
    # a Fourier (sub-pixel) shift of a periodic scene, measured on non-circular crops
    scene = texture(160, 240, seed=6)
    ky = torch.fft.fftfreq(160)[:, None]
    kx = torch.fft.fftfreq(240)[None, :]
    shifted = torch.fft.ifft2(torch.fft.fft2(scene) * torch.exp(-2j * math.pi * (ky * 0.3 + kx * -0.6))).real
    pair = torch.stack([scene[20:120, 20:204], shifted[20:120, 20:204]])[None]
    d, _ = reward.frame_shifts(pair, (27, 32), reward.RewardConfig())
    assert (d[0, 0] - torch.tensor([0.3, -0.6])).abs().max() < 0.02


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


def test_wrist_smooth_vs_jerky():
    s = scores(grid_video(wrist=[(f, f) for f in range(FRAMES)]))  # constant velocity
    assert s["accel"] < 0.01
    s = scores(grid_video(wrist=[(0, f % 2) for f in range(FRAMES)]))  # alternating +1 px
    assert abs(s["accel"] - 2.0) < 0.02 and s["r_smooth"] < 0.2


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


def test_frozen_video_hack_is_not_rewarded():
    """A frozen clip maxes static, smooth and flicker; the motion guard must make it lose to a moving one."""
    good = grid_video()
    frozen = good[:, :, :1].expand_as(good).clone()
    s_good, s_frozen = scores(good), scores(frozen)
    assert s_frozen["r_static"] >= s_good["r_static"] - 1e-3 and s_frozen["r_smooth"] >= s_good["r_smooth"]
    assert s_frozen["motion"] == 0.0 and s_frozen["r_motion"] < 1e-20
    assert 0 < s_frozen["reward"] < 1e-20 < s_good["reward"]


def test_batch_matches_single_and_all_black_is_finite():
    videos = [grid_video(), grid_video(ext1=[(0, 0) if f % 2 == 0 else (2, 0) for f in range(FRAMES)], black=0.03),
              -torch.ones(1, 3, FRAMES, H, W)]
    batch = reward.grid_rewards(torch.cat(videos))
    for b, video in enumerate(videos):
        single = reward.grid_rewards(video)
        for key, value in single.items():
            torch.testing.assert_close(batch[key][b], value[0], atol=1e-5, rtol=1e-5)
    black = {k: v[2].item() for k, v in batch.items()}
    assert all(math.isfinite(v) for v in black.values())
    assert all(0 < black[k] <= 1 for k in black if k == "reward" or k.startswith("r_"))


def test_extra_reward_joins_the_weighted_mean():
    video = torch.cat([grid_video(), grid_video(black=0.04)])
    base = reward.grid_rewards(video)
    out = reward.grid_rewards(video, extra={"mine": (lambda v: torch.full((v.shape[0],), 0.5), 2.0)})
    cfg = reward.RewardConfig()
    weights = {"static": cfg.w_static, "smooth": cfg.w_smooth, "black": cfg.w_black, "flicker": cfg.w_flicker}
    mixed = (sum(w * base[f"r_{n}"] for n, w in weights.items()) + 2.0 * 0.5) / (sum(weights.values()) + 2.0)
    torch.testing.assert_close(out["reward"], mixed * base["r_motion"])
    assert torch.equal(out["r_mine"], torch.full((2,), 0.5))
    with pytest.raises(ValueError, match="in \\(0, 1\\]"):
        reward.grid_rewards(video, extra={"bad": (lambda v: torch.zeros(v.shape[0]), 1.0)})


def test_too_small_video_is_an_error():
    with pytest.raises(ValueError, match="too small"):
        reward.grid_rewards(torch.zeros(1, 3, 5, 32, 32))
