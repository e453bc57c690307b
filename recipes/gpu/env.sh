# Sourced by recipes/gpu/*.sh (issue 37): device.sh's preamble, the random real-architecture VAE,
# the stitched data, and a summary of metrics.jsonl files. OUT: the folder whose files come back.
source "$(dirname "${BASH_SOURCE[0]}")/device.sh"  # set -u, the repo root, $OUT, imageio-ffmpeg, the card
export PYTHONPATH=tests  # tests/reward_plugins.py: the latent reward term of the RL rows
if [ ! -f .gpu/grid/manifest.jsonl ]; then
    cat >&2 <<'MSG'
.gpu/grid is missing: build it on the CPU side (no GPU needed), then run this script again:
  python -c "from base import lerobot; lerobot.make_synthetic('.gpu/raw', lengths=(400, 380))"
  python stitch.py .gpu/raw .gpu/grid --stride 4 --frames 93 --size 432x768 --workers 1
  (stand-in T5 embeddings: t5.write_embeddings into .gpu/grid/t5_xxl, as the earlier sessions did)
MSG
    exit 2
fi
python -c "import torch; print('torch', torch.__version__)" >> "$OUT/gpu.txt"
[ -f /tmp/tok.pth ] || python -c "import torch; from nets.vae import WanVAE, get_vae_config; \
torch.save(WanVAE(get_vae_config('real')).state_dict(), '/tmp/tok.pth')"
D="--init random --data .gpu/grid --vae real --vae-ckpt /tmp/tok.pth --frames 93 --height 432 --width 768 --lora 32 \
--sac block --workers 1 --eval-steps 1 --batch-size 1"
S0=$SECONDS

run() {  # run NAME SECONDS CMD...: the command under `timeout`, its log and exit code under $OUT
    local name=$1 limit=$2
    shift 2
    echo "$name: $*" >> "$OUT/commands.txt"
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    echo "$name rc $? after $((SECONDS - S0)) s of the script" >> "$OUT/rc.txt"
}

summary() {  # summary RUN_DIR NAME: metrics.jsonl copied and one line per update (seconds per phase, compile, peak)
    [ -f "$1/metrics.jsonl" ] || { echo "$2: no metrics.jsonl in $1" >> "$OUT/summary.txt"; return; }
    cp "$1/metrics.jsonl" "$OUT/$2.jsonl"
    python - "$1/metrics.jsonl" "$2" >> "$OUT/summary.txt" <<'PY'
import json, sys
keys = ("s_per_step", "s_compile", "s_rollout", "s_decode", "s_reward", "s_update", "s_optimizer", "peak_mem_gib",
        "window_start", "first_ratio", "micro_steps", "old_deviation", "reward_std", "loss")
for row in map(json.loads, open(sys.argv[1])):
    if "s_per_step" in row:
        print(sys.argv[2], "update", row["step"], " ".join(f"{k}={row[k]:.4g}" if isinstance(row.get(k), float)
                                                          else f"{k}={row.get(k)}" for k in keys if k in row))
PY
}
