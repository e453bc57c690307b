#!/bin/bash
# Issue 36, the GPU part: the action-conditioned v2w-2b-action at upstream's action shape (13 frames = 12 transitions
# of 7-dim Bridge-style actions, 480x640, one conditioning frame) through train.py on a 1-rank NCCL group (torchrun),
# then sample.py chaining 3 chunks under the held-out episode's actions, then GRPO and NFT one update each with
# actions (LoRA 32, --eval-steps 1). .gpu/grid holds no actions, so the data is made here on the device's CPU:
# make_synthetic(motion="actions", action_width=7) (the square moved by (dx, dy), 5 zero dims), stitched at stride 1,
# stand-in T5 embeddings. Random weights and the random real-architecture VAE (env.sh): speed and memory, not
# quality. Expected ~300 s (data ~20, SFT ~120 with its checkpoint, rollout ~40, GRPO ~60, NFT ~60); limits total 470.
source "$(dirname "$0")/env.sh"
A=/tmp/act
rm -rf $A  # a run directory left by an earlier call would be resumed
run data36 40 python -c "
import numpy as np, lerobot, stitch, t5
lerobot.make_synthetic('$A/raw', lengths=(44, 40, 48), height=240, width=320, motion='actions', action_width=7)
stitch.stitch('$A/raw', '$A/grid', stride=1, frames=13, size='480x640', workers=4)
rng = np.random.default_rng(0)  # stand-in prompts: the T5 shape, no download
print(t5.write_embeddings('$A/grid', lambda prompts: [rng.standard_normal((12, 1024)).astype(np.float32) * 0.1
                                                       for _ in prompts]))"
S="--vae real --vae-ckpt /tmp/tok.pth --frames 13 --height 480 --width 640"
T="--config v2w-2b-action --init random --data $A/grid $S --workers 1 --sample-every 0 --save-every 100"
run sft36 150 python -m torch.distributed.run --standalone --nproc_per_node=1 train.py $T --sac block --steps 4 \
    --out $A/sft
summary $A/sft sft36
run rollout36 80 python sample.py --ckpt $A/sft --chunks 3 --steps 10 --prompt-emb $A/grid/t5_xxl/raw__ep000002.pickle \
    --out "$OUT/rollout36.mp4"
R="$T --lora 32 --sac block --eval-steps 1 --batch-size 1 --reward default=0,reward_plugins:black_latent --steps 1"
run grpo36 100 python train.py $R --objective grpo --grpo-group-size 4 --out $A/grpo
summary $A/grpo grpo36
run nft36 100 python train.py $R --objective nft --nft-group-size 4 --out $A/nft
summary $A/nft nft36
