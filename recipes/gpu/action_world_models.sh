#!/bin/bash
# Issues 44, 46 and 47 on the device in one call (this session's device time allowed one), random weights and the
# random real-architecture VAE (speed and memory, not quality); data made here by recipes/gpu/action_data.py.
# In order of need: 44: v2w-2b-action (LoRA 32, one SFT step to make a run) as policyeval.py's world:
# benchmarks/worldbench.py (seconds per chunk at batch 1 and 8, 35 and 10 steps), then policyeval.py itself; 46: one
# NFT update of v2w-2b-action with the fidelity reward (clips.fidelity:truth_psnr) at 13x480x640; 47: p25-2b-action
# through train.py on a 1-rank NCCL group at the released 13x256x320 and at 13x480x640 (full fine-tune, --sac block),
# then sample.py chaining 3 chunks (2026-12-07's run had 28-frame episodes: refused, 2 chunks run by hand).
# Run: OUT=... bash recipes/gpu/action_world_models.sh  (carry .gpu: recipes/gpu/pusht_wheels.sh packs imageio-ffmpeg)
source "$(dirname "${BASH_SOURCE[0]}")/device.sh"  # set -u, the repo root, $OUT, imageio-ffmpeg, the card
LOGS=$OUT/logs; mkdir -p $LOGS; A=/tmp/a  # logs straight into $OUT: a call cut short still returns them
timeout 100 python recipes/gpu/action_data.py $A 480x640 256x320 > $LOGS/data.log 2>&1
V="--vae real --vae-ckpt /tmp/tok.pth --frames 13 --workers 1 --sample-every 0 --save-every 100 --sac block"
G="--data $A/g480x640 --height 480 --width 640"
# 44
timeout 100 python -m torch.distributed.run --standalone --nproc_per_node=1 train.py --config v2w-2b-action \
    --init random --lora 32 $G $V --steps 1 --out $A/run > $LOGS/sft44.log 2>&1
timeout 110 python benchmarks/worldbench.py $A/run --batches 1,8 --steps 35,10 --repeats 1 > $LOGS/world.log 2>&1
grep -h '^{' $LOGS/world.log > $OUT/world.jsonl
timeout 60 python policyeval.py $A/run --task held-out --policies tasks.standin:random_actions \
    --judge tasks.standin:never --episodes 2 --chunks 2 --batch 2 --videos 0 --out /tmp/pe > $LOGS/pe.log 2>&1
cp /tmp/pe/result.json $OUT/pe_gpu.json
# 46
timeout 90 python train.py --config v2w-2b-action --init random --lora 32 --objective nft --steps 1 \
    --reward clips.fidelity:truth_psnr --eval-steps 1 --batch-size 1 --nft-group-size 4 $G $V --out $A/nft \
    > $LOGS/nft46.log 2>&1
cp $A/nft/metrics.jsonl $OUT/nft46.jsonl
# 47
for size in 256x320 480x640; do
    timeout 100 python -m torch.distributed.run --standalone --nproc_per_node=1 train.py --config p25-2b-action \
        --init random --data $A/g$size --height ${size%x*} --width ${size#*x} $V --steps 3 \
        --out $A/p25_$size > $LOGS/p25_$size.log 2>&1
    cp $A/p25_$size/metrics.jsonl $OUT/p25_$size.jsonl
done
rm -rf $A/p25_256x320/step_*  # the disk: a full 2B step with its optimizer is ~24 GB
timeout 60 python sample.py --ckpt $A/p25_480x640 --chunks 3 --steps 10 --data $A/g480x640 \
    --prompt-emb "$(ls $A/g480x640/reason1/*.safetensors | head -1)" --out $OUT/p25_rollout.mp4 > $LOGS/sample.log 2>&1
