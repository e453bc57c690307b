#!/bin/bash
# Issue 37 items 2 and 5: DiffusionNFT v2w-2b under torchrun with --cp 1 (a 1-rank NCCL group: the cp-aware update,
# rewards gathered by cp group), 2 updates (their spread), then GRPO v2w-2b, one update, in the same session (the
# NFT-vs-GRPO ratio), both eager as the earlier rows. Expected ~370 s.
source "$(dirname "$0")/env.sh"
rm -rf /tmp/rl/nft2b_cp1 /tmp/rl/grpo2b
R="--config v2w-2b $D --reward default=0,reward_plugins:black_latent --save-every 100"
run nft2b_cp1 200 python -m torch.distributed.run --standalone --nproc_per_node=1 train.py $R --cp 1 --objective nft --nft-group-size 4 \
    --steps 2 --out /tmp/rl/nft2b_cp1
summary /tmp/rl/nft2b_cp1 nft2b_cp1
run grpo2b 240 python train.py $R --objective grpo --grpo-group-size 4 --steps 1 --out /tmp/rl/grpo2b
summary /tmp/rl/grpo2b grpo2b
