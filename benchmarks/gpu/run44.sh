#!/bin/bash
# Issues 44 and 47 on the device, one call. CPU (cores 2-4, one per seed, beside the GPU work): p25-tiny-action
# (issue 47) trained with tiny-action's preset from seeds 0, 1 and 2, each then scored by `evaluate.py --chunks 3
# --draws 2` and `policyeval.py` -> $OUT/p25_tiny_seeds.jsonl (tiny-action's own seeds ran on this repo's CPU). GPU: v2w-2b-action at upstream's 13x480x640 (random
# weights, LoRA 32 so the step saves adapters only; data made here: make_synthetic(motion="actions",
# action_width=7) stitched at stride 1, stand-in T5 embeddings), then benchmarks/worldbench.py (seconds per chunk at
# batch 1/4/8, 35 and 10 steps, eager and compiled) and policyeval.py itself through its entry point.
# Run: OUT=... bash benchmarks/gpu/run44.sh  (carry .gpu: the imageio-ffmpeg wheel)
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD
: "${OUT:?OUT must name a folder for the results}"
export PYTHONUNBUFFERED=1
python -m pip install -q --no-deps .gpu/imageio_ffmpeg-*.whl > /tmp/pip.log 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python -c "import torch; print('torch', torch.__version__)" >> "$OUT/gpu.txt"
LOGS=/tmp/logs44; mkdir -p $LOGS /tmp/seeds/data
for s in 0 1 2; do  # issue 47's table: p25-tiny-action (Predict2.5's per-latent-frame actions) with tiny-action's preset
    (mkdir -p /tmp/seeds/s$s && cd /tmp/seeds/s$s && ln -sfn /tmp/seeds/data data && \
     OMP_NUM_THREADS=1 timeout 470 taskset -c $((2 + s)) python $ROOT/train.py --config p25-tiny-action --seed $s \
        --steps 6000 --lr 3e-3 --holdout 4 --out runs/act > $LOGS/train$s.log 2>&1; \
     OMP_NUM_THREADS=1 timeout 60 taskset -c $((2 + s)) python $ROOT/evaluate.py runs/act --chunks 3 --draws 2 \
        --plot /tmp/seeds/s$s/c.png > $LOGS/eval$s.log 2>&1; \
     OMP_NUM_THREADS=1 timeout 90 taskset -c $((2 + s)) python $ROOT/policyeval.py runs/act --videos 0 \
        --out pe > $LOGS/pe$s.log 2>&1) &
done
A=/tmp/act44
timeout 60 python -c "
import numpy as np, stitch, t5
from base import lerobot
lerobot.make_synthetic('$A/raw', lengths=(44, 40, 48), height=240, width=320, motion='actions', action_width=7)
stitch.stitch('$A/raw', '$A/grid', stride=1, frames=13, size='480x640', workers=4)
rng = np.random.default_rng(0)  # stand-in prompts: the T5 shape, no download
print(t5.write_embeddings('$A/grid', lambda prompts: [rng.standard_normal((12, 1024)).astype(np.float32) * 0.1
                                                       for _ in prompts]))
import torch; from nets.vae import WanVAE, get_vae_config
torch.save(WanVAE(get_vae_config('real')).state_dict(), '/tmp/tok.pth')" > $LOGS/data.log 2>&1
S="--vae real --vae-ckpt /tmp/tok.pth --frames 13 --height 480 --width 640"
timeout 150 python -m torch.distributed.run --standalone --nproc_per_node=1 train.py --config v2w-2b-action \
    --init random --lora 32 --data $A/grid $S --workers 1 --sample-every 0 --steps 1 --out $A/run > $LOGS/sft.log 2>&1
timeout 150 python benchmarks/worldbench.py $A/run --batches 1,4,8 --steps 35,10 --repeats 1 > $LOGS/world.log 2>&1
timeout 100 python benchmarks/worldbench.py $A/run --batches 1,8 --steps 35 --compile --repeats 1 > $LOGS/world_compiled.log 2>&1
grep -h '^{' $LOGS/world.log $LOGS/world_compiled.log > $OUT/world.jsonl
timeout 80 python policyeval.py $A/run --task held-out --policies tasks.standin:random_actions \
    --judge tasks.standin:never --episodes 4 --chunks 2 --batch 4 --videos 1 --out /tmp/pe_gpu > $LOGS/pe_gpu.log 2>&1
cp /tmp/pe_gpu/result.json $OUT/pe_gpu.json
wait  # the seeds
for s in 0 1 2; do echo "{\"seed\": $s, \"evaluate\": $(grep '^{' $LOGS/eval$s.log | tail -1 || echo null), \"policyeval\": \
$(cat /tmp/seeds/s$s/pe/result.json 2>/dev/null || echo null)}"; done > $OUT/p25_tiny_seeds.jsonl
for f in $LOGS/*.log; do echo "== $f"; tail -c 2500 "$f"; done > $OUT/logs.txt
