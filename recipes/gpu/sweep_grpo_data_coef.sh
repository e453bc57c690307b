#!/bin/bash
# Issue 34 item 3, GRPO's data weight over 3 seeds on the device's CPUs (cores 4-15, one run a core), beside issue 37's
# 14B GRPO update 1 or 2 on the GPU (bash recipes/gpu/grpo_14b_fast.sh WAVE, cores 0-3).
#   bash recipes/gpu/sweep_grpo_data_coef.sh 1   # data_coef 0.001, 0.003 x brightness, red x seeds 0-2; 14B GRPO update 1
#   bash recipes/gpu/sweep_grpo_data_coef.sh 2   # 0.001, 0.003 x motion and 0.005 x brightness, red; 14B GRPO update 2
source "$(dirname "${BASH_SOURCE[0]}")/device.sh"  # set -u, the repo root, $OUT, imageio-ffmpeg, the card
S=/tmp/sweep; mkdir -p $S $OUT/r37
save() { mkdir -p $OUT/sweep; for d in $S/*/; do n=$(basename $d); mkdir -p $OUT/sweep/$n
         cp $d/metrics.jsonl $OUT/sweep/$n/ 2>/dev/null; done; }
trap save EXIT
t0=$(date +%s)
OUT=$OUT/r37 taskset -c 0-3 timeout 500 bash recipes/gpu/grpo_14b_fast.sh "$1" &
[ -d $S/base/step_00001000 ] || OMP_NUM_THREADS=1 taskset -c 4 python train.py --out $S/base --device cpu > $S/base.log 2>&1
echo "base ready after $(( $(date +%s) - t0 )) s"
curves() { OMP_NUM_THREADS=1 taskset -c 4-15 timeout 480 python tests/rl_curves.py --objectives grpo --seeds 0,1,2 \
           --extra "--device cpu" --out $S "$@"; }
case "$1" in
    1) curves --rewards brightness,red --settings "grpo.data_coef=0.001,0.003" --jobs 12 > $OUT/grpo.txt 2>&1 ;;
    2) curves --rewards motion --settings "grpo.data_coef=0.001,0.003" --jobs 6 > $OUT/grpo.txt 2>&1 &
       curves --rewards brightness,red --settings "grpo.data_coef=0.005" --jobs 6 > $OUT/grpo5.txt 2>&1 &
       wait %2 %3 ;;
esac
wait
echo "all $(( $(date +%s) - t0 )) s"
grep -hv '^{' $OUT/grpo*.txt | tail -14; cat $OUT/r37/rc.txt $OUT/r37/summary.txt
