"""Context parallelism (base/cp.py, --cp N) on CPU gloo: the CP forward and its gradients equal the no-CP run to fp32
rounding (2 and 4 ranks, a camera net included), train.py's loss curves equal over 3 steps, checkpoints resume under
another (dp, cp) layout, the refusals, and GRPO and DiffusionNFT updates equal the ones without CP. docs/memory.md,
"Context parallelism", has the design and its promises.
"""
import json
import os
import shutil

import pytest
import torch
import torch.distributed as dist

import sac
from base import cp
from base.inits import get_config
from condition import Condition, condition_mask
from dist_utils import run_dist
from model import DiT
from nets.lora import add_lora
from run_utils import in_process, script
from rl_utils import latent_reward


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
        out = net(x, t, Condition(text, condition_mask=mask, camera=camera))
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


CASES = [(2, 2, "tiny", "plain"), (2, 2, "p25-tiny-agibot", "plain"), (4, 4, "tiny-h4", "plain"),
         (4, 2, "tiny-h4", "plain"), (2, 2, "tiny", "block"), (2, 2, "tiny", "selective"), (2, 2, "tiny", "lora"),
         (2, 2, "tiny", "compile")]  # world, cp, config, mode


def _job(rank, world):
    """Every case of one world size in one spawned job (a job costs each rank ~5 s of imports on 2 cores); the
    4-rank job then runs the refusals. {(cp, config, mode) or "refusals": this rank's result}."""
    results = {case[1:]: _forward_backward(rank, world, case[2], case[1], case[3]) for case in CASES
               if case[0] == world}
    if world == 4:
        results["refusals"] = _refusals(rank, world)
    return results


@pytest.fixture(scope="module")
def ranks2():
    return run_dist(_job, 2, 300)


@pytest.fixture(scope="module")
def ranks4():
    return run_dist(_job, 4, 300)


@pytest.mark.parametrize("world,cp_size,config,mode", CASES)
def test_forward_and_gradients_equal_the_no_cp_run(request, world, cp_size, config, mode):
    for results in request.getfixturevalue(f"ranks{world}"):
        out_err, grad_err, scale = results[(cp_size, config, mode)]
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
            net(x + shift, t, Condition(text, condition_mask=mask))
            errors.append("ran")
        except (ValueError, RuntimeError) as e:
            errors.append(str(e))
    return errors


def test_refusals(ranks4):
    with pytest.raises(ValueError, match="--cp 3 must divide the number of ranks 2"):
        cp.make_mesh("cpu", 2, 3)
    for heads, frames, inputs in (r["refusals"] for r in ranks4):
        assert heads.startswith("--cp 4: the 2 attention heads of this config do not split evenly"), heads
        assert frames.startswith("--cp 2: 3 latent frames do not split evenly over 2 ranks"), frames
        assert "the ranks of a cp group were given different inputs" in inputs, inputs


# -----------------------------------------------------------------------------
# train.py --cp: the loss curve of a cp group is the one-process curve; checkpoints move between layouts.
# One-process runs are train.main in this process (run_utils.in_process); ranks are torchrun subprocesses.


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A grid folder whose clips have 13 frames (4 latent frames: splits over 2 and 4 ranks), and one random init
    file, so that a plain and an FSDP2 model start from the same weights (their random inits differ)."""
    from safetensors.torch import save_file

    import stitch
    root = tmp_path_factory.mktemp("cp")
    stitch.make_synthetic(str(root / "raw"), lengths=(80, 72, 88, 64))
    stitch.stitch(str(root / "raw"), str(root / "grid"), stride=4, frames=13, size="64x112", workers=1)
    net = DiT(get_config("tiny"))
    torch.manual_seed(0)
    net.init_weights()
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(root / "init.safetensors"))
    return root


def train(run_dir, out, steps, ranks=0, *flags, sft=True):
    """train.py on the 13-frame grid; SFT at a constant lr (the schedule depends on --steps, which resuming changes)
    of 1e-5 (Adam turns fp32 rounding noise in near-zero gradients into +-lr updates: kept far below the tolerance)."""
    import train as train_py
    args = ["--data", str(run_dir / "grid"), "--frames", "13", "--steps", str(steps), "--save-every", "1",
            "--guard-max-ratio", "10", "--out", str(run_dir / out)]  # the tiny preset samples every 100
    args += (["--warmup", "0", "--lr", "1e-5", "--lr-min-ratio", "1", "--init", str(run_dir / "init.safetensors")]
             if sft else []) + list(flags)
    proc = script(args, torchrun=ranks) if ranks else in_process(train_py, args)
    return proc, metrics(run_dir / out)


def metrics(out):
    """{step: row}, the last row per step (a resumed run re-appends the steps after its checkpoint)."""
    return {r["step"]: r for r in map(json.loads, open(out / "metrics.jsonl"))} \
        if os.path.exists(out / "metrics.jsonl") else {}


def rewind(run_dir, src, dst, step):
    """A copy of run `src` as a run killed during step `step` + 1 leaves it: checkpoints up to `step`, `latest` naming
    it (the rows logged after it are dropped by the resumed run; tests/test_train.py resumes such runs bit for bit)."""
    shutil.copytree(run_dir / src, run_dir / dst)
    for later in (run_dir / dst).glob("step_*"):
        if int(later.name.split("_")[1].split(".")[0]) > step:
            shutil.rmtree(later)
    (run_dir / dst / "latest").write_text(f"step_{step:08d}\n")


@pytest.fixture(scope="module")
def ref(run_dir):
    """One process, 3 steps: the curve every layout must reproduce."""
    proc, rows = train(run_dir, "ref", 3)
    assert proc.returncode == 0 and rows[1]["loss"] > 0, proc.stderr[-3000:]
    return rows


@pytest.fixture(scope="module")
def dp2(run_dir):
    """(dp 2, cp 1) on 2 ranks, 3 steps: the curve of two clips per step."""
    proc, rows = train(run_dir, "dp2", 3, 2)
    assert proc.returncode == 0 and rows[1]["loss"] > 0, proc.stderr[-3000:]
    return rows


def close(a, b):
    return a == pytest.approx(b, rel=1e-5, abs=1e-7)


def test_loss_curve_and_layout_changes(run_dir, ref):
    """One process (dp 1, cp 1) vs 2 ranks --cp 2 (dp 1): the same clips and noise, so the same losses, gradient
    norms and evaluation to fp32 rounding; a checkpoint of either resumes under the other. The --cp 2 run continues
    the one-process run's step 1 (one launch for both checks; test_compiled_blocks_with_selective_checkpointing
    starts --cp 2 from the init: loading it and the init guard under CP)."""
    rewind(run_dir, "ref", "cp2", 1)  # one process -> cp 2, with a sample under CP
    proc, cp2 = train(run_dir, "cp2", 3, 2, "--cp", "2", "--sample-every", "2", "--sample-steps", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(dp 1 x cp 2)" in proc.stdout and os.path.getsize(run_dir / "cp2" / "sample_00000002.mp4") > 0
    for step in (2, 3):
        assert close(cp2[step]["loss"], ref[step]["loss"]), (step, cp2[step], ref[step])
        assert close(cp2[step]["grad_norm"], ref[step]["grad_norm"]) and close(cp2[step]["eval_loss"],
                                                                               ref[step]["eval_loss"])
    rewind(run_dir, "cp2", "cp2_to_one", 2)  # cp 2 -> one process
    proc, resumed = train(run_dir, "cp2_to_one", 3)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert close(resumed[3]["loss"], ref[3]["loss"]) and close(resumed[3]["grad_norm"], ref[3]["grad_norm"])


def test_four_ranks_dp2_cp2_continues_a_dp2_run(run_dir, dp2):
    """(dp 2, cp 1) on 2 ranks at step 2, resumed as (dp 2, cp 2) on 4 ranks: step 3 equals the uninterrupted
    2-rank run's (same two clips per step, same noise; CP reorders fp32 sums only). dp may not change: that
    checkpoint's data position refuses one process (dp 1)."""
    rewind(run_dir, "dp2", "dp2cp2", 2)
    proc, resumed = train(run_dir, "dp2cp2", 3, 4, "--cp", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(dp 2 x cp 2)" in proc.stdout
    assert close(resumed[3]["loss"], dp2[3]["loss"]), (resumed[3], dp2[3])
    assert close(resumed[3]["grad_norm"], dp2[3]["grad_norm"]) and close(resumed[3]["eval_loss"], dp2[3]["eval_loss"])
    rewind(run_dir, "dp2", "dp2_to_one", 2)
    proc, _ = train(run_dir, "dp2_to_one", 3)
    assert proc.returncode == 2
    assert "its data position is for 2 data-parallel groups, this run has 1" in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("flags,message", [
    (["--cp", "0"], "--cp 0: >= 1"),
    (["--cp", "2", "--frames", "13", "--sac", "auto", "--mem-budget", "10"], "--cp 2 with --sac auto"),
    (["--cp", "2"], "--cp 2: 3 latent frames (--frames 9) do not split evenly over 2 ranks"),
    (["--cp", "4", "--frames", "13"], "--cp 4: tiny has 2 heads"),
    (["--cp", "2", "--config", "p25-tiny-agibot"], "--cp 2: 9 latent frames (--frames 9)"),  # 3 views x 3
])
def test_train_refuses(flags, message):
    import train as train_py
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        train_py.parse_config(flags)


def test_compiled_blocks_with_selective_checkpointing(run_dir, ref):
    """--compile (inductor, each block) --sac selective --cp 2: the exchange is a graph break and is replayed in the
    recompute; the losses still equal one eager process's."""
    proc, got = train(run_dir, "cp2_compile", 2, 2, "--cp", "2", "--compile", "--sac", "selective")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for step in (1, 2):
        assert close(got[step]["loss"], ref[step]["loss"]) and close(got[step]["grad_norm"], ref[step]["grad_norm"])


# -----------------------------------------------------------------------------
# GRPO under --cp: the cp ranks of a group roll out the same trajectories (each forward split), one copy of their
# rewards enters the advantages, and the LoRA update equals the one of a process without CP

GRPO_LATENT = (16, 4, 4, 4)  # C, T, H, W: 4 latent frames (2 per cp rank), the first one conditioning


def _rl_policy(world, cp_size):
    """The tiny LoRA policy (B moved off zero) under collectives.shard_model as train.py runs it (no dist: plain net),
    and one clip and prompt per dp group. Returns (net, params, cond, full: DTensor -> full tensor, dp_rank)."""
    from base.collectives import shard_model
    torch.manual_seed(0)
    net = DiT(get_config("tiny"))
    net.init_weights()
    params = add_lora(net, 4)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in params:  # B starts at zero: a non-trivial policy
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    dp_rank = 0
    if dist.is_initialized():
        dp_rank, _, group = cp.make_mesh("cpu", world, cp_size)
        cp.enable(net, group)
        shard_model(net, torch.device("cpu"), cp_size)
    params = [p for p in net.parameters() if p.requires_grad]
    full = (lambda t: t.full_tensor() if hasattr(t, "full_tensor") else t)
    g = torch.Generator().manual_seed(10 + dp_rank)  # a clip and prompt per dp group
    emb, gt = torch.randn(2, 8, 1024, generator=g), torch.randn(1, *GRPO_LATENT, generator=g)
    cond = Condition(crossattn_emb=emb[:1], neg_crossattn_emb=emb[1:], gt_frames=gt,
                     condition_mask=condition_mask(gt, 1), key=(dp_rank, 0))
    return net, params, cond, full, dp_rank


def _grpo_update(rank, world, cp_size):
    """grpo.train_step of one group per dp group, under collectives.shard_model as train.py runs it (no dist: plain net).
    Returns (metrics, the LoRA gradients of the optimizer step, the updated LoRA weights), all full tensors."""
    import grpo
    net, params, cond, full, dp_rank = _rl_policy(world, cp_size)
    cfg = grpo.GRPOConfig(num_steps=3)
    optimizer = grpo.lora_optimizer(net, params, cfg)
    grads = []
    optimizer.register_step_pre_hook(lambda *_: grads.extend(full(p.grad).clone() for p in params))

    score = latent_reward(lambda latent: (latent * torch.linspace(-1, 1, latent[0].numel()).view(latent[0].shape))
                          .mean((1, 2, 3, 4)))  # a reward that depends on every element of the sample
    _, metrics = grpo.train_step(net, optimizer, params, [cond], GRPO_LATENT, cfg, score,
                                 seed=100 + dp_rank, window_seed=7, cp_size=cp_size)
    return metrics, grads, [full(p.detach()).clone() for p in params]


def _same_update(got, ref):
    (metrics, grads, weights), (metrics_ref, grads_ref, weights_ref) = got, ref
    assert metrics["first_ratio"] == metrics_ref["first_ratio"] == 1.0  # exactly: rollout and training agree bitwise
    for key in ("reward_mean", "reward_std", "adv_std", "loss", "grad_norm"):
        assert metrics[key] == pytest.approx(metrics_ref[key], rel=1e-5, abs=1e-7), (key, metrics, metrics_ref)
    for key in ("trajectories", "micro_steps", "padded_steps", "opt_steps"):
        assert metrics[key] == metrics_ref[key], (key, metrics, metrics_ref)
    assert len(grads) == len(grads_ref) > 0 and len(weights) == len(weights_ref) > 0
    for a, b in zip(grads, grads_ref):
        assert (a - b).abs().max() <= 1e-5 * b.abs().max(), ((a - b).abs().max(), b.abs().max())
    lr = 1e-4  # GRPOConfig's: Adam's first step is ~lr sign(grad), so elements with |grad| near its eps (1e-8) may
    for a, b, grad in zip(weights, weights_ref, grads_ref):  # move by up to 2 lr on fp32 rounding; the rest agree
        assert ((a - b).abs() - 2 * lr * (grad.abs() < 1e-6)).max() <= 1e-7, (a - b).abs().max()


def test_grpo_update_equals_the_no_cp_update():
    """--cp 2 on 2 ranks (collectives.shard_model's FSDP2) equals one process: rewards, advantages, ratio exactly 1, LoRA
    gradients and updated weights to fp32 rounding."""
    ref = _grpo_update(0, 1, 1)
    assert ref[0]["reward_std"] > 0 and ref[0]["micro_steps"] > 0 and ref[0]["opt_steps"] == 1
    for got in run_dist(_grpo_update, 2, 300, 2):
        _same_update(got, ref)


@pytest.fixture(scope="module")
def lora_init(run_dir):
    """A tiny init with non-zero LoRA adapters in it: their random init would depend on the FSDP layout."""
    from safetensors.torch import save_file
    init = run_dir / "init_lora.safetensors"
    torch.manual_seed(0)
    net = DiT(get_config("tiny"))
    net.init_weights()
    add_lora(net, 4)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if "lora" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(init))
    return init


def test_train_grpo_dp2_cp2_equals_dp2(run_dir, lora_init):
    """train.py --objective grpo: dp 2 x cp 2 on 4 ranks equals dp 2 x cp 1 on 2 ranks over 2 updates (rollout
    seeds and group keys by dp rank, advantages over both dp groups from one copy each, counts over dp groups)."""
    init = lora_init
    flags = ["--objective", "grpo", "--lora", "4", "--grpo-num-steps", "3", "--init", str(init),
             "--reward", "tests.reward_plugins:black_latent", "--eval-steps", "2", "--grpo-group-size", "4",
             "--batch-size", "1"]  # latent-only: no decoding; small, for time
    _, ref = train(run_dir, "grpo_dp2", 2, 2, *flags, sft=False)
    proc, got = train(run_dir, "grpo_dp2cp2", 2, 4, "--cp", "2", *flags, sft=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(dp 2 x cp 2)" in proc.stdout
    for step in (1, 2):
        assert got[step]["first_ratio"] == ref[step]["first_ratio"] == 1.0
        assert ref[step]["reward_std"] > 0 and ref[step]["grad_norm"] > 0
        for key in ("reward_mean", "reward_std", "adv_std", "loss", "grad_norm"):
            assert close(got[step][key], ref[step][key]), (step, key, got[step], ref[step])
        for key in ("trajectories", "micro_steps", "padded_steps", "opt_steps"):
            assert got[step][key] == ref[step][key], (step, key, got[step], ref[step])
        assert close(got[step]["eval_reward"], ref[step]["eval_reward"])


# -----------------------------------------------------------------------------
# DiffusionNFT under --cp: the same promises (nft.train_step's cp_size), its old policy swapped into every shard


def _nft_updates(rank, world, cp_size, updates=3):
    """nft.train_step of one group per dp group for `updates` updates (decay 0.5 after update 1: update 2 samples and
    trains against the old policy, swapped into the dp x cp shards), as train.py runs them. Returns (per update its
    metrics, the LoRA gradients of the last optimizer step, the updated LoRA weights, the old policy), full tensors."""
    import grpo
    import nft
    net, params, cond, full, dp_rank = _rl_policy(world, cp_size)
    cfg = nft.NFTConfig(group_size=2, num_steps=3, decay_rate=0.5, kl_coef=0.1)
    optimizer = grpo.lora_optimizer(net, params, cfg)
    old = [p.detach().clone() for p in params]
    grads = []
    optimizer.register_step_pre_hook(lambda *_: grads.append([full(p.grad).clone() for p in params]))  # per step

    score = latent_reward(lambda latent: (latent * torch.linspace(-1, 1, latent[0].numel()).view(latent[0].shape))
                          .mean((1, 2, 3, 4)))  # a reward that depends on every element of the sample
    rows = [nft.train_step(net, optimizer, params, old, [cond], GRPO_LATENT, cfg, score,
                           seed=100 + 7 * update + dp_rank, update=update, cp_size=cp_size)[1]
            for update in range(updates)]
    return rows, grads, [full(p.detach()).clone() for p in params], [full(o).clone() for o in old]


def _same_nft_updates(got, ref, lr=3e-4):
    """Metrics to fp32 rounding (old_deviation, a squared difference of two close velocities, to 1e-4), every step's
    gradients to 1e-5 of their largest, weights and old policy to 1e-6 (Adam moves an element whose gradient is
    near its eps, 1e-8, by up to 2 lr on a rounding difference: allowed for each step where it was)."""
    (rows, grads, weights, old), (rows_ref, grads_ref, weights_ref, old_ref) = got, ref
    for update, (row, row_ref) in enumerate(zip(rows, rows_ref)):
        for key in ("reward_mean", "reward_std", "adv_std", "loss", "kl_ref", "old_deviation", "grad_norm"):
            rel = 1e-4 if key == "old_deviation" else 1e-5
            assert row[key] == pytest.approx(row_ref[key], rel=rel, abs=1e-9), (update, key, row, row_ref)
        for key in ("micro_steps", "skipped_updates", "nonfinite_steps", "old_decay"):
            assert row[key] == row_ref[key], (update, key, row, row_ref)
    assert len(grads) == len(grads_ref) == len(rows_ref) and grads_ref[0]
    for step, step_ref in zip(grads, grads_ref):
        for a, b in zip(step, step_ref):
            assert (a - b).abs().max() <= 1e-5 * b.abs().max(), ((a - b).abs().max(), b.abs().max())
    for i, (a, b) in enumerate(zip(weights + old, weights_ref + old_ref)):
        tiny = sum((step[i % len(weights)].abs() < 1e-6).float() for step in grads_ref)
        assert ((a - b).abs() - 2 * lr * tiny).max() <= 1e-6, (a - b).abs().max()


def test_nft_update_equals_the_no_cp_update():
    """--cp 2 on 2 ranks (dp 1) equals one process over 3 updates, the third off-policy (the old policy swapped into
    the shards): rewards, advantages, loss, KL to the base, the old policy's deviation, LoRA gradients, weights and
    the old policy itself to fp32 rounding."""
    ref = _nft_updates(0, 1, 1)
    assert ref[0][0]["reward_std"] > 0 and ref[0][2]["old_deviation"] > 0 and ref[0][1]["old_deviation"] == 0
    for got in run_dist(_nft_updates, 2, 300, 2):
        _same_nft_updates(got, ref)


def test_train_nft_dp2_cp2_equals_dp2(run_dir, lora_init):
    """train.py --objective nft: dp 2 x cp 2 on 4 ranks equals dp 2 x cp 1 on 2 ranks over 2 updates (rollout seeds
    and group keys by dp rank, advantages over both dp groups from one copy each, metrics over dp groups)."""
    flags = ["--objective", "nft", "--lora", "4", "--nft-num-steps", "3", "--init", str(lora_init),
             "--reward", "tests.reward_plugins:black_latent", "--eval-steps", "2", "--nft-group-size", "4",
             "--batch-size", "1"]  # latent-only: no decoding; small, for time
    _, ref = train(run_dir, "nft_dp2", 2, 2, *flags, sft=False)
    proc, got = train(run_dir, "nft_dp2cp2", 2, 4, "--cp", "2", *flags, sft=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(dp 2 x cp 2)" in proc.stdout
    for step in (1, 2):
        assert ref[step]["reward_std"] > 0 and ref[step]["grad_norm"] > 0
        for key in ("reward_mean", "reward_std", "adv_std", "loss", "grad_norm", "old_deviation"):
            assert close(got[step][key], ref[step][key]), (step, key, got[step], ref[step])
        # dp groups x (K x 1 level + the shipped data term's one pass a group)
        assert got[step]["micro_steps"] == ref[step]["micro_steps"] == 2 * (4 + 1)
        assert close(got[step]["eval_reward"], ref[step]["eval_reward"])
