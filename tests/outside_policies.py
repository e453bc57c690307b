"""Policies written as a user of policyeval.py would write them, outside tasks/square.py and through the plug-in
contract alone (`--policies tests.outside_policies:creep,...`): they find the square with their own colour threshold,
never call the task's helpers, and act in kinds of motion the data's families do not name (issue 51's check of
generalisation). Each carries .family = "outside" (policyeval.py colours and ranks it with that family)."""
import numpy as np
import torch


def find_square(frames):
    """[B, 2] the square's top-left corner in 320x180 pixels, from the top-left camera cell of the last frame (yellow:
    red and green high, blue low); NaN where no yellow pixel is seen."""
    last = frames[:, :, -1]
    h, w = last.shape[-2] // 2, last.shape[-1] // 2
    cell = last[:, :, :h, :w]
    yellow = ((cell[:, 0] > 0.3) & (cell[:, 1] > 0.3) & (cell[:, 2] < -0.3)).float()  # [B, h, w]
    ys, xs = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
    mass = yellow.sum((1, 2))
    cx, cy = (yellow * xs).sum((1, 2)) / mass, (yellow * ys).sum((1, 2)) / mass
    centre = torch.stack([cx * 320 / w, cy * 180 / h], 1).numpy()
    return np.where(mass.numpy()[:, None] > 0, centre - 32, np.nan)


def plan(frames, info, rate_fn):
    """Actions [B, steps, action_dim]: rate_fn(step, corner, target) -> [B, 2], the square assumed to move by each."""
    corner, target = find_square(frames), np.asarray(info["task"]["target"], np.float64)
    out = np.zeros((len(corner), info["steps"], info["action_dim"]), np.float32)
    seen = ~np.isnan(corner).any(1)
    corner = np.nan_to_num(corner)
    for i in range(info["steps"]):
        rate = np.clip(rate_fn(info["chunk"] * info["steps"] + i, corner, target), [-8, -4], [8, 4])
        rate = np.where(seen[:, None], rate, 0)
        corner = np.clip(corner + rate, [0, 0], [256, 116])
        out[:, i, :2] = rate
    return torch.from_numpy(out)


def creep(frames, info):
    """2 pixels a step along x, then along y, towards the target; stops within 2 pixels: far targets are missed."""
    def rate(t, corner, target):
        d = target - corner
        move_x = np.abs(d[:, 0]) > 2
        return np.stack([np.where(move_x, np.sign(d[:, 0]) * 2, 0), np.where(move_x, 0, np.clip(d[:, 1], -2, 2))], 1)
    return plan(frames, info, rate)


def zigzag(frames, info):
    """Towards the target in x at 4 pixels a step while swinging y up and down by 4 every 8 steps."""
    def rate(t, corner, target):
        d = target - corner
        swing = 4 * (1 if (t // 8) % 2 == 0 else -1)
        return np.stack([np.clip(d[:, 0], -4, 4), np.clip(d[:, 1], -2, 2) + swing], 1)
    return plan(frames, info, rate)


def wander(frames, info):
    """A random rate every 16 steps (seeded by the episode and the chunk), pulled a fifth of the way towards the
    target: now and then it arrives."""
    draws = np.stack([np.random.default_rng([7, info["chunk"], int(e)]).uniform([-8, -4], [8, 4], (info["steps"], 2))
                      for e in info["task"]["episode"]])

    def rate(t, corner, target):
        return 0.8 * draws[:, (t % info["steps"]) // 16 * 16] + 0.2 * np.clip(target - corner, -8, 8)
    return plan(frames, info, rate)


def dawdle(frames, info):
    """Still for the first 70 steps, then 6 pixels a step along x and 3 along y towards the target."""
    def rate(t, corner, target):
        d = target - corner
        return (t >= 70) * np.stack([np.clip(d[:, 0], -6, 6), np.clip(d[:, 1], -3, 3)], 1)
    return plan(frames, info, rate)


for policy in (creep, zigzag, wander, dawdle):
    policy.family = "outside"
