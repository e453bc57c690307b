"""engine/resume.py on CPU in one process: kill -9 during a save, rotation, an EMA as extra state (bitwise round trip,
strict keys), the release export with net_ema., the export CLI. The sharded save/resume cases run in
tests/test_ckpt.py's 2-rank job.
"""
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch

import ckpt
import export
import sample
import train
from base.inits import get_config
from ckpt import CheckpointError
from condition import Condition
from engine import resume, rundir, runs
from model import DiT
from nets.lora import add_lora
from run_utils import check, in_process, suggested

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -----------------------------------------------------------------------------
# kill -9 in the middle of a save: resume must find the previous complete checkpoint

KILL_CHILD = r"""
import os, sys, time
sys.path.insert(0, sys.argv[3])
import torch
from engine import resume
import torch.distributed.checkpoint.filesystem as fs
from base.inits import get_config
from model import DiT
out, point = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
net = DiT(get_config("tiny"))
opt = torch.optim.AdamW(net.parameters())
resume.save(out, 1, net, opt, extra={"n": 1})
def block(*args, **kwargs):
    print("BLOCKED", flush=True)
    time.sleep(600)
if point == "before_metadata":  # every data file written, .metadata not yet
    fs.FileSystemWriter.finish = block
elif point == "before_rename":  # complete under the .tmp name, not yet renamed
    real = os.rename
    os.rename = lambda a, b: block() if str(b).endswith("step_00000002") else real(a, b)
elif point == "before_pointer":  # renamed, latest not yet updated
    resume.commit_latest = block
with torch.no_grad():
    for p in net.parameters():
        p.add_(1)
resume.save(out, 2, net, opt, extra={"n": 2})
print("NOT KILLED", flush=True)
"""


def test_kill_9_during_save_resumes_from_previous_complete_checkpoint(tmp_path):
    points = {"before_metadata": 1, "before_rename": 1, "before_pointer": 2}
    procs = {p: subprocess.Popen([sys.executable, "-c", KILL_CHILD, str(tmp_path / p), p, ROOT],
                                 stdout=subprocess.PIPE, text=True) for p in points}
    try:
        for point, proc in procs.items():
            said = []
            while not said or said[-1] not in ("BLOCKED", ""):  # wait until the child sits at its kill point
                said.append(proc.stdout.readline().strip())
            assert said[-1] == "BLOCKED", f"{point}: child said {said}"
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    torch.manual_seed(0)
    initial = DiT(get_config("tiny")).state_dict()
    for point, step in points.items():
        out = str(tmp_path / point)
        net = DiT(get_config("tiny"))
        extra = resume.resume(out, net, torch.optim.AdamW(net.parameters()))
        assert extra == {"n": step, "step": step}, point
        assert all(torch.equal(v, initial[k] + (step - 1)) for k, v in net.state_dict().items()
                   if k in dict(net.named_parameters())), point
        # the run goes on: the next save replaces the killed one's leftovers, rotation keeps the resume target
        resume.save(out, 3, net, extra={}, keep=2)
        assert sorted(os.listdir(out)) == ["latest", f"step_0000000{step}", "step_00000003"] if step == 1 else \
            ["latest", "step_00000002", "step_00000003"], point


def test_rotation_never_deletes_latest_target_or_a_save_in_flight(tmp_path):
    out = str(tmp_path)
    for step in range(1, 6):
        os.makedirs(f"{out}/step_{step:08d}")
        open(f"{out}/step_{step:08d}/.metadata", "w").close()
        open(f"{out}/step_{step:08d}/meta.json", "w").close()
    os.makedirs(f"{out}/step_00000006.tmp")  # in flight
    os.makedirs(f"{out}/step_00000000.tmp")  # left by a run killed long ago
    resume.commit_latest(out, "step_00000002")  # e.g. the pointer lagged behind
    open(f"{out}/.latest.999.tmp", "w").write("step_00000001\n")  # a pointer write killed before os.replace
    resume.rotate(out, keep=2)
    assert sorted(os.listdir(out)) == [".latest.999.tmp", "latest", "step_00000002", "step_00000004",
                                       "step_00000005", "step_00000006.tmp"]
    assert resume.find_resume(out).endswith("step_00000005")  # newest complete; the lagging pointer is reported
    with pytest.raises(CheckpointError, match="at least 2"):
        resume.rotate(out, keep=1)


# -----------------------------------------------------------------------------
# Extra state (an EMA): saved beside the model, restored in place, strict about names and keys


def tiny_run(tmp_path, ema=True):
    """A tiny plain model saved once at step 1, with an EMA that differs from the weights if ema."""
    torch.manual_seed(0)
    net = DiT(get_config("tiny"))
    opt = torch.optim.AdamW(net.parameters())
    state = {"ema": {n: p.detach() * 0.5 + 0.25 for n, p in net.named_parameters()}} if ema else None
    out = str(tmp_path / ("ema" if ema else "plain"))
    resume.save(out, 1, net, opt, extra={"n": 1}, extra_state=state)
    return out, net, state


def test_extra_state_round_trips_bitwise_and_strictly(tmp_path):
    out, net, state = tiny_run(tmp_path)
    fresh = DiT(get_config("tiny"))
    ema = {n: torch.zeros_like(p) for n, p in fresh.named_parameters()}
    targets = dict(ema)
    assert resume.resume(out, fresh, torch.optim.AdamW(fresh.parameters()), extra_state={"ema": ema}) == \
        {"n": 1, "step": 1}
    assert all(ema[k] is targets[k] and torch.equal(ema[k], v) for k, v in state["ema"].items())  # in place
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in fresh.state_dict().items())
    k0 = "blocks.0.mlp.layer1.weight"
    wrong = {
        "not asked for": (None, "holds extra state ['ema'], the caller restores []"),
        "key missing": ({"ema": {k: v for k, v in ema.items() if k != k0}}, "unexpected 1"),
        "key extra": ({"ema": {**ema, "blocks.0.mlp.layer9.weight": torch.zeros(2)}}, "missing 1"),
        "wrong shape": ({"ema": {**ema, k0: torch.zeros(3, 3)}}, "shape mismatch 1"),
        "other name": ({"avg": ema}, "the caller restores ['avg']"),
        "reserved name": ({"model": ema}, "a plain name other than"),
    }
    for name, (extra_state, text) in wrong.items():
        with pytest.raises(CheckpointError, match=text.replace("[", r"\[").replace("]", r"\]")):
            resume.resume(out, DiT(get_config("tiny")), extra_state=extra_state)
    plain, _, _ = tiny_run(tmp_path, ema=False)
    with pytest.raises(CheckpointError, match=r"holds extra state \[\], the caller restores \['ema'\]"):
        resume.resume(plain, DiT(get_config("tiny")), extra_state={"ema": ema})
    with pytest.raises(CheckpointError, match="a plain name other than"):
        resume.save(plain, 2, net, extra_state={"rng": ema})


def test_release_export_with_ema_loads_strictly_as_net_ema(tmp_path):
    out, net, state = tiny_run(tmp_path)
    step = os.path.join(out, "step_00000001")
    path = export.export_release_pt(step, str(tmp_path / "release.pt"), ema=True)
    keys = torch.load(path, weights_only=True).keys()
    assert keys == {p + k for p in ("net.", "net_ema.") for k in net.state_dict()}
    bf16 = lambda t: t.to(torch.bfloat16).float()  # noqa: E731 (a release file holds bf16)
    for ema, want in ((True, {**net.state_dict(), **state["ema"]}), (False, net.state_dict())):
        fresh = DiT(get_config("tiny"))
        report = ckpt.load(fresh, path, ema=ema)
        assert report.ok and len(report.loaded) == len(want) and len(report.other_prefix) == len(want)
        assert all(torch.equal(v, bf16(want[k])) for k, v in fresh.state_dict().items())
    with pytest.raises(CheckpointError, match="both net. and net_ema."):
        ckpt.load(DiT(get_config("tiny")), path)  # two copies: the caller must choose
    # the CLI; an EMA export needs a checkpoint saved with one, and a .pt
    assert export.main([step, str(tmp_path / "cli.pt"), "--ema"]) == 0
    assert torch.load(str(tmp_path / "cli.pt"), weights_only=True).keys() == keys
    plain, _, _ = tiny_run(tmp_path, ema=False)
    with pytest.raises(CheckpointError, match=r"--ema: .* holds no EMA \(its run was trained without train.py --ema"):
        export.export_release_pt(plain, str(tmp_path / "x.pt"), ema=True)
    with pytest.raises(ValueError, match="--ema: only .pt"):  # a flag error: one line from cli.main
        export.main([step, str(tmp_path / "x.safetensors"), "--ema"])


@pytest.fixture(scope="module")
def lora_run(tiny_grid, tmp_path_factory):
    """A 2-step LoRA run from a random base (the tiny GRPO command's kind of run: LoRA-only checkpoints), no EMA."""
    out = str(tmp_path_factory.mktemp("lora") / "run")
    check(in_process(train, ["--data", tiny_grid, "--out", out, "--steps", "2", "--lora", "4", "--sample-every", "0",
                             "--lr", "0.05"]))
    return out


def test_a_lora_run_exports_adapters_or_the_merged_network_and_says_which(lora_run, tmp_path):
    step = os.path.join(lora_run, "step_00000002")
    proc = check(in_process(export, [lora_run, str(tmp_path / "adapters.safetensors")]))
    assert "LoRA adapters and buffers only" in proc.stdout and "--merge-lora writes the whole network" in proc.stdout
    proc = check(in_process(export, [lora_run, str(tmp_path / "merged.safetensors"), "--merge-lora"]))
    assert "adapters folded into the base weights" in proc.stdout
    lora_net = runs.build_from_step(step, torch.device("cpu"))  # base (seeded init) + adapters, as trained
    assert any(m.lora_b.weight.abs().sum() > 0 for m in lora_net.modules() if hasattr(m, "lora_b"))  # it trained
    plain = DiT(get_config("tiny"))
    assert ckpt.load(plain, str(tmp_path / "merged.safetensors")).ok  # strict: plain keys, no adapters
    x, t, text = torch.randn(1, 16, 3, 8, 14), torch.full((1,), 0.5), torch.randn(1, 16, 1024)
    with torch.no_grad():
        torch.testing.assert_close(plain(x, t, Condition(text)), lora_net(x, t, Condition(text)), rtol=1e-5, atol=1e-5)
    proc = in_process(export, [step, str(tmp_path / "r.pt"), "--ema", "--merge-lora"])
    assert proc.returncode == 2 and "--ema: the run of" in proc.stderr and "kept no EMA" in proc.stderr
    check(in_process(export, [step, str(tmp_path / "r.pt"), "--merge-lora"]))  # what that says to do
    assert ckpt.load(DiT(get_config("tiny")), str(tmp_path / "r.pt")).ok
    proc = in_process(export, [step, str(tmp_path / "x.pt")])
    assert proc.returncode == 2 and "pass --merge-lora" in proc.stderr


def test_ckpt_check_of_a_random_base_lora_step_suggests_a_command_that_works(lora_run):
    import ckpt as ckpt_py
    step = os.path.join(lora_run, "step_00000002")
    proc = in_process(ckpt_py, ["check", "--config", "tiny", step])
    assert proc.returncode == 2 and "LoRA-only step directory" in proc.stderr
    (script, argv), = suggested(proc.stderr)
    assert script == "ckpt" and argv[-2:] == ["--init", "random"], argv
    proc = check(in_process(ckpt_py, argv))
    assert "random init (train.py --init random, seed 0)" in proc.stdout and "OK, would load" in proc.stdout
    net = DiT(get_config("tiny"))
    add_lora(net, 4)
    with pytest.raises(CheckpointError, match="LoRA-only step directory") as e:
        ckpt.load(net, step)  # the library's message names the commands too: each of them works
    commands = dict(suggested(str(e.value)))
    assert set(commands) == {"sample", "export", "ckpt"}, commands
    for script, argv in commands.items():  # the sample's mp4 and the export land in the test's empty cwd
        check(in_process({"sample": sample, "export": export, "ckpt": ckpt_py}[script], argv + (
            ["--steps", "2"] if script == "sample" else [])))


# -----------------------------------------------------------------------------
# Divergence, a kill while rotating, a full disk: never a lost or a NaN checkpoint


def test_a_nan_state_is_never_saved_and_rotation_keeps_the_last_good_checkpoint(tmp_path):
    out = str(tmp_path)
    torch.manual_seed(0)
    net = DiT(get_config("tiny"))
    for step in (1, 2):
        resume.save(out, step, net, extra={}, keep=2)
    assert resume.read_meta(f"{out}/step_00000002")["finite"] is True
    weight = dict(net.named_parameters())["blocks.0.mlp.layer1.weight"]
    with torch.no_grad():
        weight[0, 0] = float("nan")
    with pytest.raises(CheckpointError, match=r"step 3: not saved: 1 tensor\(s\) hold NaN/Inf \(first: "
                                              r"model.blocks.0.mlp.layer1.weight\): the run diverged"):
        resume.save(out, 3, net, extra={}, keep=2)
    assert sorted(os.listdir(out)) == ["latest", "step_00000001", "step_00000002"]  # nothing written, nothing lost
    with torch.no_grad():
        weight[0, 0] = 0.0
    resume.write_eval_marker(f"{out}/step_00000002", {"eval_loss": 0.5, "step": 2})
    for step in (3, 4, 5):  # finite weights, but the held-out loss went NaN: the newest good one is step 2
        resume.save(out, step, net, extra={}, keep=2)
        resume.write_eval_marker(f"{out}/step_{step:08d}", {"eval_loss": float("nan"), "step": step})
    assert sorted(os.listdir(out)) == ["latest", "step_00000002", "step_00000004", "step_00000005"]


def test_a_kill_while_rotating_leaves_no_half_deleted_checkpoint(tmp_path, monkeypatch):
    out = str(tmp_path)
    net = DiT(get_config("tiny"))
    for step in (1, 2):
        resume.save(out, step, net, extra={}, keep=2)
    os.makedirs(f"{out}/step_00000000")  # what an older version's kill mid-rmtree left: no .metadata
    open(f"{out}/step_00000000/meta.json", "w").close()
    rmtree = shutil.rmtree

    def killed(path, *args, **kwargs):  # the first file goes, then the process dies (a BaseException, as a kill)
        os.remove(os.path.join(path, ".metadata"))
        raise KeyboardInterrupt
    monkeypatch.setattr(shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        resume.save(out, 3, net, extra={}, keep=2)
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    assert "step_00000001" not in os.listdir(out) and resume.find_resume(out).endswith("step_00000003")
    rundir.claim_out(out).close()  # the next start deletes the leftovers, never a complete checkpoint
    assert sorted(os.listdir(out)) == [".lock", "latest", "step_00000002", "step_00000003"]


def test_a_full_disk_is_named_and_nothing_earlier_is_lost(tmp_path, monkeypatch):
    import errno

    import torch.distributed.checkpoint.filesystem as fs
    out = str(tmp_path)
    net = DiT(get_config("tiny"))
    resume.save(out, 1, net, extra={"n": 1})

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    write_atomic = resume.write_atomic
    for target, name in ((fs, "_write_item"), (resume, "write_atomic")):  # DCP's tensor files, then meta.json
        with monkeypatch.context() as m:
            m.setattr(target, name, full if target is fs else lambda path, text: (
                full() if path.endswith("meta.json") else write_atomic(path, text)))
            with pytest.raises(CheckpointError) as e:
                resume.save(out, 2, net, extra={"n": 2})
        assert str(e.value).startswith(f"no space left on device: writing {out}/step_00000002.tmp (") and \
            "the earlier checkpoints and `latest` are intact" in str(e.value), (name, str(e.value))
        assert sorted(os.listdir(out)) == ["latest", "step_00000001"], name  # the partial save gave its space back
    assert resume.resume(out, DiT(get_config("tiny"))) == {"n": 1, "step": 1}


def test_a_truncated_distcp_is_named_by_resume_and_load(tmp_path):
    """Issue 35, item 7 (library side): DCP reading a cut-short file fails with an empty EOFError; the sizes .metadata
    records are checked first, so resume and ckpt.load name the file and what happened to it."""
    out = str(tmp_path)
    net = DiT(get_config("tiny"))
    for step in (1, 2):
        resume.save(out, step, net, extra={}, keep=2)
    shard = f"{out}/step_00000002/__0_0.distcp"
    size = os.path.getsize(shard)
    os.truncate(shard, size // 2)
    for load in (lambda: resume.resume(out, DiT(get_config("tiny"))),
                 lambda: ckpt.load(DiT(get_config("tiny")), f"{out}/step_00000002")):
        with pytest.raises(CheckpointError) as e:
            load()
        assert f"{shard}: truncated ({size // 2} of the {size} bytes its .metadata records)" in str(e.value), e.value
        assert "EOFError" not in str(e.value) and "\n" not in str(e.value)


def test_a_lora_run_knows_its_base_by_content_not_by_path(tiny_grid, tmp_path):
    """Every LoRA step records the content checksum of the base it trained on. The same base under another path
    resumes; another network put at the recorded path is refused by train.py's resume, sample.py, evaluate.py and
    `export.py --merge-lora` in one line each (before, the adapters went onto it with exit 0)."""
    import evaluate
    sft = lambda out, seed: ["--data", tiny_grid, "--out", str(tmp_path / out), "--steps", "20", "--save-every", "20",
                             "--sample-every", "0", "--seed", seed]  # noqa: E731
    check(in_process(train, sft("a", "0")))
    check(in_process(train, sft("b", "1")))
    base = str(tmp_path / "base")
    shutil.copytree(tmp_path / "a" / "step_00000020", base)
    run_dir = str(tmp_path / "lora")
    lora = ["--data", tiny_grid, "--out", run_dir, "--lora", "4", "--save-every", "1", "--sample-every", "0",
            "--guard-max-ratio", "0.99"]
    check(in_process(train, lora + ["--init", base, "--steps", "1"]))
    recorded = resume.read_meta(os.path.join(run_dir, "step_00000001"))["extra"]["base_checksum"]
    same = str(tmp_path / "same_base")
    shutil.copytree(base, same)
    proc = check(in_process(train, lora + ["--init", same, "--steps", "2"]))  # a byte-identical copy: the same base
    assert "resume" in proc.stdout and resume.read_meta(os.path.join(run_dir, "step_00000002"))["extra"][
        "base_checksum"] == recorded
    shutil.rmtree(same)
    shutil.copytree(tmp_path / "b" / "step_00000020", same)  # another network where the base was
    proc = in_process(train, lora + ["--init", same, "--steps", "3"])
    assert proc.returncode == 2 and f"but the LoRA adapters of {run_dir}/step_00000002 were trained on content " \
        f"checksum {recorded}: resume with the base they were trained on" in proc.stderr, proc.stderr
    assert sorted(n for n in os.listdir(run_dir) if n.startswith("step_")) == ["step_00000001", "step_00000002"]
    base_line = f"holds LoRA adapters trained on a base of content checksum {recorded}, but its run's recorded base " \
        f"{same} now holds"
    for module, argv in ((sample, ["--ckpt", run_dir, "--steps", "2", "--out", str(tmp_path / "s.mp4")]),
                         (evaluate, [run_dir, "--steps", "2", "--clips", "1", "--plot", str(tmp_path / "c.png")]),
                         (export, [run_dir, str(tmp_path / "m.safetensors"), "--merge-lora"])):
        proc = in_process(module, argv)
        assert proc.returncode == 2 and base_line in proc.stderr, (module.__name__, proc.stderr)


def test_a_run_records_its_episodes_and_refuses_a_data_folder_that_changed(tiny_grid, tmp_path):
    """Every step records the training and held-out episodes and a content fingerprint. A held-out video deleted
    since (the held-out set would shift onto a trained-on episode) and a same-size folder of other content are refused
    by the resume and by evaluate.py in one line each, naming what changed."""
    import json

    import evaluate
    grid = str(tmp_path / "grid")
    shutil.copytree(tiny_grid, grid)
    out = str(tmp_path / "out")
    args = ["--data", grid, "--out", out, "--save-every", "1", "--sample-every", "0"]
    check(in_process(train, args + ["--steps", "1"]))
    episodes = resume.read_meta(os.path.join(out, "step_00000001"))["extra"]["episodes"]
    held = episodes["held_out"]
    assert len(held) == 2 and len(episodes["train"]) == 4 and len(episodes["fingerprint"]) == 16
    video = os.path.join(grid, "videos", held[0] + ".mp4")
    os.rename(video, video + ".away")
    proc = in_process(train, args + ["--steps", "2"])
    assert proc.returncode == 2 and f"its held-out episodes changed in {grid}: {held[0]} no longer usable there " \
        "(deleted or skipped)" in proc.stderr and "restore the data folder, or use a new --out" in proc.stderr, \
        proc.stderr
    proc = in_process(evaluate, [out, "--steps", "2", "--clips", "1", "--plot", str(tmp_path / "c.png")])
    assert proc.returncode == 2 and f"its held-out episode(s) {held[0]} are no longer usable in {grid}" in proc.stderr
    os.rename(video + ".away", video)
    manifest = os.path.join(grid, "manifest.jsonl")  # two training episodes' files swapped, their records with them
    rows = [json.loads(line) for line in open(manifest)]
    a, b = [r for r in rows if r["stem"] in episodes["train"][:2]]
    for key in ("sha1", "bytes", "n_out"):
        a[key], b[key] = b[key], a[key]
    paths = [os.path.join(grid, "videos", r["stem"] + ".mp4") for r in (a, b)]
    os.rename(paths[0], paths[0] + ".swap")
    os.rename(paths[1], paths[0])
    os.rename(paths[0] + ".swap", paths[1])
    with open(manifest, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    proc = in_process(train, args + ["--steps", "2"])
    assert proc.returncode == 2 and f"the episodes of {grid} have the same names but other content" in proc.stderr, \
        proc.stderr
