#!/bin/bash
# Cosmos-Policy's training throughput on one H100 at the LIBERO layout (issue 53): train.py --objective policy on
# v2w-2b, 9 latent frames of 28x28 at 224 px (1,764 tokens a sample), chunk 16, at batch 8, 16, 24, 32, 48 until one
# runs out of memory; per batch: samples/s (batch / the median s_per_step of steps 3-8), MFU at cosmos-policy's
# 2.1e13 FLOP a training sample against 989 TFLOP/s (H100 bf16 dense), peak memory. Target >= 14 samples/s (2x
# cosmos-policy's ~6.9). Random weights (--init random) and the random real-architecture VAE: the pace, not the
# quality. ~8 min on one H100.
Run: OUT=... bash recipes/gpu/policy_throughput.sh
# (carry .gpu: pusht_wheels.sh's setup.sh brings imageio-ffmpeg, which the device lacks)
source "$(dirname "${BASH_SOURCE[0]}")/device.sh"  # set -u, the repo root, $OUT, imageio-ffmpeg, the card
BUDGET=${BUDGET:-560}  # seconds for the whole script
left() { echo $(( BUDGET - SECONDS < $1 ? BUDGET - SECONDS : $1 )); }
LOGS=$OUT/logs; mkdir -p $LOGS; D=/tmp/policy224
[ -f /tmp/tok.pth ] || python -c "import torch; from nets.vae import WanVAE, get_vae_config; \
torch.save(WanVAE(get_vae_config('real')).state_dict(), '/tmp/tok.pth')" > $LOGS/vae.log 2>&1
# the tiny policy's orbit episodes stitched at 224 px as a grid folder, and LIBERO's 9 slots over its one camera
# (train.py opens a views folder only for a camera net, so `--policy-layout libero` on views is for later: the same
# 9 latent frames of 28x28, the same tokens and cost)
timeout $(left 120) python -c "from base import lerobot; lerobot.make_synthetic('$D.raw', lengths=(160,) * 6, \
motion='orbit')" > $LOGS/data.log 2>&1
timeout $(left 120) python stitch.py $D.raw $D --stride 4 --frames 9 --size 224x224 --workers 8 >> $LOGS/data.log 2>&1
# stand-in T5 embeddings (v2w-2b reads 1024-wide text; train.py refuses videos without one)
python -c "import numpy as np, t5; rng = np.random.default_rng(0); t5.write_embeddings('$D', \
lambda p: [rng.standard_normal((8, 1024)).astype(np.float32) * 0.1 for _ in p])" >> $LOGS/data.log 2>&1
NINE=blank,proprio,image:grid,image:grid,action,future_proprio,future_image:grid,future_image:grid,value
V="--config v2w-2b --init random --objective policy --policy-layout $NINE --policy-chunk 16 --policy-success all
   --policy-eval-samples 2 --data $D --height 224 --width 224 --frames 9 --holdout 1 --vae real --vae-ckpt /tmp/tok.pth
   --sac block --workers 1 --steps 8 --save-every 0"
for B in ${BATCHES:-8 16 24 32 48}; do
    [ "$(left 60)" -ge 60 ] || { echo "batch $B: no time left" >> $OUT/progress.txt; break; }
    timeout $(left 150) python train.py $V --batch-size $B --out /tmp/pt_b$B > $LOGS/b$B.log 2>&1
    rc=$?
    echo "batch $B: exit $rc at ${SECONDS}s" >> $OUT/progress.txt
    cp /tmp/pt_b$B/metrics.jsonl $OUT/b$B.jsonl 2>/dev/null
    rm -rf /tmp/pt_b$B/step_*  # a 2B step with its optimizer: ~24 GB of disk
    grep -qi "out of memory" $LOGS/b$B.log && break
done
python - $OUT > $OUT/summary.txt <<'PY'
import glob, json, os, statistics, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "b*.jsonl")), key=lambda p: int(p.split("/b")[-1][:-6])):
    batch = int(path.split("/b")[-1][:-6])
    rows = [json.loads(line) for line in open(path) if '"s_per_step"' in line]
    steady = [r["s_per_step"] for r in rows if r["step"] >= 3]
    if not steady:
        print(f"batch {batch}: no steady steps ({len(rows)} logged)")
        continue
    rate = batch / statistics.median(steady)
    peak = max(r.get("peak_mem_gib") or 0 for r in rows)
    print(f"batch {batch}: {rate:.2f} samples/s, MFU {rate * 2.1e13 / 989e12:.1%}, peak {peak:.1f} GiB "
          f"(median of {len(steady)} steps)")
PY
cat $OUT/summary.txt
