#!/bin/bash
# Refactor parity: the same tiny runs through train.py, sample.py, evaluate.py and smoke.py from one code folder.
# Run it on a clone of the commit before a refactor and on the work tree after, then compare:
#   git clone -q . /tmp/before && git -C /tmp/before checkout -q BASE
#   bash tests/refactor_parity.sh /tmp/before /tmp/p_before; bash tests/refactor_parity.sh "$PWD" /tmp/p_after
#   python tests/compare_metrics.py /tmp/p_before /tmp/p_after; md5sum /tmp/p_*/s_*.mp4
# One thread per process (OMP_NUM_THREADS=1), so the numbers are bitwise comparable; ~5 min on one core.
set -e
CODE=$1; OUT=$2; mkdir -p $OUT; cd $CODE
export OMP_NUM_THREADS=1
R="--sample-every 0 --workers 0"
python train.py --steps 60 --save-every 60 --eval-every 20 --warmup 5 $R --out $OUT/sft > $OUT/sft.log 2>&1
B=$OUT/sft/step_00000060
python train.py --objective grpo --lora 4 --init $B --guard-max-ratio 0.99 --steps 2 --save-every 2 --eval-every 1 --eval-steps 4 --batch-size 2 --grpo-group-size 3 --grpo-num-steps 4 $R --out $OUT/grpo > $OUT/grpo.log 2>&1
python train.py --objective grpo --lora 4 --init $B --guard-max-ratio 0.99 --steps 2 --save-every 2 --eval-every 1 --eval-steps 4 --batch-size 2 --grpo-group-size 3 --grpo-num-steps 6 --grpo-window-size 2 --grpo-window-range 0,4 --grpo-same-latent --grpo-rollout-batch cfg --grpo-kl-coef 0.01 $R --out $OUT/grpo_fast > $OUT/grpo_fast.log 2>&1
python train.py --objective nft --lora 4 --init $B --guard-max-ratio 0.99 --steps 2 --save-every 2 --eval-every 1 --eval-steps 4 --batch-size 2 --nft-group-size 3 $R --out $OUT/nft > $OUT/nft.log 2>&1
python train.py --config p25-tiny --steps 20 --save-every 20 --eval-every 10 --warmup 5 $R --out $OUT/p25 > $OUT/p25.log 2>&1
P=$OUT/p25/step_00000020
python train.py --config p25-tiny --objective grpo --lora 4 --init $P --guard-max-ratio 0.99 --steps 2 --save-every 2 --eval-every 1 --eval-steps 4 --batch-size 2 --grpo-group-size 3 --grpo-num-steps 4 $R --out $OUT/p25grpo > $OUT/p25grpo.log 2>&1
python train.py --config p25-tiny --objective nft --lora 4 --init $P --guard-max-ratio 0.99 --steps 2 --save-every 2 --eval-every 1 --eval-steps 4 --batch-size 2 --nft-group-size 3 $R --out $OUT/p25nft > $OUT/p25nft.log 2>&1
python train.py --config p25-tiny-agibot --steps 10 --save-every 10 --eval-every 5 --warmup 5 $R --out $OUT/agibot > $OUT/agibot.log 2>&1
A=$OUT/agibot/step_00000010
python train.py --config p25-tiny-agibot --objective nft --lora 4 --init $A --guard-max-ratio 0.99 --steps 1 --save-every 1 --eval-every 1 --eval-steps 4 --batch-size 1 --nft-group-size 2 $R --out $OUT/agnft > $OUT/agnft.log 2>&1
python train.py --config p25-tiny-agibot --objective grpo --lora 4 --init $A --guard-max-ratio 0.99 --steps 1 --save-every 1 --eval-every 1 --eval-steps 4 --batch-size 1 --grpo-group-size 2 --grpo-num-steps 4 $R --out $OUT/aggrpo > $OUT/aggrpo.log 2>&1
python sample.py --ckpt $OUT/sft --steps 6 --out $OUT/s_sft.mp4 > $OUT/s_sft.log 2>&1
python sample.py --ckpt $OUT/p25 --steps 6 --out $OUT/s_p25.mp4 > $OUT/s_p25.log 2>&1
python sample.py --ckpt $OUT/agibot --steps 6 --out $OUT/s_ag.mp4 > $OUT/s_ag.log 2>&1
python evaluate.py $OUT/sft --steps 4 --plot $OUT/c1.png > $OUT/e_sft.json 2> $OUT/e_sft.log || true
python evaluate.py $OUT/p25 --steps 4 --plot $OUT/c2.png > $OUT/e_p25.json 2> $OUT/e_p25.log || true
python smoke.py > $OUT/smoke.log 2>&1 || true
python train.py --config tiny-action --steps 20 --save-every 20 --eval-every 10 --warmup 5 $R --out $OUT/act > $OUT/act.log 2>&1
python train.py --config tiny-action --objective nft --lora 4 --init $OUT/act/step_00000020 --guard-max-ratio 10 --steps 1 --save-every 1 --eval-every 1 --eval-steps 4 --batch-size 1 --nft-group-size 2 $R --out $OUT/actnft > $OUT/actnft.log 2>&1
python train.py --config tiny-action --objective grpo --lora 4 --init $OUT/act/step_00000020 --guard-max-ratio 10 --steps 1 --save-every 1 --eval-every 1 --eval-steps 4 --batch-size 1 --grpo-group-size 2 --grpo-num-steps 4 $R --out $OUT/actgrpo > $OUT/actgrpo.log 2>&1
python sample.py --ckpt $OUT/act --steps 6 --chunks 2 --out $OUT/s_act.mp4 > $OUT/s_act.log 2>&1
python evaluate.py $OUT/act --steps 4 --chunks 2 --plot $OUT/c3.png > $OUT/e_act.json 2> $OUT/e_act.log || true
echo done
