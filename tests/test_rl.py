"""RL through train.py (rl.py's driver): the held-out evaluation, a weight-0 control that stays the base bit for bit,
a reward the policy can change rising under GRPO and NFT against that control, NFT resuming bitwise."""
import json
import os

import pytest

import train
from run_utils import check, in_process, script_beside

SMALL = ["--lora", "4", "--batch-size", "2", "--eval-steps", "4", "--eval-every", "2", "--sample-every", "0"]


def run(args):
    return check(in_process(train, args))


def rows(out):
    """Last row per step (a resumed run re-appends the steps after its checkpoint)."""
    last = {}
    for line in open(os.path.join(out, "metrics.jsonl")):
        row = json.loads(line)
        last[row["step"]] = row
    return last


@pytest.fixture(scope="module")
def base(tiny_grid, tmp_path_factory):
    """A short SFT run of the tiny default: the starting point of every RL run here. 400 steps: at 150 the tiny
    DiT's samples are still noise, and GRPO's 12 updates from there moved the held-out brightness by 0.1 and 0.0
    within-group sd on seeds 0 and 1, as little as the noise-reward arm (tests/rl_curves.py's) moved it."""
    out = str(tmp_path_factory.mktemp("rl") / "base")
    run(["--data", tiny_grid, "--out", out, "--steps", "400", "--save-every", "400", "--sample-every", "0",
         "--warmup", "10"])
    return os.path.join(out, "step_00000400")


@pytest.mark.parametrize("objective,knobs", [("nft", ["--nft-group-size", "4"]),
                                             ("grpo", ["--batch-size", "4", "--grpo-num-steps", "4"])])
def test_reward_rises_against_the_weight_zero_control(objective, knobs, base, tiny_grid, tmp_path):
    """Same seed, clips and noise; the control's reward has weight 0: every group ties, nothing trains, and its
    held-out evaluation is the starting point's at every step, bit for bit. The learned run's is above it by more
    than the base's within-group sd of the reward (the spread of one group's samples at update 1). Measured with
    seeds 0, 1, 2 from this base: GRPO +2.4, +3.2, +3.8 sd, its noise-reward arm (tests/rl_curves.py) +0.5, +0.2,
    +0.1; NFT +8.6, +2.7, +3.0 sd."""
    common = ["--objective", objective, "--init", base, "--data", tiny_grid, "--steps", "12", "--save-every", "12",
              *SMALL, "--eval-every", "4", *knobs]
    learned, control = str(tmp_path / "learned"), str(tmp_path / "control")
    # independent runs: the control is `python train.py` on the second core meanwhile
    beside = script_beside(common + ["--out", control, "--reward", "reward:wrist_brightness=0"])
    run(common + ["--out", learned])
    proc = check(beside.result())
    assert "this run is a paired control" in proc.stdout
    got, ref = rows(learned), rows(control)
    term = "eval_reward_wrist_brightness"
    evals = sorted(s for s in got if term in got[s])
    assert evals == [0, 4, 8, 12] == sorted(s for s in ref if term in ref[s])
    assert got[0][term] == ref[0][term]  # the same starting point
    assert all(ref[s][term] == ref[0][term] for s in evals)  # the control is the base, bit for bit
    gain, sd = got[12][term] - ref[12][term], got[1]["reward_group_std"]
    assert sd > 0 and gain > sd, (gain, sd)  # beyond noise (the size over 30 updates: tests/rl_curves.py)
    assert all(r.get("skipped_updates", 0) == 1 or r.get("skipped_chunks", 0) == 1 for s, r in ref.items() if s)


def test_nft_resumes_bitwise(base, tiny_grid, tmp_path):
    common = ["--objective", "nft", "--init", base, "--data", tiny_grid, *SMALL, "--nft-group-size", "3",
              "--nft-decay-rate", "0.2", "--save-every", "2"]  # decay > 0 from update 2: the old adapters matter
    whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
    run(common + ["--out", whole, "--steps", "4"])
    run(common + ["--out", parts, "--steps", "2"])
    proc = run(common + ["--out", parts, "--steps", "4"])
    assert "resumed" in proc.stdout
    a, b = rows(whole), rows(parts)
    assert sorted(a) == sorted(b) == [0, 1, 2, 3, 4]
    for step in (3, 4):
        for key in ("loss", "grad_norm", "reward_mean", "old_deviation", "old_decay"):
            assert a[step][key] == b[step][key], (step, key)
    assert a[4]["eval_reward"] == b[4]["eval_reward"] and a[4]["old_deviation"] > 0
    import evaluate
    import sample
    assert sample.parse_config(["--ckpt", whole]).guidance == 0.0  # an NFT run samples CFG-free, as trained
    assert sample.parse_config(["--ckpt", whole, "--guidance", "3"]).guidance == 3.0
    assert evaluate.runs_reward([whole, parts]) == "reward:wrist_brightness"  # scored by the runs' own reward


def test_rl_flags_belong_to_their_objective():
    with pytest.raises(ValueError, match="--nft-beta does nothing with --objective grpo"):
        train.parse_config(["--objective", "grpo", "--lora", "4", "--nft-beta", "0.5"])
    with pytest.raises(ValueError, match="--grpo-eta does nothing with --objective nft"):
        train.parse_config(["--objective", "nft", "--lora", "4", "--grpo-eta", "0.7"])
    with pytest.raises(ValueError, match="--lr does nothing with --objective nft \\(use --nft-lr\\)"):
        train.parse_config(["--objective", "nft", "--lora", "4", "--lr", "1e-3"])
    with pytest.raises(ValueError, match="--eval-steps does nothing with --objective sft"):
        train.parse_config(["--eval-steps", "3"])
    with pytest.raises(ValueError, match="--guidance does nothing with --objective nft"):
        train.parse_config(["--objective", "nft", "--lora", "4", "--guidance", "3"])
    with pytest.raises(ValueError, match="trains LoRA adapters only"):
        train.parse_config(["--objective", "nft"])
    cfg = train.parse_config(["--objective", "nft", "--lora", "4", "--nft-timesteps", "2"])
    assert cfg.nft.timesteps == 2 and cfg.nft.lr == 3e-3 and cfg.reward == "reward:wrist_brightness"  # tiny preset
    keys = train.resume_keys(cfg)
    assert "nft.beta" in keys and "nft.timesteps" in keys and "nft.lr" not in keys and "grpo.eta" not in keys
