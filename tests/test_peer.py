"""bench.py --vs diffusers (peer.py): diffusers' CosmosTransformer3DModel and AutoencoderKLWan, fed our weights through
the key maps, compute our DiT and WanVAE to fp32 rounding (forward, gradients, LoRA adapters included), and the
bench command prints a ratio table with both sides. Skipped where diffusers is not installed (a benchmark-only
dependency: pip install diffusers==0.42.1).
"""
import json
import math

import pytest
import torch

pytest.importorskip("diffusers")

import bench  # noqa: E402
import peer  # noqa: E402
from lora import add_lora  # noqa: E402
from model import DiT, condition_mask, get_config  # noqa: E402
from vae import WanVAE, get_vae_config  # noqa: E402

CPU = ["--device", "cpu", "--dtype", "float32", "--config", "tiny", "--frames", "9", "--height", "64", "--width", "64",
       "--text-len", "16", "--steps", "1", "--warmup", "0"]


@torch.no_grad()
def randomize(model, seed):
    """Every parameter random and O(1) in effect (the default init keeps the adaLN gates and LoRA B near zero, which
    would hide a wrong map of those keys): norms' gains around 1, matrices ~ 1/sqrt(fan-in)."""
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        if p.dim() == 1 or p.shape[1:].numel() == 1:  # RMSNorm weights and gammas, biases
            p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
        else:
            p.copy_(torch.randn(p.shape, generator=g) * p[0].numel() ** -0.5)


def tiny_dit(lora):
    torch.manual_seed(0)
    # RoPE scaled differently per axis (as v2w-2b/14b are): a (t, h, w) order mix-up in rope_scale shows
    net = DiT(get_config("tiny", rope_t_extrapolation_ratio=5 / 6, rope_h_extrapolation_ratio=3.0,
                         rope_w_extrapolation_ratio=2.0))
    if lora:
        add_lora(net, lora)
    randomize(net, 1)
    return net


def dit_inputs():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 16, 3, 8, 8, generator=g)
    t = torch.tensor([[1e-4 / (1 + 1e-4), 0.3, 0.7]])  # per latent frame: a conditioning frame, then two noisy ones
    text = torch.randn(1, 16, 1024, generator=g)
    pad = (torch.rand(1, 1, 8, 8, generator=g) > 0.5).float()
    return x, t, text, condition_mask(x, 1), pad


@pytest.mark.parametrize("lora", [0, 4])
def test_dit_same_function_and_gradients(lora):
    net = tiny_dit(lora)
    theirs = peer.to_diffusers(net)  # shares net's tensors; net stays usable
    wrapped = peer.PeerNet(theirs, net.cfg)
    x, t, text, mask, pad = dit_inputs()
    out = {}
    for name, model in (("ours", net), ("theirs", wrapped)):
        y = model(x, t, text, condition_mask_B_1_T_H_W=mask, padding_mask_B_1_H_W=pad)
        (y.square().mean()).backward()
        out[name] = y.detach()
    # bit-equal on CPU today; 1e-6 still sees diffusers' own q/k RMSNorm eps (1e-5: 1.3e-6 here)
    assert peer.compare(out["theirs"], out["ours"])["rel_rms"] < 1e-6
    table = peer.dit_table(net.cfg)
    ours_grads = peer.rename({k: p.grad for k, p in net.named_parameters() if p.requires_grad}, table)
    their_grads = {k: p.grad for k, p in theirs.named_parameters() if p.requires_grad}
    assert ours_grads.keys() == their_grads.keys() and len(ours_grads) == (40 if lora else len(list(net.parameters())))
    for k, grad in ours_grads.items():
        assert peer.compare(their_grads[k], grad)["rel_rms"] < 1e-5, k
    with torch.no_grad():  # controls: the padding channel is live, and a wrong key map shows
        assert peer.compare(wrapped(x, t, text, mask, padding_mask_B_1_H_W=1 - pad), out["theirs"])["rel_rms"] > 1e-3
        attn = theirs.transformer_blocks[0].attn1
        attn.to_q.weight, attn.to_k.weight = attn.to_k.weight, attn.to_q.weight
        assert peer.compare(wrapped(x, t, text, mask, padding_mask_B_1_H_W=pad), out["theirs"])["rel_rms"] > 1e-3


def test_vae_same_function():
    torch.manual_seed(0)
    ours = WanVAE(get_vae_config("tiny")).eval()
    randomize(ours, 3)
    theirs = peer.vae_to_diffusers(ours)
    video = torch.rand(1, 3, 9, 16, 16, generator=torch.Generator().manual_seed(4)) * 2 - 1
    latent = ours.encode(video)  # 16 frames per encoder call; theirs takes 4 at a time: the same function
    assert peer.compare(peer.their_encode(theirs, video), latent)["rel_rms"] < 1e-5
    assert peer.compare(peer.their_decode(theirs, latent), ours.decode(latent).clamp(-1, 1))["rel_rms"] < 1e-5


def run_cli(capsys, *flags):
    bench.main([*CPU, *flags])
    out = capsys.readouterr().out
    row = json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])
    header, rule, line = [ln for ln in out.splitlines() if ln.startswith("|")]
    assert header == "| case | nanocosmos | diffusers | ratio |" and line.startswith(f"| {row['case']} |")
    return row, line


@pytest.mark.parametrize("lora,mode,their_mode", [(0, "none", "no GC"), (2, "block", "GC")])
def test_bench_vs_diffusers_prints_both_sides(capsys, lora, mode, their_mode):
    row, line = run_cli(capsys, "--vs", "diffusers", "--sac", mode, "--lora", str(lora))
    ours, theirs = row["ours"], row["diffusers"]
    assert ours["status"] == theirs["status"] == "ok" and ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5)
    for side in (ours, theirs):
        assert math.isfinite(side["step_s"]) and side["step_s"] > 0
        assert f"{side['step_s']:.3f} s ({side['mode']})" in line
    assert ours["mode"] == mode and theirs["mode"] == their_mode and line.endswith(f"{row['ratio']:.2f}x |")
    assert theirs["trainable_params"] == ours["trainable_params"]
    assert row["parity"]["rel_rms"] < 1e-5 and row["ratio"] == pytest.approx(theirs["step_s"] / ours["step_s"], 1e-2)


def test_bench_vs_diffusers_vae(capsys):
    row, line = run_cli(capsys, "--vs", "diffusers-vae", "--frames", "1", "--height", "16", "--width", "16")
    assert row["latent"] == [1, 16, 1, 2, 2] and all(p["rel_rms"] < 1e-5 for p in row["parity"].values())
    for who in ("ours", "diffusers"):
        for op in ("encode", "decode"):
            s = row[who][op]["s"]
            assert math.isfinite(s) and s > 0 and f"{s:.3f} s" in line
    assert line.endswith(f"{row['ratio']['encode']:.2f}x / {row['ratio']['decode']:.2f}x |")


@pytest.mark.parametrize("flags,message", [
    (["--vs", "peft"], "--vs 'peft': valid: diffusers, diffusers-vae"),
    (["--vs", "diffusers", "--world", "2"], "--world does nothing with --vs diffusers"),
    (["--vs", "diffusers", "--lora", "4", "--fp8"], "--fp8 does nothing with --vs diffusers"),
    (["--vs", "diffusers", "--config", "p25-tiny"], "compares the Predict2 network"),
    (["--vs", "diffusers-vae", "--compile"], "--lora and --compile do nothing with --vs diffusers-vae"),
    (["--vs", "diffusers", "--sac", "auto"], "--sac auto does nothing with --vs"),
])
def test_refusals(flags, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        bench.main([*CPU, *flags])


def test_missing_diffusers_is_one_line(monkeypatch):
    find_spec = peer.importlib.util.find_spec
    monkeypatch.setattr(peer.importlib.util, "find_spec", lambda name: None if name == "diffusers" else find_spec(name))
    with pytest.raises(ValueError) as e:
        bench.main([*CPU, "--vs", "diffusers", "--sac", "block"])
    assert str(e.value) == ("bench.py --vs diffusers needs diffusers (pip install diffusers==0.42.1); it is a "
                            "benchmark-only dependency")


def test_sweep_commands_forward_flags_and_let_entries_win():
    b = bench.parse_args(["--vs", "diffusers", "--sweep", "--compile", "--steps", "4", "--no-tf32", "--timeout", "900",
                          "--out", "rows.jsonl", "--config", "tiny"])
    cmds = peer.sweep_commands(b)
    assert len(cmds) == len(peer.SWEEP) == 4
    runs = [bench.parse_args(cmd[2:]) for cmd in cmds]
    for cmd, r in zip(cmds, runs):
        assert cmd[1].endswith("bench.py") and not r.sweep and not r.out and r.timeout == 300 and not r.tf32
    assert [(r.vs, r.config, r.sac, r.lora, r.steps, r.compile) for r in runs] == [
        ("diffusers", "v2w-2b", "selective", 0, 4, True), ("diffusers", "v2w-2b", "block", 0, 4, True),
        ("diffusers", "v2w-14b", "block", 32, 3, True), ("diffusers-vae", "v2w-2b", "selective", 0, 4, False)]
