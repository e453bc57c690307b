#!/usr/bin/env bash
# Our training step against diffusers' on one GPU, and where the difference comes from. A budget-bounded run of
# `benchmarks/bench.py --vs diffusers` and its neighbours; each row is a JSON line in $OUT/peer.jsonl (the log, with
# every side's stderr, in $OUT/peer.log):
#   1. sdpa_probe x2: the SDPA backend (and its fwd+bwd time at v2w-2b's self-attention) in a fresh process, and in
#      one where our attention (model.attention, its sdpa_kernel(set_priority=True)) ran first: does ours change
#      what a later SDPA call picks? (it once did: benchmarks/peer.py's docstring)
#   2. v2w-2b full FT, --sac block + compile: ours | in-bench diffusers (GC + compile) | stock diffusers, agreement
#   3. v2w-14b LoRA r=32, --sac block + compile, bf16: the same three (stock LoRA: PEFT)
#   4. v2w-2b --sac selective + compile, ours only (its ratio against row 2's diffusers sides, in the summary)
#   5. v2w-14b LoRA r=32 --fp8, block + compile, ours only (against row 3's); skipped when under FP8_NEEDS_S remain
#   6. summary: every ratio against the stock and the in-bench diffusers time, printed and as a JSON line
# Needs one CUDA GPU (the estimates below are an H200's), diffusers==0.42.1 and, for row 3's stock side,
# PEFT >= 0.17 (without it row 3 runs without --vs-standalone and says so).
# Usage, from any directory: [OUT=dir] [BUDGET=seconds] bash benchmarks/peer_gpu.sh
# Budget: rows run in order while time is left, each given what remains; one that needs more than is left is
# recorded as skipped. BUDGET defaults to 560 s (under a 10-minute job limit). Estimated on one H200
# (BENCHMARKS.md's compile and step times, ~10-15 s of start-up per process): probes 20 s, row 2 ~170 s, row 3
# ~300 s (three 14B processes, ~45 s of compile each), row 4 ~55 s, row 5 ~100 s: at 560 s row 5 is usually skipped
# (then run it alone: python3 benchmarks/bench.py --config v2w-14b --lora 32 --fp8 --sac block --compile --steps 2
# --warmup 1 --out $OUT/peer.jsonl, ~100 s).
set -uo pipefail  # no -e: a failed row is logged with its exit code and the next one still runs
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/peer_out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)  # absolute before the cd below
cd "$(dirname "$0")/.."  # the repository root: the rows run benchmarks/bench.py, the probe imports model
J=$OUT/peer.jsonl
LOG=$OUT/peer.log
BUDGET=${BUDGET:-560}
FP8_NEEDS_S=${FP8_NEEDS_S:-110}
PY=python3

note() { echo "== $* ($SECONDS s)" | tee -a "$LOG"; }

row() {  # NAME NEEDS_S CMD...: run CMD within the budget left (its JSON lines go to $J), or record why not
  local name=$1 needs=$2 left=$((BUDGET - SECONDS)) rc
  shift 2
  if (( left < needs )); then
    note "$name skipped: $left s left, needs $needs"
    echo "{\"row\": \"$name\", \"status\": \"skipped\", \"left_s\": $left, \"needs_s\": $needs}" >> "$J"
    return
  fi
  note "$name: $* (timeout $left s)"
  timeout --kill-after=10 "$left" "$@" >> "$LOG" 2>&1
  rc=$?
  note "$name rc=$rc"
  echo "{\"row\": \"$name\", \"rc\": $rc, \"at_s\": $SECONDS}" >> "$J"
}

note "start"
nvidia-smi -L >> "$LOG" 2>&1
if ! $PY -c "import diffusers, torch; from diffusers import CosmosTransformer3DModel
print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), 'diffusers', diffusers.__version__)" \
    2>&1 | tee -a "$LOG"; then
  note "diffusers does not import: pip install diffusers==0.42.1, then run again"
  exit 2
fi
PEFT=$($PY -c "import peft; from packaging.version import Version as V
print(peft.__version__ if V(peft.__version__) >= V('0.17.0') else '')" 2>/dev/null)
note "peft: ${PEFT:-missing or < 0.17.0}"

PROBE='import json, sys, time, torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend
q = torch.randn(1, 31104, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)  # v2w-2b, DROID shape
if sys.argv[1] == "after_ours":
    import model
    with torch.no_grad():
        model.attention(q[:, :256], q[:, :256], q[:, :256])  # once, as our first block does
qt = q.transpose(1, 2)  # [B, h, L, d] over [B, L, h, d] memory: the layout both networks hand to SDPA
name = {int(v): k for k, v in SDPBackend.__members__.items()}
choice = name[torch._fused_sdp_choice(qt, qt, qt)]
for i in range(7):
    if i == 2:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
    F.scaled_dot_product_attention(qt, qt, qt).sum().backward()
torch.cuda.synchronize()
print(json.dumps(dict(row="sdpa_probe", process=sys.argv[1], choice=choice, order=torch._C._get_sdp_priority_order(),
                      fwd_bwd_s=round((time.perf_counter() - t0) / 5, 4), torch=torch.__version__,
                      cudnn=torch.backends.cudnn.version())))'
for process in fresh after_ours; do
  note "sdpa_probe $process"
  $PY -c "$PROBE" "$process" 2>>"$LOG" | tee -a "$LOG" >> "$J"
done

row v2w-2b-block 150 $PY benchmarks/bench.py --vs diffusers --vs-standalone --config v2w-2b --sac block --compile \
  --steps 3 --warmup 1 --out "$J"
STANDALONE=(--vs-standalone)
if [[ -z $PEFT ]]; then
  STANDALONE=()
  note "v2w-14b-lora-block without --vs-standalone: no PEFT >= 0.17.0 for stock diffusers' LoRA"
fi
row v2w-14b-lora-block 240 $PY benchmarks/bench.py --vs diffusers "${STANDALONE[@]}" --config v2w-14b --lora 32 \
  --sac block --compile --steps 2 --warmup 1 --out "$J"
row v2w-2b-selective 60 $PY benchmarks/bench.py --config v2w-2b --sac selective --compile --steps 3 --warmup 1 \
  --out "$J"
row v2w-14b-lora-fp8 "$FP8_NEEDS_S" $PY benchmarks/bench.py --config v2w-14b --lora 32 --fp8 --sac block --compile \
  --steps 2 --warmup 1 --out "$J"

note "summary"
$PY - "$J" <<'EOF' 2>&1 | tee -a "$LOG"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
cases = {r["case"]: r for r in rows if r.get("vs") == "diffusers"}
plain = [r for r in rows if "sac" in r and "vs" not in r and "row" not in r]
lines = ["| case | ours s | in-bench diffusers s | stock diffusers s | vs stock | vs in-bench | stock / in-bench |",
         "|---|---|---|---|---|---|---|"]
out = []
def add(name, ours, case):
    theirs, stock = (case or {}).get("diffusers", {}), (case or {}).get("stock", {})
    s = lambda side: side.get("step_s") if side.get("status") == "ok" else None
    o, t, k = s(ours), s(theirs), s(stock)
    r = lambda a, b: round(a / b, 3) if a and b else None
    out.append(dict(case=name, ours_s=o, in_bench_s=t, stock_s=k, vs_stock=r(k, o), vs_in_bench=r(t, o),
                    stock_over_in_bench=r(k, t), sdpa=[theirs.get("sdpa_choice"), stock.get("sdpa_choice")]))
    lines.append("| " + " | ".join(str(out[-1][f]) for f in ("case", "ours_s", "in_bench_s", "stock_s", "vs_stock",
                                                             "vs_in_bench", "stock_over_in_bench")) + " |")
for name, case in cases.items():
    add(f"{name} ({case['ours'].get('mode')})", case["ours"], case)
for r in plain:
    like = next((c for c in cases.values() if c["ours"].get("config") == r["config"] and
                 c["ours"].get("lora") == r["lora"]), None)
    add(f"{r['config']} lora {r['lora']} --sac {r['sac']}{' --fp8' if r['fp8'] else ''}"
        f"{' + compile' if r['compile'] else ''}", r, like)
print("\n".join(lines))
print(json.dumps(dict(row="summary", ratios=out)))
with open(sys.argv[1], "a") as f:
    f.write(json.dumps(dict(row="summary", ratios=out)) + "\n")
EOF
note "done"
