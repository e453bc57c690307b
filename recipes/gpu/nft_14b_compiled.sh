#!/bin/bash
# Issue 37 item 1: DiffusionNFT v2w-14b --fp8 --compile, LoRA r=32, --sac block, K=4, 10 CFG-free steps, through
# train.py on one H200: update 1 (compiles) and update 2 (the steady state while the old policy equals theta:
# s_compile should read 0). Expected ~420 s: build ~20, held-out evaluation with its compiles ~50, update 1 ~180,
# update 2 ~130. STEPS=3 (about 560 s: needs the device's whole 10 minutes) adds update 3, the first with the old
# policy's own forwards.
source "$(dirname "$0")/env.sh"
rm -rf /tmp/rl/nft14c  # a run directory left by an earlier call would be resumed
run nft14c 480 python train.py --config v2w-14b --fp8 --compile $D --objective nft --nft-group-size 4 \
    --reward default=0,reward_plugins:black_latent --steps "${STEPS:-2}" --save-every 100 --out /tmp/rl/nft14c
summary /tmp/rl/nft14c nft14c
