"""Compare the metrics.jsonl of every run folder of two tests/refactor_parity.sh outputs, timings aside: bitwise.

    python tests/compare_metrics.py BEFORE AFTER    # exit 1 if any run differs or is missing
"""
import json
import os
import re
import sys

base, new = sys.argv[1], sys.argv[2]
TIMING = re.compile(r"^(s_|time|wall|mfu|peak|mem|.*_s$|.*per_s|it_s|elapsed|tflops|step_s|gib)")
bad = 0
for run in sorted(os.listdir(base)):
    p = os.path.join(base, run, "metrics.jsonl")
    if not os.path.isfile(p):
        continue
    q = os.path.join(new, run, "metrics.jsonl")
    if not os.path.isfile(q):
        print(run, "MISSING in new"); bad += 1; continue
    a = [json.loads(l) for l in open(p)]; b = [json.loads(l) for l in open(q)]
    strip = lambda r: {k: v for k, v in r.items() if not TIMING.match(k)}
    a2, b2 = [strip(r) for r in a], [strip(r) for r in b]
    if a2 == b2:
        print(f"{run}: {len(a)} rows bitwise equal ({len(a2[0])} keys compared)")
    else:
        bad += 1
        print(f"{run}: DIFFER")
        for i, (x, y) in enumerate(zip(a2, b2)):
            for k in sorted(set(x) | set(y)):
                if x.get(k) != y.get(k):
                    print("  row", i, k, x.get(k), y.get(k))
print("runs differing or missing:", bad)
sys.exit(1 if bad else 0)
