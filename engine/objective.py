"""What every training objective shares (SFT: sft.py; GRPO: grpo.py; DiffusionNFT: nft.py; what only the RL ones
share: engine/rl.py): the seeds every random draw comes from and the one guarded optimizer step (clip, skip on NaN/Inf).

Below every objective: sft, grpo, nft and rl import it, it imports none of them.
"""
import hashlib
import math
import time

import torch


def sample_seed(*keys):
    """A 63-bit seed from a tuple of counters: every random draw depends only on (seed, step, sample, purpose),
    so a resumed or re-sharded run draws exactly the same numbers as an uninterrupted one."""
    digest = hashlib.blake2b(repr(keys).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def held_out_slots(dp_rank, dp_world, per_rank=2):
    """The global slots of this rank's held-out clips (slot s: the s-th held-out video, cycling; s also picks its
    evaluation noise), the same number on every rank, and their total over ranks."""
    return [i * dp_world + dp_rank for i in range(per_rank)], per_rank * dp_world


# -----------------------------------------------------------------------------
# The guarded optimizer step


def clip_and_step(optimizer, params, max_norm, skip=False):
    """Clip params' gradients to max_norm, step the optimizer unless the gradient norm is NaN/Inf or `skip` (e.g. a
    NaN/Inf loss on some rank), then zero the gradients: the one optimizer step of SFT, GRPO and NFT. A skipped step
    leaves the weights and the optimizer state as they were. Returns (gradient norm as a float, the seconds the
    optimizer step took, CUDA synchronised, or None when skipped)."""
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
    seconds = None
    if math.isfinite(grad_norm) and not skip:
        device = params[0].device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, seconds
