"""RL through train.py (engine/rl.py's driver): the held-out evaluation, a weight-0 control that stays the base bit for bit,
a reward the policy can change rising under GRPO and NFT against that control, NFT resuming bitwise, GRPO's flags,
metrics, resume and refusals, and its NaN/Inf updates and rollouts stopping the run."""
import json
import os

import pytest

import train
from run_utils import check, in_process, script_beside

SMALL = ["--lora", "4", "--batch-size", "2", "--eval-steps", "4", "--eval-every", "2", "--sample-every", "0"]


def run(args, check_rc=True):
    """train.main(args) in this process, as a CompletedProcess (check_rc: a non-zero exit fails the test)."""
    proc = in_process(train, args)
    return check(proc) if check_rc else proc


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
    seeds 0, 1, 2 from this base before the data terms: GRPO +2.4, +3.2, +3.8 sd, its noise-reward arm
    (tests/rl_curves.py) +0.5, +0.2, +0.1; NFT +8.6, +2.7, +3.0 sd. With the shipped data terms, seed 0: GRPO +1.4 sd
    at +0.004 dB held-out PSNR, NFT +1.7 sd at -0.03 dB."""
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
    assert all(ref[s]["eval_psnr"] == ref[0]["eval_psnr"] for s in evals)  # fidelity: the control's is the base's
    # the shipped data terms (--nft-data-coef 0.5, --grpo-data-coef 0.005) keep the world (docs/rl.md)
    assert got[12]["eval_psnr"] > ref[12]["eval_psnr"] - 0.1, (got[12]["eval_psnr"], ref[12]["eval_psnr"])
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
    from engine import rundir
    assert sample.parse_config(["--ckpt", whole]).guidance == 0.0  # an NFT run samples CFG-free, as trained
    assert sample.parse_config(["--ckpt", whole, "--guidance", "3"]).guidance == 3.0
    runs = [rundir.run_config(whole), rundir.run_config(parts)]
    assert evaluate.runs_reward(runs) == "reward:wrist_brightness"  # scored by the runs' own reward
    # evaluate.py on the checkpoint, with the run's --eval-steps and the evaluation's 2 draws, reprints its numbers
    proc = check(in_process(evaluate, [whole, "--steps", "4", "--draws", "2", "--clips", "2", "--seed", "0",
                                       "--plot", str(tmp_path / "cmp.png")]))
    got = json.loads(proc.stdout.strip().splitlines()[-1])["runs"][0]
    assert got["metrics"]["psnr"] == a[4]["eval_psnr"] and got["metrics"]["ssim"] == a[4]["eval_ssim"]
    assert got["metrics"]["wrist/psnr"] == a[4]["eval_psnr_wrist"] and got["rewards"]["reward"] == a[4]["eval_reward"]


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


def test_grpo_objective_updates_lora_and_resumes(tiny_grid, tmp_path):
    out = str(tmp_path / "grpo")
    args = ["--data", tiny_grid, "--out", out, "--objective", "grpo", "--lora", "4", "--save-every", "2",
            "--grpo-group-size", "3", "--grpo-num-steps", "4", "--grpo-kl-coef", "0.01", "--grpo-window-size", "2",
            "--grpo-window-range", "0,3", "--grpo-same-latent", "--reward", "default,reward_plugins:wrist_brightness=0.5",
            "--batch-size", "1", "--eval-steps", "2"]
    first = run(args + ["--steps", "2"])  # tests/reward_plugins.py: importable, tests/ is on sys.path
    assert "optimizer: AdamW betas (0.9, 0.999), weight decay 0.0001, lr 0.003 (warm-up 0, then constant)" \
        in first.stdout  # GRPO's own optimizer (the tiny RL preset's lr), not the SFT preset's (wd 0.1, beta2 0.99)
    second = run(args + ["--steps", "3", "--grpo-lr", "5e-5"])  # resumes the LoRA-only checkpoint
    assert "--grpo-lr 0.003 -> 5e-05" in second.stdout  # an optimizer change is applied and said
    by_step = rows(out)
    assert by_step[0]["eval_reward_wrist_brightness"] > 0  # the held-out evaluation before the first update
    start = by_step[0]  # with each term's spread over the held-out samples (clips x noise draws): the unit of a gain
    assert start["eval_samples"] >= 2 and start["eval_sd_wrist_brightness"] > 0 and start["eval_sd"] >= 0
    updates = {k: v for k, v in by_step.items() if k > 0}
    assert sorted(updates) == [1, 2, 3] and [r["lr"] for r in updates.values()] == [3e-3, 3e-3, 5e-5]
    for row in updates.values():
        assert row["first_ratio"] == 1.0  # rollout and training forward identical before the update
        assert 0 < row["grad_norm"] < float("inf") and 0 < row["reward_mean"]
        assert row["micro_steps"] == 3 * 2 and row["kl_ref"] is not None and row["reward_std"] >= 0
        assert row["approx_kl"] > 0 and row["clipfrac_in_update"] == 0  # measured after the step: it moved
        for key in ("adv_std", "clipfrac", "approx_kl", "s_rollout", "s_decode", "s_reward", "s_update",
                    "s_optimizer", "reward_default", "reward_wrist_brightness"):
            assert key in row, key
        assert row["window_start"] in (0.0, 1.0)  # a window of 2 inside steps [0, 3)
    assert "s_checkpoint" in updates[2] and "eval_reward" in updates[2]
    meta = json.load(open(os.path.join(out, "step_00000002", "meta.json")))
    assert meta["lora_only"] is True
    config = json.load(open(os.path.join(out, "config.json")))
    assert config["grpo"]["kl_coef"] == 0.01 and config["grpo"]["window_range"] == [0, 3]
    latent_only = run(["--data", tiny_grid, "--out", str(tmp_path / "latent"), "--objective", "grpo", "--lora", "4",
                       "--steps", "1", "--grpo-num-steps", "3", "--reward", "reward_plugins:black_latent",
                       "--batch-size", "1", "--eval-steps", "2"])
    assert "(latents only: no decoding)" in latent_only.stdout
    row = rows(str(tmp_path / "latent"))[1]
    assert row["s_decode"] < 0.01 and "reward_black_latent" in row and "reward_default" not in row
    changed = run(args + ["--steps", "4", "--grpo-kl-coef", "0.02"], check_rc=False)
    assert changed.returncode == 2 and "grpo.kl_coef" in changed.stderr  # an objective change is refused
    assert json.load(open(os.path.join(out, "config.json")))["grpo"]["kl_coef"] == 0.01  # and writes nothing


def test_every_grpo_knob_is_a_flag_and_sft_flags_are_refused_with_grpo():
    import dataclasses

    import grpo
    base = ["--objective", "grpo", "--lora", "4"]
    for f in dataclasses.fields(grpo.GRPOConfig):
        value = {bool: not f.default, int: 3, float: 0.25, str: f.default}.get(type(f.default))
        if f.name in ("window_range", "train_steps", "betas", "window_size", "eta", "num_steps", "group_size"):
            continue  # checked together below (they constrain each other)
        flag = "--grpo-" + f.name.replace("_", "-")
        argv = base + ([flag if value else "--no-grpo-" + f.name.replace("_", "-")] if isinstance(value, bool)
                       else [flag, str(value)])
        if f.name == "sde_type":
            argv = base + [flag, "cps"]
            value = "cps"
        if f.name == "pg_step_weight":
            argv, value = base + [flag, "beta2"], "beta2"
        if f.name == "std_ddof":
            argv, value = base + [flag, "1"], 1
        assert getattr(train.parse_config(argv).grpo, f.name) == value, f.name
    cfg = train.parse_config(base + ["--grpo-group-size", "4", "--grpo-num-steps", "10", "--grpo-eta", "0.7",
                                     "--grpo-window-size", "2", "--grpo-window-range", "1,6", "--grpo-betas", "0.8,0.95"])
    assert (cfg.grpo.group_size, cfg.grpo.num_steps, cfg.grpo.eta, cfg.grpo.window_range, cfg.grpo.betas) == \
        (4, 10, 0.7, (1, 6), (0.8, 0.95))
    assert train.parse_config(base + ["--grpo-train-steps", "0,2"]).grpo.train_steps == (0, 2)
    for flag in ("--lr", "--warmup", "--weight-decay", "--beta2", "--grad-clip", "--grad-accum"):
        with pytest.raises(ValueError, match=f"{flag} does nothing with --objective grpo"):
            train.parse_config(base + [flag, "1"])
    with pytest.raises(ValueError, match="--grpo-kl-coef does nothing with --objective sft"):
        train.parse_config(["--grpo-kl-coef", "0.1"])
    with pytest.raises(ValueError, match="window_size"):
        train.parse_config(base + ["--grpo-window-size", "9"])
    with pytest.raises(ValueError, match="no-grpo-recompute-old-logp"):
        train.parse_config(base + ["--compile", "--no-grpo-recompute-old-logp"])
    assert train.parse_config(base + ["--compile"]).grpo.recompute_old_logp  # needed, so set (and printed)
    for layout in ("cfg", "group"):  # batched rollout calls round unlike training's: the same rule
        assert train.parse_config(base + ["--grpo-rollout-batch", layout]).grpo.recompute_old_logp
        with pytest.raises(ValueError, match=f"--grpo-rollout-batch {layout} with --no-grpo-recompute-old-logp"):
            train.parse_config(base + ["--grpo-rollout-batch", layout, "--no-grpo-recompute-old-logp"])
    assert not train.parse_config(base).grpo.recompute_old_logp
    with pytest.raises(ValueError, match="rollout_batch='batched'; valid: none, cfg, group"):
        train.parse_config(base + ["--grpo-rollout-batch", "batched"])
    with pytest.raises(ValueError, match="nosuchmodule"):
        train.parse_config(base + ["--reward", "nosuchmodule:fn"])


def test_grpo_nonfinite_updates_stop_after_max_nonfinite_and_nan_rollouts_are_named(tiny_grid, tmp_path, monkeypatch):
    """GRPO behaves as SFT (a NaN/Inf gradient norm skips the update, counted and logged, --max-nonfinite in a row
    stop the run in one line), and a NaN rollout is named as such before any reward sees it."""
    import grpo
    args = ["--data", tiny_grid, "--objective", "grpo", "--lora", "4", "--steps", "3", "--batch-size", "1",
            "--grpo-group-size", "2", "--grpo-num-steps", "3", "--max-nonfinite", "2", "--reward",
            "default,reward_plugins:black_latent"]
    loss_of = grpo.grpo_loss
    with monkeypatch.context() as m:
        m.setattr(grpo, "grpo_loss", lambda *a, **k: (lambda loss, info: (loss * float("inf"), info))(
            *loss_of(*a, **k)))
        proc = run(args + ["--out", str(tmp_path / "nan_update")], check_rc=False)
    assert proc.returncode == 2 and "error: step 2: 2 steps in a row with a NaN/Inf loss or gradient norm " \
        "(--max-nonfinite 2), each skipped: NaN/Inf GRPO gradients" in proc.stderr, proc.stderr
    by_step = rows(str(tmp_path / "nan_update"))  # step 0: the held-out evaluation before the first update
    assert sorted(by_step) == [0, 1, 2] and all(by_step[s]["nonfinite_steps"] == 1 and
                                                by_step[s]["skipped"] == "nonfinite" for s in (1, 2))
    rollout = grpo.rollout_group

    def diverged(*a, **k):
        ro = rollout(*a, **k)
        ro.x0_final[0, 0, 0, 0, 0] = float("nan")
        return ro
    monkeypatch.setattr(grpo, "rollout_group", diverged)
    proc = run(args + ["--out", str(tmp_path / "nan_rollout")], check_rc=False)
    assert proc.returncode == 2 and "RL rollouts of 1 of 1 groups are NaN/Inf before scoring (the rewards were " \
        "not called); group 0 (key (0, 0)): its inputs are finite: the policy diverged" in proc.stderr, proc.stderr
    assert "reward term" not in proc.stderr


def test_a_diverged_policy_is_named_by_the_held_out_evaluation_not_the_reward(tiny_grid, tmp_path):
    """An absurd --grpo-lr diverges the policy in its first update; the held-out evaluation after it finds NaN samples
    and says so, instead of calling the reward on them (which blamed the reward plug-in: "its reward is not
    finite"). Finite samples beyond rl.MAX_SAMPLE_ABS are named likewise."""
    import torch

    from engine import rl
    proc = run(["--data", tiny_grid, "--objective", "grpo", "--lora", "4", "--grpo-lr", "1e6", "--steps", "2",
                "--batch-size", "1", "--grpo-group-size", "2", "--grpo-num-steps", "3", "--eval-steps", "2",
                "--eval-every", "1", "--sample-every", "0", "--reward", "reward_plugins:black_latent",
                "--out", str(tmp_path / "diverged")], check_rc=False)
    assert proc.returncode == 2 and "error: the held-out evaluation: FloatingPointError: held-out samples of 1 of 1 " \
        "groups are NaN/Inf before scoring (the rewards were not called); group 0 (key ('held-out', 0)): its inputs are " \
        "finite: the policy diverged (lower the --grpo-lr" in proc.stderr, proc.stderr
    assert "reward term" not in proc.stderr
    with pytest.raises(FloatingPointError, match=r"RL rollouts of 1 of 2 groups reach \|x\| = 1e\+08 .*diverged"):
        rl.check_samples([torch.zeros(2, 1, 1, 1, 1), torch.full((2, 1, 1, 1, 1), 1e8)], [None, None])


def test_a_run_keeps_its_objective_and_records_only_its_own_preset(tiny_grid, tmp_path):
    """An NFT run resumed as GRPO is refused in one line that names the objectives (not the GRPO preset values an NFT
    run never used), and the NFT run's config.json records the tiny RL preset for NFT only."""
    out = str(tmp_path / "nft")
    common = ["--lora", "4", "--batch-size", "1", "--eval-steps", "2", "--sample-every", "0", "--data", tiny_grid,
              "--steps", "1", "--save-every", "1", "--out", out]
    run(["--objective", "nft", "--nft-group-size", "2", *common])
    saved = json.load(open(os.path.join(out, "config.json")))
    assert saved["nft"]["group_size"] == 2 and saved["nft"]["lr"] == 3e-3  # the flag, then the preset's lr
    assert saved["grpo"] == json.loads(json.dumps(train.dataclasses.asdict(train.GRPOConfig())))  # untouched
    proc = run(["--objective", "grpo", "--grpo-num-steps", "3", *common], check_rc=False)
    line = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and f"{out} was written by --objective nft, this run is --objective grpo: a run " \
        "keeps its objective. Use a new --out (to start from that run's weights: --init " in line, line
    assert "group_size" not in line and "num_steps" not in line


def test_the_fidelity_guard_warns_once_and_names_the_newest_checkpoint_within_the_bound(tmp_path):
    """rl.fidelity_guard on made-up evaluation rows: step 0's PSNR and reward are the control's."""
    import types

    from engine import rl
    for name in (".metadata", "meta.json"):  # step 5 saved (the guard names, and keeps, only a step still there)
        os.makedirs(tmp_path / "OUT" / "step_00000005", exist_ok=True)
        (tmp_path / "OUT" / "step_00000005" / name).write_text("{}")
    cfg = types.SimpleNamespace(max_psnr_drop=0.5, stop_on_psnr_drop=False, out=str(tmp_path / "OUT"), init="BASE")
    said = []
    watch = rl.fidelity_guard(cfg, said.append, master=True)
    history = [{"step": 0, "eval_psnr": 20.0, "eval_reward": 0.5, "eval_sd": 0.01},
               {"step": 5, "eval_psnr": 19.8, "eval_reward": 0.52, "s_checkpoint": 0.1},
               {"step": 10, "eval_psnr": 19.3, "eval_reward": 0.55, "s_checkpoint": 0.1}]
    agree = lambda stop: stop  # noqa: E731  (one rank)
    watch({"step": 5, "eval_psnr": 19.8, "eval_reward": 0.52}, history[:1], agree)
    assert said == []  # 0.2 dB: within the bound
    watch({"step": 15, "eval_psnr": 19.4, "eval_reward": 0.56}, history, agree)
    assert len(said) == 1 and "step 15" in said[0] and "0.60 dB below" in said[0] and "OUT/step_00000005" in said[0]
    watch({"step": 20, "eval_psnr": 18.0, "eval_reward": 0.6}, history, agree)
    assert len(said) == 1  # once
    watch({"step": 25, "eval_psnr": 19.9, "eval_reward": 0.48}, history, agree)  # below step 0 by > its spread
    assert len(said) == 2 and "not learning this reward" in said[1]
    stopping = rl.fidelity_guard(dataclass_replace(cfg, stop_on_psnr_drop=True), said.append, master=True)
    with pytest.raises(rl.FidelityStop, match="newest checkpoint within the bound: .*OUT/step_00000005"):
        stopping({"step": 15, "eval_psnr": 19.4, "eval_reward": 0.56}, history, agree)
    other_rank = rl.fidelity_guard(dataclass_replace(cfg, stop_on_psnr_drop=True), said.append, master=False)
    with pytest.raises(rl.FidelityStop, match="rank 0 stopped"):  # rank 0 decided (agree: any rank)
        other_rank({"step": 15, "eval_psnr": 19.4, "eval_reward": 0.56}, [], lambda stop: True)
    fresh = rl.fidelity_guard(cfg, said.append, master=True)
    fresh({"step": 5, "eval_psnr": 1.0, "eval_reward": 0.0}, history[1:], agree)  # no step-0 row: said, guard off
    assert "the guard is off" in said[-1]


def dataclass_replace(namespace, **changes):
    import types
    return types.SimpleNamespace(**{**vars(namespace), **changes})


def test_a_run_built_to_hack_is_stopped_by_the_fidelity_guard(base, tiny_grid, tmp_path):
    """A learning rate 10x the preset's on the brightness reward, no data term: the held-out PSNR falls past the
    bound within a few updates; --stop-on-psnr-drop ends the run after that evaluation (its row logged), naming the
    newest checkpoint that was within the bound; PSNR, SSIM and every camera's are logged from step 0."""
    out = str(tmp_path / "hack")
    proc = run(["--objective", "nft", "--init", base, "--data", tiny_grid, *SMALL, "--nft-group-size", "4",
                "--nft-lr", "3e-2", "--nft-data-coef", "0", "--steps", "12", "--save-every", "2", "--eval-every", "2",
                "--max-psnr-drop", "0.3", "--stop-on-psnr-drop", "--out", out], check_rc=False)
    assert proc.returncode == 2 and "--stop-on-psnr-drop: step" in proc.stderr, proc.stderr[-2000:]
    got = rows(out)
    last = max(got)
    assert last < 12 and got[0]["eval_psnr"] - got[last]["eval_psnr"] > 0.3
    assert all(got[0]["eval_psnr"] - got[s]["eval_psnr"] <= 0.3 for s in got if s and s < last and "eval_psnr" in got[s])
    for key in ("eval_ssim", "eval_psnr_ext_1", "eval_psnr_ext_2", "eval_psnr_wrist", "eval_ssim_wrist", "eval_sd_psnr"):
        assert key in got[0] and key in got[last]
    best = max([s for s in got if s and s < last and "s_checkpoint" in got[s]] or [0])  # saved, within the bound
    assert (f"step_{best:08d}" if best else "none saved") in proc.stderr
