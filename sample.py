"""Sampling: the default Cosmos-Predict2 sampler (35 Karras steps, Euler then 2-step Adams-Bashforth) with
classifier-free guidance in upstream's convention.

The network and its x0 prediction live in model.py (`denoise`); this file only walks the noise schedule.
"""
import math

import numpy as np
import torch

from model import denoise

SIGMA_MIN, SIGMA_MAX, RHO = 0.002, 80.0, 7.0


def karras_sigmas(num_steps, sigma_min=SIGMA_MIN, sigma_max=SIGMA_MAX, rho=RHO):
    """num_steps + 1 noise levels from sigma_max down to sigma_min, float64 (the last one is the final clean pass)."""
    ramp = torch.arange(num_steps + 1, dtype=torch.float64) / num_steps
    lo, hi = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    return (hi + ramp * (lo - hi)) ** rho


def sampler_step(x0_pred, i, x, x0_prev, sigmas):
    """One step from sigmas[i] to sigmas[i+1] in float64; returns (x as float32, x0_pred as float32 for next step).

    Step 0 is Euler in x0 form. Later steps use the 2-step Adams-Bashforth exponential integrator on the x0
    predictions at sigma_i and sigma_{i-1} (upstream's res_x0_rk2_step).
    """
    s_prev, s, s_next = (float(sigmas[j]) if j >= 0 else None for j in (i - 1, i, i + 1))
    x, x0 = x.double(), x0_pred.double()
    if i == 0 or x0_prev is None:
        out = (s - s_next) / s * x0 + s_next / s * x
    else:
        h = math.log(s / s_next)
        c2 = math.log(s / s_prev) / h  # negative: the previous point lies behind
        phi1 = (math.exp(-h) - 1) / (-h)
        phi2 = (phi1 - 1) / (-h)
        b2 = phi2 / c2
        b1 = phi1 - b2
        out = math.exp(-h) * x + h * (b1 * x0 + b2 * x0_prev.double())
    return out.float(), x0_pred.float()


def initial_noise(shape, seed, sigma_max=SIGMA_MAX):
    """Upstream's arch-invariant noise: numpy's RandomState normal, float32, times sigma_max."""
    noise = np.random.RandomState(seed).standard_normal(shape).astype(np.float32)
    return torch.from_numpy(noise) * sigma_max


def guided_x0_fn(net, crossattn_emb, neg_crossattn_emb=None, guidance=7.0, **cond):
    """x0(x, sigma) with classifier-free guidance: x0_c + g * (x0_c - x0_u) (so g=7 is classic scale 8).

    The unconditional branch swaps in the negative-prompt embedding and keeps the conditioning frames.
    With neg_crossattn_emb None or guidance 0 there is one network call per step.
    """

    def x0_fn(x, sigma):
        x0_cond, _ = denoise(net, x, sigma, crossattn_emb, **cond)
        if neg_crossattn_emb is None or guidance == 0:
            return x0_cond
        x0_uncond, _ = denoise(net, x, sigma, neg_crossattn_emb, **cond)
        return x0_cond + guidance * (x0_cond - x0_uncond)

    return x0_fn


@torch.no_grad()
def sample(x0_fn, noise, num_steps=35, callback=None):
    """Run the sampler from `noise` (already scaled by sigma_max) and return the final x0 prediction."""
    sigmas = karras_sigmas(num_steps)
    x, x0_prev = noise.float(), None
    batch = x.shape[0]
    for i in range(num_steps):
        sigma = torch.full((batch,), float(sigmas[i]), dtype=torch.float32, device=x.device)
        x0 = x0_fn(x, sigma)
        x, x0_prev = sampler_step(x0, i, x, x0_prev, sigmas)
        if callback is not None:
            callback(i, x, x0)
    sigma = torch.full((batch,), float(sigmas[-1]), dtype=torch.float32, device=x.device)
    return x0_fn(x, sigma)  # final clean pass at sigma_min


def write_mp4(path, video_3_T_H_W, fps=16):
    """Write a [3,T,H,W] video in [-1,1] as H.264 mp4 (yuv420p: sides rounded down to even)."""
    import imageio.v2 as imageio
    frames = ((video_3_T_H_W.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    frames = frames.permute(1, 2, 3, 0).cpu().numpy()  # [T,H,W,3]
    H, W = frames.shape[1] // 2 * 2, frames.shape[2] // 2 * 2
    tmp = path + ".tmp.mp4"
    with imageio.get_writer(tmp, fps=fps, codec="libx264", quality=8, pixelformat="yuv420p",
                            macro_block_size=1) as writer:
        for frame in frames[:, :H, :W]:
            writer.append_data(frame)
    import os
    os.replace(tmp, path)  # a reader never sees a half-written file
    return path
