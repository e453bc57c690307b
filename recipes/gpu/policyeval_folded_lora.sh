#!/bin/bash
# Issue 44's world model with a LoRA run's adapters folded into its weights (policyeval.py's default) against the
# same run unfolded, v2w-2b-action at 13x480x640, random weights, guidance 0, eager; issue 47's 3-chunk sample of
# p25-2b-action (random weights: action_world_models.sh's episodes were too short for 3 chunks); then folded at batch 8. The data
# and the one-step LoRA run as action_world_models.sh makes them. Run: OUT=... bash recipes/gpu/policyeval_folded_lora.sh  (carry .gpu)
source "$(dirname "${BASH_SOURCE[0]}")/device.sh"  # set -u, the repo root, $OUT, imageio-ffmpeg, the card
A=/tmp/a
timeout 60 python recipes/gpu/action_data.py $A 480x640 > $OUT/log.txt 2>&1
timeout 80 python -m torch.distributed.run --standalone --nproc_per_node=1 train.py --config v2w-2b-action \
    --init random --lora 32 --data $A/g480x640 --height 480 --width 640 --vae real --vae-ckpt /tmp/tok.pth \
    --frames 13 --workers 1 --sample-every 0 --save-every 100 --steps 1 --out $A/run >> $OUT/log.txt 2>&1
W="timeout 45 python benchmarks/worldbench.py $A/run --steps 35,10 --repeats 1"
$W --batches 1 > $OUT/folded1.txt 2>&1
$W --batches 1 --unfolded > $OUT/unfolded1.txt 2>&1
timeout 60 python sample.py --ckpt random --config p25-2b-action --vae real --vae-ckpt /tmp/tok.pth --chunks 3 \
    --steps 10 --data $A/g480x640 --prompt-emb "$(ls $A/g480x640/reason1/*.safetensors | head -1)" \
    --out $OUT/p25_3chunks.mp4 > $OUT/sample.txt 2>&1
$W --batches 8 > $OUT/folded8.txt 2>&1
