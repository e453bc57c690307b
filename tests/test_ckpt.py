"""ckpt.py on CPU: strict loading into FSDP2 shards (gloo, 2 ranks), a fault matrix where every fault is a clear
error on every rank, the init guard, the check CLI; and engine/resume.py's sharded cases: DCP save/resume bit-exactness
(with an EMA as extra state), LoRA-only checkpoints, export. Single-process engine/resume.py tests: tests/test_resume.py.

The sharded cases all run inside ONE spawned 2-rank job (the `dist_job` fixture) to keep the file fast on 2 cores;
the tests below assert on its per-rank results.
"""
import argparse
import io
import json
import os
import time

import loadbench
import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import ckpt
import export
from base.inits import get_config
from condition import Condition
from dist_utils import run_dist
from engine import resume
from engine.build import GUARD_MAX_RATIO, guard_loss, init_guard
from model import DiT
from nets.edm import denoise
from nets.lora import add_lora
from run_utils import in_process

# tiny, with an odd dim 0 (crossattn_proj.0: 33 rows -> 17 + 16 on 2 ranks)
CFG = get_config("tiny", crossattn_emb_channels=33, crossattn_proj_in_channels=40)


def reference_state():
    torch.manual_seed(0)
    return {k: v.clone() for k, v in DiT(CFG).state_dict().items()}


def build(lora=0, dtype=None, sharded=True, hsdp=False):
    """The train.py order: meta -> (dtype, LoRA) -> fully_shard blocks, final layer, root -> to_empty -> init.
    hsdp: a 2-D (replicate=2, shard=1) mesh, so the loader meets Replicate placements too."""
    with torch.device("meta"):
        net = DiT(CFG)
    if dtype is not None:
        net = net.to(dtype)
    if lora:
        add_lora(net, lora)
    if sharded:
        ws = dist.get_world_size()
        shape, names = ((ws, 1), ("replicate", "shard")) if hsdp else ((ws,), ("shard",))
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        for block in net.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=True)
        fully_shard(net.final_layer, mesh=mesh, reshard_after_forward=False)
        fully_shard(net, mesh=mesh, reshard_after_forward=False)
    net.to_empty(device="cpu")
    net.init_weights()
    return net


def full_state(net):
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone() for k, v in net.state_dict().items()}


def train_step(net, opt, step):
    """One rectified-flow step on a batch fixed by (step, rank)."""
    g = torch.Generator().manual_seed(1000 * step + (dist.get_rank() if dist.is_initialized() else 0))
    x0, eps = torch.randn(1, 16, 1, 4, 4, generator=g), torch.randn(1, 16, 1, 4, 4, generator=g)
    sigma = torch.rand(1, generator=g) * 3
    _, velocity = denoise(net, x0 + sigma * eps, sigma, Condition(torch.randn(1, 3, 40, generator=g)))
    loss = ((velocity - (eps - x0)) ** 2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


def flip_chunk(path, offset, length):
    """Flip one bit in the middle of a byte range of a file (a tensor's bytes: a bit rotted on disk)."""
    with open(path, "r+b") as f:
        f.seek(offset + length // 2)
        byte = f.read(1)[0]
        f.seek(offset + length // 2)
        f.write(bytes([byte ^ 8]))


def flip_last_shard(step, fqn):
    """Flip a bit in the last rank's chunk of a saved sharded tensor (DCP stores each chunk as a small torch.save
    zip, whose middle is tensor data for a tensor much larger than its ~1 KB of headers)."""
    storage = FileSystemReader(step).read_metadata().storage_data
    info = storage[max((i for i in storage if i.fqn == fqn), key=lambda i: tuple(i.offset))]
    flip_chunk(os.path.join(step, info.relative_path), info.offset, info.length)


# -----------------------------------------------------------------------------
# Fixture files (written once by the parent, read by both ranks)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    sd = reference_state()
    f = {}

    def st(name, tensors):
        f[name] = str(d / f"{name}.safetensors")
        save_file({k: v.contiguous() for k, v in tensors.items()}, f[name])

    def pt(name, obj, **kw):
        f[name] = str(d / f"{name}.pt")
        torch.save(obj, f[name], **kw)
    st("ref", sd)
    pt("ref_pt", sd)
    st("ref_other", {k: v * 2 for k, v in sd.items()})  # same keys and shapes, other values: another revision
    pt("pt_flipped", sd)
    flip_chunk(f["pt_flipped"], *ckpt.open_source(f["pt_flipped"]).records["blocks.1.mlp.layer2.weight"][:2])
    release = {"net." + k: v.to(torch.bfloat16) for k, v in sd.items()}
    release.update({"net.accum_iteration": torch.tensor(7), "net.blocks.0.self_attn.q_norm._extra_state":
                    torch.zeros(5, dtype=torch.uint8), "net.blocks.0.self_attn.attn_op._extra_state": io.BytesIO(b"TE")})
    pt("release", release)
    # sharded safetensors with an index json
    os.makedirs(d / "index")
    keys = sorted(sd)
    weight_map = {k: f"part-{i % 2}.safetensors" for i, k in enumerate(keys)}
    for part in ("part-0.safetensors", "part-1.safetensors"):
        save_file({k: sd[k].contiguous() for k in keys if weight_map[k] == part}, str(d / "index" / part))
    f["index"] = str(d / "index" / "model.safetensors.index.json")
    with open(f["index"], "w") as fh:
        json.dump({"metadata": {}, "weight_map": weight_map}, fh)
    # faults
    k0, k1 = "blocks.1.mlp.layer2.weight", "blocks.0.self_attn.q_proj.weight"
    st("missing_key", {k: v for k, v in sd.items() if k != k0})
    st("missing_buffer", {k: v for k, v in sd.items() if k != "pos_embedder.seq"})
    st("extra_key", {**sd, "blocks.0.mlp.layer3.weight": torch.zeros(3)})
    st("wrong_shape", {**sd, k1: torch.zeros(64, 32)})
    st("int_dtype", {**sd, k1: sd[k1].to(torch.int32)})
    st("fp64_into_fp32", {k: v.double() for k, v in sd.items()})
    st("prefix_mix", {("net." + k if i % 2 else k): v for i, (k, v) in enumerate(sd.items())})
    st("collision", {**sd, "module." + k1: sd[k1].clone()})
    nan = dict(sd)
    nan[k1] = sd[k1].clone()
    nan[k1][3, 5] = float("nan")
    st("nan_value", nan)
    pt("both_copies", {**{"net." + k: v for k, v in sd.items()}, **{"net_ema." + k: v for k, v in sd.items()}})
    pt("non_tensor", {**sd, "step": 5})
    pt("nested", {"model": sd, "optimizer": {}})
    pt("pickled_object", {**sd, "args": argparse.Namespace(lr=1)})
    pt("legacy_format", sd, _use_new_zipfile_serialization=False)
    for name, src in (("truncated_pt", f["ref_pt"]), ("truncated_safetensors", f["ref"])):
        data = open(src, "rb").read()
        f[name] = str(d / (name + (".pt" if name.endswith("pt") else ".safetensors")))
        open(f[name], "wb").write(data[: len(data) // 2])
    f["garbage_safetensors"] = str(d / "garbage.safetensors")
    open(f["garbage_safetensors"], "wb").write(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    f["empty_file"] = str(d / "empty.safetensors")
    open(f["empty_file"], "wb").close()
    f["bin"] = str(d / "model.bin")
    open(f["bin"], "wb").write(b"x")
    for name in ("empty_dir", "dcp_no_metadata", "out_dir/step_00000001"):
        os.makedirs(d / name)
    open(d / "dcp_no_metadata" / "__0_0.distcp", "wb").write(b"x")
    f.update(empty_dir=str(d / "empty_dir"), dcp_no_metadata=str(d / "dcp_no_metadata"), out_dir=str(d / "out_dir"))
    os.makedirs(d / "index_missing")
    with open(d / "index_missing" / "model.safetensors.index.json", "w") as fh:
        json.dump({"weight_map": {k: "gone.safetensors" for k in sd}}, fh)
    f["index_missing_shard"] = str(d / "index_missing")
    os.makedirs(d / "index_wrong")
    for part in ("part-0.safetensors", "part-1.safetensors"):
        os.link(d / "index" / part, d / "index_wrong" / part)
    with open(d / "index_wrong" / "model.safetensors.index.json", "w") as fh:
        json.dump({"weight_map": {**weight_map, k1: "part-1.safetensors" if weight_map[k1].startswith("part-0")
                                  else "part-0.safetensors"}}, fh)
    f["index_wrong_map"] = str(d / "index_wrong")
    f["dir"] = str(d)
    return f


# Every fault must raise CheckpointError on BOTH ranks with the same text, which must contain the expected words.
# (fault, fixture file or literal source, expected text): ckpt.load(model, source)
LOAD_FAULTS = [
    ("missing key", "missing_key", "missing 1"), ("missing buffer", "missing_buffer", "pos_embedder.seq"),
    ("unexpected key", "extra_key", "unexpected 1"), ("wrong shape", "wrong_shape", "file (64, 32) vs model (64, 64)"),
    ("int dtype", "int_dtype", "int/bool/float mismatch"), ("fp64 into trainable fp32", "fp64_into_fp32", "narrowing"),
    ("prefix mix", "prefix_mix", "unexpected"), ("key collision", "collision", "collisions 1"),
    ("net and net_ema, no choice", "both_copies", "both net. and net_ema."),
    ("non-tensor payload", "non_tensor", "step (int)"), ("nested training dict", "nested", "model (dict)"),
    ("pickled object", "pickled_object", "weights-only"), ("legacy .pt format", "legacy_format", "legacy (pre-zip)"),
    ("truncated .pt", "truncated_pt", "weights-only"), ("truncated .safetensors", "truncated_safetensors", "truncated"),
    ("garbage .safetensors", "garbage_safetensors", "safetensors"), ("empty file", "empty_file", "empty file (0 bytes)"),
    ("unsupported extension", "bin", "unsupported checkpoint format"),
    ("DCP without .metadata", "dcp_no_metadata", "no .metadata"), ("empty dir", "empty_dir", "holds no checkpoint"),
    ("out_dir given as init", "out_dir", "training out_dir"), ("index: shard missing", "index_missing_shard", "gone.safetensors is missing"),
    ("index: wrong shard", "index_wrong_map", "not in the shard the index names"),
    ("unknown named init", "2b-480p", "not a named init"), ("'random' passed to load", "random", "'random' is not"),
    ("malformed hf://", "hf://nvidia/only-repo", "hf://ORG/REPO/PATH"),
    # a named init is checked against the model's config before any download (offline: test_named_inits_and_offline_error)
    ("named init for another config", "2b-480p-16fps", "build the model with --config v2w-2b"),
]


def fault_cases(f, tmp):
    load = ckpt.load
    return [(name, lambda m, src=src: load(m, f.get(src, src)), text) for name, src, text in LOAD_FAULTS] + [
        ("ema asked, absent", lambda m: load(m, f["release"], ema=True), "has only ['net']"),
        (".pt path that does not exist", lambda m: load(m, f["dir"] + "/model-480p-16fps.pt"), "not found"),
        ("NaN weight", lambda m: load(m, f["nan_value"]), "blocks.0.self_attn.q_proj.weight holds NaN or Inf"),
        ("file on rank 0 only", lambda m: load(m, f["ref"] if dist.get_rank() == 0 else f["dir"] + "/gone.pt"),
         "rank(s) [1]"),
        ("model still on meta", lambda m: load(build_meta(), f["ref"]), "meta device"),
        ("LoRA adapters absent, not allowed", lambda m: load(build(lora=2), f["ref"]), "lora_a.weight"),
        ("bf16 trainable from fp32 file", lambda m: load(build(dtype=torch.bfloat16), f["ref"]), "narrowing"),
        ("DCP shard file deleted", lambda m: load(m, tmp["dcp_broken"]), "__1_0.distcp"),
        ("LoRA-only DCP as full init", lambda m: load(m, tmp["lora_step"]), "missing"),
        ("dangling latest", lambda m: resume.resume(tmp["dangling"], m), "missing or incomplete"),
        ("garbage latest", lambda m: resume.resume(tmp["garbage_latest"], m), "not a step_XXXXXXXX"),
        ("resume into other config", lambda m: resume.resume(tmp["out"], build_other()), "shape mismatch"),
        ("save keep=1", lambda m: resume.save(tmp["scratch"], 1, m, keep=1), "at least 2"),
        ("save extra not JSON", lambda m: resume.save(tmp["scratch"], 1, m, extra={"t": torch.ones(1)}),
         "JSON-serialisable"),
        ("save over a complete step", lambda m: resume.save(tmp["out"], 3, m), "already exists"),
        ("ranks read different files", lambda m: load(m, f["ref"] if dist.get_rank() == 0 else f["ref_other"]),
         "ranks read different files for one checkpoint: rank 0"),
        ("bit flipped in a .pt (rank 1's rows)", lambda m: load(m, f["pt_flipped"]),
         "bytes of ['blocks.1.mlp.layer2.weight'] fail their zip CRC-32"),
        ("bit flipped in a .distcp: resume", lambda m: resume.resume(tmp["flipped"], m, extra_state={
            "ema": {n: torch.zeros_like(p) for n, p in m.named_parameters()}}),
         "differ from the checksums recorded when this step was saved, e.g. ['model.blocks.1.mlp.layer2.weight']"),
        ("bit flipped in a .distcp: load", lambda m: load(m, tmp["flipped"] + "/step_00000003"),
         "differ from the checksums recorded when this step was saved, e.g. ['model.blocks.1.mlp.layer2.weight']"),
        ("EMA asked of a step saved without one", lambda m: load(m, tmp["lora_step"], ema=True), "holds no ema.*"),
    ]


def build_meta():
    with torch.device("meta"):
        return DiT(CFG)


def build_other():
    with torch.device("meta"):
        net = DiT(get_config("tiny", crossattn_emb_channels=33, crossattn_proj_in_channels=48))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    fully_shard(net, mesh=mesh)
    net.to_empty(device="cpu")
    return net


def _job(rank, ws, f, tmpdir):
    import shutil
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_HOME"] = os.path.join(tmpdir, f"hf{rank}")
    out, res = {}, {}
    ref = reference_state()
    # 1. every source format into FSDP2 shards, compared bitwise after gathering
    expect_bf16 = {k: v.to(torch.bfloat16).to(v.dtype) for k, v in ref.items()}
    for name, src, want in (("pt", f["ref_pt"], ref),
                            ("safetensors", f["ref"], ref), ("index", f["index"], ref),
                            ("release_pt", f["release"], expect_bf16)):
        net = build()
        report = ckpt.load(net, src)
        got = full_state(net)
        res[f"load_{name}"] = all(torch.equal(got[k], want[k]) for k in want) and got.keys() == want.keys()
        res[f"checksum_{name}"] = report.checksum
        res[f"ignored_{name}"] = len(report.ignored)
    net = build(lora=2, dtype=torch.bfloat16)  # frozen bf16 base from an fp32 file: narrowing allowed (not trained)
    ckpt.load(net, f["ref"], allow_missing=(ckpt.LORA_KEYS,))
    got = full_state(net)
    res["load_bf16_frozen_base"] = all(torch.equal(got[k], v.to(torch.bfloat16)) for k, v in ref.items())
    net = build(hsdp=True)
    report = ckpt.load(net, f["ref_pt"])  # Replicate placements: each row's CRC and sum counted once
    res["load_hsdp_pt"] = all(torch.equal(v, ref[k]) for k, v in full_state(net).items())
    net = build(hsdp=True)
    report = ckpt.load(net, f["ref"])
    res["load_hsdp"] = all(torch.equal(v, ref[k]) for k, v in full_state(net).items())
    res["checksum_hsdp"], res["placements_hsdp"] = report.checksum, str(net.blocks[0].mlp.layer1.weight.placements)
    # 2. train 3 steps, saving at 1, 2, 3 (keep 2) with an EMA (sharded like the parameters) as extra state;
    # step 4 after the save is the reference for resume
    out["out"] = os.path.join(tmpdir, "out")
    net = build()
    ckpt.load(net, f["ref"], verbose=False)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    ema = {n: p.detach().clone() for n, p in net.named_parameters()}
    for step in (1, 2, 3):
        train_step(net, opt, step)
        torch._foreach_lerp_(list(ema.values()), [p.detach() for p in net.parameters()], 0.5)
        torch.manual_seed(100 + rank)  # different per rank: per-rank RNG keys must bring back each rank's own state
        resume.save(out["out"], step, net, opt, extra={"data_position": step * 4, "config": {"lr": 1e-3}}, keep=2,
                    extra_state={"ema": ema})
    res["state_step3"], res["out_dir"] = full_state(net), out["out"]
    res["ema_step3"] = {n: t.full_tensor() for n, t in ema.items()}
    res["rand_after_save"] = torch.rand(4)
    res["loss4"] = train_step(net, opt, 4)
    res["state4"] = full_state(net)
    res["dirs_after_rotation"] = sorted(os.listdir(out["out"]))
    # resume into fresh objects
    net2 = build()
    opt2 = torch.optim.AdamW(net2.parameters(), lr=1e-3)
    ema2 = {n: torch.zeros_like(p) for n, p in net2.named_parameters()}
    torch.manual_seed(999)
    extra = resume.resume(out["out"], net2, opt2, extra_state={"ema": ema2})
    res["extra"] = extra
    res["ema_resumed"] = {n: t.full_tensor() for n, t in ema2.items()}
    res["rand_after_resume"] = torch.rand(4)
    res["loss4_resumed"] = train_step(net2, opt2, 4)
    res["state4_resumed"] = full_state(net2)
    # DCP step dir as an init source (every rank reads only the chunks of its shard)
    net3 = build()
    ckpt.load(net3, os.path.join(out["out"], "step_00000003"))
    res["load_dcp"] = all(torch.equal(a, b) for a, b in zip(full_state(net3).values(), res["state_step3"].values()))
    report = ckpt.load(net3, os.path.join(out["out"], "step_00000003"), ema=True)  # its EMA where it has one
    want = {k: res["ema_step3"].get(k, v) for k, v in res["state_step3"].items()}
    res["load_dcp_ema"] = all(torch.equal(v, want[k]) for k, v in full_state(net3).items())
    res["taken_from_dcp_ema"] = report.taken_from
    # 3. LoRA-only save (frozen base excluded) and resume on top of the base loaded from the init file
    out["lora"] = os.path.join(tmpdir, "lora")
    net = build(lora=2)
    ckpt.load(net, f["ref"], allow_missing=(ckpt.LORA_KEYS,), verbose=False)
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=1e-2)
    train_step(net, opt, 1)
    train_step(net, opt, 2)
    resume.save(out["lora"], 2, net, opt, extra={}, lora_only=True)
    res["lora_loss3"] = train_step(net, opt, 3)
    res["lora_state3"] = full_state(net)
    out["lora_step"] = os.path.join(out["lora"], "step_00000002")
    res["lora_keys"] = sorted(k for k in FileSystemReader(out["lora_step"]).read_metadata().state_dict_metadata
                              if k.startswith("model."))
    net = build(lora=2)
    ckpt.load(net, f["ref"], allow_missing=(ckpt.LORA_KEYS,), verbose=False)
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=1e-2)
    res["lora_extra"] = resume.resume(out["lora"], net, opt)
    res["lora_loss3_resumed"] = train_step(net, opt, 3)
    res["lora_state3_resumed"] = full_state(net)
    # 4. fault matrix
    if rank == 0:
        shutil.copytree(os.path.join(out["out"], "step_00000003"), os.path.join(tmpdir, "dcp_broken"))
        os.remove(os.path.join(tmpdir, "dcp_broken", "__1_0.distcp"))
        shutil.copytree(out["out"], os.path.join(tmpdir, "flipped"))
        flip_last_shard(os.path.join(tmpdir, "flipped", "step_00000003"), "model.blocks.1.mlp.layer2.weight")
        for name, text in (("dangling", "step_00000009\n"), ("garbage_latest", "../../etc\n")):
            shutil.copytree(out["out"], os.path.join(tmpdir, name))
            with open(os.path.join(tmpdir, name, "latest"), "w") as fh:
                fh.write(text)
    dist.barrier()
    out.update(dcp_broken=os.path.join(tmpdir, "dcp_broken"), flipped=os.path.join(tmpdir, "flipped"),
               dangling=os.path.join(tmpdir, "dangling"),
               garbage_latest=os.path.join(tmpdir, "garbage_latest"), scratch=os.path.join(tmpdir, "scratch"))
    faults = {}
    for name, call, _ in fault_cases(f, out):
        with open(os.path.join(tmpdir, f"progress.{rank}"), "a") as fh:
            fh.write(name + "\n")  # the last line names the culprit if the job times out
        try:
            call(build())
            faults[name] = ("no error", "")
        except Exception as e:
            faults[name] = (type(e).__name__, str(e))
        dist.barrier()
    res["faults"] = faults
    return res


@pytest.fixture(scope="module")
def dist_job(files, tmp_path_factory):
    t0 = time.time()
    results = run_dist(_job, 2, 240, files, str(tmp_path_factory.mktemp("job")))
    print(f"2-rank job: {time.time() - t0:.1f}s")
    return results


def test_every_format_loads_bitwise_into_fsdp2_shards(dist_job, files):
    for r in dist_job:
        for name in ("pt", "safetensors", "index", "release_pt", "dcp", "dcp_ema", "hsdp", "hsdp_pt",
                     "bf16_frozen_base"):
            assert r[f"load_{name}"], name
        assert r["taken_from_dcp_ema"] == {"ema": len(r["ema_step3"]), "model": 3}  # the 3 RoPE buffers
        assert r["placements_hsdp"] == "(Replicate(), Shard(dim=0))"
        assert r["ignored_release_pt"] == 3  # accum_iteration and 2 _extra_state (TE, old: BytesIO): counted only
    # the checksum is a property of the file's bytes, not of the world size: ws=2 equals ws=1
    net = build(sharded=False)
    single = ckpt.load(net, files["ref"])
    assert {r[f"checksum_{name}"] for r in dist_job for name in ("pt", "safetensors", "hsdp")} == {single.checksum}


def test_fault_matrix_every_fault_is_a_clear_error_on_every_rank(dist_job, files):
    cases = fault_cases(files, {})
    assert len(cases) >= 25
    for name, _, text in cases:
        outcomes = [r["faults"][name] for r in dist_job]
        for rank, (kind, message) in enumerate(outcomes):
            assert kind == "CheckpointError", f"{name}: rank {rank} -> {kind}"
            assert text in message, f"{name}: rank {rank} message lacks {text!r}:\n{message}"
        assert outcomes[0][1] == outcomes[1][1], f"{name}: ranks disagree"


def test_resume_is_bitwise_and_restores_per_rank_rng(dist_job):
    for rank, r in enumerate(dist_job):
        assert r["extra"] == {"data_position": 12, "config": {"lr": 1e-3}, "step": 3}
        assert r["loss4_resumed"] == r["loss4"]
        assert all(torch.equal(r["state4"][k], r["state4_resumed"][k]) for k in r["state4"])
        assert torch.equal(r["rand_after_save"], r["rand_after_resume"]), rank
        assert r["ema_resumed"].keys() == r["ema_step3"].keys()
        assert all(torch.equal(r["ema_resumed"][k], v) for k, v in r["ema_step3"].items())
        assert not torch.equal(r["ema_step3"]["x_embedder.proj.1.weight"], r["state_step3"]["x_embedder.proj.1.weight"])
    assert not torch.equal(dist_job[0]["rand_after_save"], dist_job[1]["rand_after_save"])
    assert dist_job[0]["dirs_after_rotation"] == ["latest", "step_00000002", "step_00000003"]


def test_lora_only_checkpoint_excludes_base_and_resumes_bitwise(dist_job):
    r = dist_job[0]
    base = [k for k in r["lora_keys"] if ".lora_a." not in k and ".lora_b." not in k]
    assert len(r["lora_keys"]) == 3 + 2 * 10 * CFG.num_blocks  # adapters + the 3 persistent RoPE buffers only
    assert base == ["model.pos_embedder." + b for b in ("dim_spatial_range", "dim_temporal_range", "seq")]
    assert r["lora_extra"] == {"step": 2}
    assert r["lora_loss3"] == r["lora_loss3_resumed"]
    assert all(torch.equal(r["lora_state3"][k], r["lora_state3_resumed"][k]) for k in r["lora_state3"])


def test_export_round_trip(dist_job, tmp_path):
    step3 = dist_job[0]["state_step3"]
    out_dir = dist_job[0]["out_dir"]
    export.export_safetensors(out_dir, str(tmp_path / "m.safetensors"))
    got = load_file(str(tmp_path / "m.safetensors"))
    assert got.keys() == step3.keys() and all(torch.equal(got[k], step3[k]) for k in got)
    export.export_release_pt(os.path.join(out_dir, "step_00000003"), str(tmp_path / "release.pt"))
    rel = torch.load(str(tmp_path / "release.pt"), weights_only=True)
    assert all(torch.equal(rel["net." + k], v.to(torch.bfloat16)) for k, v in step3.items())
    net = build(sharded=False)
    ckpt.load(net, str(tmp_path / "release.pt"))  # upstream-style file loads back through the strict path
    assert all(torch.equal(v, step3[k].to(torch.bfloat16).float()) for k, v in net.state_dict().items())


# -----------------------------------------------------------------------------
# Single-process pieces


def test_keys_are_normalised_by_whole_segments():
    assert ckpt.normalize_key("net.blocks.0.adaln_net.weight", "net") == "blocks.0.adaln_net.weight"
    assert ckpt.normalize_key("module._orig_mod.blocks.3._checkpoint_wrapped_module.mlp.w", None) == "blocks.3.mlp.w"
    assert ckpt.normalize_key("net_ema.x", "net") is None
    report, _ = ckpt.build_report({f"blocks.{i}.w": ((2,), torch.float32, True) for i in range(28)}, {}, "f")
    assert "blocks.*.w x28" in report.details()


def test_named_inits_and_offline_error():
    assert {"droid", "2b-480p-16fps", "2b-720p-16fps", "2b-480p-10fps", "2b-720p-10fps", "14b-480p-16fps",
            "14b-720p-16fps", "14b-480p-10fps", "14b-720p-10fps", "p25-2b-pre", "p25-2b-post", "p25-14b-pre",
            "p25-14b-post", "p25-2b-agibot", "action-2b"} == set(ckpt.NAMED_INITS) == set(ckpt.INIT_CONFIGS)
    assert ckpt.NAMED_INITS["droid"].endswith("@ebc29d30a3fab504bcc779a85bca073d14ad39f9")
    # upstream's registry (cosmos_oss/checkpoints_predict2.py): repo, file and full revision of each 2.5 release
    assert ckpt.NAMED_INITS["p25-2b-post"] == ("hf://nvidia/Cosmos-Predict2.5-2B/base/post-trained/"
                                               "81edfebe-bd6a-4039-8c1d-737df1a790bf_ema_bf16.pt"
                                               "@15a82a2ec231bc318692aa0456a36537c806e7d4")
    assert ckpt.NAMED_INITS["p25-14b-pre"].endswith("54937b8c-29de-4f04-862c-e67b04ec41e8_ema_bf16.pt"
                                                    "@03eb354f35eae0d6e0c1be3c9f94d8551e125570")
    assert ckpt.NAMED_INITS["p25-2b-agibot"].startswith("hf://nvidia/Cosmos-Predict2.5-2B/robot/multiview-agibot/")
    assert all(get_config(c) for c in ckpt.INIT_CONFIGS.values())  # every named init names a real config
    with pytest.raises(ckpt.CheckpointError, match="offline"):
        ckpt.resolve_source("droid", offline=True)


def test_a_named_init_loads_only_into_its_config():
    net = DiT(get_config("tiny"))
    # refused from the config alone, before any download
    with pytest.raises(ckpt.CheckpointError, match=r"p25-2b-pre is a p25-2b checkpoint .* --config p25-2b$"):
        ckpt.load(net, "p25-2b-pre")
    with pytest.raises(ckpt.CheckpointError, match="--init droid is a v2w-14b checkpoint"):
        ckpt.check("p25-14b", "droid")
    ckpt.check_init_config("p25-2b-agibot", get_config("p25-2b-agibot"))  # the right one passes
    ckpt.check_init_config("some/file.pt", get_config("tiny"))  # files and hf:// urls name no config


def _release_layout(path, cfg_name, extra_keys=()):
    """A model saved as the Predict2.5 release files are: `net.` keys, bf16, upstream's counters and TransformerEngine
    `_extra_state` keys (agibot's cross-attention op included)."""
    torch.manual_seed(0)
    net = DiT(get_config(cfg_name))
    sd = {"net." + k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in net.state_dict().items()}
    sd.update({f"net.{k}": torch.zeros((), dtype=torch.int64) for k in ckpt.IGNORABLE_KEYS})
    sd.update({f"net.{k}": torch.zeros(5, dtype=torch.uint8) for k in extra_keys})
    save_file(sd, path)
    return net


def test_predict25_release_layout_loads_strictly_and_wrong_networks_are_named(tmp_path):
    extra = ["t_embedding_norm._extra_state"] + [f"blocks.{i}.{a}.{n}._extra_state" for i in range(2)
                                                 for a in ("self_attn", "cross_attn") for n in ("q_norm", "k_norm")]
    agibot_extra = extra + [f"blocks.{i}.cross_attn.attn_op._extra_state" for i in range(2)]
    agibot_file, base_file, p2_file = (str(tmp_path / f"{n}.safetensors") for n in ("agibot", "base", "p2"))
    src = _release_layout(agibot_file, "p25-tiny-agibot", agibot_extra)
    _release_layout(base_file, "p25-tiny", extra)
    _release_layout(p2_file, "tiny")
    net = DiT(get_config("p25-tiny-agibot"))
    report = ckpt.load(net, agibot_file)
    assert report.ok and len(report.ignored) == len(agibot_extra) + len(ckpt.IGNORABLE_KEYS)
    assert len(report.loaded) == len(net.state_dict()) and not report.missing
    assert torch.equal(net.blocks[1].cam_encoder.weight, src.blocks[1].cam_encoder.weight.bfloat16().float())
    # the hint names the model's size class: tiny configs for a tiny model, the released ones for a released model
    released = ckpt.LoadReport(source="f", missing=["crossattn_proj.0.weight"], model_config="p25-2b")
    assert released.family_hint().endswith("a Predict2 checkpoint loads into --config v2w-2b or v2w-14b")
    cases = [("p25-tiny", agibot_file, "robot/multiview-agibot network .* --config p25-tiny-agibot\n"),
             ("tiny", base_file, "a Cosmos-Predict2.5 network .* --config p25-tiny\n"),
             ("p25-tiny", p2_file, "has no text projection: a Predict2 checkpoint loads into --config tiny\n"),
             ("p25-tiny-agibot", base_file, "has cam_encoder .* load into --config p25-tiny\n")]
    for config, path, hint in cases:
        with pytest.raises(ckpt.CheckpointError, match=hint) as err:
            ckpt.load(DiT(get_config(config)), path)
        assert str(err.value).splitlines()[0].startswith(f"{path}: wrong network: ")  # the first line says it
    assert ckpt.check("p25-tiny", base_file) and not ckpt.check("p25-tiny", p2_file)


def _write_tiny(path, cfg_name="tiny", drop=None, prefix="", dtype=None):
    torch.manual_seed(0)
    sd = DiT(get_config(cfg_name)).state_dict()
    save_file({prefix + k: (v.to(dtype) if dtype else v).contiguous() for k, v in sd.items() if k != drop}, path)
    return path


def test_check_cli_reports_from_metadata_and_sets_the_exit_code(tmp_path, capsys):
    good = _write_tiny(str(tmp_path / "good.safetensors"), prefix="net.", dtype=torch.bfloat16)
    bad = _write_tiny(str(tmp_path / "bad.safetensors"), drop="blocks.1.mlp.layer1.weight")
    assert ckpt.main(["check", "--config", "tiny", good]) == 0
    assert ckpt.main(["check", "--config", "tiny", "--lora-rank", "4", good]) == 0
    assert ckpt.main(["check", "--config", "v2w-2b", good]) == 1  # shapes differ; nothing is allocated (meta)
    with pytest.raises(ckpt.CheckpointError, match="not found"):  # a user error: one line from cli.main
        ckpt.main(["check", "--config", "tiny", str(tmp_path / "nope.pt")])
    proc = in_process(ckpt, ["check", "--config", "tiny", bad])  # as the script (test_integrity runs the real one)
    assert proc.returncode == 1 and "missing: blocks.1.mlp.layer1.weight" in proc.stdout, proc.stdout + proc.stderr


def test_bench_runs_at_a_tiny_size(tmp_path):
    for fmt in ("pt", "safetensors"):
        times = loadbench.load_speed(0.002, str(tmp_path), fmt, "cpu", threads=2)
        assert set(times) == {("cat", "cold"), ("load", "cold"), ("cat", "warm"), ("load", "warm")}


# -----------------------------------------------------------------------------
# The iteration-0 init guard, calibrated: random init fails it, weights that learned something pass it


def test_init_guard_separates_random_init_from_loaded_weights(tmp_path):
    cfg = get_config("tiny", crossattn_emb_channels=16, crossattn_proj_in_channels=16)
    g = torch.Generator().manual_seed(0)
    basis = torch.randn(1, 16, 1, 8, 8, generator=g)

    def batch(n):
        return torch.randn(n, 1, 1, 1, 1, generator=g) * basis, torch.zeros(n, 1, 16)
    x0, emb = batch(8)  # the fixed guard batch
    torch.manual_seed(0)
    net = DiT(cfg)
    ratio_random = guard_loss(net, x0, Condition(emb))
    with pytest.raises(ckpt.CheckpointError, match="too high for a pretrained start"):
        init_guard(*ratio_random, source="random")
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    for _ in range(150):  # "pretraining": a few seconds on CPU
        x, c = batch(16)
        sigma = torch.exp(torch.randn(16, generator=g) * 1.2)
        eps = torch.randn(x.shape, generator=g)
        _, velocity = denoise(net, x + sigma.view(-1, 1, 1, 1, 1) * eps, sigma, Condition(c))
        ((velocity - (eps - x)) ** 2).mean().backward()
        opt.step()
        opt.zero_grad()
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(tmp_path / "warm.safetensors"))
    with torch.device("meta"):
        fresh = DiT(cfg)
    fresh.to_empty(device="cpu")
    fresh.init_weights()
    not_loaded = guard_loss(fresh, x0, Condition(emb))
    ckpt.load(fresh, str(tmp_path / "warm.safetensors"))
    loaded = guard_loss(fresh, x0, Condition(emb))
    ratio = init_guard(*loaded, source="warm")
    print(f"guard ratios: random {ratio_random[0] / ratio_random[1]:.3f}, init_weights"
          f" {not_loaded[0] / not_loaded[1]:.3f}, loaded {ratio:.3f} (threshold {GUARD_MAX_RATIO})")
    assert ratio < GUARD_MAX_RATIO - 0.1 and min(ratio_random[0] / ratio_random[1],
                                                     not_loaded[0] / not_loaded[1]) > 1.0
    # with conditioning frames (video2world): they are excluded, and the guard still runs
    x2 = torch.cat([x0, x0], dim=2)
    from condition import condition_mask
    loss, zero = guard_loss(fresh, x2, Condition(emb, condition_mask=condition_mask(x2, 1)))
    assert 0 < loss < zero


def test_init_guard_says_the_weights_went_in_and_names_the_way_on():
    """Issue 35, item 15: the guard runs after ckpt.load verified the file, so its refusal must not say the weights did
    not go in; it names the ratio, the likely cause (an undertrained or random checkpoint), the flag that accepts it
    and the fix, in one line."""
    with pytest.raises(ckpt.CheckpointError) as e:
        init_guard(0.765, 1.0, source="runs/base/step_00000100")
    message = str(e.value)
    assert "did not go in" not in message and "\n" not in message, message
    for words in ("runs/base/step_00000100", "loaded and verified", "(loss ratio 0.765 >= 0.75)",
                  "undertrained checkpoint, or a random one", "train the base longer", "--guard-max-ratio",
                  "python train.py --help"):
        assert words in message, (words, message)
    assert init_guard(0.5, 1.0, max_ratio=0.75) == 0.5
