#!/bin/bash
# policyeval.py's world-model chunk time through the user's own command, on one GPU: v2w-2b-action with LoRA 32 at
# 13x480x640, batch 1, random weights and the random real-architecture VAE (speed, not quality): eager vs compiled
# (--compile auto, the default on a GPU), bf16 vs --fp8, 35 / 20 (the default) / 10 sampler steps. Each run: 1 episode x 3 chunks; its
# result.json's s_per_chunk_warm is the median of chunks 2-3 (chunk 1 also compiles: s_first_chunk).
# Then benchmarks/worldbench.py's PSNR of 35 vs 20/15/10 steps on the same chunk (random weights: the sampler's error,
# not the model's quality). Every command under `timeout`, within a 500 s budget; logs written into $OUT as they go.
# Run: OUT=... bash recipes/gpu/policyeval_speed.sh  (carry .gpu: recipes/gpu/pusht_wheels.sh packs imageio-ffmpeg)
source "$(dirname "${BASH_SOURCE[0]}")/device.sh"  # set -u, the repo root, $OUT, imageio-ffmpeg, the card
BUDGET=500
left() { echo $(( BUDGET - SECONDS < $1 ? BUDGET - SECONDS : $1 )); }  # a command's timeout, within the budget
LOGS=$OUT/logs; mkdir -p $LOGS; A=/tmp/a
timeout $(left 90) python recipes/gpu/action_data.py $A 480x640 > $LOGS/data.log 2>&1
G="--data $A/g480x640 --height 480 --width 640 --vae real --vae-ckpt /tmp/tok.pth --frames 13 --workers 1"
timeout $(left 100) python -m torch.distributed.run --standalone --nproc_per_node=1 train.py --config v2w-2b-action \
    --init random --lora 32 $G --steps 1 --sample-every 0 --save-every 100 --sac block --out $A/run > $LOGS/sft.log 2>&1
echo "setup done at ${SECONDS}s" >> $OUT/progress.txt
P="$A/run --task held-out --policies tasks.standin:random_actions --judge tasks.standin:never --episodes 1 --chunks 3
   --batch 1 --videos 0"
run() {  # run NAME SECONDS FLAGS...: policyeval.py with FLAGS, its result.json and log kept as NAME
    local name=$1 limit; limit=$(left $2); shift 2
    [ "$limit" -lt 20 ] && { echo "$name: skipped (budget)" >> $OUT/progress.txt; return; }
    timeout $limit python policyeval.py $P --out /tmp/pe_$name "$@" > $LOGS/$name.log 2>&1
    echo "$name: exit $? at ${SECONDS}s" >> $OUT/progress.txt
    cp /tmp/pe_$name/result.json $OUT/$name.json 2>/dev/null
}
run eager35 70 --compile off --steps 35
run default 120                               # the user's command as is: --compile auto (compiled), --steps 20
run compiled35 120 --steps 35
run compiled35_fp8 120 --steps 35 --fp8
run default_fp8 90 --fp8
run compiled10 80 --steps 10
timeout $(left 90) python benchmarks/worldbench.py $A/run --batches 1 --steps 35,20,15,10 --repeats 1 \
    > $LOGS/world.log 2>&1
grep -h '^{' $LOGS/world.log > $OUT/world.jsonl
python - "$OUT" > $OUT/summary.txt 2>&1 <<'EOF'
import glob, json, os, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    r = json.load(open(path))
    print(f"{os.path.basename(path)[:-5]:16s} steps {r.get('steps')}: warm {r.get('s_per_chunk_warm')} s/chunk, first "
          f"{r.get('s_first_chunk')} s, MFU warm {r.get('mfu_warm')}, peak {r.get('peak_gib')} GiB")
EOF
echo "done at ${SECONDS}s" >> $OUT/progress.txt
