#!/bin/bash
# Issue 34 item 3, GRPO's part (CPU, 12 jobs) beside issue 37's NFT --cp 1-rank NCCL run and the 2B GRPO update (GPU).
# Runs from the repository root on the GPU machine with .gpu/ carried (setup.sh and imageio-ffmpeg from recipes/gpu/pusht_wheels.sh; .gpu/grid for the 14B runs).
source "$(dirname "${BASH_SOURCE[0]}")/device.sh"  # set -u, the repo root, $OUT, imageio-ffmpeg, the card
S=/tmp/sweep; mkdir -p $S $OUT/r37
save() { mkdir -p $OUT/sweep; for d in $S/*/; do n=$(basename $d); mkdir -p $OUT/sweep/$n; cp $d/metrics.jsonl $OUT/sweep/$n/ 2>/dev/null; done; cp $S/grpo*.log $OUT/sweep/ 2>/dev/null; }
trap save EXIT
t0=$(date +%s)
(OMP_NUM_THREADS=1 python train.py --out $S/base --device cpu > $S/base.log 2>&1; echo "base $(( $(date +%s) - t0 )) s"
OMP_NUM_THREADS=1 timeout 430 python tests/rl_curves.py --objectives grpo --rewards brightness,red \
  --settings "grpo.kl_coef=0,0.1,1" --seeds 0,1 --jobs 12 --extra "--device cpu" --out $S > $OUT/grpo.txt 2>&1) &
OUT=$OUT/r37 timeout 450 bash recipes/gpu/nft_vs_grpo_2b.sh &
wait
echo "all $(( $(date +%s) - t0 )) s"
grep -v '^{' $OUT/grpo.txt | tail -12; cat $OUT/r37/rc.txt $OUT/r37/summary.txt
