#!/bin/bash
# Issues 47 and 46 on the device, one call (random weights, the random real-architecture VAE: speed and memory, not
# quality). 47: p25-2b-action (Predict2.5's per-latent-frame action net) through train.py on a 1-rank NCCL group at
# the released 13x256x320 and at 13x480x640 (full fine-tune, --sac block), then sample.py chaining 3 chunks. 46: one
# NFT update of v2w-2b-action at upstream's 13x480x640 with the fidelity reward (clips.fidelity:truth_psnr: the true
# continuation decoded), LoRA 32, --eval-steps 1. Data made here: make_synthetic(motion="actions", action_width=7)
# stitched at stride 1, stand-in text (Reason1-wide for Predict2.5, T5-wide for Predict2).
# Run: OUT=... bash benchmarks/gpu/run47.sh  (carry .gpu: the imageio-ffmpeg wheel)
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
: "${OUT:?OUT must name a folder for the results}"
export PYTHONUNBUFFERED=1
python -m pip install -q --no-deps .gpu/imageio_ffmpeg-*.whl > /tmp/pip.log 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
LOGS=/tmp/logs47; mkdir -p $LOGS; A=/tmp/a47
timeout 120 python -c "
import numpy as np, torch, stitch, t5
from base import lerobot
from nets.vae import WanVAE, get_vae_config
lerobot.make_synthetic('$A/raw', lengths=(28, 28, 28), height=240, width=320, motion='actions', action_width=7)
for size in ('256x320', '480x640'):
    stitch.stitch('$A/raw', '$A/g' + size, stride=1, frames=13, size=size, workers=4)
rng = np.random.default_rng(0)
for size in ('256x320', '480x640'):
    t5.write_embeddings('$A/g' + size, lambda p: [torch.from_numpy(rng.standard_normal((8, 100352)).astype(np.float32)
                        * 0.1).bfloat16() for _ in p], encoder='reason1', source={'encoder': 'stand-in', 'revision': '0'})
t5.write_embeddings('$A/g480x640', lambda p: [rng.standard_normal((8, 1024)).astype(np.float32) * 0.1 for _ in p])
torch.save(WanVAE(get_vae_config('real')).state_dict(), '/tmp/tok.pth')" > $LOGS/data.log 2>&1
V="--vae real --vae-ckpt /tmp/tok.pth --frames 13 --workers 1 --sample-every 0 --save-every 100"
for size in 256x320 480x640; do
    timeout 170 python -m torch.distributed.run --standalone --nproc_per_node=1 train.py --config p25-2b-action \
        --init random --data $A/g$size $V --height ${size%x*} --width ${size#*x} --sac block --steps 4 \
        --out $A/p25_$size > $LOGS/p25_$size.log 2>&1
    cp $A/p25_$size/metrics.jsonl $OUT/p25_$size.jsonl
    [ $size = 256x320 ] && rm -rf $A/p25_$size/step_*  # the disk: a full 2B step is ~24 GB
done
timeout 90 python sample.py --ckpt $A/p25_480x640 --chunks 3 --steps 10 --data $A/g480x640 \
    --prompt-emb "$(ls $A/g480x640/reason1/*.safetensors | head -1)" --out $OUT/p25_rollout.mp4 > $LOGS/sample.log 2>&1
rm -rf $A/p25_480x640/step_*
timeout 150 python train.py --config v2w-2b-action --init random --lora 32 --objective nft --steps 1 \
    --reward clips.fidelity:truth_psnr --eval-steps 1 --batch-size 1 --nft-group-size 4 --data $A/g480x640 $V \
    --height 480 --width 640 --sac block --out $A/nft > $LOGS/nft.log 2>&1
cp $A/nft/metrics.jsonl $OUT/nft46.jsonl
for f in $LOGS/*.log; do echo "== $f"; tail -c 2500 "$f"; done > $OUT/logs.txt
