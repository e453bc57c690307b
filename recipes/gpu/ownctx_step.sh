#!/bin/bash
# Issue 52 on the device: own-context SFT steps (--objective ownctx) of v2w-2b-action at 13x480x640, LoRA 32 and full
# fine-tune, against plain SFT steps of the same shape: seconds per step and peak memory, random weights and the
# random real-architecture VAE (speed and memory, not quality); data from recipes/gpu/action_data.py (40-frame
# episodes: 3 chained 13-frame chunks need 37). --ownctx-true-share 0 --ownctx-chunks 3: every sample is conditioned on
# a 1- or 2-chunk rollout the net makes first (k drawn in 2..3 each step, logged as ctx_chunks beside s_per_step,
# s_draw and peak_mem_gib); 6 steps each, so both chain lengths show (step 1 also pays the warm-up). --sac block.
# Took: data, the LoRA pair and the full SFT run ~190 s, own full 5 steps by 230 s (one H100): ~300 s in all.
# Run 2026-12-08 on one H100 (BENCHMARKS.md; the full pair was cut by the call's limit). Run: OUT=... bash recipes/gpu/run.sh ownctx_step
source "$(dirname "${BASH_SOURCE[0]}")/device.sh"  # set -u, the repo root, $OUT, imageio-ffmpeg, the card
LOGS=$OUT/logs; mkdir -p $LOGS; A=/tmp/own52
rm -rf $A/sft_* $A/own_*  # a run directory left by an earlier call would be resumed
timeout 120 python recipes/gpu/action_data.py $A 480x640 > $LOGS/data.log 2>&1
T="--config v2w-2b-action --init random --data $A/g480x640 --height 480 --width 640 --frames 13 --vae real \
--vae-ckpt /tmp/tok.pth --workers 1 --sample-every 0 --save-every 100 --sac block --steps 6"
O="--objective ownctx --ownctx-true-share 0 --ownctx-chunks 3 --ownctx-context-steps 10"
keep() {  # $1: a run; its metrics into $OUT at once (a later run stopped at the call's limit must not lose them)
    cp $A/$1/metrics.jsonl $OUT/$1.jsonl
    python -c "import json, sys
for r in map(json.loads, open(sys.argv[1])):
    if 's_per_step' in r: print(sys.argv[2], r['step'], {k: r.get(k) for k in ('ctx_chunks', 'ctx_calls', 's_draw',
                                                                          's_per_step', 'peak_mem_gib')})" \
        $A/$1/metrics.jsonl $1 >> $OUT/summary.txt
    rm -rf $A/$1/step_*  # the disk: a full 2B step with its optimizer is ~24 GB
}
for mode in lora full; do
    F=$([ $mode = lora ] && echo "--lora 32" || echo "")
    timeout 150 python train.py $T $F --out $A/sft_$mode > $LOGS/sft_$mode.log 2>&1; keep sft_$mode
    timeout 240 python train.py $T $F $O --out $A/own_$mode > $LOGS/own_$mode.log 2>&1; keep own_$mode
done
