"""Checkpoint integrity on CPU in one process: each fault an outside fault-injection harness found silent or unclear
is here a clear error naming the file, key or flag and the fix (or a correct load). The sharded versions (ranks
reading different files, CRCs and save-time checksums combined over ranks, an EMA into FSDP2 shards) run in
tests/test_ckpt.py's 2-rank job.
"""
import hashlib
import json
import os
import re
import shutil
import tempfile
import zlib
from dataclasses import replace

import pytest
import torch
from safetensors.torch import save_file
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import MetadataIndex

import ckpt
import export
from base import formats
from base.formats import CheckpointError
from base.inits import INITS, get_config
from engine import resume
from model import DiT
from nets.lora import add_lora
from run_utils import in_process, script

CFG = get_config("tiny")
K = "blocks.0.mlp.layer1.weight"


def tiny(lora=0, seed=0, dtype=None):
    torch.manual_seed(seed)
    net = DiT(CFG)
    if dtype is not None:
        net = net.to(dtype)
    if lora:
        add_lora(net, lora)
    return net


def run(tmp_path, name="run", ema=True, lora=0):
    """A tiny run saved once at step 1 (with an EMA of the trainable parameters that differs from them)."""
    net = tiny(lora)
    trainable = {n: p for n, p in net.named_parameters() if p.requires_grad}
    state = {"ema": {n: p.detach() * 0.5 + 0.25 for n, p in trainable.items()}} if ema else None
    out = str(tmp_path / name)
    resume.save(out, 1, net, torch.optim.AdamW(trainable.values()), extra={}, lora_only=bool(lora),
                extra_state=state)
    return os.path.join(out, "step_00000001"), net, state


def flip_bit(path, offset, bit=3):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))


def flip_in_distcp(step, fqn):
    """Flip one bit in the middle of `fqn`'s bytes in a saved step (DCP stores each chunk as a small torch.save zip,
    whose middle is tensor data for any tensor much larger than the zip's ~1 KB of headers)."""
    info = FileSystemReader(step).read_metadata().storage_data[MetadataIndex(fqn, (0,) * 2)]
    flip_bit(os.path.join(step, info.relative_path), info.offset + info.length // 2)


# -----------------------------------------------------------------------------
# 1. --ema-weights net_ema / ckpt.load(ema=True) / check --ema net_ema on a DCP step directory


def test_ema_from_a_step_dir_loads_the_saved_ema_or_refuses(tmp_path, capsys):
    step, net, state = run(tmp_path)
    fresh = tiny(seed=1)
    report = ckpt.load(fresh, step, ema=True)
    params = dict(net.named_parameters())
    assert all(torch.equal(v, state["ema"][k] if k in params else net.state_dict()[k])
               for k, v in fresh.state_dict().items())
    assert report.taken_from == {"ema": len(params), "model": len(net.state_dict()) - len(params)}
    ckpt.load(fresh, step, ema=False)  # the raw weights, as before
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in fresh.state_dict().items())
    plain, _, _ = run(tmp_path, "plain", ema=False)
    with pytest.raises(CheckpointError, match=r"holds no ema\.\* tensors.*--ema-weights net"):
        ckpt.load(fresh, plain, ema=True)
    assert ckpt.main(["check", "--config", "tiny", step, "--ema", "net_ema"]) == 0
    assert f"{len(params)} from ema., 3 from model." in capsys.readouterr().out
    with pytest.raises(CheckpointError, match="holds no ema"):
        ckpt.main(["check", "--config", "tiny", plain, "--ema", "net_ema"])


def test_lora_run_ema_covers_the_adapters_and_check_explains_a_lora_step_dir(tmp_path, capsys):
    base = str(tmp_path / "base.safetensors")
    save_file({k: v.contiguous() for k, v in tiny().state_dict().items()}, base)
    step, net, state = run(tmp_path, "lora", lora=2)
    # 7. a LoRA-only step dir: explained, with the flags that check it
    with pytest.raises(CheckpointError, match=r"LoRA-only step directory.*rank \[2\].*--lora-rank 2 --init BASE"):
        ckpt.main(["check", "--config", "tiny", step])
    assert ckpt.main(["check", "--config", "tiny", step, "--lora-rank", "2", "--init", base, "--ema", "net_ema"]) == 0
    out = capsys.readouterr().out
    assert f"{len(state['ema'])} from ema., 3 from model." in out and out.count("OK, would load") == 2
    with pytest.raises(ValueError, match="--init .*only for a LoRA-only step"):
        ckpt.main(["check", "--config", "tiny", base, "--init", base])
    # loading it as a full init says what it is
    with pytest.raises(CheckpointError, match="(?s)missing 47.*is a LoRA-only step directory.*--init BASE"):
        ckpt.load(tiny(lora=2), step)
    fresh = tiny(lora=2, seed=1)
    ckpt.load(fresh, base, allow_missing=(ckpt.LORA_KEYS,))
    report = ckpt.load(fresh, step, ema=True, allow_missing=(r"^(?!.*lora_).*",))
    assert report.taken_from == {"ema": len(state["ema"]), "model": 3}
    assert all(torch.equal(p, state["ema"][n]) for n, p in fresh.named_parameters() if p.requires_grad)


# -----------------------------------------------------------------------------
# 3. pinned named inits; the identity every rank compares (the mismatch itself: tests/test_ckpt.py)


def test_every_named_init_is_pinned_and_identity_tells_files_apart(tmp_path):
    hexadecimal = lambda text, n: len(text) == n and all(c in "0123456789abcdef" for c in text)  # noqa: E731
    for name, url in ckpt.NAMED_INITS.items():  # a hub revision, else (upstream pins none) the file's md5
        assert hexadecimal(url.rpartition("@")[2], 40) or ("@" not in url and hexadecimal(INITS[name].md5, 32)), name
    a, b = str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")
    save_file({"w": torch.zeros(4)}, a)
    save_file({"w": torch.ones(4)}, b)
    assert formats.identity(a) != formats.identity(b)
    shutil.copy(a, str(tmp_path / "c.safetensors"))
    assert formats.identity(a) == formats.identity(str(tmp_path / "c.safetensors"))  # the path is not the identity


def test_a_named_init_pinned_by_md5_refuses_a_changed_file(tmp_path, monkeypatch):
    from base import inits
    release = tmp_path / "model-480p-4fps.pt"
    release.write_bytes(b"the released bytes")
    monkeypatch.setattr(inits, "_hf_download", lambda url, offline: str(release))
    monkeypatch.setitem(inits.INITS, "action-2b", replace(INITS["action-2b"], md5=hashlib.md5(b"the released bytes")
                                                          .hexdigest()))
    assert ckpt.resolve_source("action-2b") == str(release)
    release.write_bytes(b"the hub's head moved on")
    with pytest.raises(ckpt.CheckpointError, match=r"has md5 [0-9a-f]{32}, upstream's downloader expects .*the hub's file changed"):
        ckpt.resolve_source("action-2b")
    assert ckpt.resolve_source("hf://org/repo/model-480p-4fps.pt") == str(release)  # a URL of yours: no md5 pin


# -----------------------------------------------------------------------------
# 4. save-time checksums, verified on resume, load, export and check; .pt zip CRCs


def test_crc_of_a_concatenation_from_the_crcs_of_its_parts():
    data = os.urandom(100_003)
    for cuts in ((0, 100_003), (1, 50_000, 99_999), (7, 7, 8, 60_000)):
        bounds = [0, *cuts, len(data)]
        parts = [data[lo:hi] for lo, hi in zip(bounds, bounds[1:])]
        after = [len(data) - hi for hi in bounds[1:]]
        combined = 0
        for part, n in zip(parts, after):
            combined ^= formats.crc_shift(zlib.crc32(part), n)
        assert combined == zlib.crc32(data), cuts


def test_a_bit_flipped_in_a_saved_distcp_is_caught_naming_the_tensor(tmp_path, capsys):
    step, net, _ = run(tmp_path)
    meta = json.load(open(os.path.join(step, "meta.json")))
    md = FileSystemReader(step).read_metadata().state_dict_metadata
    assert set(meta["checksums"]) == {k for k, m in md.items() if hasattr(m, "chunks")}  # every tensor, optim too
    fresh = tiny(seed=1)
    resume.resume(os.path.dirname(step), fresh, torch.optim.AdamW(fresh.parameters()), extra_state={
        "ema": {n: torch.empty_like(p) for n, p in fresh.named_parameters()}})
    assert "tensors match the checksums recorded at save" in capsys.readouterr().out
    for fqn in ("model." + K, "optim.state." + K + ".exp_avg_sq", "ema." + K):
        bad = shutil.copytree(os.path.dirname(step), str(tmp_path / fqn.replace(".", "_")))
        flip_in_distcp(os.path.join(bad, "step_00000001"), fqn)
        fresh = tiny(seed=1)
        with pytest.raises(CheckpointError, match=rf"differ from the checksums recorded.*{fqn}"):
            resume.resume(bad, fresh, torch.optim.AdamW(fresh.parameters()), extra_state={
                "ema": {n: torch.empty_like(p) for n, p in fresh.named_parameters()}})
        with pytest.raises(CheckpointError, match=rf"differ from the checksums recorded.*{fqn}"):
            ckpt.main(["check", "--config", "tiny", os.path.join(bad, "step_00000001")])
        if fqn.startswith(("model.", "ema.")):
            with pytest.raises(CheckpointError, match=rf"differ from the checksums recorded.*{fqn}"):
                ckpt.load(tiny(), os.path.join(bad, "step_00000001"), ema=fqn.startswith("ema."))
            with pytest.raises(CheckpointError, match=rf"differ from the checksums recorded.*{fqn}"):
                export.export_release_pt(bad, str(tmp_path / "x.pt"), ema=True)


def test_a_bit_flipped_in_a_pt_fails_its_zip_crc(tmp_path, capsys):
    path = str(tmp_path / "m.pt")
    torch.save({"net." + k: v for k, v in tiny().state_dict().items()}, path)
    assert ckpt.main(["check", "--config", "tiny", path]) == 0
    assert "zip records match their CRC-32" in capsys.readouterr().out
    rec = ckpt.open_source(path).records["net." + K]
    flip_bit(path, rec[0] + rec[1] // 2)
    with pytest.raises(CheckpointError, match=rf"bytes of \['net.{K}'\] fail their zip CRC-32 check"):
        ckpt.load(tiny(), path)
    with pytest.raises(CheckpointError, match=rf"net.{K}.*fail their zip CRC-32"):
        ckpt.main(["check", "--config", "tiny", path])
    assert ckpt.main(["check", "--config", "tiny", path, "--no-verify"]) == 0
    # a view into a larger storage is checked too (rank 0 reads its whole record)
    big = torch.arange(12.0)
    torch.save({"a": big[:6], "b": big[6:]}, path)
    report = ckpt.build_report({"a": ((6,), torch.float32, True)}, ckpt.open_source(path).entries, path)[0]
    assert report.unexpected == ["b"]
    src = ckpt.open_source(path)
    assert not src.records["a"][3] and src.records["a"][:2] == src.records["b"][:2]
    assert "1 zip records match" in formats.verify_bytes(src)
    two = torch.nn.Module()
    two.a, two.b = torch.nn.Parameter(torch.zeros(6)), torch.nn.Parameter(torch.zeros(6))
    ckpt.load(two, path)
    assert torch.equal(torch.cat([two.a, two.b]).detach(), big)
    flip_bit(path, src.records["b"][0] + 40)
    with pytest.raises(CheckpointError, match="fail their zip CRC-32"):
        formats.verify_bytes(ckpt.open_source(path), ["a"])  # 'a' shares the record with the flipped 'b'
    with pytest.raises(CheckpointError, match=r"bytes of \['a', 'b'\] fail their zip CRC-32"):
        ckpt.load(two, path)


# -----------------------------------------------------------------------------
# 5. the real cause: empty files, error pages, truncated meta.json, permissions, a shard missing from the cache


def test_empty_files_and_error_pages_are_named_as_such(tmp_path):
    cases = {"empty.pt": (b"", "empty file (0 bytes)"),
             "gated.pt": (b"<!DOCTYPE html><html><body>Access to model nvidia/... is restricted",
                          "HTML/JSON error page"),
             "gated.safetensors": (b'{"error":"Access to model is restricted. You must be authenticated."}',
                                   "HTML/JSON error page"),
             "empty.safetensors": (b"", "empty file (0 bytes)"),
             "legacy.pt": (b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19.", "legacy (pre-zip) .pt format")}
    for name, (data, text) in cases.items():
        path = str(tmp_path / name)
        open(path, "wb").write(data)
        with pytest.raises(CheckpointError, match=rf"{name}: .*{re.escape(text)}"):
            ckpt.load(tiny(), path)
    index = tmp_path / "model.safetensors.index.json"
    index.write_text('<html>502 Bad Gateway</html>')
    with pytest.raises(CheckpointError, match="not a safetensors index.*error page"):
        ckpt.load(tiny(), str(index))


def test_a_truncated_meta_json_is_named_with_the_fix(tmp_path):
    step, _, _ = run(tmp_path, ema=False)
    text = open(os.path.join(step, "meta.json")).read()
    open(os.path.join(step, "meta.json"), "w").write(text[: len(text) // 2])
    for call in (lambda: resume.resume(os.path.dirname(step), tiny()), lambda: ckpt.load(tiny(), step),
                 lambda: export.export_safetensors(step, str(tmp_path / "x.safetensors"))):
        with pytest.raises(CheckpointError, match=r"meta.json: truncated or corrupt.*move .*step_00000001 away"):
            call()
    open(os.path.join(step, "meta.json"), "w").write('{"step": 1}')
    with pytest.raises(CheckpointError, match=r"lacks \['world_size', 'lora_only', 'extra'\]"):
        resume.resume(os.path.dirname(step), tiny())


def unprivileged(fn):
    """fn() as a user that may not read root-only files (root bypasses permission bits: fork and drop to nobody);
    returns the text of what it raised."""
    def call():
        try:
            fn()
            return "no error"
        except Exception as e:
            return f"{type(e).__name__}: {e}"
    if os.geteuid() != 0:
        return call()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child only runs already-imported code
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.write(w, call().encode())
        finally:
            os._exit(0)
    os.close(w)
    out = b""
    while chunk := os.read(r, 1 << 16):
        out += chunk
    os.waitpid(pid, 0)
    return out.decode()


def test_a_permission_denied_step_dir_says_permission_denied(tmp_path):
    base = tempfile.mkdtemp(dir="/tmp")  # traversable by the unprivileged user (pytest's tmp_path is not)
    try:
        os.chmod(base, 0o755)
        step, _, _ = run(tmp_path, ema=False)
        out = os.path.join(base, "out")
        shutil.copytree(os.path.dirname(step), out)
        for root, dirs, files in os.walk(out):
            os.chmod(root, 0o755)
            for f in files:
                os.chmod(os.path.join(root, f), 0o644)
        os.chmod(os.path.join(out, "step_00000001"), 0o000)
        for call in (lambda: resume.find_resume(out), lambda: ckpt.resolve_source(os.path.join(out, "step_00000001"))):
            text = unprivileged(call)
            assert "step_00000001: permission denied (mode d---------" in text and "chmod" in text, text
    finally:
        os.chmod(os.path.join(base, "out", "step_00000001"), 0o755)
        shutil.rmtree(base)


def test_a_sharded_hf_index_names_the_shard_missing_from_the_offline_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--org--repo"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "part-1.safetensors", "b": "part-2.safetensors"}}))
    save_file({"a": torch.zeros(2)}, str(snap / "part-1.safetensors"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(CheckpointError, match=r"shard part-2.safetensors \(listed in the index\) missing from the"
                                              " local cache"):
        ckpt.resolve_source("hf://org/repo/model.safetensors.index.json", offline=True)


# -----------------------------------------------------------------------------
# 6. malformed safetensors headers; dtype overflow after the cast; lossy narrowing into trainable weights


def test_malformed_safetensors_headers_are_refused(tmp_path):
    four = {"dtype": "F32", "shape": [1]}
    cases = {
        "duplicate": ('{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
                      '"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}', 8, r"repeats key\(s\) \['a'\]"),
        "overlap": (json.dumps({"a": {**four, "data_offsets": [0, 4]}, "b": {"dtype": "F32", "shape": [2],
                                                                            "data_offsets": [2, 10]}}), 10, "overlap"),
        "gap": (json.dumps({"a": {**four, "data_offsets": [0, 4]}, "b": {**four, "data_offsets": [8, 12]}}), 12,
                "leave a gap"),
        "not_first": (json.dumps({"a": {**four, "data_offsets": [4, 8]}}), 8, "starts at data byte 4, expected 0"),
        "bad_entry": (json.dumps({"a": {"dtype": "F32", "shape": [1]}}), 4, "invalid header entry"),
    }
    for name, (header, nbytes, text) in cases.items():
        path = str(tmp_path / f"{name}.safetensors")
        blob = header.encode()
        open(path, "wb").write(len(blob).to_bytes(8, "little") + blob + bytes(nbytes))
        with pytest.raises(CheckpointError, match=text):
            ckpt.open_source(path)


def test_overflow_after_the_cast_and_lossy_narrowing_into_trainable_weights(tmp_path):
    sd = tiny().state_dict()
    big = {k: v.to(torch.bfloat16) for k, v in sd.items()}
    big[K] = big[K].clone()
    big[K][0, 0] = 2.0 ** 20  # a bf16 value; fp16's max is 65504
    path = str(tmp_path / "big.safetensors")
    save_file({k: v.contiguous() for k, v in big.items()}, path)
    frozen = tiny(dtype=torch.float16).requires_grad_(False)  # frozen: narrowing allowed, overflow is not
    with pytest.raises(CheckpointError, match=rf"{K}: values overflow fp16 when cast from bf16 \(max \|x\| 1.049e"):
        ckpt.load(frozen, path)
    with pytest.raises(CheckpointError, match=r"bf16 -> fp16: narrowing a trainable parameter"):
        ckpt.load(tiny(dtype=torch.float16), path)
    fp16 = str(tmp_path / "fp16.safetensors")
    save_file({k: v.to(torch.float16).contiguous() for k, v in sd.items()}, fp16)
    with pytest.raises(CheckpointError, match=r"fp16 -> bf16: narrowing a trainable parameter"):
        ckpt.load(tiny(dtype=torch.bfloat16), fp16)
    net = tiny(dtype=torch.bfloat16).requires_grad_(False)
    assert ckpt.load(net, fp16).dtype_conversions == {"fp16->bf16": len(sd)}  # a frozen copy may narrow


# -----------------------------------------------------------------------------
# export's missing parent directory; the CLIs (base/cli.py dataclasses; user errors as one line)


def test_export_names_a_missing_parent_directory(tmp_path):
    step, _, _ = run(tmp_path)
    for out in ("x.safetensors", "x.pt"):
        with pytest.raises(CheckpointError, match=rf"its directory {tmp_path}/nope/deeper does not exist; create it"):
            (export.export_safetensors if out.endswith("safetensors") else export.export_release_pt)(
                step, str(tmp_path / "nope" / "deeper" / out))


def test_the_clis_keep_their_command_lines_and_print_user_errors_as_one_line(tmp_path):
    """One real command line per script; the other cases run its main in this process under the same cli.main."""
    step, _, _ = run(tmp_path)
    proc = script([step, str(tmp_path / "nope" / "m.pt"), "--ema"], name="export.py")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "export.py: error:" in proc.stderr and f"{tmp_path}/nope does not exist" in proc.stderr
    proc = in_process(export, [step, str(tmp_path / "m.safetensors"), "--dtype", "bf16"])
    assert proc.returncode == 0 and os.path.exists(tmp_path / "m.safetensors"), proc.stdout + proc.stderr
    proc = in_process(export, [step, str(tmp_path / "m.pt"), "--dtype", "bf16"])
    assert proc.returncode == 2 and "for .safetensors only" in proc.stderr, proc.stderr
    proc = in_process(ckpt, ["check", "--config", "tiny", step, "--lora-rank", "16", "--ema", "net_ema"])
    assert proc.returncode == 0 and "OK, would load into tiny with LoRA rank 16" in proc.stdout, proc.stdout
    proc = script(["check", "--config", "tiny", str(tmp_path / "nope.pt")], name="ckpt.py")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "not found" in proc.stderr
    assert proc.stderr.startswith("ckpt.py: error:"), proc.stderr
    proc = in_process(ckpt, ["check", step])
    assert proc.returncode == 2 and "--config is required" in proc.stderr
    proc = in_process(ckpt, ["check", "--help"])
    assert proc.returncode == 0 and "--no-verify" in proc.stdout and "train.py --init" in " ".join(proc.stdout.split())
    proc = in_process(export, ["--help"])
    assert proc.returncode == 0 and "net_ema. copy" in " ".join(proc.stdout.split())


def test_a_meta_device_save_and_a_narrowing_load_are_named_for_what_they_are(tmp_path):
    """A .pt that torch.save wrote from meta tensors (no bytes) is named as such, not as "not written by torch.save";
    a load refused for narrowing dtypes names the first tensors on its first line."""
    net = DiT(get_config("tiny"))
    meta = str(tmp_path / "meta.pt")
    torch.save({"net." + k: v.to("meta") for k, v in net.state_dict().items()}, meta)
    with pytest.raises(ckpt.CheckpointError, match=r"tensors \(e\.g\. net\..*\) were saved on the meta device"):
        ckpt.load(DiT(get_config("tiny")), meta)
    narrow = str(tmp_path / "bf16.pt")
    torch.save({"net." + k: v.to(torch.bfloat16) for k, v in net.state_dict().items()}, narrow)
    with pytest.raises(ckpt.CheckpointError) as e:
        ckpt.load(DiT(get_config("tiny")).half(), narrow)
    first = str(e.value).splitlines()[0]
    assert "dtype errors 47 (x_embedder.proj.1.weight: bf16 -> fp16; t_embedder.1.linear_1.weight" in first, first
