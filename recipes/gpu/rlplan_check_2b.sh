#!/bin/bash
# Issue 37 item 4: bench.py --world N --rl plans an RL update per rank (benchmarks/rlplan.py), checked against the
# one-GPU train.py rows: NFT and GRPO v2w-2b eager on one rank (train.py: NFT 49.6-52.9 s, GRPO 153.3-172.4 s), NFT
# v2w-14b at --world 8 --cp 8, and cosmos-rl's NFT recipe at 14B (K 12 on 8 GPUs, 4 samples a rollout call).
# Every row appends one JSON line to $OUT/plans.jsonl. Expected ~300 s.
source "$(dirname "$0")/env.sh"
P="python benchmarks/bench.py --lora 32 --sac block --steps 2 --warmup 1 --out $OUT/plans.jsonl"
run plan_nft2b 100 $P --world 1 --config v2w-2b --rl nft --rl-k 4
run plan_grpo2b 100 $P --world 1 --config v2w-2b --rl grpo --rl-k 4
run plan_nft14b_cp8 120 $P --world 8 --cp 8 --config v2w-14b --rl nft --rl-k 4
run plan_nft14b_k12 170 $P --world 8 --config v2w-14b --rl nft --rl-k 12 --rl-set "rollout_batch=4"
