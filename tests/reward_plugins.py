"""Example reward plug-ins for train.py --reward, e.g. `--reward default,tests.reward_plugins:black_latent=0.5`.

A plug-in names the inputs it needs as parameters: `video` (the decoded clips [B, 3, F, H, W] float32 in [-1, 1])
and/or `latent` (the sampler's clean x0 [B, 16, T, H/8, W/8] float32; a latent-only reward skips decoding). It
returns a [B] tensor, or a dict with "reward": [B] and other named [B] components, which are logged.
"""
import hashlib

import torch


def noise(latent):
    """A reward with nothing to learn (the paired "noise" arm of tests/rl_curves.py): a uniform number in [0, 1) from
    the sha256 of each sample's bytes, so identical samples score alike and anything else scores at random."""
    return torch.tensor([int.from_bytes(hashlib.sha256(x.detach().cpu().float().numpy().tobytes()).digest()[:8],
                                        "little") / 2 ** 64 for x in latent], device=latent.device)


def wrist_brightness(video):
    """Mean intensity in [0, 1] of the wrist view (bottom-left quadrant); its top and bottom halves are logged."""
    H, W = video.shape[-2:]
    wrist = (video[:, :, :, H // 2:, : W // 2] + 1) / 2
    half = wrist.shape[-2] // 2
    return {"reward": wrist.mean(dim=(1, 2, 3, 4)), "top": wrist[..., :half, :].mean(dim=(1, 2, 3, 4)),
            "bottom": wrist[..., half:, :].mean(dim=(1, 2, 3, 4))}


def black_latent(latent):
    """Minus the mean energy of the latent's bottom-right quadrant: a decoding-free black-quadrant proxy. (In
    earnest, compare with the latent of an encoded all-black clip instead of 0: the VAE does not map black to 0.)"""
    H, W = latent.shape[-2:]
    return -latent[:, :, :, H // 2:, W // 2:].square().mean(dim=(1, 2, 3, 4))


def red_top_left(video):
    """Redness of the top-left (exterior 1) view: the mean of R - (G + B) / 2 over its pixels in [0, 1] units, in
    [-1, 1]. A reward the video can easily change (tests/rl_curves.py, docs/rl.md "Keeping the world")."""
    H, W = video.shape[-2:]
    view = (video[:, :, :, : H // 2, : W // 2] + 1) / 2
    return (view[:, 0] - (view[:, 1] + view[:, 2]) / 2).mean(dim=(1, 2, 3))


def motion_energy(video):
    """Motion: the mean absolute change between consecutive frames of the three camera views (the black cell
    excluded), in [0, 1] units. A frozen video scores 0."""
    H, W = video.shape[-2:]
    x = (video + 1) / 2
    step = (x[:, :, 1:] - x[:, :, :-1]).abs()
    cells = (step[..., : H // 2, :], step[..., H // 2:, : W // 2])  # the top row, the wrist
    return sum(c.mean(dim=(1, 2, 3, 4)) * c[0].numel() for c in cells) / sum(c[0].numel() for c in cells)
