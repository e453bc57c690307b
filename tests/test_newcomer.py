"""Issue 45 items 5 and 7-10, 12: a newcomer's first hour, each wrong turn said in one line. The checkpoint the
fidelity guard names survives rotation; a small folder's hold-out is said; a short first run writes its last sample; a
missing --init step lists the steps there are, and a finished run says it is done; held-out episodes are named alike
everywhere, evaluate.py says when the runs' held-out sets or guidance differ, and a resume names a changed --holdout;
the Quickstart's outputs are ignored by git and its install steps say what to do without a venv or the CPU index."""
import json
import os
import re
import subprocess
import types

import pytest

import evaluate
import stitch
import train
from base import lerobot
from engine import resume, rl
from run_utils import check, in_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHORT = ["--sample-every", "0", "--workers", "0"]


def complete_step(out, step):
    """A directory that complete_checkpoints counts (its files are not read here)."""
    path = os.path.join(out, f"step_{step:08d}")
    os.makedirs(path)
    for name in (".metadata", "meta.json"):
        open(os.path.join(path, name), "w").write("{}")
    return path


def test_the_checkpoint_the_fidelity_guard_names_is_kept_by_rotation_or_said_to_be_gone(tmp_path):
    """Item 5: the warning names the newest checkpoint within the bound and marks it, so --keep rotation (which
    would delete it as the run goes on, warn-only) keeps it; one rotated out before the warning is said to be gone."""
    out = str(tmp_path / "run")
    for step in (5, 10, 15):
        complete_step(out, step)
    cfg = types.SimpleNamespace(max_psnr_drop=0.5, stop_on_psnr_drop=False, out=out, init="BASE")
    said = []
    history = [{"step": 0, "eval_psnr": 20.0, "eval_reward": 0.5, "eval_sd": 0.01},
               {"step": 5, "eval_psnr": 19.8, "eval_reward": 0.52, "s_checkpoint": 0.1},
               {"step": 10, "eval_psnr": 19.3, "eval_reward": 0.55, "s_checkpoint": 0.1}]
    rl.fidelity_guard(cfg, said.append, master=True)({"step": 15, "eval_psnr": 19.0, "eval_reward": 0.6}, history,
                                                     lambda stop: stop)
    assert f"{out}/step_00000005 (kept: --keep rotation never deletes it)" in said[0]
    for step in (20, 25):
        complete_step(out, step)
    resume.rotate(out, keep=2)
    assert [s for s, _ in resume.complete_checkpoints(out)] == [5, 20, 25]
    gone = str(tmp_path / "gone")
    complete_step(gone, 10)
    rl.fidelity_guard(dict_replace(cfg, out=gone), said.append, master=True)(
        {"step": 15, "eval_psnr": 19.0, "eval_reward": 0.6}, history, lambda stop: stop)
    assert "step_00000005, deleted by --keep rotation since; none is left: the base (--init BASE)" in said[-1]


def dict_replace(namespace, **changes):
    return types.SimpleNamespace(**{**vars(namespace), **changes})


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """A newcomer's 3-episode folder at the tiny size."""
    root = tmp_path_factory.mktemp("three")
    src = lerobot.make_synthetic(str(root / "src"), lengths=(48, 40, 56))
    stitch.stitch(src, str(root / "grid"), size="64x112", frames=9, stride=4, workers=1)
    return str(root / "grid")


def test_a_small_folder_says_the_tiny_presets_hold_out_leaves_fewer_to_train_on(three, tmp_path):
    """Item 7: 3 episodes, the tiny preset's --holdout 2: trains on 1, said before any model is built."""
    proc = check(in_process(train, ["--data", three, "--steps", "1", "--out", str(tmp_path / "run")] + SHORT))
    line = next(line for line in proc.stdout.splitlines() if line.startswith("WARNING"))
    assert "--holdout 2 leaves 1 of its 3 usable videos to train on" in line
    assert proc.stdout.index("WARNING") < proc.stdout.index("model: tiny")


def test_a_short_first_run_writes_its_last_sample_and_a_rerun_or_a_missing_step_is_said(tiny_grid, tmp_path):
    """Items 8-10: --steps 3 (samples every 500) writes the sample of its last step; its start-up names the held-out
    episodes by stem, as evaluate.py does; run again it says it is done; --init of a step it never saved lists the
    steps there are; a resume with another --holdout names that flag."""
    out = str(tmp_path / "run")
    proc = check(in_process(train, ["--data", tiny_grid, "--steps", "3", "--out", out, "--workers", "0"]))
    assert os.path.getsize(os.path.join(out, "sample_00000003.mp4")) > 0
    assert "evaluation: held-out episodes tiny_lerobot__ep000005, tiny_lerobot__ep000006 (the last 2 of 6" in \
        proc.stdout
    again = check(in_process(train, ["--data", tiny_grid, "--steps", "3", "--out", out, "--workers", "0"]))
    assert f"train: {out} is already at step 3 (--steps 3): nothing to train" in again.stdout
    assert "100%" not in again.stderr
    proc = in_process(train, ["--data", tiny_grid, "--objective", "nft", "--lora", "4", "--init",
                              f"{out}/step_00000300", "--out", str(tmp_path / "nft")])
    assert proc.returncode == 2 and f"its complete steps: {out}/step_00000003" in proc.stderr, proc.stderr
    assert "--init random" not in proc.stderr
    proc = in_process(train, ["--data", tiny_grid, "--steps", "4", "--holdout", "1", "--out", out] + SHORT)
    assert proc.returncode == 2 and "--holdout 2 -> 1: a resumed run keeps its held-out episodes" in proc.stderr
    assert "deleted or skipped" not in proc.stderr


def test_evaluate_says_when_the_runs_hold_out_different_episodes_or_sample_at_different_guidance(
        tiny_grid, tmp_path):
    """Item 10: two runs of one folder with --holdout 2 and 1 and guidance 7 and 3: scored on the episode they share,
    each at its own guidance, and both differences said once."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    check(in_process(train, ["--data", tiny_grid, "--steps", "1", "--out", a] + SHORT))
    check(in_process(train, ["--data", tiny_grid, "--steps", "1", "--out", b, "--holdout", "1", "--guidance", "3"]
                     + SHORT[2:]))
    proc = check(in_process(evaluate, [a, b, "--clips", "1", "--steps", "1", "--plot", str(tmp_path / "c.png")]))
    lines = proc.stdout.splitlines()
    held = [line for line in lines if "hold out different episodes" in line]
    cfg = [line for line in lines if "sample at different guidance" in line]
    assert len(held) == 1 and "scored on the 1 they all hold out" in held[0] and f"{a}: 2" in held[0], held
    assert len(cfg) == 1 and f"{a} 7, {b} 3" in cfg[0], cfg
    assert json.loads(lines[-1])["stems"] == ["tiny_lerobot__ep000006"]


def test_the_quickstarts_outputs_are_ignored_and_it_says_how_to_install_without_a_gpu_index():
    """Item 12: what the Quickstart writes is ignored by git; it makes a venv first and says what to do when the
    CPU-wheel index cannot be reached."""
    outputs = ["runs/tiny-nft/config.json", "sample.mp4", "nft.mp4", "act.mp4", "compare.png", "out/x", "data/x",
               "mine.mp4", "mine-nft.mp4", "policyeval/result.json", "policyeval_fast/result.json"]
    if os.path.exists(os.path.join(ROOT, ".git")):  # a clone's folder, or a worktree's file
        proc = subprocess.run(["git", "check-ignore", *outputs], cwd=ROOT, capture_output=True, text=True)
        assert proc.stdout.split() == outputs, proc.stdout
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    quickstart = readme[readme.index("## Quickstart"):readme.index("## The first hour")]
    assert "python -m venv" in quickstart and re.search(r"index .*(unreachable|cannot be reached)", quickstart)


def test_rl_from_a_base_holds_out_what_the_base_held_out_and_all_held_out_names_holdout_1(three, tmp_path):
    """Issue 54: 3 episodes: --holdout 3 names --holdout 1 as the way on; an SFT base trained with --holdout 1, then
    RL from its step without the flag holds out the base's 1 (said), not the tiny preset's 2."""
    proc = in_process(train, ["--data", three, "--steps", "1", "--holdout", "3", "--out", str(tmp_path / "x")] + SHORT)
    assert proc.returncode == 2 and "pass --holdout 1 (evaluate.py and policyeval.py need one" in proc.stderr
    base = str(tmp_path / "base")
    check(in_process(train, ["--data", three, "--steps", "2", "--holdout", "1", "--out", base] + SHORT))
    rl_run = str(tmp_path / "nft")
    proc = check(in_process(train, ["--data", three, "--objective", "nft", "--lora", "4", "--init",
                                    f"{base}/step_00000002", "--steps", "1", "--guard-max-ratio", "100",
                                    "--eval-every", "0", "--out", rl_run] + SHORT))
    assert f"--holdout 1, as --init {base}/step_00000002's run held out" in proc.stdout
    with open(os.path.join(rl_run, "config.json")) as f:
        assert json.load(f)["holdout"] == 1
