"""Context parallelism (cp.py, --cp N) on CPU gloo: the CP forward and its gradients equal the no-CP run to fp32
rounding (2 and 4 ranks, a camera net included), train.py's loss curves equal over 3 steps, checkpoints resume under
another (dp, cp) layout, and the refusals. docs/memory.md, "Context parallelism", has the design and its promises.
"""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import cp
import sac
from dist_utils import run_dist
from lora import add_lora
from model import DiT, condition_mask, get_config


def _inputs(cfg, T=4, H=8, W=8, text_len=8):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 16, T, H, W, generator=g)
    t = torch.rand(1, T, generator=g)  # a time per latent frame: the per-frame adaLN rows are split too
    text = torch.randn(1, text_len, cfg.crossattn_proj_in_channels, generator=g)
    camera = (torch.randn(1, T, H // 2, W // 2, cfg.camera_channels, generator=g) if cfg.camera_channels else None)
    weight = torch.randn(1, 16, T, H, W, generator=g)  # a loss that weighs every output element differently
    return x, t, text, condition_mask(x, 1), camera, weight


def _forward_backward(rank, world, config, cp_size, mode="plain"):
    """(max |out_cp - out|, max |grad_cp - grad| relative to max |grad|, max |out|) on this rank, grads summed over
    the cp group. mode: plain, a sac mode (the all-to-all is replayed in the recompute), lora, or compile (each block
    compiled with aot_eager, as --compile does with inductor: the exchange is a graph break)."""
    torch.manual_seed(0)
    net = DiT(get_config(config))
    if mode == "lora":
        add_lora(net, 4)
        for name, p in net.named_parameters():  # B starts at zero: give the adapters a non-trivial value
            if "lora" in name:
                torch.nn.init.normal_(p, std=0.1)
    elif mode in sac.MODES:
        sac.apply(net, mode)
    x, t, text, mask, camera, weight = _inputs(net.cfg)

    def run():
        net.zero_grad(set_to_none=True)
        out = net(x, t, text, condition_mask_B_1_T_H_W=mask, camera_B_T_Hp_Wp_C=camera)
        (out * weight).sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in net.named_parameters() if p.requires_grad}
    out_ref, grads_ref = run()
    _, _, group = cp.make_mesh("cpu", world, cp_size)
    cp.enable(net, group)
    if mode == "compile":
        for block in net.blocks:
            block.compile(backend="aot_eager")
    out, grads = run()
    assert grads.keys() == grads_ref.keys() and grads
    for g in grads.values():  # each rank holds its frames' part of the sample's gradient
        dist.all_reduce(g, group=group)
    out_err = (out - out_ref).abs().max().item()
    grad_err = max(((grads[n] - g).abs().max() / g.abs().max().clamp_min(1e-30)).item() for n, g in grads_ref.items())
    return out_err, grad_err, out_ref.abs().max().item()


@pytest.mark.parametrize("world,cp_size,config,mode", [
    (2, 2, "tiny", "plain"), (2, 2, "p25-tiny-agibot", "plain"), (4, 4, "tiny-h4", "plain"), (4, 2, "tiny-h4", "plain"),
    (2, 2, "tiny", "block"), (2, 2, "tiny", "selective"), (2, 2, "tiny", "lora"), (2, 2, "tiny", "compile")])
def test_forward_and_gradients_equal_the_no_cp_run(world, cp_size, config, mode):
    for out_err, grad_err, scale in run_dist(_forward_backward, world, 300, config, cp_size, mode):
        assert out_err <= 1e-5 * scale, (out_err, scale)
        assert grad_err <= 1e-5, grad_err


def _refusals(rank, world):
    """One message per refusal, on every rank: heads, frames, inputs that differ between the ranks of a cp group."""
    errors = []
    cases = [("tiny", 4, world, 0), ("tiny-h4", 3, 2, 0), ("tiny-h4", 4, 2, rank)]  # config, T, cp, shift per rank
    for config, T, cp_size, shift in cases:
        net = DiT(get_config(config))
        try:
            cp.enable(net, cp.make_mesh("cpu", world, cp_size)[2])
            x, t, text, mask, _, _ = _inputs(net.cfg, T=T)
            net(x + shift, t, text, condition_mask_B_1_T_H_W=mask)
            errors.append("ran")
        except (ValueError, RuntimeError) as e:
            errors.append(str(e))
    return errors


def test_refusals():
    with pytest.raises(ValueError, match="--cp 3 must divide the number of ranks 2"):
        cp.make_mesh("cpu", 2, 3)
    heads, frames, inputs = run_dist(_refusals, 4, 120)[0]
    assert heads.startswith("--cp 4: the 2 attention heads of this config do not split evenly"), heads
    assert frames.startswith("--cp 2: 3 latent frames do not split evenly over 2 ranks"), frames
    assert "the ranks of a cp group were given different inputs" in inputs, inputs


# -----------------------------------------------------------------------------
# train.py --cp: the loss curve of a cp group is the one-process curve; checkpoints move between layouts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A grid folder whose clips have 13 frames (4 latent frames: splits over 2 and 4 ranks), and one random init
    file, so that a plain and an FSDP2 model start from the same weights (their random inits differ)."""
    import stitch
    from safetensors.torch import save_file
    root = tmp_path_factory.mktemp("cp")
    stitch.make_synthetic(str(root / "raw"), lengths=(80, 72, 88, 64))
    stitch.stitch(str(root / "raw"), str(root / "grid"), stride=4, frames=13, size="64x112", workers=1)
    net = DiT(get_config("tiny"))
    torch.manual_seed(0)
    net.init_weights()
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(root / "init.safetensors"))
    return root


def train(run_dir, out, steps, ranks=0, *flags):
    """train.py on the 13-frame grid, at a constant lr (the schedule depends on --steps, which resuming changes) of
    1e-5 (Adam turns fp32 rounding noise in near-zero gradients into +-lr updates: kept far below the tolerance)."""
    args = ["--data", str(run_dir / "grid"), "--frames", "13", "--steps", str(steps), "--save-every", "1",
            "--warmup", "0", "--lr", "1e-5", "--lr-min-ratio", "1", "--init", str(run_dir / "init.safetensors"),
            "--guard-max-ratio", "10", "--out", str(run_dir / out), *flags]  # the tiny preset samples every 100
    cmd = [sys.executable] + (["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"] if ranks
                              else []) + [os.path.join(ROOT, "train.py")] + args
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    return proc, {r["step"]: r for r in map(json.loads, open(run_dir / out / "metrics.jsonl"))} \
        if os.path.exists(run_dir / out / "metrics.jsonl") else {}


def close(a, b):
    return a == pytest.approx(b, rel=1e-5, abs=1e-7)


def test_loss_curve_and_layout_changes(run_dir):
    """One process (dp 1, cp 1) vs 2 ranks --cp 2 (dp 1): the same clips and noise, so the same losses, gradient
    norms and evaluation to fp32 rounding; a checkpoint of either resumes under the other; dp may not change."""
    _, ref = train(run_dir, "ref", 3)
    proc, cp2 = train(run_dir, "cp2", 2, 2, "--cp", "2", "--sample-every", "2", "--sample-steps", "2")  # sampling too
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(dp 1 x cp 2)" in proc.stdout and os.path.getsize(run_dir / "cp2" / "sample_00000002.mp4") > 0
    for step in (1, 2):
        assert ref[step]["loss"] > 0 and close(cp2[step]["loss"], ref[step]["loss"]), (step, cp2[step], ref[step])
        assert close(cp2[step]["grad_norm"], ref[step]["grad_norm"]) and close(cp2[step]["eval_loss"],
                                                                               ref[step]["eval_loss"])
    proc, resumed = train(run_dir, "cp2", 3)  # cp 2 -> one process
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert close(resumed[3]["loss"], ref[3]["loss"]) and close(resumed[3]["grad_norm"], ref[3]["grad_norm"])
    proc, _ = train(run_dir, "one", 2)
    proc, resumed = train(run_dir, "one", 3, 2, "--cp", "2")  # one process -> cp 2
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert close(resumed[3]["loss"], ref[3]["loss"]) and close(resumed[3]["grad_norm"], ref[3]["grad_norm"])
    proc, _ = train(run_dir, "one", 4, 2)  # 2 ranks, --cp 1: 2 dp groups, the data position is for 1
    assert proc.returncode != 0
    assert "its data position is for 1 data-parallel groups, this run has 2" in proc.stdout + proc.stderr


def test_four_ranks_dp2_cp2_continues_a_dp2_run(run_dir):
    """(dp 2, cp 1) on 2 ranks for 2 steps, resumed as (dp 2, cp 2) on 4 ranks: step 3 equals the uninterrupted
    2-rank run's (same two clips per step, same noise; CP reorders fp32 sums only)."""
    _, ref = train(run_dir, "dp2", 3, 2)
    proc, _ = train(run_dir, "dp2cp2", 2, 2)
    proc, resumed = train(run_dir, "dp2cp2", 3, 4, "--cp", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(dp 2 x cp 2)" in proc.stdout
    assert ref[3]["loss"] > 0 and close(resumed[3]["loss"], ref[3]["loss"]), (resumed[3], ref[3])
    assert close(resumed[3]["grad_norm"], ref[3]["grad_norm"]) and close(resumed[3]["eval_loss"], ref[3]["eval_loss"])


@pytest.mark.parametrize("flags,message", [
    (["--cp", "0"], "--cp 0: >= 1"),
    (["--cp", "2", "--frames", "13", "--objective", "grpo", "--lora", "4"], "--cp 2 with --objective grpo"),
    (["--cp", "2", "--frames", "13", "--sac", "auto", "--mem-budget", "10"], "--cp 2 with --sac auto"),
    (["--cp", "2"], "--cp 2: 3 latent frames (--frames 9) do not split evenly over 2 ranks"),
    (["--cp", "4", "--frames", "13"], "--cp 4: tiny has 2 heads"),
    (["--cp", "2", "--config", "p25-tiny-agibot"], "--cp 2: 9 latent frames (--frames 9)"),  # 3 views x 3
])
def test_train_refuses(flags, message):
    import train as train_py
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        train_py.parse_config(flags)


def test_compiled_blocks_with_selective_checkpointing(run_dir):
    """--compile (inductor, each block) --sac selective --cp 2: the exchange is a graph break and is replayed in the
    recompute; the losses still equal one eager process's."""
    _, ref = train(run_dir, "ref_compile", 2)
    proc, got = train(run_dir, "cp2_compile", 2, 2, "--cp", "2", "--compile", "--sac", "selective")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for step in (1, 2):
        assert close(got[step]["loss"], ref[step]["loss"]) and close(got[step]["grad_norm"], ref[step]["grad_norm"])
