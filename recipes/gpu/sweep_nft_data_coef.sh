#!/bin/bash
# Issue 34 item 3: the regularisation sweep on the tiny default (CPU runs for NFT, GPU runs for GRPO, in parallel).
# Runs from the repository root on the GPU machine with .gpu/ carried (setup.sh and imageio-ffmpeg from recipes/gpu/pusht_wheels.sh; .gpu/grid for the 14B runs).
source "$(dirname "${BASH_SOURCE[0]}")/device.sh"  # set -u, the repo root, $OUT, imageio-ffmpeg, the card
nproc; nvidia-smi --query-gpu=name,memory.used --format=csv
S=/tmp/sweep; mkdir -p $S
save() { mkdir -p $OUT/sweep; for d in $S/*/; do n=$(basename $d); mkdir -p $OUT/sweep/$n; cp $d/metrics.jsonl $OUT/sweep/$n/ 2>/dev/null; done; cp $S/*.log $OUT/sweep/ 2>/dev/null; }
trap save EXIT
t0=$(date +%s)
OMP_NUM_THREADS=1 python train.py --out $S/base --device cpu > $S/base.log 2>&1; echo "base $(( $(date +%s) - t0 )) s"
OMP_NUM_THREADS=1 timeout 470 python tests/rl_curves.py --objectives nft --rewards brightness,red,motion \
  --settings "nft.data_coef=0,0.1,0.3,1" --seeds 0,1,2 --jobs 9 --extra "--device cpu" --out $S > $OUT/nft.txt 2>&1 &
OMP_NUM_THREADS=1 timeout 470 python tests/rl_curves.py --objectives grpo --rewards brightness,red \
  --settings "grpo.kl_coef=0,0.01,0.1,1" --seeds 0,1,2 --jobs 7 --extra "--device cuda" --out $S > $OUT/grpo.txt 2>&1 &
wait
echo "all $(( $(date +%s) - t0 )) s"
tail -20 $OUT/nft.txt | grep -v '^{'; tail -20 $OUT/grpo.txt | grep -v '^{'
