"""train.py end to end on the tiny config: runs, resumes bit for bit after kill -9, FSDP2 on 2 gloo ranks, init guard.

Runs go through train.main in this process (run_utils.in_process: the same cli.main, one thread, ~4.5 s of imports
saved per run); what needs a process of its own is one: kill -9, SIGTERM, torchrun, and one real command line."""
import json
import os
import signal
import subprocess
import sys
import time

import imageio.v3
import pytest
import torch

import reward
import sft
import train
from clips import tiny
from engine import resume, rl, rundir
from run_utils import check as checked
from run_utils import in_process, script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def grid(tiny_grid):
    return tiny_grid


def run(args, check=True, module=train):
    """train.main(args) in this process (module: sample for sample.py), as a CompletedProcess."""
    proc = in_process(module, args)
    return checked(proc) if check else proc


def metrics(out):
    """Last row per step (a resumed run re-appends the steps after its checkpoint)."""
    rows = {}
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            rows[row["step"]] = row
    return rows


@pytest.fixture(scope="module")
def trained(grid, tmp_path_factory):
    """A tiny run long enough to denoise (the init guard's notion of trained): 120 steps, checkpoints at 60, 120."""
    out = str(tmp_path_factory.mktemp("trained") / "out")
    run(["--data", grid, "--out", out, "--steps", "120", "--save-every", "60", "--warmup", "10"])
    return out


def test_tiny_default_trains_and_writes_everything(trained):
    rows = metrics(trained)
    assert sorted(rows) == list(range(1, 121))
    losses = [rows[s]["loss"] for s in range(1, 121)]
    assert all(v == v and v < 1e4 for v in losses)
    assert sum(losses[-20:]) < 0.7 * sum(losses[:20])  # it learns
    assert open(os.path.join(trained, "latest")).read().strip() == "step_00000120"
    for step in (60, 120):
        assert resume.eval_marker_valid(os.path.join(trained, f"step_{step:08d}"))
    assert os.path.getsize(os.path.join(trained, "loss.png")) > 0


def dcp_tensors(step_dir, prefix):
    """The full tensors under `prefix` of a DCP checkpoint, read in this process."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    md = dcp.FileSystemReader(step_dir).read_metadata().state_dict_metadata
    full = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in md.items()
            if k.startswith(prefix) and isinstance(m, TensorStorageMetadata)}
    dcp.load(full, checkpoint_id=step_dir, no_dist=True)
    return {k[len(prefix):]: v for k, v in full.items()}


@pytest.fixture(scope="module")
def uninterrupted(grid, tmp_path_factory):
    """The 8-step run (checkpoints at 3, 6, 8; an EMA) that both runs killed with kill -9 must end equal to."""
    out = str(tmp_path_factory.mktemp("uninterrupted") / "ref")
    run(["--data", grid, *KILL_ARGS, "--out", out])
    return out


KILL_ARGS = ["--steps", "8", "--save-every", "3", "--warmup", "2", "--ema", "0.1"]


def test_resume_after_kill_is_bitwise(grid, uninterrupted, tmp_path):
    """With an EMA (--ema 0.1): it is saved with each checkpoint and restored, so it also ends bit for bit equal.
    The killed run is a subprocess (at 1 thread), the reference and the resumed run are in-process (at 1 thread)."""
    args, ref = ["--data", grid, *KILL_ARGS], uninterrupted
    out = str(tmp_path / "killed")
    proc = subprocess.Popen([sys.executable, "train.py"] + args + ["--out", out], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="1"))
    deadline = time.time() + 300
    while time.time() < deadline:  # kill -9 once step 4 is logged: checkpoint 3 exists, step 4+ is lost
        path = os.path.join(out, "metrics.jsonl")
        if os.path.exists(path) and sum(1 for _ in open(path)) >= 4:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert os.path.exists(os.path.join(out, "step_00000003"))
    run(args + ["--out", out])
    got, want = metrics(out), metrics(ref)
    assert sorted(got) == sorted(want) == list(range(1, 9))
    for step in want:
        for key in ("loss", "grad_norm", "lr"):
            assert got[step][key] == want[step][key], (step, key, got[step][key], want[step][key])
    for prefix in ("model.", "optim.", "ema."):  # the final checkpoints; the EMA is not a copy of the weights
        a, b = (dcp_tensors(os.path.join(d, "step_00000008"), prefix) for d in (out, ref))
        assert a and a.keys() == b.keys() and all(torch.equal(v, b[k]) for k, v in a.items()), prefix
    ema, model = (dcp_tensors(os.path.join(out, "step_00000008"), p) for p in ("ema.", "model."))
    assert ema.keys() < model.keys() and not any(torch.equal(v, model[k]) for k, v in ema.items() if v.dim() > 1)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_ctrl_c_save_and_exit_zero(grid, tmp_path, sig):
    """SIGTERM (a scheduler) and SIGINT (Ctrl-C) alike: the step finishes, is saved, exit 0, no traceback. Sent to
    the whole process group, DataLoader workers included, as Ctrl-C, `timeout` and scancel do (a worker killed
    mid-step would make the loader raise in train.py: a GPU run lost its update that way)."""
    out = str(tmp_path / "out")
    proc = subprocess.Popen([sys.executable, "train.py", "--data", grid, "--out", out, "--steps", "500",
                             "--save-every", "1000", "--workers", "1"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                            start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and not (os.path.exists(os.path.join(out, "metrics.jsonl"))
                                          and sum(1 for _ in open(os.path.join(out, "metrics.jsonl"))) >= 2):
        time.sleep(0.05)
    os.killpg(proc.pid, sig)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output[-2000:]
    latest = open(os.path.join(out, "latest")).read().strip()
    assert int(latest.split("_")[1]) == max(metrics(out))  # the step it finished is the step it saved
    assert f"stopping after step {max(metrics(out))} on {sig.name}" in output and "Traceback" not in output
    assert ("Ctrl-C: finishing this step" in output) == (sig == signal.SIGINT)
    assert "assuming the intent" not in output  # torch's warning at a single-process DCP save: filtered


def test_a_second_ctrl_c_aborts_at_once():
    stop, said = {"signal": None}, []
    rundir.on_signal(stop, signal.SIGINT, said.append)
    assert stop["signal"] == signal.SIGINT and "Ctrl-C again: abort now" in said[0]
    with pytest.raises(KeyboardInterrupt):  # cli.main turns it into one line, exit 130
        rundir.on_signal(stop, signal.SIGINT, said.append)
    stop = {"signal": signal.SIGTERM}  # a scheduler's stop, then one Ctrl-C: still a graceful stop
    rundir.on_signal(stop, signal.SIGINT, said.append)
    assert stop["signal"] == signal.SIGINT


@pytest.fixture(scope="module")
def trained_file(trained, tmp_path_factory):
    import export
    return export.export_safetensors(trained, str(tmp_path_factory.mktemp("export") / "trained.safetensors"))


def test_fsdp_two_gloo_ranks_match_one_process(grid, trained_file, tmp_path):
    # Both start from the same file: a random init differs between a plain and a sharded (DTensor RNG) model.
    # A small lr: Adam divides each gradient element by its own magnitude, so fp32 reduction-order noise in
    # near-zero gradients turns into +-lr updates; at lr 1e-5 that stays far below the tolerance below.
    args = ["--data", grid, "--steps", "3", "--save-every", "3", "--warmup", "0", "--lr", "1e-5", "--init", trained_file]
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    run(args + ["--out", one, "--batch-size", "2"])
    checked(script(args + ["--out", two, "--batch-size", "1"], torchrun=2))
    a, b = metrics(one), metrics(two)
    for step in (1, 2, 3):
        # same global batch and noise; only the order of fp32 reductions differs (gradient all-reduce vs one batch)
        assert a[step]["loss"] == pytest.approx(b[step]["loss"], rel=1e-5, abs=1e-6), (step, a[step], b[step])
        assert a[step]["grad_norm"] == pytest.approx(b[step]["grad_norm"], rel=1e-4)


def test_init_guard_passes_trained_weights_and_stops_rerandomised_ones(grid, trained_file, tmp_path):
    from safetensors.torch import save_file

    from base.inits import get_config
    from model import DiT
    proc = run(["--data", grid, "--out", str(tmp_path / "ft"), "--steps", "1", "--init", trained_file])
    assert "init guard" in proc.stdout
    net = DiT(get_config("tiny"))
    torch.manual_seed(123)
    net.init_weights()
    rerandomised = str(tmp_path / "random.safetensors")
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, rerandomised)
    proc = run(["--data", grid, "--out", str(tmp_path / "bad"), "--steps", "1", "--init", rerandomised], check=False)
    assert proc.returncode != 0 and "init guard" in proc.stdout + proc.stderr


def test_options_are_validated_before_anything_is_built():
    with pytest.raises(SystemExit):
        train.parse_config(["--no-such-flag", "1"])
    with pytest.raises(ValueError, match="explicit --init"):
        train.parse_config(["--config", "v2w-2b"])
    with pytest.raises(ValueError, match="valid"):
        train.parse_config(["--sac", "block_wise"])
    with pytest.raises(ValueError, match="4k\\+1"):
        train.parse_config(["--frames", "10"])
    with pytest.raises(ValueError, match="at least 2"):
        train.parse_config(["--keep", "1"])
    control = train.parse_config(["--objective", "grpo", "--lora", "4", "--reward", "default=0"])  # a paired control,
    line = rl.reward_line("grpo", control.grpo, control.reward, reward.parse_rewards(control.reward))  # said
    assert "every term has weight 0, so every sample scores 0" in line and "paired control" in line
    with pytest.raises(ValueError, match="--guidance -3.0 >= 0"):
        train.parse_config(["--guidance", "-3"])
    raw = os.path.join(ROOT, "tests", "data", "lerobot_v21_tiny")
    with pytest.raises(ValueError, match="is a LeRobot dataset .*: run stitch.py first, `python stitch.py"):
        train.parse_config(["--data", raw])


def test_newcomer_refusals_name_only_what_applies(grid, trained, tmp_path):
    """A run refused for another --config says nothing of LoRA; a Predict2 tiny step as --init of p25-tiny names the
    tiny configs, not the released ones."""
    proc = run(["--data", grid, "--out", trained, "--config", "p25-tiny"], check=False)
    assert proc.returncode == 2 and "{'config': ('tiny', 'p25-tiny')}" in proc.stderr and "LoRA" not in proc.stderr
    proc = run(["--data", grid, "--out", str(tmp_path / "p25"), "--config", "p25-tiny", "--init",
                os.path.join(trained, "step_00000060")], check=False)
    assert proc.returncode == 2 and "a Predict2 checkpoint loads into --config tiny" in proc.stderr, proc.stderr


def test_tiny_on_a_folder_of_yours_reads_its_t5_embeddings(grid, tmp_path):
    """--config tiny is T5-wide: on a stitched folder with t5_xxl/ it trains on those (512 tokens), not stand-ins."""
    import shutil

    from safetensors.torch import save_file
    mine = str(tmp_path / "mine")
    shutil.copytree(grid, mine)
    os.makedirs(os.path.join(mine, "t5_xxl"))
    for name in os.listdir(os.path.join(mine, "videos")):
        save_file({"text_emb": torch.randn(7, 1024)}, os.path.join(mine, "t5_xxl", name[:-4] + ".safetensors"))
    assert train.parse_config(["--data", mine]).text_len == 512 and train.parse_config(["--data", grid]).text_len == 16
    proc = run(["--data", mine, "--out", str(tmp_path / "out"), "--steps", "1", "--sample-every", "0"])
    assert f"text: {mine}/t5_xxl's T5 embeddings" in proc.stdout
    shutil.rmtree(os.path.join(mine, "t5_xxl"))
    proc = run(["--data", mine, "--out", str(tmp_path / "out2"), "--steps", "1", "--sample-every", "0"])
    assert "text: stand-in embeddings" in proc.stdout and "(no t5_xxl/)" in proc.stdout


def test_loss_png_says_whether_the_evaluation_is_held_out(monkeypatch, tmp_path):
    import matplotlib.axes
    labels, plot = [], matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot", lambda ax, *a, **k: labels.append(k.get("label")) or plot(
        ax, *a, **k))
    history = [{"step": 1, "loss": 2.0, "eval_loss": 1.5}, {"step": 2, "loss": 1.0}]
    rundir.plot_metrics(str(tmp_path / "a.png"), history, held_out=False)
    rundir.plot_metrics(str(tmp_path / "b.png"), history)
    assert "eval loss (training clips, --holdout 0)" in labels and "eval loss (held out)" in labels


def test_eval_marker_partial_or_tampered_is_not_done(tmp_path):
    d = str(tmp_path)
    assert not resume.eval_marker_valid(d)
    resume.write_eval_marker(d, {"eval_loss": 1.5, "step": 3})
    assert resume.eval_marker_valid(d)
    marker = json.load(open(os.path.join(d, resume.EVAL_MARKER)))
    marker["result"]["eval_loss"] = 0.1
    json.dump(marker, open(os.path.join(d, resume.EVAL_MARKER), "w"))
    assert not resume.eval_marker_valid(d)
    json.dump({"status": "submitted"}, open(os.path.join(d, resume.EVAL_MARKER), "w"))
    assert not resume.eval_marker_valid(d)


def test_resume_refuses_changed_settings_and_save_every_zero_saves_at_the_end(grid, tmp_path):
    out = str(tmp_path / "out")
    args = ["--data", grid, "--out", out, "--lora", "4", "--warmup", "0", "--save-every", "0"]
    run(args + ["--steps", "2"])
    assert open(os.path.join(out, "latest")).read().strip() == "step_00000002"  # 0 = only at the end
    proc = run(args + ["--steps", "3", "--lora-alpha", "64"], check=False)
    assert proc.returncode != 0 and "lora_alpha" in proc.stderr


KILL_IN_SAVE = """
import os, runpy, signal, sys
rename = os.rename
def rename_or_die(src, dst):  # SIGKILL the run after DCP wrote step 6 but before the save is committed
    if str(src).endswith("step_00000006.tmp"):
        os.kill(os.getpid(), signal.SIGKILL)
    rename(src, dst)
os.rename = rename_or_die
sys.argv = ["train.py"] + sys.argv[1:]
runpy.run_path("train.py", run_name="__main__")
"""


def test_kill_9_during_a_save_resumes_bitwise_from_the_previous_checkpoint(grid, uninterrupted, tmp_path):
    args, ref, out = ["--data", grid, *KILL_ARGS], uninterrupted, str(tmp_path / "killed")
    proc = subprocess.run([sys.executable, "-c", KILL_IN_SAVE] + args + ["--out", out], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == -signal.SIGKILL
    assert os.path.isdir(os.path.join(out, "step_00000006.tmp"))  # the half-committed save is there
    assert open(os.path.join(out, "latest")).read().strip() == "step_00000003"
    run(args + ["--out", out])
    got, want = metrics(out), metrics(ref)
    assert sorted(got) == sorted(want) == list(range(1, 9))
    assert all(got[s]["loss"] == want[s]["loss"] and got[s]["grad_norm"] == want[s]["grad_norm"] for s in want)
    assert not os.path.exists(os.path.join(out, "step_00000006.tmp"))


def test_user_errors_are_one_line_and_nothing_is_written(grid, tmp_path, capsys):
    """Bad flags, data and outputs stop before any model is built, as one line (exit 2), writing nothing."""
    empty, user = tmp_path / "empty", tmp_path / "user"
    empty.mkdir()
    user.mkdir()
    (user / "notes.txt").write_text("my files")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    cases = [(["--data", str(tmp_path / "missing")], "no such folder"),
             (["--data", str(empty)], "empty"),
             (["--data", str(user)], "user"),
             (["--device", "cuda"], "no CUDA device"),
             (["--lora-alpha", "8"], "--lora-alpha does nothing without --lora"),
             (["--ema-weights", "net"], "does nothing with --init random"),
             (["--sac-every", "2"], "--sac-every does nothing with --sac none"),
             (["--out", str(a_file)], "is a file"),
             (["--init", str(tmp_path / "nope.pt")], "nope.pt"),
             (["--vae-ckpt", "x.pth"], "--vae-ckpt does nothing without --vae real")]
    from base import cli
    for args, message in cases:
        if "--device" in args and torch.cuda.is_available():
            continue
        out = tmp_path / f"out{len(message)}"
        argv = (["--data", grid] if "--data" not in args else []) + ["--out", str(out)] + args
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_info:  # in-process: the same cli.main the script runs under
            cli.main(lambda: train.main(argv), user_errors=train.USER_ERRORS)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2, (args, err)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and ": error: " in lines[0], lines  # (the program name is pytest's here)
        if message not in ("empty", "user"):
            assert message in lines[0], (message, lines[0])
        assert not out.exists() or not any(out.iterdir()), (args, list(out.iterdir()))
    proc = script(["--data", grid, "--lora-alpha", "8"])  # and once as the real script
    assert proc.returncode == 2 and proc.stderr.strip().startswith("train.py: error: --lora-alpha does nothing")
    assert sorted(p.name for p in user.iterdir()) == ["notes.txt"] and not any(empty.iterdir())  # read, never written


def test_one_run_per_out_metrics_after_the_resume_point_and_plot(grid, tmp_path):
    out = str(tmp_path / "out")
    args = ["--data", grid, "--out", out, "--save-every", "2", "--sample-every", "0"]
    os.makedirs(out)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a+');"
                               "fcntl.lockf(f, fcntl.LOCK_EX); f.write('pid 1 on host'); f.flush(); print('locked', "
                               "flush=True); time.sleep(60)", os.path.join(out, ".lock")], stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline().strip() == "locked"
    proc = run(args + ["--steps", "2"], check=False)
    assert proc.returncode == 2 and "in use by a running train.py" in proc.stderr
    assert not os.path.exists(os.path.join(out, "config.json"))
    holder.kill()  # a dead holder leaves nothing stuck: the kernel drops its lock
    holder.wait()
    run(args + ["--steps", "3"])
    with open(os.path.join(out, "metrics.jsonl"), "a") as f:  # a killed run's rows past the checkpoint, torn last
        f.write(json.dumps({"step": 4, "loss": 1.0}) + "\n" + '{"step": 5, "lo')
    proc = run(args + ["--steps", "4"])
    assert "dropping the torn last line" in proc.stdout and "dropping 1 rows after step 3" in proc.stdout
    steps = [json.loads(line)["step"] for line in open(os.path.join(out, "metrics.jsonl"))]
    assert steps == [1, 2, 3, 4]
    png = open(os.path.join(out, "loss.png"), "rb").read()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10000  # matplotlib, with axes and labels


def test_partial_eval_marker_is_evaluated_again(grid, tmp_path):
    out = str(tmp_path / "out")
    args = ["--data", grid, "--out", out, "--sample-every", "0"]
    run(args + ["--steps", "2"])
    marker = os.path.join(out, "step_00000002", resume.EVAL_MARKER)
    text = open(marker).read()
    open(marker, "w").write(text[: len(text) // 2])  # a partial write
    proc = run(args + ["--steps", "2"])
    assert "is partial" in proc.stdout and "evaluated the resumed checkpoint step 2" in proc.stdout
    assert resume.eval_marker_valid(os.path.dirname(marker))


def test_p25_tiny_trains_with_the_rf_loss_samples_with_unipc_and_resumes_bitwise(grid, tmp_path):
    """--config p25-tiny: nets/flow.py's loss through train.py; a run stopped at step 2 and resumed ends like an
    uninterrupted one; the sample video comes from flow.sample (UniPC); GRPO's first ratio is exactly 1."""
    args = ["--config", "p25-tiny", "--data", grid, "--save-every", "2", "--warmup", "2", "--sample-every", "4",
            "--sample-steps", "2"]
    ref, out = str(tmp_path / "ref"), str(tmp_path / "out")
    run(args + ["--out", ref, "--steps", "4"])
    run(args + ["--out", out, "--steps", "2"])
    run(args + ["--out", out, "--steps", "4"])
    got, want = metrics(out), metrics(ref)
    assert sorted(got) == sorted(want) == [1, 2, 3, 4]
    for step in want:
        for key in ("loss", "grad_norm", "lr"):
            assert got[step][key] == want[step][key], (step, key, got[step][key], want[step][key])
    assert got[4]["eval_loss"] == want[4]["eval_loss"]
    assert os.path.getsize(os.path.join(ref, "sample_00000004.mp4")) > 0
    assert json.load(open(os.path.join(ref, "config.json")))["conditional_frame_timestep"] == -1.0
    grpo_out = str(tmp_path / "grpo")
    run(["--config", "p25-tiny", "--data", grid, "--out", grpo_out, "--objective", "grpo", "--lora", "4", "--steps",
         "2", "--grpo-num-steps", "3", "--conditional-frame-timestep", "0.1", "--grpo-group-size", "2",
         "--batch-size", "1", "--eval-steps", "2", "--grpo-probe-every", "2"])
    row, unprobed = metrics(grpo_out)[1], metrics(grpo_out)[2]
    assert row["first_ratio"] == 1.0 and row["micro_steps"] == 2 * 2 and 0 < row["grad_norm"] < float("inf")
    # --grpo-probe-every 2: the after-step probe on update 1 (index 0) only; its forwards are gone from update 2
    assert row["approx_kl"] is not None and unprobed["approx_kl"] is None and unprobed["clipfrac"] is None
    assert unprobed["data_loss"] > 0 and unprobed["opt_steps"] == 1


def test_p25_loss_settings_are_refused_where_they_do_nothing():
    assert train.parse_config(["--config", "p25-tiny"]).conditional_frame_timestep == -1.0
    assert train.parse_config(["--config", "p25-tiny", "--conditional-frame-timestep", "0.1"]) \
        .conditional_frame_timestep == 0.1
    for flag in ("--loss-scale", "--high-sigma-ratio"):
        with pytest.raises(ValueError, match="a Predict2 loss setting"):
            train.parse_config(["--config", "p25-tiny", flag, "1"])
    with pytest.raises(ValueError, match="a Predict2.5 loss setting"):
        train.parse_config(["--conditional-frame-timestep", "0.1"])  # the tiny default is a Predict2 net
    with pytest.raises(ValueError, match="in \\[0, 1000\\)"):
        train.parse_config(["--config", "p25-tiny", "--conditional-frame-timestep", "-0.5"])
    assert train.parse_config(["--config", "p25-tiny-agibot"]).data == "data/tiny_views"


def test_p25_agibot_trains_on_views_with_cameras_samples_three_views_and_runs_grpo(tmp_path):
    """--config p25-tiny-agibot: views stitched from (synthetic) LeRobot episodes with camera poses, stacked on latent
    time with their Pluecker map; SFT resumes bitwise, the sample holds data | generated for every view, sample.py
    writes the views side by side, and GRPO scores the views as Path B's grid with its first ratio exactly 1."""
    views = str(tmp_path / "views")
    tiny.make_tiny_dataset(views, views=True)
    args = ["--config", "p25-tiny-agibot", "--data", views, "--save-every", "2", "--sample-every", "2",
            "--sample-steps", "2"]
    ref, out = str(tmp_path / "ref"), str(tmp_path / "out")
    proc = run(args + ["--out", ref, "--steps", "2"])
    assert "ViewClips" in proc.stdout and "fallback" not in proc.stdout  # the synthetic episodes carry real poses
    run(args + ["--out", out, "--steps", "1", "--save-every", "1"])
    run(args + ["--out", out, "--steps", "2", "--save-every", "1"])
    assert [metrics(out)[2][k] for k in ("loss", "grad_norm")] == [metrics(ref)[2][k] for k in ("loss", "grad_norm")]
    assert imageio.v3.improps(os.path.join(ref, "sample_00000002.mp4")).shape[1:3] == (3 * 64, 2 * 112)
    mp4 = str(tmp_path / "s.mp4")
    import sample
    run(["--ckpt", ref, "--steps", "2", "--out", mp4], module=sample)
    assert imageio.v3.improps(mp4).shape[1:3] == (64, 3 * 112)
    grpo_out = str(tmp_path / "grpo")
    run(["--config", "p25-tiny-agibot", "--data", views, "--out", grpo_out, "--objective", "grpo", "--lora", "4",
         "--steps", "1", "--grpo-num-steps", "3", "--grpo-group-size", "2", "--batch-size", "1", "--eval-steps",
         "2"])
    row = metrics(grpo_out)[1]
    assert row["first_ratio"] == 1.0 and 0 < row["reward_mean"] <= 1 and 0 < row["grad_norm"] < float("inf")


def test_sac_auto_picks_a_mix_within_the_budget_and_refuses_none_fitting(grid, tmp_path):
    """--sac auto --mem-budget: the choice is printed and checked at the first step; a budget nothing fits is one
    line before training; the flags come as a pair."""
    proc = run(["--data", grid, "--out", str(tmp_path / "a"), "--steps", "1", "--sac", "auto", "--mem-budget", "2"])
    assert "sac auto: " in proc.stdout and "of the 2 GiB budget" in proc.stdout
    proc = run(["--data", grid, "--out", str(tmp_path / "b"), "--steps", "1", "--sac", "auto", "--mem-budget",
                "1e-6"], check=False)
    assert proc.returncode != 0 and "no checkpointing mix fits" in proc.stderr
    assert not os.path.exists(os.path.join(tmp_path / "b", "step_00000001"))
    for flags in (["--sac", "auto"], ["--mem-budget", "4"]):
        with pytest.raises(ValueError, match="--sac auto needs --mem-budget"):
            train.parse_config(flags)


# -----------------------------------------------------------------------------
# Divergence, kills around a save, the run directory's lock, two tiny defaults at once (issue 22)


def test_nonfinite_sft_steps_are_skipped_logged_and_stop_the_run(grid, tmp_path, monkeypatch):
    """A NaN/Inf loss or gradient norm: no update (Adam's step count and the weights stay), the step logged as
    skipped with its likely cause; --max-nonfinite in a row stop the run in one line, exit 2, before any NaN is
    saved."""
    out = str(tmp_path / "overflow")
    proc = run(["--data", grid, "--out", out, "--steps", "6", "--save-every", "2", "--loss-scale", "1e39",
                "--max-nonfinite", "3"], check=False)  # loss * 1e39 is Inf in float32 at every step
    lines = [ln for ln in proc.stderr.splitlines() if "error" in ln]  # (the rest is tqdm's progress bar)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("train.py: error: step 3: 3 steps in a row with a NaN/Inf loss or gradient norm "
                               "(--max-nonfinite 3), each skipped: the loss overflowed from finite inputs and weights "
                               "(--lr 0.002 too high, or --loss-scale 1e+39 too large)"), lines[0]
    rows = metrics(out)
    assert sorted(rows) == [1, 2, 3] and all(r["skipped"] == "nonfinite" and r["nonfinite_steps"] == 1
                                             for r in rows.values())
    from base.inits import get_config
    from model import DiT
    with torch.device("meta"):
        init = DiT(get_config("tiny"))
    init.to_empty(device="cpu")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # train.py's --seed 0 init of --init random
        init.init_weights()
    saved = dcp_tensors(os.path.join(out, "step_00000002"), "model.")  # saved at step 2: the init, untouched
    assert saved.keys() == init.state_dict().keys() and all(torch.equal(v, saved[k])
                                                              for k, v in init.state_dict().items())
    loss_of = sft.training_loss
    calls = []

    def nan_at_the_second_step(*args, **kwargs):  # a NaN in one batch: that step alone is skipped, the run goes on
        loss = loss_of(*args, **kwargs)
        calls.append(torch.is_grad_enabled())
        return loss * float("nan") if (calls.count(True) == 2 and calls[-1]) or not calls[-1] else loss
    monkeypatch.setattr(sft, "training_loss", nan_at_the_second_step)  # and every held-out loss
    out = str(tmp_path / "one_nan")
    proc = run(["--data", grid, "--out", out, "--steps", "4", "--save-every", "0", "--ema", "0.1"])
    rows = metrics(out)
    assert [r["nonfinite_steps"] for r in rows.values()] == [0, 1, 0, 0] and "skipped" not in rows[3]
    assert rows[2]["nonfinite"].startswith("the loss overflowed") and rows[4]["loss"] < 1e4
    assert "WARNING: a NaN/Inf held-out eval_loss" in proc.stdout  # said, and rotation keeps the newest finite one
    assert "step 2: skipped, no update (a NaN/Inf loss or gradient norm: the loss overflowed" in proc.stdout \
        and "1 in a row, the run stops at --max-nonfinite 3" in proc.stdout  # on the console, not only in metrics
    state = dcp_tensors(os.path.join(out, "step_00000004"), "optim.")
    assert {float(v) for k, v in state.items() if k.endswith(".step")} == {3.0}  # 4 steps, one not applied


KILL_IN_ROTATION = """
import os, runpy, shutil, signal, sys
rmtree = shutil.rmtree
def rmtree_and_die(path, *args, **kwargs):  # SIGKILL the run half-way through deleting the rotated-out step 3
    if "step_00000003" in str(path):
        os.remove(os.path.join(path, ".metadata"))
        os.kill(os.getpid(), signal.SIGKILL)
    rmtree(path, *args, **kwargs)
shutil.rmtree = rmtree_and_die
sys.argv = ["train.py"] + sys.argv[1:]
runpy.run_path("train.py", run_name="__main__")
"""


def test_kill_9_while_rotating_loses_no_metrics_row_and_leaves_no_half_checkpoint(grid, uninterrupted, tmp_path):
    """Killed in the rotation of the last save (step 8 committed, its row not yet written, step 3 half-deleted):
    the resumed run logs step 8's row again from its checkpoint, evaluation included, and deletes the leftover."""
    args, out = ["--data", grid, *KILL_ARGS, "--keep", "2"], str(tmp_path / "killed")
    proc = subprocess.run([sys.executable, "-c", KILL_IN_ROTATION] + args + ["--out", out], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert open(os.path.join(out, "latest")).read().strip() == "step_00000008" and max(metrics(out)) == 7
    second = run(args + ["--out", out])
    assert "logging step 8 again" in second.stdout and "left half-deleted" in second.stdout
    got, want = metrics(out), metrics(uninterrupted)
    assert sorted(got) == sorted(want) == list(range(1, 9))
    assert all(got[s][k] == want[s][k] for s in want for k in ("loss", "grad_norm", "lr"))
    assert got[8]["eval_loss"] == want[8]["eval_loss"] and got[8]["relogged"] is True
    assert sorted(n for n in os.listdir(out) if n.startswith("step_")) == ["step_00000006", "step_00000008"]


def test_an_immediate_restart_after_kill_9_is_not_refused_by_lingering_dataloader_workers(grid, tmp_path):
    """The OUT/.lock dies with train.py: its DataLoader workers (which notice a dead parent only every ~5 s; stopped
    here so that they certainly outlive it) do not hold it, so a restart right after kill -9 claims the run."""
    out = str(tmp_path / "out")
    proc = subprocess.Popen([sys.executable, "train.py", "--data", grid, "--out", out, "--steps", "200", "--workers",
                             "1", "--no-cache-latents", "--save-every", "1000", "--sample-every", "0"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    workers = []
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not (os.path.exists(os.path.join(out, "metrics.jsonl"))
                                              and os.path.getsize(os.path.join(out, "metrics.jsonl"))):
            time.sleep(0.05)
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
            workers = [int(pid) for pid in f.read().split()]
        assert workers, "no DataLoader worker"
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        restart = run(["--data", grid, "--out", out, "--steps", "1", "--sample-every", "0"], check=False)
        assert restart.returncode == 0 and "in use" not in restart.stderr, restart.stderr
    finally:
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()


def test_refused_starts_leave_a_fresh_out_as_found_and_lines_name_the_cause(grid, trained, tmp_path):
    """--init OUT_DIR names its newest complete step; a start refused after the claim (a checkpoint of the wrong
    network) leaves no config.json or .lock behind in an --out it created (an existing folder keeps its files); a
    resumed run of --init random does not announce random weights."""
    proc = run(["--data", grid, "--init", trained, "--out", str(tmp_path / "a")], check=False)
    assert proc.returncode == 2 and f"{trained} is a training out_dir: pass one of its step directories, e.g. its " \
        f"newest complete one, {os.path.join(trained, 'step_00000120')}" in proc.stderr, proc.stderr
    fresh = str(tmp_path / "fresh")
    proc = run(["--config", "p25-tiny", "--data", grid, "--init", os.path.join(trained, "step_00000120"), "--out",
                fresh], check=False)
    assert proc.returncode == 2 and "wrong network" in proc.stderr and not os.path.exists(fresh), proc.stderr
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    proc = run(["--config", "p25-tiny", "--data", grid, "--init", os.path.join(trained, "step_00000120"), "--out",
                str(kept)], check=False)
    assert proc.returncode == 2 and (kept / "notes.txt").read_text() == "mine"
    out = str(tmp_path / "resumed")
    run(["--data", grid, "--out", out, "--steps", "1", "--save-every", "1", "--sample-every", "0"])
    proc = run(["--data", grid, "--out", out, "--steps", "2", "--save-every", "1", "--sample-every", "0"])
    assert "resume" in proc.stdout and "init: RANDOM weights" not in proc.stdout, proc.stdout
