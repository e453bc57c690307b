"""Issue 45 item 11: the tiny-default numbers README.md and BENCHMARKS.md quote are the ones tests/readme_numbers.py
printed last (RECORDED), and the cheap deterministic part of them is re-run here: the first PREFIX steps of the
Quickstart's `python train.py` (stopped there as a signal stops it: the schedule is the 1000-step run's)."""
import json
import os
import signal

import pytest

import readme_numbers
import train
from engine import rundir
from readme_numbers import PREFIX, RECORDED
from run_utils import check, in_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def doc(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


def test_the_docs_quote_the_numbers_the_script_printed():
    readme, bench = doc("README.md"), doc("BENCHMARKS.md")
    assert f"{RECORDED['sft/eval_loss@500']:.3f} at step 500, {RECORDED['sft/eval_loss@1000']:.3f} at 1000" in readme
    for name in ("nft", "grpo"):
        assert f"held-out {RECORDED[f'{name}/eval_reward@0']:.3f} → {RECORDED[f'{name}/eval_reward@30']:.3f}" in bench
    assert f"{RECORDED['action/steps']} steps" in readme and "tests/readme_numbers.py" in readme + bench
    assert f"(loss ratio {RECORDED['guard/ratio@100']:.3f} >=" in readme
    assert f"the ratio was {RECORDED['guard/ratio@1000']:.3f}" in readme
    assert f"{RECORDED['action/action_gap_db']:+.2f} dB" in bench
    rl_doc = doc("docs/rl.md")
    assert (f"held-out {RECORDED['nft/eval_reward@0']:.3f} → {RECORDED['nft/eval_reward@30']:.3f} (NFT) and "
            f"{RECORDED['grpo/eval_reward@0']:.3f} → {RECORDED['grpo/eval_reward@30']:.3f} (GRPO)") in rl_doc
    assert "about 0.52 (NFT) and 0.45 (GRPO)" not in rl_doc
    actions = doc("docs/actions.md")  # its `evaluate.py runs/act --chunks 3`
    assert f"held-out PSNR {RECORDED['action/chunks3/psnr']:.2f}, `action_gap_db` " \
           f"**{RECORDED['action/chunks3/action_gap_db']:+.2f}**" in actions
    assert " / ".join(f"{RECORDED[f'action/chunks3/chunk{k}/psnr']:.2f}" for k in (1, 2, 3)) in actions
    for stale in ("1.69 at step 500", "0.376 → 0.516", "→ 0.436", "ratio 0.765", "ratio was 0.371"):
        assert stale not in readme + bench, stale


class StopAfter(dict):
    """rundir.stop_on_signals' dict, whose signal comes after `steps` steps: the loop saves, evaluates and exits 0."""

    def __init__(self, steps):
        super().__init__(signal=None)
        self.steps = steps

    def __getitem__(self, key):
        self.steps -= 1
        return signal.SIGTERM if self.steps <= 0 else None


def test_the_default_runs_first_steps_give_the_recorded_loss(tiny_grid, tmp_path, monkeypatch):
    """The Quickstart's run (the tiny preset, its 1000-step schedule) stopped after PREFIX steps: the loss of step
    PREFIX is the full run's, as tests/readme_numbers.py recorded it (one thread: deterministic)."""
    monkeypatch.setattr(rundir, "stop_on_signals", lambda say: StopAfter(PREFIX))
    out = str(tmp_path / "out")
    proc = check(in_process(train, ["--data", tiny_grid, "--out", out]))
    assert f"stopping after step {PREFIX}" in proc.stdout
    rows = {r["step"]: r for r in map(json.loads, open(os.path.join(out, "metrics.jsonl")))}
    assert max(rows) == PREFIX and rows[PREFIX]["lr"] == pytest.approx(RECORDED[f"sft/lr@{PREFIX}"], rel=1e-9)
    assert rows[PREFIX]["loss"] == pytest.approx(RECORDED[f"sft/loss@{PREFIX}"], rel=1e-4)


def test_the_script_refuses_an_unknown_part(capsys):
    with pytest.raises(SystemExit):
        readme_numbers.main(["--out", "x", "--only", "sft,rl"])
    assert "unknown part(s) ['rl']" in capsys.readouterr().err
