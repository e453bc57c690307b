#!/bin/bash
# Issue 37 item 4, the 14B checks: the planner at --world 1 with train.py's 14B RL settings (--fp8 base, --compile)
# against nft_14b_compiled.sh (NFT) and grpo_14b_fast.sh (GRPO's fast path): the same network and calls, so the projected s/update
# and peak should land on the measured ones. Expected ~400 s (each plan compiles its variants first).
source "$(dirname "$0")/env.sh"
P="python benchmarks/bench.py --lora 32 --fp8 --sac block --compile --steps 2 --warmup 1 --out $OUT/plans14.jsonl"
run plan_nft14b_w1 230 $P --world 1 --config v2w-14b --rl nft --rl-k 4
run plan_grpo14b_w1 250 $P --world 1 --config v2w-14b --rl grpo --rl-k 4 --rl-steps 10 \
    --rl-set "window_size=2 window_range=0,4 same_latent=true kl_coef=0.004 rollout_batch=cfg"
