"""The device runs' action data (action_world_models.sh, policyeval_folded_lora.sh): 3 synthetic episodes of 40 frames with 7-value commands
(long enough for 3 chained 13-frame chunks), stitched at stride 1 into ROOT/gHxW for each size, with stand-in text
of both widths (Reason1's for p25, T5's for v2w); the random real-architecture Wan VAE at /tmp/tok.pth.

    python recipes/gpu/action_data.py ROOT 480x640 [256x320 ...]
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import stitch  # noqa: E402
import t5  # noqa: E402
from base import lerobot  # noqa: E402
from nets.vae import WanVAE, get_vae_config  # noqa: E402


def main(root, sizes):
    lerobot.make_synthetic(f"{root}/raw", lengths=(40, 40, 40), height=240, width=320, motion="actions",
                           action_width=7)
    rng = np.random.default_rng(0)
    for size in sizes:
        grid = f"{root}/g{size}"
        stitch.stitch(f"{root}/raw", grid, stride=1, frames=13, size=size, workers=4)
        t5.write_embeddings(grid, lambda p: [torch.from_numpy(rng.standard_normal((8, 100352)).astype(np.float32)
                                                              * 0.1).bfloat16() for _ in p],
                            encoder="reason1", source={"encoder": "stand-in", "revision": "0"})
        t5.write_embeddings(grid, lambda p: [rng.standard_normal((8, 1024)).astype(np.float32) * 0.1 for _ in p])
    torch.save(WanVAE(get_vae_config("real")).state_dict(), "/tmp/tok.pth")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
