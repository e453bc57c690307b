"""cache.py: cached windows are the VAE's encoding of the clips GridClips / ViewClips read (bitwise, fp32 on CPU), the
reader draws them deterministically, a stale cache is refused in one line, a killed run resumes, two gloo ranks
encode each video once, a video that fails to decode is skipped as GridClips skips it."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import safetensors.torch
import torch
from torch.utils.data import DataLoader

import cache
from clips import data
from dist_utils import run_dist
from nets import vae

# stitch, synthetic and sample are imported where used: the 2-rank test's spawned processes import this module, and
# those would double their start-up (the DiT, pyarrow)

FRAMES, SIZE, STRIDE = 5, (32, 48), 2  # small enough that the tiny VAE encodes a window in ~0.1 s on one core
STEMS = ["src__ep000000", "src__ep000001", "src__ep000003"]  # 6, 5 and 7 frames; episode 2 is too short
STARTS = {"src__ep000000": [0, 1], "src__ep000001": [0], "src__ep000003": [0, 2]}  # 0, 2, ... then the tail
KEY = dict(vae="tiny", vae_ckpt="", frames=FRAMES, height=SIZE[0], width=SIZE[1], dtype="fp32")
TEXT = dict(text="standin", text_len=16, text_dim=8)
CPU = torch.device("cpu")


@pytest.fixture(scope="module", autouse=True)
def one_thread():  # before the module's fixtures: the tiny VAE is ~10x slower on two threads of two busy cores, and
    # a convolution's bits depend on the thread count (cached and expected latents must come from the same one)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    import stitch
    from base import lerobot
    root = tmp_path_factory.mktemp("cache_data")
    lerobot.make_synthetic(str(root / "src"), lengths=(24, 20, 8, 28), cameras=True)
    for layout in ("grid", "views"):
        stitch.stitch(str(root / "src"), str(root / layout), stride=4, frames=FRAMES, size=f"{SIZE[0]}x{SIZE[1]}",
                      workers=1, layout=layout)
    return root


def config(data_dir, out, **overrides) -> cache.CacheConfig:
    return cache.CacheConfig(**{"data": str(data_dir), "out": str(out), "vae": "tiny", "frames": FRAMES,
                                "height": SIZE[0], "width": SIZE[1], "stride": STRIDE, "dtype": "fp32",
                                "device": "cpu", "workers": 0, "progress_every": 0, **overrides})


@pytest.fixture(scope="module")
def built(folders, tmp_path_factory):
    """The grid folder cached once: (cache dir, summary)."""
    out = tmp_path_factory.mktemp("cache") / "grid"
    return out, cache.build(config(folders / "grid", out), CPU)


def cached(out, stem) -> dict:
    return safetensors.torch.load_file(cache.latent_path(str(out), stem))


def same_file(a: str, b: str) -> bool:
    """Same tensors, bitwise, and metadata (the header's byte order is not fixed: safetensors writes a hash map)."""
    with safetensors.safe_open(a, "pt") as f, safetensors.safe_open(b, "pt") as g:
        return f.metadata() == g.metadata() and f.keys() == g.keys() and all(
            torch.equal(f.get_tensor(k), g.get_tensor(k)) for k in f.keys())


def window_of(clips, index, start) -> dict:
    """The dataset's sample of video `index` whose window starts at `start`, found through its public item protocol."""
    for seed in range(200):
        sample = clips[(index, seed)]
        if sample["start"] == start:
            return sample
    raise AssertionError(f"no seed below 200 gives start {start}")


def test_window_grid_and_the_droid_numbers_of_docs_cache_md():
    assert cache.window_starts(250, 93, 32) == [0, 32, 64, 96, 128, 157]  # the tail window 157 is added
    assert cache.window_starts(93, 93, 32) == [0] and cache.window_starts(125, 93, 32) == [0, 32]
    assert {s: len(cache.window_starts(250, 93, s)) for s in (16, 32, 48, 93)} == {16: 11, 32: 6, 48: 5, 93: 3}
    with pytest.raises(ValueError, match="a 92-frame video has no 93-frame window"):
        cache.window_starts(92, 93, 32)
    for bad, match in (({"frames": 6}, "4k\\+1"), ({"vae": "real"}, "--vae-ckpt"), ({"stride": 0}, "--stride 0"),
                       ({"dtype": "fp16"}, "--dtype"), ({"height": 40}, "multiples of 16")):
        with pytest.raises(ValueError, match=match):
            config("d", "o", **bad)


def test_cached_windows_are_the_vae_encoding_of_gridclips_windows(folders, built):
    out, summary = built
    assert (summary["videos"], summary["windows"], summary["encoded"], summary["failed"]) == (3, 5, STEMS, {})
    with open(out / "index.json") as f:
        index = json.load(f)
    assert {s: e["starts"] for s, e in index["videos"].items()} == STARTS and list(index["videos"]) == STEMS
    clips = data.GridClips(str(folders / "grid"), FRAMES, *SIZE, **TEXT)
    net = cache.build_vae("tiny", "", CPU, torch.float32)
    for i, stem in enumerate(STEMS):
        tensors = cached(out, stem)
        assert tensors["latent"].shape == (len(STARTS[stem]), 16, 2, SIZE[0] // 8, SIZE[1] // 8)
        assert tensors["latent"].dtype == torch.float32 and tensors["starts"].tolist() == STARTS[stem]
        for k, start in enumerate(STARTS[stem]):
            expected = net.encode(window_of(clips, i, start)["video"][None])[0]  # train.py's to_latent, fp32 on CPU
            assert torch.equal(tensors["latent"][k], expected), (stem, start)


def test_reader_draws_deterministic_windows_and_covers_every_cached_start(folders, built):
    out, _ = built
    grid = str(folders / "grid")
    ds = cache.LatentClips(str(out), grid, FRAMES, *SIZE, **TEXT, **{k: KEY[k] for k in ("vae", "dtype")})
    clips = data.GridClips(grid, FRAMES, *SIZE, **TEXT)
    assert [v.stem for v in ds.videos] == [v.stem for v in clips.videos] == STEMS  # holdout ids and sampler agree
    for i, stem in enumerate(STEMS):
        draws = [ds[(i, seed)] for seed in range(24)]
        assert {d["start"] for d in draws} == set(STARTS[stem])
        for d in draws:
            assert torch.equal(d["latent"], cached(out, stem)["latent"][STARTS[stem].index(d["start"])])
        again = ds[(i, 5)]
        assert again["start"] == draws[5]["start"] and torch.equal(again["latent"], draws[5]["latent"])
    sample, reference = ds[1], clips[1]  # a plain index, as GridClips
    assert set(sample) == set(reference) - {"video"} | {"latent"}
    assert all(torch.equal(sample[k], reference[k]) for k in ("text_emb", "text_mask"))
    assert (sample["prompt"], sample["stem"], sample["skipped"]) == (reference["prompt"], STEMS[1], 0)
    # through DataLoader workers, as train.py reads it: the same samples as indexing the sampler's items directly
    items = iter(data.ClipSampler(len(ds), seed=3))
    expected = [ds[next(items)] for _ in range(4)]
    loader = iter(DataLoader(ds, batch_size=1, sampler=data.ClipSampler(len(ds), seed=3), num_workers=2))
    for want in expected:
        got = next(loader)
        assert got["stem"] == [want["stem"]] and torch.equal(got["latent"][0], want["latent"])


def fake_real_vae(name, path, device, dtype):
    """--vae real with a small checkpoint: the tiny architecture loaded from `path` (tokenizer.pth is 508 MB)."""
    assert name == "real"
    net = vae.WanVAE(vae.get_vae_config("tiny"))
    net.load_state_dict(safetensors.torch.load_file(path))
    return net.to(device=device, dtype=dtype).eval().requires_grad_(False)


def test_a_stale_cache_is_refused_in_one_line_naming_what_changed(folders, built, tmp_path, monkeypatch):
    out, _ = built
    grid = str(folders / "grid")

    def refused(cache_dir, data_dir=grid, **changes) -> str:
        with pytest.raises(ValueError) as e:
            cache.check_cache(str(cache_dir), data_dir, **(KEY | changes))
        assert "\n" not in str(e.value)
        return str(e.value)

    assert cache.check_cache(str(out), grid, **KEY)["key_hash"]
    assert f"{out} was encoded with other settings: frames 5 in cache.json, 1 now; build" in refused(out, frames=1)
    assert "other settings: dtype 'fp32' in cache.json, 'bf16' now; build" in refused(out, dtype="bf16")
    assert "--out NEW_CACHE" in refused(out, frames=1)
    assert "no cache.json" in refused(tmp_path)
    # the VAE checkpoint's bytes (a small stand-in for tokenizer.pth)
    ckpt = str(tmp_path / "tokenizer.safetensors")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # a WanVAE of the tiny config (build_vae("tiny") is the weight-free LinearCodec)
        safetensors.torch.save_file(vae.WanVAE(vae.get_vae_config("tiny")).state_dict(), ckpt)
    monkeypatch.setattr(cache, "build_vae", fake_real_vae)
    real = tmp_path / "real"
    cache.build(config(grid, real, vae="real", vae_ckpt=ckpt), CPU)
    cache.check_cache(str(real), grid, **(KEY | dict(vae="real", vae_ckpt=ckpt)))
    weights = safetensors.torch.load_file(ckpt)
    safetensors.torch.save_file({k: v * 1.01 for k, v in weights.items()}, ckpt)  # other weights, the same size
    line = refused(real, vae="real", vae_ckpt=ckpt)
    assert line.startswith(f"{real} was encoded with other settings: vae_ckpt '3718036 bytes in 1 file(s), sha256 ")
    assert line.count(" in cache.json, ") == 1  # that field alone
    with pytest.raises(ValueError, match="holds latents of another setting: vae_ckpt '3718036 bytes.* now; a cache "
                                         "holds one setting: pass a new --out"):
        cache.build(config(grid, real, vae="real", vae_ckpt=ckpt), CPU)
    assert "other settings: vae 'real' in cache.json, 'tiny' now; vae_config " in refused(real)
    # a latent file gone, a video the index does not hold, no index at all
    broken = shutil.copytree(out, tmp_path / "broken")
    os.remove(cache.latent_path(str(broken), STEMS[2]))
    assert f"1 have a missing or resized latent file (first: {cache.latent_path(str(broken), STEMS[2])})" in \
        refused(broken)
    with open(broken / "index.json") as f:
        index = json.load(f)
    del index["videos"][STEMS[0]]
    with open(broken / "index.json", "w") as f:
        json.dump(index, f)
    assert f"of the 3 videos of {grid}, 1 have no cached latents (first: {STEMS[0]}); 1 have a missing" in \
        refused(broken)
    assert "`python cache.py --data" in refused(broken) and "--stride 2" in refused(broken)
    os.remove(broken / "index.json")
    assert "incomplete (no index.json" in refused(broken)


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


def test_a_damaged_latent_file_is_named_when_it_is_read(folders, built, tmp_path):
    """Checked like a checkpoint: a flipped bit in a cached window (its checksum, recorded at build), a file of
    another latent shape (the run's settings) and a damaged header each stop the read in one line naming the file."""
    out, grid = built[0], str(folders / "grid")

    def reader(cache_dir):
        return cache.LatentClips(str(cache_dir), grid, FRAMES, *SIZE, **TEXT, vae="tiny", dtype="fp32")

    damaged = shutil.copytree(out, tmp_path / "flipped")
    path = cache.latent_path(str(damaged), STEMS[0])  # windows at starts 0 and 1
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        begin, end = json.loads(f.read(header_len))["latent"]["data_offsets"]
    flip_byte(path, 8 + header_len + end - 3)  # in window 1's latent, its last float
    ds = reader(damaged)
    seed = {int(np.random.default_rng(s).integers(0, 2)): s for s in range(10)}  # a sample seed per window
    assert torch.equal(ds[(0, seed[0])]["latent"], cached(out, STEMS[0])["latent"][0])  # window 0 is intact
    with pytest.raises(ValueError, match=f"{path}: window 1 \\(start 1\\) does not match the checksum cache.py "
                                         "recorded"):
        ds[(0, seed[1])]
    reshaped = shutil.copytree(out, tmp_path / "reshaped")
    path = cache.latent_path(str(reshaped), STEMS[0])
    with safetensors.safe_open(path, "pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    n, c, t, h, w = tensors["latent"].shape  # the same bytes as [n, c, t, w, h]: the size and checksums still match
    tensors["latent"] = tensors["latent"].reshape(n, c, t, w, h)
    safetensors.torch.save_file(tensors, path, metadata=meta)
    assert os.path.getsize(path) == os.path.getsize(cache.latent_path(str(out), STEMS[0]))
    with pytest.raises(ValueError, match=f"{path}: latents F32 \\[2, 16, 2, 6, 4\\], this run needs fp32 "
                                         "\\[2, 16, 2, 4, 6\\]"):
        reader(reshaped)[(0, 0)]
    torn = shutil.copytree(out, tmp_path / "torn")
    path = cache.latent_path(str(torn), STEMS[2])
    flip_byte(path, 12)  # inside the header's JSON
    with pytest.raises(ValueError, match=f"{path}: damaged safetensors file \\("):
        reader(torn)[(2, 0)]


def test_an_edited_cache_json_and_a_second_cache_py_are_refused(folders, built, tmp_path):
    """cache.json's key hash is recomputed from its fields at every open (an edit that made it match another run's
    settings is refused); a cache.py while another holds CACHE/.lock is refused before it writes anything."""
    out, grid = built[0], str(folders / "grid")
    edited = shutil.copytree(out, tmp_path / "edited")
    with open(edited / "cache.json") as f:
        saved = json.load(f)
    saved["key"]["dtype"] = "bf16"  # fp32 latents presented as a bf16 run's
    with open(edited / "cache.json", "w") as f:
        json.dump(saved, f)
    for read in (lambda: cache.check_cache(str(edited), grid, **(KEY | {"dtype": "bf16"})),
                 lambda: cache.build(config(grid, edited, dtype="bf16"), CPU)):
        with pytest.raises(ValueError, match=f"{edited}/cache.json: its key_hash {saved['key_hash']} is not the hash "
                                             "of its fields"):
            read()
    busy = tmp_path / "busy"
    busy.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); "
                               "fcntl.lockf(f, fcntl.LOCK_EX); f.write('pid 1 on host'); f.flush(); print('locked', "
                               "flush=True); time.sleep(60)", str(busy / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ValueError, match=f"--out {busy} is in use by a running cache.py \\(pid 1 on host\\)"):
            cache.build(config(grid, busy), CPU)
        assert sorted(os.listdir(busy)) == [".lock"]
    finally:
        holder.kill()
        holder.wait()
    assert cache.build(config(grid, busy), CPU)["videos"] == 3  # the holder is gone, and so is its lock


def restitch(folder, stem):
    """Re-encode one grid video (other bytes, same frames) and record it in the manifest, as a restitch would."""
    import stitch
    path = os.path.join(folder, "videos", stem + ".mp4")
    subprocess.run([stitch.ffmpeg_exe(), "-v", "error", "-i", path, "-c:v", "libx264", "-crf", "35", "-preset",
                    "ultrafast", "-pix_fmt", "yuv420p", "-y", path + ".mp4"], check=True)
    os.replace(path + ".mp4", path)
    with open(os.path.join(folder, "manifest.jsonl")) as f:
        records = [json.loads(line) for line in f]
    for r in records:
        r.update(sha1=stitch.sha1_file(path), bytes=os.path.getsize(path)) if r["stem"] == stem else None
    with open(os.path.join(folder, "manifest.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def test_a_restitched_video_is_refused_by_the_reader_and_reencoded_by_a_rerun(folders, built, tmp_path):
    out, _ = built
    grid = shutil.copytree(folders / "grid", tmp_path / "grid")
    restitch(grid, STEMS[1])
    with pytest.raises(ValueError, match=f"1 were restitched since \\(sha1\\) \\(first: {STEMS[1]}: cached "):
        cache.LatentClips(str(out), str(grid), FRAMES, *SIZE, **TEXT, vae="tiny", dtype="fp32")
    again = shutil.copytree(out, tmp_path / "cache")
    summary = cache.build(config(grid, again), CPU)
    assert (summary["encoded"], summary["reused"]) == ([STEMS[1]], [STEMS[0], STEMS[2]])
    clips = data.GridClips(str(grid), FRAMES, *SIZE, **TEXT)
    expected = cache.build_vae("tiny", "", CPU, torch.float32).encode(window_of(clips, 1, 0)["video"][None])[0]
    ds = cache.LatentClips(str(again), str(grid), FRAMES, *SIZE, **TEXT, vae="tiny", dtype="fp32")
    assert torch.equal(ds[1]["latent"], expected)


def test_a_killed_run_is_completed_by_a_rerun_that_encodes_only_the_missing_video(folders, built, tmp_path):
    out, _ = built
    killed = shutil.copytree(out, tmp_path / "killed")
    path = cache.latent_path(str(killed), STEMS[2])
    os.remove(path)
    with open(path + ".tmp", "wb") as f:  # the partial write of the killed run
        f.write(b"\0" * 100)
    os.remove(killed / "index.json")  # a killed run never wrote it
    kept = {s: os.stat(cache.latent_path(str(killed), s)).st_mtime_ns for s in STEMS[:2]}
    with pytest.raises(ValueError, match="incomplete"):
        cache.check_cache(str(killed), str(folders / "grid"), **KEY)
    summary = cache.build(config(folders / "grid", killed, workers=2), CPU)  # through DataLoader workers this time
    assert (summary["encoded"], summary["reused"], summary["videos"]) == ([STEMS[2]], STEMS[:2], 3)
    assert sorted(os.listdir(killed / "latents")) == [s + ".safetensors" for s in STEMS]  # the .tmp is gone
    assert kept == {s: os.stat(cache.latent_path(str(killed), s)).st_mtime_ns for s in STEMS[:2]}
    assert same_file(path, cache.latent_path(str(out), STEMS[2]))  # what the uninterrupted run wrote
    cache.check_cache(str(killed), str(folders / "grid"), **KEY)


def encode_shard(rank, world, data_dir, out):
    torch.set_num_threads(1)
    summary = cache.build(config(data_dir, out), CPU)
    return summary["encoded"], summary["reused"], summary["videos"]


def test_two_gloo_ranks_encode_each_video_once(folders, built, tmp_path):
    out, _ = built
    sharded = tmp_path / "sharded"
    results = run_dist(encode_shard, 2, 120, str(folders / "grid"), str(sharded))
    assert results == [([STEMS[0], STEMS[2]], [], 3), ([STEMS[1]], [], 3)]  # video i on rank i % 2
    assert all(same_file(cache.latent_path(str(sharded), s), cache.latent_path(str(out), s)) for s in STEMS)
    with open(sharded / "index.json") as f, open(out / "index.json") as g:
        assert json.load(f) == json.load(g)


def test_views_round_trip_with_their_cameras(folders, tmp_path):
    from base.camera import stack_views
    views, out = str(folders / "views"), tmp_path / "views"
    summary = cache.build(config(views, out), CPU)
    assert (summary["videos"], summary["windows"]) == (3, 5)
    clips = data.ViewClips(views, FRAMES, *SIZE, **TEXT)
    ds = cache.LatentClips(str(out), views, FRAMES, *SIZE, **TEXT, vae="tiny", dtype="fp32")
    net = cache.build_vae("tiny", "", CPU, torch.float32)
    for i, stem in enumerate(STEMS):
        tensors = cached(out, stem)
        assert tensors["latent"].shape == (len(STARTS[stem]), 16, 3 * 2, SIZE[0] // 8, SIZE[1] // 8)
        for k, start in enumerate(STARTS[stem]):
            sample = window_of(clips, i, start)
            expected = stack_views(net.encode(sample["video"]), 3)[0]  # train.py's to_latent for views
            assert torch.equal(tensors["latent"][k], expected), (stem, start)
            assert torch.equal(tensors["w2c"][k], sample["w2c"]) and torch.equal(tensors["intrinsics"][k],
                                                                                  sample["intrinsics"])
            got = window_of(ds, i, start)
            assert torch.equal(got["latent"], expected) and torch.equal(got["w2c"], sample["w2c"])
            assert (got["cameras"], got["views"]) == (sample["cameras"], sample["views"]) == ("real",
                                                                                             list(data.VIEW_ORDER))
    with pytest.raises(ValueError, match="other settings: layout 'views' in cache.json, 'grid' now; camera_params "
                                         "'auto' in cache.json, '' now"):
        cache.check_cache(str(out), str(folders / "grid"), **KEY)


def test_a_video_that_fails_to_decode_is_named_and_skipped_like_gridclips(folders, tmp_path, capsys):
    grid = shutil.copytree(folders / "grid", tmp_path / "grid")

    def damage(stem):  # same size (construction passes), other bytes: the sha1 at first use fails
        path = os.path.join(grid, "videos", stem + ".mp4")
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 2)
            byte = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([byte[0] ^ 0xFF]))

    damage(STEMS[1])
    out = tmp_path / "cache"
    summary = cache.build(config(grid, out), CPU)
    assert list(summary["failed"]) == [STEMS[1]] and summary["failed"][STEMS[1]].startswith("sha1_mismatch")
    assert summary["videos"] == 2 and f"1 failed: {STEMS[1]} (sha1_mismatch" in capsys.readouterr().out
    ds = cache.LatentClips(str(out), str(grid), FRAMES, *SIZE, **TEXT, vae="tiny", dtype="fp32")
    clips = data.GridClips(str(grid), FRAMES, *SIZE, **TEXT)
    for source in (ds, clips):  # the sample moves on to the next video, counted
        assert (source[(1, 0)]["stem"], source[(1, 0)]["skipped"]) == (STEMS[2], 1)
    damage(STEMS[0])
    damage(STEMS[2])
    argv = ["--data", str(grid), "--out", str(tmp_path / "empty"), "--vae", "tiny", "--frames", str(FRAMES), "--height",
            str(SIZE[0]), "--width", str(SIZE[1]), "--stride", str(STRIDE), "--workers", "0", "--device", "cpu"]
    assert cache.main(argv) == 1  # a cache of no video
    assert "holds no video: 3 failed" in capsys.readouterr().err


def test_train_on_a_stride_one_cache_equals_online_encoding(folders, tmp_path):
    """train.py --latents: with every window cached (stride 1) the sampler's draws land on the same windows, so the
    loss curve is bitwise the online-encoding one; a folder that is no cache is refused before training."""
    import train
    out = tmp_path / "c1"
    cache.build(config(folders / "grid", out, stride=1), CPU)
    common = ["--data", str(folders / "grid"), "--frames", str(FRAMES), "--height", str(SIZE[0]), "--width",
              str(SIZE[1]), "--steps", "3", "--sample-every", "0", "--workers", "0", "--holdout", "1"]
    cached_run = train.main(common + ["--latents", str(out), "--out", str(tmp_path / "a")])
    online_run = train.main(common + ["--no-cache-latents", "--out", str(tmp_path / "b")])
    assert [r["loss"] for r in cached_run] == [r["loss"] for r in online_run]
    assert cached_run[-1]["eval_loss"] == online_run[-1]["eval_loss"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty.*cache.py --data"):  # before any model is built
        train.main(common + ["--latents", str(tmp_path / "empty"), "--out", str(tmp_path / "c")])


def test_default_workers_follow_the_cpus_of_each_rank(monkeypatch, tmp_path):
    """--workers defaults to min(8, CPUs / ranks of the node): 2 on a 2-core machine, 8 per rank on 64 cores x 8."""
    for cpus, ranks, want in ((2, None, 2), (64, "8", 8), (128, None, 8), (4, "8", 1)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, cpus=cpus: set(range(cpus)))
        if ranks:
            monkeypatch.setenv("LOCAL_WORLD_SIZE", ranks)
        else:
            monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
        assert cache.CacheConfig(data=str(tmp_path), out=str(tmp_path / "c"), vae="tiny").workers == want
    assert cache.CacheConfig(data=str(tmp_path), out=str(tmp_path / "c"), vae="tiny", workers=0).workers == 0
