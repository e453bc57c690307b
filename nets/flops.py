"""FLOPs of the DiT's formula (MFU in train.py, smoke.py and bench.py) and the measured matmul peak they are held
against: the formula counts what the network must compute, never what a kernel happened to run."""
import time

import torch


def model_flops(cfg, latent, text_len, lora_rank=0):
    """Forward FLOPs of the batch latent [B, C, T, H, W] holds (a multiply-add = 2 FLOPs), and the step total under
    two backward rules.

    Per block, L video tokens of width D, S text tokens of width Dc, MLP hidden F, Tt adaLN rows (one per frame):
      self-attention projections q,k,v,o  4 * 2LD^2        self-attention  QK^T and PV: 4 L^2 D
      cross-attention q,o                 2 * 2LD^2        cross-attention QK^T and PV: 4 L S D
      cross-attention k,v on the text     2 * 2S Dc D      MLP                          2 * 2LDF
      adaLN(-LoRA) modulations            3 * 2Tt(D r + r 3D)   (or 3 * 2Tt D 3D without adaLN-LoRA)
      LoRA adapters on each target linear 2 tokens r (in + out)
      camera encoder (agibot)             2 L C_cam D
    plus the patch embedding, the final layer (with its adaLN), the timestep MLP (Tt rows) and the text projection
    when the config has one. Recompute under activation checkpointing is not counted.
    Returns (fwd, step_3x, step_needed): step_3x = 3 * fwd, the usual rule (each linear's backward costs twice
    its forward); step_needed drops the weight gradients that a LoRA run does not compute (frozen linears cost 1x
    in backward, attention always 2x).
    """
    B, C, T, H, W = latent  # B samples cost B times one (the world benchmarks time batches of episodes)
    p, pt = cfg.patch_spatial, cfg.patch_temporal
    Tt, L, S = T // pt, (T // pt) * (H // p) * (W // p), text_len
    D, Dc, F = cfg.model_channels, cfg.crossattn_emb_channels, int(cfg.model_channels * cfg.mlp_ratio)
    r_ada = cfg.adaln_lora_dim if cfg.use_adaln_lora else 0
    ada = 3 * 2 * Tt * (D * r_ada + r_ada * 3 * D) if r_ada else 3 * 2 * Tt * D * 3 * D
    linear = 4 * 2 * L * D * D + 2 * 2 * L * D * D + 2 * 2 * S * Dc * D + 2 * 2 * L * D * F
    attn = 4 * L * L * D + 4 * L * S * D
    linear += 2 * L * cfg.camera_channels * D
    lora = 0
    if lora_rank:
        r = lora_rank
        lora = (4 * 2 * L * r * 2 * D  # self q,k,v,o
                + 2 * 2 * L * r * 2 * D + 2 * 2 * S * r * (Dc + D)  # cross q,o on video; k,v on text
                + 2 * 2 * L * r * (D + F))  # mlp layer1, layer2
    in_ch = C + int(cfg.video2world) + int(cfg.concat_padding_mask)
    outer = (2 * L * in_ch * pt * p * p * D + 2 * L * D * cfg.out_channels * pt * p * p  # embed, final linear
             + 2 * Tt * (D * r_ada + r_ada * 2 * D if r_ada else D * 2 * D)  # final adaLN
             + 2 * Tt * (D * D + D * (3 * D if r_ada else D)))  # timestep MLP
    if cfg.crossattn_proj_in_channels != Dc:
        outer += 2 * S * cfg.crossattn_proj_in_channels * Dc
    per_block = linear + attn + ada + lora
    fwd = cfg.num_blocks * per_block + outer
    step_3x = 3 * fwd
    if not lora_rank:
        return B * fwd, B * step_3x, B * step_3x
    frozen = cfg.num_blocks * (linear + ada) + outer
    step_needed = fwd + 2 * cfg.num_blocks * attn + frozen + 2 * cfg.num_blocks * lora
    return B * fwd, B * step_3x, B * step_needed


def matmul_peak(device, dtype, n=8192, reps=20):
    """Median FLOP/s of an n^3 matmul on random data (zeros run faster than real data on this GPU)."""
    if device.type != "cuda":
        n, reps = 512, 5
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    times = []
    for i in range(reps + 3):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            a @ b
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            a @ b
            seconds = time.perf_counter() - t0
        if i >= 3:  # three warm-ups: clocks up, cuBLAS heuristics cached
            times.append(seconds)
    return 2 * n ** 3 / sorted(times)[len(times) // 2]
