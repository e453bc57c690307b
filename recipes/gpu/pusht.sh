#!/bin/bash
# Issue 51, PushT on one GPU (the lead runs it; nothing here was run on a GPU yet): gym-pusht episodes from the
# behaviour mixture (tasks/pushtworld.py, 240 instead of the CPU run's 60, played on 15 processes), the tiny action
# net trained larger than the README's CPU run (batch 8 instead of 1, 12000 steps instead of 6000), then policyeval.py
# against gym-pusht's own simulator (7 policies x 32 tasks x 3 chunks) and the judge's agreement with the env's
# coverage: all through tests/pusht_numbers.py, the script behind docs/policyeval.md's CPU numbers. Budget: 500 s;
# 12000 steps is a guess at the tiny net's GPU speed (unmeasured): the log's s_per_step says what fits next time.
# $OUT gets 8 files (the device's most): gpu.txt, pusht.log, train.log, result.json, ranking.png, metrics.jsonl, 2 mp4s
# Packages: bash recipes/gpu/pusht_wheels.sh here first (.gpu/, one carry); then run(carry [".gpu"]):
#   OUT=$OUT bash recipes/gpu/pusht.sh
# (2026-12-07: its first device try lacked cffi, pymunk's, and stopped at the import; the packing then ran the
# leave-one-family-out sweep on the device but no machine came for a second PushT try.)
source "$(dirname "${BASH_SOURCE[0]}")/device.sh"  # set -u, the repo root, $OUT, imageio-ffmpeg, the card
export OMP_NUM_THREADS=1
python3 -c "import gym_pusht, imageio_ffmpeg, cv2" || { echo "pusht.sh: gym-pusht or imageio-ffmpeg missing"; exit 1; }
W=/tmp/pusht
timeout 500 python3 tests/pusht_numbers.py --work $W --workers 15 --seeds 0 --data-episodes 240 --episodes 32 \
    --steps 12000 --train-args "--batch-size 8 --workers 4" 2>&1 | tee "$OUT/pusht.log" | grep -v "it/s"
cp $W/runs/pusht-s0.log "$OUT/train.log" 2>/dev/null
cp $W/policyeval/pusht-s0/result.json $W/policyeval/pusht-s0/ranking.png $W/runs/pusht-s0/metrics.jsonl "$OUT/" \
    2>/dev/null
cp $W/policyeval/pusht-s0/expert_ep0.mp4 $W/policyeval/pusht-s0/push_away_ep0.mp4 "$OUT/" 2>/dev/null
true
