"""bench.py --vs diffusers (peer.py, peer_net.py): diffusers' CosmosTransformer3DModel and AutoencoderKLWan, built by
diffusers with our weights copied in through the key maps, compute our DiT and WanVAE to fp32 rounding (forward,
gradients, LoRA adapters included) while owning their parameters; the bench command runs each side in its own
process under torch's defaults and prints a ratio table with both sides (and stock diffusers with --vs-standalone).
Skipped where diffusers is not installed (a benchmark-only dependency: pip install diffusers==0.42.1).
"""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("diffusers")

import bench  # noqa: E402
import peer  # noqa: E402
import peer_net  # noqa: E402
from base.inits import get_config  # noqa: E402
from condition import Condition, condition_mask  # noqa: E402
from model import DiT
from nets.lora import add_lora  # noqa: E402
from nets.vae import WanVAE, get_vae_config  # noqa: E402

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
    theirs = peer_net.to_diffusers(net)  # net's values copied into diffusers' own parameters
    wrapped = peer_net.PeerNet(theirs, net.cfg)
    x, t, text, mask, pad = dit_inputs()
    out = {}
    for name, model in (("ours", net), ("theirs", wrapped)):
        y = model(x, t, Condition(text, condition_mask=mask, padding_mask=pad))
        (y.square().mean()).backward()
        out[name] = y.detach()
    # bit-equal on CPU today; 1e-6 still sees diffusers' own q/k RMSNorm eps (1e-5: 1.3e-6 here)
    assert peer_net.compare(out["theirs"], out["ours"])["rel_rms"] < 1e-6
    table = peer_net.dit_table(net.cfg)
    ours_grads = peer_net.rename({k: p.grad for k, p in net.named_parameters() if p.requires_grad}, table)
    their_grads = {k: p.grad for k, p in theirs.named_parameters() if p.requires_grad}
    assert ours_grads.keys() == their_grads.keys() and len(ours_grads) == (40 if lora else len(list(net.parameters())))
    for k, grad in ours_grads.items():
        assert peer_net.compare(their_grads[k], grad)["rel_rms"] < 1e-5, k
    with torch.no_grad():  # controls: the padding channel is live, and a wrong key map shows
        assert peer_net.compare(wrapped(x, t, Condition(text, condition_mask=mask, padding_mask=1 - pad)), out["theirs"])["rel_rms"] > 1e-3
        attn = theirs.transformer_blocks[0].attn1
        attn.to_q.weight, attn.to_k.weight = attn.to_k.weight, attn.to_q.weight
        assert peer_net.compare(wrapped(x, t, Condition(text, condition_mask=mask, padding_mask=pad)), out["theirs"])["rel_rms"] > 1e-3


def _storages(model):
    return {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}


@pytest.mark.parametrize("lora", [0, 4])
def test_peer_owns_contiguous_parameters_in_its_dtype(lora):
    """The old handover assigned our tensors (the same storage) into a meta-built model: the peer must own its own."""
    net = tiny_dit(lora).to(torch.bfloat16)
    for m in net.modules():  # ours keeps fp32 adapters next to a bf16 base
        if hasattr(m, "lora_a"):
            m.lora_a.float(), m.lora_b.float()
    theirs = peer_net.to_diffusers(net)
    assert not _storages(theirs) & _storages(net)
    params = dict(theirs.named_parameters())
    assert all(p.is_contiguous() and isinstance(p, torch.nn.Parameter) for p in params.values())
    assert {str(p.dtype) for n, p in params.items() if ".lora_" not in n} == {"torch.bfloat16"}
    assert {str(p.dtype) for n, p in params.items() if ".lora_" in n} == ({"torch.float32"} if lora else set())
    ours = peer_net.rename(net.state_dict(), peer_net.dit_table(net.cfg))
    assert all(torch.equal(params[k], v) for k, v in ours.items()) and len(ours) == len(params)


def test_vae_same_function():
    torch.manual_seed(0)
    ours = WanVAE(get_vae_config("tiny")).eval()
    randomize(ours, 3)
    theirs = peer_net.vae_to_diffusers(ours)
    assert not _storages(theirs) & _storages(ours)
    video = torch.rand(1, 3, 9, 16, 16, generator=torch.Generator().manual_seed(4)) * 2 - 1
    latent = ours.encode(video)  # 16 frames per encoder call; theirs takes 4 at a time: the same function
    assert peer_net.compare(peer_net.their_encode(theirs, video), latent)["rel_rms"] < 1e-5
    assert peer_net.compare(peer_net.their_decode(theirs, latent), ours.decode(latent).clamp(-1, 1))["rel_rms"] < 1e-5


def run_cli(capsys, *flags):
    bench.main([*CPU, *flags])
    out = capsys.readouterr().out
    row = json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])
    header, rule, line = [ln for ln in out.splitlines() if ln.startswith("|")]
    assert header.startswith("| case | nanocosmos | diffusers | ratio |") and line.startswith(f"| {row['case']} |")
    return row, header, line


def pristine_state():
    """global_state of a fresh process started as the diffusers sides are (--vs on its command line), nothing run."""
    code = "import json, sys; sys.path.insert(0, 'benchmarks'); import peer; print(json.dumps(peer.global_state()))"
    proc = subprocess.run([sys.executable, "-c", code, "--vs"], capture_output=True, text=True, check=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return json.loads(proc.stdout.splitlines()[-1])


def test_bench_vs_diffusers_sides_in_fresh_processes(capsys, monkeypatch):
    """Ours, diffusers with our weights and stock diffusers, each its own process: a row, a table, the same loss for
    the same weights, and no global setting that differs between the diffusers sides and a fresh process."""
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)  # as a user's shell: bench's own setting is ours only
    row, header, line = run_cli(capsys, "--vs", "diffusers", "--sac", "block", "--vs-standalone",
                                "--vs-tolerance", "1e6")  # CPU times: no 3% to hold here
    assert header.endswith("| diffusers standalone | ratio | standalone / in-bench |")
    for who in ("ours", "diffusers", "stock"):
        side = row[who]
        assert side["status"] == "ok" and math.isfinite(side["step_s"]) and side["step_s"] > 0, side
        assert f"{side['step_s']:.3f} s ({side['mode']})" in line
    ours, theirs, stock = row["ours"], row["diffusers"], row["stock"]
    assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5) and ours["mode"] == "block"
    assert theirs["mode"] == stock["mode"] == "GC" and theirs["trainable_params"] == ours["trainable_params"]
    assert row["parity"]["rel_rms"] < 1e-5 and row["ratio"] == pytest.approx(theirs["step_s"] / ours["step_s"], 1e-2)
    assert f"| {row['ratio']:.2f}x |" in line
    assert theirs["cmd"].startswith("python benchmarks/bench.py --vs diffusers --vs-side peer")
    assert ours["cmd"].startswith("python benchmarks/bench.py ") and "--vs" not in ours["cmd"]
    fresh = pristine_state()  # ours sets TF32 (and expandable segments) for itself
    assert theirs["global_state"] == stock["global_state"] == fresh and fresh["env"]["PYTORCH_CUDA_ALLOC_CONF"] is None
    assert not fresh["matmul_tf32"] and ours["tf32"] and stock["trainable_params"] == ours["trainable_params"]
    assert line.endswith(f"{row['ratio_standalone']:.2f}x | {row['standalone_vs_in_bench']:.2f}x |")
    assert row["standalone_vs_in_bench"] == pytest.approx(stock["step_s"] / theirs["step_s"], 1e-2)


def side(capsys, *flags):
    bench.main([*CPU, "--vs", "diffusers", *flags])
    return json.loads(capsys.readouterr().out.splitlines()[-1])


def test_peer_side_with_lora(capsys):
    """`--vs-side peer` with LoRA: our adapters on diffusers' Linears, its step timed, parity after it."""
    res = side(capsys, "--vs-side", "peer", "--sac", "none", "--lora", "2")
    net = tiny_dit(2)
    assert res["status"] == "ok" and res["side"] == "peer" and res["mode"] == "no GC"
    assert res["parity"]["rel_rms"] < 1e-5
    assert res["trainable_params"] == sum(p.numel() for p in net.parameters() if p.requires_grad)
    assert res["trainable_dtypes"] == ["float32"] and math.isfinite(res["loss"])


def test_standalone_stock_step_runs_alone(capsys):
    """`--vs-side stock`: diffusers' own model and init, its checkpointing, one timed step, nothing of ours in it."""
    res = side(capsys, "--vs-side", "stock", "--sac", "block")
    assert res["status"] == "ok" and res["side"] == "stock" and res["step_s"] > 0 and math.isfinite(res["loss"])
    assert res["mode"] == "GC"
    assert res["trainable_params"] == sum(p.numel() for p in DiT(get_config("tiny")).parameters())
    assert res["sdpa_choice"] in torch.nn.attention.SDPBackend.__members__


def test_standalone_stock_lora_is_peft(capsys):
    pytest.importorskip("peft")
    res = side(capsys, "--vs-side", "stock", "--sac", "none", "--lora", "4")
    net = tiny_dit(4)
    assert res["status"] == "ok" and res["mode"].startswith("no GC, PEFT ") and res["mode"].endswith(" LoRA")
    assert res["trainable_params"] == sum(p.numel() for p in net.parameters() if p.requires_grad)


def test_agreement_is_one_line_past_the_tolerance():
    def row(peer_s, stock_s, status="ok"):
        sides = dict(diffusers=dict(status="ok", step_s=peer_s), stock=dict(status=status, step_s=stock_s))
        return dict(**sides, standalone_vs_in_bench=peer._ratio(sides["stock"], sides["diffusers"]))
    peer.check_agreement(row(2.0, 2.05), 0.03)
    with pytest.raises(ValueError, match=r"in-bench diffusers 2\.000 s and standalone diffusers 2\.100 s differ by "
                                         r"\+5\.0% \(> 3%\)"):
        peer.check_agreement(row(2.0, 2.1), 0.03)
    with pytest.raises(ValueError, match="nothing to compare: in-bench diffusers ok, standalone OOM"):
        peer.check_agreement(row(2.0, 2.1, "OOM"), 0.03)


def test_bench_vs_diffusers_vae(capsys):
    row, _, line = run_cli(capsys, "--vs", "diffusers-vae", "--frames", "1", "--height", "16", "--width", "16")
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
    (["--vs", "diffusers-vae", "--compile"], "--lora, --compile, --vs-side and --vs-standalone do nothing with --vs "
                                             "diffusers-vae"),
    (["--vs", "diffusers-vae", "--vs-standalone"], "do nothing with --vs diffusers-vae"),
    (["--vs", "diffusers", "--sac", "auto"], "--sac auto does nothing with --vs"),
    (["--vs", "diffusers", "--vs-side", "ours"], "--vs-side 'ours': valid: peer, stock"),
    (["--vs", "diffusers", "--vs-side", "stock", "--vs-standalone"], "--vs-side runs one side alone"),
    (["--vs", "diffusers", "--vs-side", "peer", "--no-tf32"], "--no-tf32 does nothing with --vs-side"),
    (["--vs", "diffusers", "--vs-tolerance", "0.05"], "only with --vs-standalone"),
])
def test_refusals(flags, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        bench.main([*CPU, *flags])


def test_missing_diffusers_or_peft_is_one_line(monkeypatch):
    find_spec = peer.importlib.util.find_spec
    missing = {"diffusers"}
    monkeypatch.setattr(peer.importlib.util, "find_spec", lambda name: None if name in missing else find_spec(name))
    with pytest.raises(ValueError) as e:
        bench.main([*CPU, "--vs", "diffusers", "--sac", "block"])
    assert str(e.value) == ("bench.py --vs diffusers needs diffusers (pip install diffusers==0.42.1); it is a "
                            "benchmark-only dependency")
    missing = {"peft"}
    for flags in (["--vs-standalone"], ["--vs-side", "stock"]):
        with pytest.raises(ValueError, match="needs PEFT, diffusers' LoRA backend") as e:
            bench.main([*CPU, "--vs", "diffusers", "--lora", "4", *flags])
        assert str(e.value) == peer.PEFT_MISSING


def test_sweep_commands_forward_flags_and_let_entries_win():
    b = bench.parse_args(["--vs", "diffusers", "--sweep", "--compile", "--steps", "4", "--no-tf32", "--timeout", "900",
                          "--out", "rows.jsonl", "--config", "tiny", "--vs-standalone"])
    cmds = peer.sweep_commands(b)
    assert len(cmds) == len(peer.SWEEP) == 4
    runs = [bench.parse_args(cmd[2:]) for cmd in cmds]
    for cmd, r in zip(cmds, runs):
        assert cmd[1].endswith(os.path.join("benchmarks", "bench.py"))
        assert not r.sweep and not r.out and r.timeout == 900 and not r.tf32
    assert [(r.vs, r.config, r.sac, r.lora, r.steps, r.compile, r.vs_standalone) for r in runs] == [
        ("diffusers", "v2w-2b", "selective", 0, 4, True, True), ("diffusers", "v2w-2b", "block", 0, 4, True, True),
        ("diffusers", "v2w-14b", "block", 32, 3, True, True),
        ("diffusers-vae", "v2w-2b", "selective", 0, 4, False, False)]


def test_side_commands_are_ours_plain_and_theirs_at_torch_defaults():
    b = bench.parse_args(["--vs", "diffusers", "--config", "tiny", "--lora", "4", "--no-tf32", "--vs-standalone",
                          "--timeout", "900", "--compile"])
    ours, theirs, stock = (peer.side_command(b, s) for s in ("ours", "peer", "stock"))
    assert bench.parse_args(ours[2:]) == bench.parse_args(["--config", "tiny", "--lora", "4", "--no-tf32", "--compile"])
    assert theirs[2:6] == ["--vs", "diffusers", "--vs-side", "peer"] and stock[5] == "stock"
    assert bench.parse_args(theirs[2:]).tf32 and "--vs-standalone" not in theirs and "--timeout" not in stock
