#!/bin/bash
# Where p25-2b-action's training step goes at the released 13x256x320 (0.62 s a step, 3.1% MFU on one H100 before):
# train.py's own step profiled (recipes/gpu/profile_train_step.py: its 3rd step, torch.profiler tables sorted by
# CUDA and by CPU time, and the step's ranges: to_latent (VAE encode), clip_grad_norm_, AdamW.step) on a 1-rank NCCL group
# as train.py runs there, with --sac block (run_all.sh's) and --sac none. Random weights and the random
# real-architecture VAE; every command under `timeout`, within a 500 s budget; tables written into $OUT as they go.
# Run: OUT=... bash recipes/gpu/p25_step_profile.sh  (carry .gpu: recipes/gpu/pusht_wheels.sh packs imageio-ffmpeg)
source "$(dirname "${BASH_SOURCE[0]}")/device.sh"  # set -u, the repo root, $OUT, imageio-ffmpeg, the card
BUDGET=${BUDGET:-500}  # seconds for the whole script; a short device lease passes less
left() { echo $(( BUDGET - SECONDS < $1 ? BUDGET - SECONDS : $1 )); }
LOGS=$OUT/logs; mkdir -p $LOGS; A=/tmp/a
timeout $(left 90) python recipes/gpu/action_data.py $A 256x320 > $LOGS/data.log 2>&1
V="--config p25-2b-action --init random --data $A/g256x320 --height 256 --width 320 --vae real --vae-ckpt /tmp/tok.pth
   --frames 13 --workers 1 --sample-every 0 --save-every 100 --steps 3"
for sac in ${SACS:-block none}; do  # SACS="block": one mode
    timeout $(left 180) python -m torch.distributed.run --standalone --nproc_per_node=1 \
        recipes/gpu/profile_train_step.py $OUT/p25_$sac $V --sac $sac --out $A/p25_$sac > $LOGS/p25_$sac.log 2>&1
    echo "sac $sac: exit $? at ${SECONDS}s" >> $OUT/progress.txt
    cp $A/p25_$sac/metrics.jsonl $OUT/p25_$sac.jsonl 2>/dev/null
    rm -rf $A/p25_$sac/step_*  # a full 2B step with its optimizer is ~24 GB of disk
done
