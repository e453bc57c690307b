"""evaluate.py: weight-free metrics (PSNR, SSIM, camera views) checked by hand, and the comparison of a Path B grid run
with a Path A views run trained on one synthetic LeRobot source (runs and evaluations in this process:
run_utils.in_process)."""
import json
import math
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import evaluate
import sample
import stitch
import train
from base.cli import recipe
from clips import data, fidelity
from engine.runs import held_out_stems, open_run, run_guidance
from run_utils import check, in_process

TINY = recipe("tiny")  # the tiny preset's clips (recipes/tiny.py)

# -----------------------------------------------------------------------------
# Metrics


def test_psnr_by_hand():
    black = torch.full((2, 3, 2, 16, 16), -1.0)
    pred = black.clone()
    pred[0, :, 0] += 0.2  # intensity 0.1 in frame 0: MSE 0.01, 20 dB
    pred[0, :, 1] += 0.02  # 0.01 in frame 1: MSE 1e-4, 40 dB
    pred[1] = 1.5  # clamped to white: MSE 1, 0 dB
    got = fidelity.psnr(pred, black)
    assert got.shape == (2,) and got.dtype == torch.float64
    assert got[0].item() == pytest.approx(30.0, abs=1e-4)  # the mean of the frames' PSNR, not of a pooled MSE (23 dB)
    assert got[1].item() == pytest.approx(0.0, abs=1e-6)
    assert fidelity.psnr(black, black).tolist() == [math.inf, math.inf]
    with pytest.raises(ValueError, match="one shape"):
        fidelity.psnr(pred, black[:1])


def test_ssim_by_hand_symmetric_and_per_sample():
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(2, 3, 3, 24, 20, generator=gen) * 2 - 1
    assert fidelity.ssim(x, x).tolist() == pytest.approx([1.0, 1.0], abs=1e-6)
    a = torch.full((1, 3, 2, 16, 16), 0.0)  # intensity 0.5 against 0.6: only the luminance term is left
    got = fidelity.ssim(a, a + 0.2).item()
    assert got == pytest.approx((2 * 0.5 * 0.6 + 1e-4) / (0.5 ** 2 + 0.6 ** 2 + 1e-4), abs=1e-5)
    noisy = (x + 0.3 * torch.randn(x.shape, generator=gen)).clamp(-1, 1)
    s = fidelity.ssim(x, noisy)
    assert torch.equal(s, fidelity.ssim(noisy, x)) and (s < 0.9).all() and (s > 0).all()
    assert fidelity.ssim(x[1:], noisy[1:]).item() == pytest.approx(s[1].item(), abs=1e-12)  # samples independent
    shifted = (x + 0.1).clamp(-1, 1)  # a constant brightness shift costs a little, noise a lot
    assert (fidelity.ssim(x, shifted) > s).all()
    with pytest.raises(ValueError, match="window"):
        fidelity.ssim(x[..., :10, :], x[..., :10, :])


def test_ssim_matches_skimage():
    metrics = pytest.importorskip("skimage.metrics")
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(1, 3, 1, 32, 40, generator=gen)
    y = (x + 0.2 * torch.randn(x.shape, generator=gen)).clamp(0, 1)
    ref = metrics.structural_similarity(x[0, :, 0].double().numpy(), y[0, :, 0].double().numpy(), channel_axis=0,
                                        data_range=1.0, gaussian_weights=True, sigma=1.5, use_sample_covariance=False)
    assert fidelity.ssim(x * 2 - 1, y * 2 - 1).item() == pytest.approx(ref, abs=1e-4)


def test_camera_views_of_a_grid_and_of_views():
    grid = torch.full((1, 3, 2, 8, 12), -1.0)
    grid[..., :4, :6], grid[..., :4, 6:], grid[..., 4:, :6] = 0.1, 0.2, 0.3  # ext_1, ext_2, wrist; black cell
    cells = fidelity.camera_views(grid, "grid")
    assert list(cells) == ["ext_1", "ext_2", "wrist"]
    assert [v.shape for v in cells.values()] == [(1, 3, 2, 4, 6)] * 3
    assert [v.unique().item() for v in cells.values()] == pytest.approx([0.1, 0.2, 0.3])
    views = torch.stack([torch.full((3, 2, 8, 12), float(i)) for i in range(3)])[None]  # data.VIEW_ORDER
    by_name = fidelity.camera_views(views, "views", size=(4, 6))
    assert all(by_name[name].unique().item() == i for i, name in enumerate(data.VIEW_ORDER))
    checker = torch.tensor([[1.0, -1.0], [-1.0, 1.0]]).repeat(4, 6).expand(1, 3, 2, 8, 12)
    assert torch.equal(fidelity.resize(checker, (4, 6)), torch.zeros(1, 3, 2, 4, 6))  # area: each 2x2 block's mean
    with pytest.raises(ValueError, match="views"):
        fidelity.camera_views(grid, "views")


def test_held_out_stems_and_guidance_as_train_computes_them():
    videos = [data.Video(stem=f"v{i:03d}", path="", prompt="", frames=9) for i in range(120)]
    assert held_out_stems(videos, -1) == {"v118": 118, "v119": 119}  # 2%, the last in order
    assert held_out_stems(videos[:10], -1) == {"v009": 9}  # at least one
    assert held_out_stems(videos, 0) == {}
    sft = {"objective": "sft", "guidance": 7.0}
    assert run_guidance("r", sft, -1.0) == 7.0 and run_guidance("r", sft, 2.0) == 2.0
    assert run_guidance("r", {"objective": "grpo", "guidance": 7.0, "grpo": {"guidance": 4.5}}, -1) == 4.5
    assert run_guidance("r", {"objective": "nft", "nft": {"guidance": 0.0}}, -1) == 0.0
    with pytest.raises(ValueError, match="pass --guidance"):
        run_guidance("r", {"objective": "nft"}, -1)


def test_curves_and_plot(tmp_path):
    rl, sft = tmp_path / "rl", tmp_path / "sft"
    rl.mkdir(), sft.mkdir()
    rows = [{"step": 1, "reward_mean": 0.2}, {"step": 2, "reward_mean": 0.3, "eval_reward": 0.25,
                                              "eval_reward_default": 0.25}]
    (rl / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "rew')  # torn
    (sft / "metrics.jsonl").write_text(json.dumps({"step": 5, "loss": 1.0, "eval_loss": 0.8}) + "\n")
    curves = [("rl", evaluate.read_curves(str(rl))), ("sft", evaluate.read_curves(str(sft)))]
    assert curves[0][1] == {"eval_reward": [(2, 0.25)], "reward_mean": [(1, 0.2), (2, 0.3)]}
    assert curves[1][1] == {"eval_loss": [(5, 0.8)]}
    pytest.importorskip("matplotlib")
    path = str(tmp_path / "cmp.png")
    assert evaluate.plot_curves(path, curves) == ["eval_reward", "reward_mean", "eval_loss"]
    assert os.path.getsize(path) > 0 and sorted(os.listdir(tmp_path)) == ["cmp.png", "rl", "sft"]  # no temporary
    assert evaluate.plot_curves(str(tmp_path / "none.png"), [("x", {})]) == [] and not (tmp_path / "none.png").exists()
    (sft / "metrics.jsonl").write_text('{"step": 1\n' + json.dumps({"step": 2, "eval_loss": 1.0}) + "\n")
    with pytest.raises(ValueError, match="metrics.jsonl:1"):
        evaluate.read_curves(str(sft))


# -----------------------------------------------------------------------------
# Runs: Path B (Predict2 grid) and Path A (Predict2.5 views) of one synthetic LeRobot source


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"grid": run, "views": run, ...}: 2-step runs with --holdout 1 on a grid and a views folder stitched from
    one source (4 episodes, held out: the last, raw__ep000003), at train.py's tiny sizes."""
    root = tmp_path_factory.mktemp("evaluate")
    raw = str(root / "raw")
    stitch.make_synthetic(raw, lengths=(48, 40, 56, 44), cameras=True)
    size = f"{TINY['height']}x{TINY['width']}"
    out = {}
    for layout, config in (("grid", "tiny"), ("views", "p25-tiny-agibot")):
        stitch.stitch(raw, str(root / layout), stride=4, frames=TINY["frames"], size=size, workers=1,
                      layout=layout)
        out[layout] = str(root / f"run_{layout}")
        check(in_process(train, ["--config", config, "--data", str(root / layout), "--out", out[layout], "--steps",
                                 "2", "--holdout", "1"]))
    return out


def test_a_grid_run_and_a_views_run_in_one_table_and_one_plot(runs, tmp_path):
    plot = str(tmp_path / "compare.png")
    proc = check(in_process(evaluate, [runs["grid"], runs["views"], runs["grid"], "--steps", "2", "--plot", plot]))
    lines = proc.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    head = next(line for line in lines if line.startswith("run "))
    assert all(f"{c} {m}" in head for c in ("ext_1", "ext_2", "wrist") for m in ("psnr", "ssim"))
    assert "reward" in head and "default" in head
    assert [line.split()[0] for line in lines[lines.index(head) + 1: -1]] == [runs["grid"], runs["views"], runs["grid"]]
    assert result["stems"] == ["raw__ep000003"] and result["view_size"] == [32, 56]  # the grid's cell size
    rows = result["runs"]
    assert [(r["family"], r["step"], r["guidance"]) for r in rows[:2]] == [("Predict2 grid", 2, 7.0),
                                                                          ("Predict2.5 views", 2, 7.0)]
    for row in rows:
        values = [*row["metrics"].values(), *row["rewards"].values()]
        assert len(row["metrics"]) == 8 and all(math.isfinite(v) for v in values)
        assert -1 < row["metrics"]["ssim"] < 1 and row["rewards"]["reward"] > 0  # SSIM may be < 0 for noise
    assert rows[0] == rows[2]  # the same run twice: the same numbers
    assert rows[0]["metrics"] != rows[1]["metrics"]
    assert os.path.getsize(plot) > 0 and f"wrote {plot} (eval_loss)" in proc.stdout


def test_both_runs_see_the_same_episode_camera_by_camera(runs):
    """The held-out truth of the grid run and of the views run, cut into cameras at the common size, is one episode:
    each camera matches its namesake (stitched from one source camera, once into a cell, once at full size)
    and no other."""
    cfg = evaluate.parse_config([runs["grid"], runs["views"]])
    grid, views = (open_run(runs[k], cfg.ema, cfg.guidance) for k in ("grid", "views"))
    truth_grid = evaluate.held_out_clip(grid, "raw__ep000003", torch.device("cpu"))[0]
    truth_views = evaluate.held_out_clip(views, "raw__ep000003", torch.device("cpu"))[0][None]
    cells = fidelity.camera_views(truth_grid, "grid", (32, 56))
    full = fidelity.camera_views(truth_views, "views", (32, 56))
    for a in fidelity.CAMERAS:
        for b in fidelity.CAMERAS:
            match = fidelity.psnr(cells[a], full[b]).item()
            assert match > 20 if a == b else match < 12, (a, b, match)  # measured: 24.5-26 dB, 7-8.4 dB


def test_refusals_name_the_run_before_any_model_is_built(runs, tiny_grid, tmp_path):
    other = str(tmp_path / "other")  # held out: the last video of the tiny default's own synthetic source
    check(in_process(train, ["--data", tiny_grid, "--out", other, "--steps", "1", "--holdout", "1"]))
    trained_on_all = str(tmp_path / "all")
    check(in_process(train, ["--data", tiny_grid, "--out", trained_on_all, "--steps", "1", "--holdout", "0"]))
    broken = str(tmp_path / "broken")
    shutil.copytree(runs["grid"], broken)
    os.remove(os.path.join(broken, "step_00000002", "meta.json"))
    edited = str(tmp_path / "edited")  # the held-out count edited in config.json after training
    shutil.copytree(runs["grid"], edited)
    with open(os.path.join(edited, "config.json")) as f:
        saved = json.load(f)
    with open(os.path.join(edited, "config.json"), "w") as f:
        json.dump(dict(saved, holdout=saved["holdout"] + 1), f)
    (tmp_path / "empty").mkdir()
    others = data.list_videos(tiny_grid)[-1].stem  # the last video of another synthetic source
    cases = [([other, runs["views"]], ["raw__ep000003", others, "no common episode"]),
             ([str(tmp_path / "empty")], ["empty: not a train.py run directory"]),
             ([broken], [broken, "missing or incomplete"]),
             ([trained_on_all], [trained_on_all, "--holdout 0"]),
             ([edited], [edited, "config.json disagrees", "holdout 2 in config.json, 1 in the step"]),
             ([runs["grid"], "--ema"], [runs["grid"], "kept no EMA"]),
             ([runs["grid"], "--reward", "default,reward_plugins:black_latent"], ["black_latent", "read the latent"]),
             ([runs["grid"], "--plot", os.path.join(runs["grid"], "cmp.png")], ["inside the run"]),
             ([runs["grid"], "--guidance", "-2"], ["--guidance -2.0"])]
    for argv, words in cases:
        proc = in_process(evaluate, argv)
        assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
        assert proc.stderr.startswith("evaluate.py: error: ") and proc.stderr.count("\n") == 1, proc.stderr
        assert all(w in proc.stderr for w in words), (words, proc.stderr)
        assert "ckpt: resumed" not in proc.stdout  # refused before a network was built
    assert not os.path.exists(os.path.join(runs["grid"], "cmp.png"))
    proc = in_process(sample, ["--ckpt", edited, "--steps", "1", "--out", str(tmp_path / "s.mp4")])  # any reader
    assert proc.returncode == 2 and "config.json disagrees" in proc.stderr and "holdout 2 in config.json" in proc.stderr


# -----------------------------------------------------------------------------
# Issue 35: outputs checked before any work, no result lost to a late failure, damaged runs named


def refused(argv, *words, module=evaluate):
    """The one error line of a run refused before any checkpoint was read, checked to hold `words`."""
    proc = in_process(module, argv)
    prog = f"{module.__name__}.py"
    assert proc.returncode == 2 and proc.stderr.startswith(f"{prog}: error: "), (proc.stdout[-2000:], proc.stderr)
    assert proc.stderr.count("\n") == 1 and "ckpt:" not in proc.stdout, (proc.stdout[-2000:], proc.stderr)
    assert all(w in proc.stderr for w in words), (words, proc.stderr)
    return proc.stderr


def test_an_unwritable_plot_is_refused_before_any_clip_is_sampled(runs, tmp_path, monkeypatch):
    """Item 3: today every clip is sampled and scored, then the plot fails and every result is lost."""
    (tmp_path / "a_file").write_text("x")
    nodir, locked = tmp_path / "nodir", tmp_path / "locked"
    refused([runs["grid"], "--plot", str(nodir / "cmp.png")], f"--plot {nodir / 'cmp.png'}: its folder {nodir} "
            "does not exist", f"mkdir -p {nodir}")
    refused([runs["grid"], "--plot", str(tmp_path / "a_file" / "cmp.png")], f"{tmp_path / 'a_file'} is not a folder")
    locked.mkdir()
    access = os.access  # root writes anywhere: a folder this process may not write into, as access(2) says
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if os.fspath(p) == str(locked) else
                        access(p, mode, **kw))
    refused([runs["grid"], "--plot", str(locked / "cmp.png")], f"its folder {locked} is not writable")


def test_a_plot_that_fails_late_loses_no_result(runs, tmp_path, monkeypatch):
    """Item 3: a plot that fails after the work (a full disk, a folder removed meanwhile): the table and the JSON are
    printed first, then the one error line."""
    def full(path, curves, note=""):
        raise OSError(28, "No space left on device", path)
    monkeypatch.setattr(evaluate, "plot_curves", full)
    plot = str(tmp_path / "cmp.png")
    proc = in_process(evaluate, [runs["grid"], "--steps", "1", "--plot", plot])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"--plot {plot}: not written (No space left on device)" in proc.stderr
    assert "the table and JSON above hold every result" in proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert any(line.startswith("run ") for line in lines)
    assert json.loads(lines[-1])["runs"][0]["run"] == runs["grid"]


def test_a_damaged_run_config_is_named_with_the_fix(runs, tmp_path):
    """Item 5: not "Expecting value: line 53 column 16 (char 1041)": the file, what is wrong, a command that fixes it
    (evaluate.py and sample.py alike)."""
    run = str(tmp_path / "run")
    shutil.copytree(runs["grid"], run)
    config = os.path.join(run, "config.json")
    with open(config) as f:
        text = f.read()
    with open(config, "w") as f:
        f.write(text[: len(text) // 2])
    words = (f"{config}: truncated or damaged (JSONDecodeError: ", f"{run}/step_00000002/meta.json")
    message = refused([run], *words)
    refused(["--ckpt", run], *words, module=sample)
    fix = re.search(r"`python (-c .*?)`", message).group(1)  # the command it names restores the file
    subprocess.run(f"{sys.executable} {fix}", shell=True, check=True)
    with open(config) as f:
        assert json.load(f) == json.loads(text)


def test_a_truncated_newest_step_names_the_step_to_evaluate_instead(tiny_grid, tmp_path):
    """Item 7 for evaluate.py: the damaged file, the newest whole earlier step, and that step evaluates when given."""
    run = str(tmp_path / "run")
    check(in_process(train, ["--data", tiny_grid, "--out", run, "--steps", "2", "--save-every", "1",
                             "--sample-every", "0"]))
    shard = os.path.join(run, "step_00000002", "__0_0.distcp")
    os.truncate(shard, 1000)
    refused([run, "--steps", "1"], f"{shard}: truncated (1000 of the", f"pass it explicitly: {run}/step_00000001")
    step = os.path.join(run, "step_00000001")
    proc = check(in_process(evaluate, [step, "--steps", "1", "--clips", "1", "--plot", str(tmp_path / "c.png")]))
    row = json.loads(proc.stdout.strip().splitlines()[-1])["runs"][0]
    assert (row["run"], row["step"]) == (step, 1) and "wrote" in proc.stdout  # curves: the run's metrics.jsonl


def test_the_plot_says_where_it_goes_and_never_overwrites_another_file(runs, tmp_path):
    """Item 18: compare.png in the current folder is named, a file evaluate.py did not write is never overwritten,
    and its own earlier plot is replaced with a word."""
    mine = tmp_path / "compare.png"
    mine.write_bytes(b"my own figure")
    refused([runs["grid"], "--plot", str(mine)], f"--plot {mine}: {mine} exists and is not a plot evaluate.py wrote",
            "another --plot")
    assert mine.read_bytes() == b"my own figure"
    where = os.path.abspath("compare.png")  # the default, in the current folder
    proc = check(in_process(evaluate, [runs["grid"], "--steps", "1"]))
    assert f"evaluate: the plot goes to {where}\n" in proc.stdout and f"evaluate: wrote {where} (" in proc.stdout
    proc = check(in_process(evaluate, [runs["grid"], "--steps", "1"]))
    assert f"evaluate: the plot goes to {where} (replacing the earlier evaluate.py plot there)" in proc.stdout
    assert "overwrote the earlier evaluate.py plot" in proc.stdout


def test_an_rl_run_with_no_checkpoint_yet_says_when_it_saves(runs, tmp_path):
    """Item 18: the Quickstart's `evaluate.py RUN` on an RL run before its first save."""
    with open(os.path.join(runs["grid"], "config.json")) as f:
        settings = json.load(f)
    for save_every, when in ((15, "saves every 15 steps (--save-every) and at its end (step 30)"),
                             (0, "saves only at its end (step 30; --save-every 0) and when stopped by SIGTERM")):
        run = tmp_path / f"nft{save_every}"
        run.mkdir()
        (run / "config.json").write_text(json.dumps(dict(settings, objective="nft", lora=4, steps=30,
                                                         save_every=save_every)))
        (run / "step_00000015.tmp").mkdir()  # a save in flight
        refused([str(run)], f"{run}: no complete checkpoint yet", f"this nft run {when}",
                "step_00000015.tmp: a save in flight, or a killed one")


def test_every_flag_has_help():
    helps = evaluate.cli.field_help(evaluate.EvalConfig)
    assert all(helps.get(f) for f in evaluate.EvalConfig.__dataclass_fields__)


def test_compare_png_labels_each_runs_guidance_and_says_when_they_differ(tmp_path):
    """Issue 54: the Quickstart's SFT (7), NFT (0) and GRPO (7) curves: each labelled with its guidance, and a note
    above the panels that they are not comparable; runs at one guidance get no note."""
    import types
    runs = [types.SimpleNamespace(path=name, directory=str(tmp_path / name), cfg=cfg) for name, cfg in (
        ("out", {"objective": "sft", "guidance": 7.0}), ("runs/tiny-nft", {"objective": "nft", "nft": {"guidance": 0}}),
        ("runs/tiny-grpo", {"objective": "grpo", "grpo": {"guidance": 7.0}}))]
    curves, note = evaluate.curve_labels(runs)
    assert [label for label, _ in curves] == ["out (guidance 7)", "runs/tiny-nft (guidance 0)",
                                              "runs/tiny-grpo (guidance 7)"]
    assert note.startswith("NOT COMPARABLE") and "runs/tiny-nft 0" in note
    assert evaluate.curve_labels([runs[0], runs[2]])[1] == ""
