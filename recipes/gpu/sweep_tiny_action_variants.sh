#!/bin/bash
# Issue 36 item 4: which tiny-action variant follows its actions? tests/action_curves.py on the device's 16 CPU cores
# (one run a core): each variant trains `train.py --config tiny-action` for STEPS, evaluate.py scores every saved step.
#   bash recipes/gpu/sweep_tiny_action_variants.sh "base,abspos,..." 4000
source "$(dirname "${BASH_SOURCE[0]}")/device.sh"  # set -u, the repo root, $OUT, imageio-ffmpeg, the card
S=/tmp/sweep36
save() { cd $S && tar czf $OUT/logs.tgz --exclude='*.pt' --exclude='*.safetensors' --exclude=data --exclude='step_*' \
         --exclude='*.distcp' . 2>/dev/null; }
trap save EXIT
t0=$(date +%s)
OMP_NUM_THREADS=1 timeout 530 python tests/action_curves.py --variants "$1" --steps "$2" --save-every "${3:-1000}" \
    --jobs 16 --out $S > $OUT/curves.txt 2>&1
echo "rc $? after $(( $(date +%s) - t0 )) s"
grep -v '^{' $OUT/curves.txt | tail -60
