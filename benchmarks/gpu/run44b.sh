#!/bin/bash
# Issue 44's world model with a LoRA run's adapters folded into its weights (policyeval.py's default) against the
# same run unfolded, v2w-2b-action at 13x480x640, random weights, guidance 0, eager; then folded at batch 8. The data
# and the one-step LoRA run as run_all.sh makes them. Run: OUT=... bash benchmarks/gpu/run44b.sh  (carry .gpu)
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
: "${OUT:?OUT must name a folder for the results}"
export PYTHONUNBUFFERED=1
python -m pip install -q --no-deps .gpu/imageio_ffmpeg-*.whl > /tmp/pip.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu.txt" 2>&1
A=/tmp/a
timeout 60 python -c "
import numpy as np, torch, stitch, t5
from base import lerobot
from nets.vae import WanVAE, get_vae_config
lerobot.make_synthetic('$A/raw', lengths=(28, 28, 28), height=240, width=320, motion='actions', action_width=7)
rng = np.random.default_rng(0)
stitch.stitch('$A/raw', '$A/g', stride=1, frames=13, size='480x640', workers=4)
t5.write_embeddings('$A/g', lambda p: [rng.standard_normal((8, 1024)).astype(np.float32) * 0.1 for _ in p])
torch.save(WanVAE(get_vae_config('real')).state_dict(), '/tmp/tok.pth')" > $OUT/log.txt 2>&1
timeout 80 python -m torch.distributed.run --standalone --nproc_per_node=1 train.py --config v2w-2b-action \
    --init random --lora 32 --data $A/g --height 480 --width 640 --vae real --vae-ckpt /tmp/tok.pth --frames 13 \
    --workers 1 --sample-every 0 --save-every 100 --steps 1 --out $A/run >> $OUT/log.txt 2>&1
W="timeout 45 python benchmarks/worldbench.py $A/run --steps 35,10 --repeats 1"
$W --batches 1 > $OUT/folded1.txt 2>&1
$W --batches 1 --unfolded > $OUT/unfolded1.txt 2>&1
$W --batches 8 > $OUT/folded8.txt 2>&1
