"""clips/data.py: clips from stitched grids (the v3.0 tiny dataset has videos of 94, 93 and 103 frames), embeddings,
what is refused at start-up and what is skipped at first use, and the deterministic resumable sampler."""
import json
import os
import pickle
import shutil
import subprocess

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch.utils.data import DataLoader

import stitch
import t5
from base.camera import grid_from_views
from clips import data, text, tiny
from run_utils import in_process
from test_stitch import SIZE, V30, grid_codes, stitched

STEMS = [f"lerobot_v30_tiny__ep{i:06d}" for i in range(3)]  # 94, 93, 103 frames at stride 4


def copy_grid(tmp_path) -> str:
    out, _ = stitched(V30)
    return shutil.copytree(out, tmp_path / "grid")


def clip_frames(sample: dict) -> list:
    """frame_index shown by each slot of each clip frame, read from the [-1,1] tensor."""
    pixels = ((sample["video"].permute(1, 2, 3, 0) + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).numpy()
    codes = [grid_codes(frame) for frame in pixels]
    assert all([c["camera"] for c in frame] == [1, 2, 3] for frame in codes)
    return [[c["frame"] for c in frame] for frame in codes]


def test_93_frame_video_gives_a_93_frame_clip():
    out, _ = stitched(V30)
    ds = data.GridClips(out, frames=93, height=SIZE[0], width=SIZE[1], text="standin", text_len=16, text_dim=8)
    assert [v.stem for v in ds.videos] == STEMS and not ds.skipped
    sample = ds[1]
    assert sample["stem"] == STEMS[1] and sample["start"] == 0 and sample["skipped"] == 0
    assert sample["video"].shape == (3, 93, *SIZE) and sample["video"].dtype == torch.float32
    assert -1 <= sample["video"].min() and sample["video"].max() <= 1
    assert clip_frames(sample) == [[4 * j] * 3 for j in range(93)]  # every frame, in order, aligned
    assert {ds[(0, seed)]["start"] for seed in range(12)} == {0, 1}  # a 94-frame video: both windows occur


def test_random_window_is_contiguous_and_reproducible():
    out, _ = stitched(V30)
    ds = data.GridClips(out, frames=9, height=SIZE[0], width=SIZE[1], text="standin", text_len=16, text_dim=8)
    starts = set()
    for seed in range(6):
        sample = ds[(2, seed)]
        starts.add(sample["start"])
        assert 0 <= sample["start"] <= 103 - 9
        assert clip_frames(sample) == [[4 * (sample["start"] + j)] * 3 for j in range(9)]
        assert torch.equal(sample["video"], ds[(2, seed)]["video"])  # same seed, same clip
    assert len(starts) > 1
    # read_clip resizes only when asked to (sample.py's conditioning frame)
    path = ds.videos[0].path
    assert data.read_clip(path, 0, 2, 48, 80, fit="stretch").shape == (2, 48, 80, 3)
    assert data.read_clip(path, 0, 2, 64, 64, fit="crop").shape == (2, 64, 64, 3)
    with pytest.raises(data.ClipError, match=f"wrong_size: {path} is {SIZE[0]}x{SIZE[1]}, expected 48x80"):
        data.read_clip(path, 0, 2, 48, 80)


def test_wrong_size_is_refused_at_start_up_never_resized(tmp_path):
    root = copy_grid(tmp_path)
    fix = f"pass --height {SIZE[0]} --width {SIZE[1]}, or restitch with `python stitch.py SRC OUT --size 48x80`"
    asked = "\\(3 of 3 in manifest.jsonl\\), this run asks for 48x80"
    with pytest.raises(ValueError, match=f"the videos are {SIZE[0]}x{SIZE[1]} {asked}.*{fix}"):
        data.GridClips(root, frames=9, height=48, width=80, text="standin")
    os.remove(os.path.join(root, "manifest.jsonl"))  # upstream layout: the first video is probed
    with pytest.raises(ValueError, match=f"{SIZE[0]}x{SIZE[1]} .*{STEMS[0]}.mp4, probed.*{fix}"):
        data.GridClips(root, frames=9, height=48, width=80, text="standin")
    # any later video of another size is skipped and counted at its first use
    path = os.path.join(root, "videos", STEMS[1] + ".mp4")
    subprocess.run([stitch.ffmpeg_exe(), "-v", "error", "-i", path, "-vf", "scale=160:96", "-c:v", "libx264",
                    "-preset", "ultrafast", "-y", path + ".mp4"], check=True)
    os.replace(path + ".mp4", path)
    ds = data.GridClips(root, frames=9, height=SIZE[0], width=SIZE[1], text="standin", text_len=4, text_dim=2)
    sample = ds[(1, 0)]
    assert sample["stem"] == STEMS[2] and sample["skipped"] == 1
    assert ds.failed == {STEMS[1]: f"wrong_size: {path} is 96x160, expected {SIZE[0]}x{SIZE[1]}"}


def test_too_short_videos_are_skipped_and_counted_at_construction():
    out, _ = stitched(V30)
    ds = data.GridClips(out, frames=100, height=SIZE[0], width=SIZE[1], text="standin", text_len=4, text_dim=2)
    assert [v.stem for v in ds.videos] == [STEMS[2]]
    assert {s: r.split(":")[0] for s, r in ds.skipped.items()} == {STEMS[0]: "too_short", STEMS[1]: "too_short"}
    with pytest.raises(ValueError, match="no usable video"):
        data.GridClips(out, frames=200, height=SIZE[0], width=SIZE[1], text="standin")


def test_videos_shorter_than_the_clips_and_too_few_episodes_name_the_cause_and_the_fix(tiny_grid, tmp_path):
    """Clips longer than most videos: the start-up line, the "no usable video" error and train.py's hold-out refusal
    say how long the videos are and what to do (a smaller --stride, or --frames), not only "too_short" counts or a
    hold-out that leaves nothing; with too few episodes the refusal names --holdout 0 and stitching more."""
    short = "fewer than the {} a clip needs: restitch with a smaller --stride (more frames per episode), or train with "
    with pytest.raises(ValueError) as e:  # the tiny grid's 6 videos have 10-15 frames
        data.GridClips(tiny_grid, frames=17, height=64, width=112, text="standin")
    assert str(e.value).endswith("; 6 video(s) have 10-15 frames, " + short.format(17) + "--frames 13")
    import train
    proc = in_process(train, ["--data", tiny_grid, "--out", str(tmp_path / "a"), "--frames", "13", "--holdout", "3"])
    cause = "3 video(s) have 10-12 frames, " + short.format(13) + "--frames 9"
    assert f"GridClips: {tiny_grid}: 3 videos 64x112, 3 skipped {{'too_short': 3}}; {cause}\n" in proc.stdout
    assert proc.returncode == 2 and proc.stderr == (f"train.py: error: {tiny_grid}: {cause}; the 3 video(s) left "
                                                    "are all held out by --holdout 3: "
                                                    "pass --holdout 1 (evaluate.py and policyeval.py need one held-out "
                                                    "episode), or --holdout 0 to train on them all "
                                                    "(no held-out evaluation: evaluate.py and policyeval.py then refuse the run)\n")
    proc = in_process(train, ["--data", tiny_grid, "--out", str(tmp_path / "b"), "--holdout", "6"])
    assert proc.returncode == 2 and proc.stderr == (f"train.py: error: {tiny_grid}: only 6 usable video(s) for 9-frame "
                                                    "clips, all held out by --holdout 6: stitch more episodes, or "
                                                    "pass --holdout 1 (evaluate.py and policyeval.py need one held-out "
                                                    "episode), or --holdout 0 to train on them all "
                                                    "(no held-out evaluation: evaluate.py and policyeval.py then refuse the run)\n")
    assert not os.path.exists(tmp_path / "a") and not os.path.exists(tmp_path / "b")


def corrupt(path: str, at: float = 0.1, n: int = 64):
    """Flip n bytes a fraction `at` into the file: same size, and the h264 decoder logs errors but exits 0."""
    with open(path, "r+b") as f:
        f.seek(int(os.path.getsize(path) * at))
        block = f.read(n)
        f.seek(-n, os.SEEK_CUR)
        f.write(bytes(b ^ 0x5A for b in block))


def test_truncated_changed_and_badly_decoding_videos_are_counted_skips_and_workers_survive(tmp_path, capsys):
    root = copy_grid(tmp_path)
    first = os.path.join(root, "videos", STEMS[0] + ".mp4")
    with open(first, "rb") as f:
        head = f.read()[: os.path.getsize(first) // 2]
    with open(first, "wb") as f:
        f.write(head)  # truncated mid-file, as a killed copy leaves it: the manifest's byte count, at construction
    corrupt(os.path.join(root, "videos", STEMS[1] + ".mp4"))  # same size: the manifest's sha1, at first use
    kw = dict(height=SIZE[0], width=SIZE[1], text="standin", text_len=4, text_dim=2)
    ds = data.GridClips(root, frames=9, **kw)
    assert [v.stem for v in ds.videos] == STEMS[1:] and ds.skipped[STEMS[0]].startswith("bytes_mismatch: ")
    sample = ds[(0, 0)]
    assert sample["stem"] == STEMS[2] and sample["skipped"] == 1
    assert ds.failed[STEMS[1]].startswith(f"sha1_mismatch: {root}/videos/{STEMS[1]}.mp4 has sha1 ")
    assert ds.verified == {STEMS[2]} and "skipping" in capsys.readouterr().err
    sampler = data.ClipSampler(len(ds), seed=3)
    loader = DataLoader(ds, batch_size=2, sampler=sampler, num_workers=2)
    batches = [b for _, b in zip(range(3), loader)]
    assert all(b["video"].shape == (2, 3, 9, *SIZE) for b in batches)
    assert {s for b in batches for s in b["stem"]} == {STEMS[2]}
    assert sum(int(b["skipped"].sum()) for b in batches) >= 1  # workers reported what they passed over
    # a manifest without sha1 and byte count (they are checked when present): the truncated video decodes short,
    # the corrupted one decodes all 93 frames and exits 0 but logs decode errors: both counted skips at first use
    records = [json.loads(line) for line in open(os.path.join(root, "manifest.jsonl"))]
    with open(os.path.join(root, "manifest.jsonl"), "w") as f:
        f.writelines(json.dumps({k: v for k, v in r.items() if k not in ("sha1", "bytes")}) + "\n" for r in records)
    ds = data.GridClips(root, frames=93, **kw)
    assert ds.skipped == {} and [v.stem for v in ds.videos] == STEMS
    assert ds[(0, 0)]["stem"] == STEMS[2] and ds.verified == set()
    assert ds.failed[STEMS[0]].startswith("truncated: decoded ")
    assert ds.failed[STEMS[1]].startswith("decode_error: ") and "[error]" in ds.failed[STEMS[1]]
    # without a manifest, probing at start-up (until the first readable video) finds both: skipped and counted
    os.remove(os.path.join(root, "manifest.jsonl"))
    ds = data.GridClips(root, frames=93, **kw)
    assert [v.stem for v in ds.videos] == [STEMS[2]]
    assert {s: r.split(":")[0] for s, r in ds.skipped.items()} == {STEMS[0]: "unreadable", STEMS[1]: "unreadable"}


def test_a_video_deleted_after_start_up_and_nan_cameras_are_named_counted_skips(tmp_path, capsys):
    """The loader's policy for a bad video found at first use: skipped and counted, the next video used, the file
    named. A video deleted between construction and its first use is one (missing_file), as is a camera file with a
    NaN (bad_camera): a NaN camera would otherwise train silently on a NaN Pluecker map."""
    root = copy_grid(tmp_path)
    ds = data.GridClips(root, frames=9, height=SIZE[0], width=SIZE[1], text="standin", text_len=4, text_dim=2)
    os.remove(os.path.join(root, "videos", STEMS[0] + ".mp4"))
    sample = ds[(0, 0)]
    assert sample["stem"] == STEMS[1] and sample["skipped"] == 1
    assert ds.failed[STEMS[0]] == f"missing_file: {root}/videos/{STEMS[0]}.mp4 (deleted since start-up)"
    from test_stitch import VIEW_SIZE, stitched_views
    views = shutil.copytree(stitched_views()[1], tmp_path / "views")
    ds = data.ViewClips(str(views), 9, *VIEW_SIZE, text_len=16, text_dim=8, text="standin")
    camera_file = f"{views}/cameras/{ds.videos[0].stem}.npz"
    with np.load(camera_file) as f:
        arrays = dict(f)
    arrays["w2c"][1, 2, 0, 3] = np.nan
    np.savez(camera_file, **arrays)
    capsys.readouterr()
    assert ds[(0, 5)]["stem"] == ds.videos[1].stem
    assert ds.failed[ds.videos[0].stem] == f"bad_camera: {camera_file} holds NaN/Inf values; restitch the episode " \
        "(delete the file first)"
    assert camera_file in capsys.readouterr().err
    for video in ds.videos[1:]:  # every camera file damaged: one user error (ValueError, one line), no traceback
        path = f"{views}/cameras/{video.stem}.npz"
        np.savez(path, **arrays)
    with pytest.raises(ValueError, match=rf"{views}: all {len(ds.videos)} videos failed to load, e\.g\. "
                                         rf"{ds.videos[0].stem}: bad_camera: .* holds NaN/Inf values; restitch"):
        ds[(0, 6)]


def fake_t5(calls=None):
    def encode(prompts):  # (tokens, 1024), one row per word; deterministic per prompt
        if calls is not None:
            calls.extend(prompts)
        return [np.full((len(p.split()), 1024), len(p) / 1000, np.float32) for p in prompts]
    return encode


def test_text_embeddings_upstream_pickle_and_safetensors(tmp_path):
    root = copy_grid(tmp_path)
    kw = dict(frames=9, height=SIZE[0], width=SIZE[1])
    with pytest.raises(FileNotFoundError, match="t5.py"):  # a real config without embeddings fails clearly
        data.GridClips(root, **kw)
    assert text.negative_prompt_path(root) is None
    calls = []
    counts = t5.write_embeddings(root, fake_t5(calls), batch=1)
    # 2 unique video prompts + the negative prompt, each encoded once; 3 video files + the negative one
    assert counts == {"videos": 3, "unique_prompts": 3, "files": 4} and sorted(calls) == sorted(
        {v.prompt for v in data.list_videos(root)} | {t5.NEGATIVE_PROMPT})
    negative = text.negative_prompt_path(root)
    assert negative == os.path.join(root, "t5_xxl", "negative_prompt.pickle")
    emb, mask = text.load_text_embedding(negative, 512, 1024)  # the same format as a video's
    assert int(mask.sum()) == len(t5.NEGATIVE_PROMPT.split()) and "static with no motion" in t5.NEGATIVE_PROMPT
    before = open(negative, "rb").read()
    assert t5.write_embeddings(root, fake_t5(calls))["files"] == 0 and len(calls) == 3  # a rerun only fills gaps
    assert open(negative, "rb").read() == before
    with open(os.path.join(root, "t5_xxl", STEMS[1] + ".pickle"), "rb") as f:
        (arr,) = pickle.load(f)
    assert arr.dtype == np.float16 and arr.shape[1] == 1024
    os.remove(os.path.join(root, "t5_xxl", STEMS[2] + ".pickle"))
    save_file({"text_emb": torch.ones(7, 1024, dtype=torch.float16)}, os.path.join(root, "t5_xxl", STEMS[2] +
                                                                                    ".safetensors"))
    ds = data.GridClips(root, **kw)
    assert [v.stem for v in ds.videos] == STEMS  # the negative prompt's file is no video's
    one = ds[1]
    assert one["text_emb"].shape == (512, 1024) and one["text_emb"].dtype == torch.float32
    assert int(one["text_mask"].sum()) == len(arr) and torch.equal(one["text_emb"][:len(arr)],
                                                                   torch.from_numpy(arr.astype(np.float32)))
    assert one["text_emb"][len(arr):].abs().sum() == 0
    assert int(ds[2]["text_mask"].sum()) == 7 and ds[2]["text_emb"][:7].eq(1).all()


def test_bad_text_embeddings_stop_the_run_at_start_up(tmp_path):
    root = copy_grid(tmp_path)
    t5.write_embeddings(root, fake_t5())
    kw = dict(frames=9, height=SIZE[0], width=SIZE[1])
    emb = lambda stem, ext=".pickle": os.path.join(root, "t5_xxl", stem + ext)  # noqa: E731
    # the wrong width for this model, and more tokens than text_len: at construction, not in a worker at step 2
    with pytest.raises(ValueError, match=r"shape \(\d+, 1024\), expected float \(1..512, 16\)"):
        data.GridClips(root, **kw, text_dim=16)
    with pytest.raises(ValueError, match=r"expected float \(1..4, 1024\)"):
        data.GridClips(root, **kw, text_len=4)
    # every file is read whole: STEMS[0] and STEMS[2] share a prompt and a byte count, and a NaN has as many bytes as
    # the number it replaced, so the twin is checked too
    files = [(emb(v.stem), v.prompt) for v in data.list_videos(root)]
    assert [p for _, p in files].count(files[0][1]) == 2 and text.check_text_embeddings(files, 512, 1024) == 3
    shared = [v.stem for v in data.list_videos(root) if v.prompt == files[0][1]][1]
    good = open(emb(shared), "rb").read()
    (arr,) = pickle.loads(good)
    arr[3, 7] = np.inf
    with open(emb(shared), "wb") as f:
        pickle.dump([arr], f)
    assert os.path.getsize(emb(shared)) == len(good) == os.path.getsize(files[0][0])
    with pytest.raises(ValueError, match=f"{shared}.pickle: the text embedding holds NaN/Inf values"):
        data.GridClips(root, **kw)
    with open(emb(shared), "wb") as f:  # cut short by a full disk or a killed copy: one line naming it
        f.write(good[: len(good) // 2])
    with pytest.raises(ValueError, match=f"{shared}.pickle: truncated or damaged pickle"):
        data.GridClips(root, **kw)
    # a file of a shared prompt written by another encoder has another byte count: refused
    with open(emb(shared), "wb") as f:
        pickle.dump([np.zeros((5, 768), np.float16)], f)
    with pytest.raises(ValueError, match=f"{shared}.pickle: text embedding has shape \\(5, 768\\)"):
        data.GridClips(root, **kw)
    os.remove(emb(shared))
    save_file({"emb": torch.ones(7, 1024)}, emb(shared, ".safetensors"))
    with pytest.raises(ValueError, match=r"no tensor 'text_emb' \(has \['emb'\]\)"):
        data.GridClips(root, **kw)
    save_file({"text_emb": torch.ones(7, 1024, dtype=torch.int32)}, emb(shared, ".safetensors"))
    with pytest.raises(ValueError, match=r"\(not float\)"):
        data.GridClips(root, **kw)
    save_file({"text_emb": torch.ones(7, 1024).index_fill_(0, torch.tensor([2]), float("nan"))},
              emb(shared, ".safetensors"))
    with pytest.raises(ValueError, match=f"{shared}.safetensors: the text embedding holds NaN/Inf values"):
        data.GridClips(root, **kw)


def test_a_video_named_like_the_negative_prompt_is_refused(tmp_path):
    root = copy_grid(tmp_path)
    os.remove(os.path.join(root, "manifest.jsonl"))
    os.rename(os.path.join(root, "videos", STEMS[0] + ".mp4"), os.path.join(root, "videos", "negative_prompt.mp4"))
    for call in (lambda: data.GridClips(root, frames=9, height=SIZE[0], width=SIZE[1], text="standin"),
                 lambda: t5.write_embeddings(root, fake_t5())):
        with pytest.raises(ValueError, match="a video is named negative_prompt.mp4, the name t5.py gives"):
            call()


def test_a_torn_or_foreign_manifest_is_refused(tmp_path):
    root = copy_grid(tmp_path)
    path = os.path.join(root, "manifest.jsonl")
    lines = open(path).read().splitlines()
    with open(path, "w") as f:
        f.write("\n".join(lines[:2] + [lines[2][:40]]) + "\n")
    with pytest.raises(ValueError, match="manifest.jsonl:3: not valid JSON.*rerun it"):
        data.list_videos(root)
    rec = json.loads(lines[0])
    del rec["width"]
    with open(path, "w") as f:
        f.write(json.dumps(rec) + "\n")
    with pytest.raises(ValueError, match=r"manifest.jsonl:1: no \['width'\]"):
        data.list_videos(root)


def test_embedding_pickle_cannot_run_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    path = tmp_path / "x.pickle"
    path.write_bytes(pickle.dumps([Evil()]))
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        text.load_text_embedding(str(path), 512, 1024)


def test_standin_embedding_is_deterministic_per_prompt():
    a, mask = text.standin_text_embedding("put the cup down", 16, 8)
    assert a.shape == (16, 8) and mask.tolist() == [1] * 4 + [0] * 12 and a[4:].abs().sum() == 0
    assert torch.equal(a, text.standin_text_embedding("put the cup down", 16, 8)[0])
    assert not torch.equal(a, text.standin_text_embedding("put the cup up", 16, 8)[0])


def test_upstream_layout_without_manifest(tmp_path):
    root = copy_grid(tmp_path)
    os.remove(os.path.join(root, "manifest.jsonl"))
    ds = data.GridClips(root, frames=93, height=SIZE[0], width=SIZE[1], text="standin", text_len=4, text_dim=2)
    assert [v.frames for v in ds.videos] == [94, None, None]  # the first probed at start-up, the others at first use
    assert ds[1]["start"] == 0 and ds.videos[1].frames == 93
    assert ds[1]["prompt"] == open(os.path.join(root, "metas", STEMS[1] + ".txt")).read()


def take(sampler, n):
    it = iter(sampler)
    return [next(it) for _ in range(n)]


def test_sampler_is_deterministic_resumable_and_shards_ranks():
    stream = take(data.ClipSampler(5, seed=1), 15)
    assert stream == take(data.ClipSampler(5, seed=1), 15)
    assert [sorted(i for i, _ in stream[k:k + 5]) for k in (0, 5, 10)] == [list(range(5))] * 3  # each epoch: all
    assert [i for i, _ in stream[:5]] != [i for i, _ in stream[5:10]]  # reshuffled per epoch
    sampler = data.ClipSampler(5, seed=1)
    take(sampler, 11)
    state = sampler.state_dict(consumed=7)  # the loop took 7; prefetching ran ahead to 11
    resumed = data.ClipSampler(5, seed=1)
    resumed.load_state_dict(state)
    assert take(resumed, 8) == stream[7:15]
    with pytest.raises(ValueError, match="world_size"):
        data.ClipSampler(5, world_size=2, seed=1).load_state_dict(state)
    ranks = [take(data.ClipSampler(5, rank=r, world_size=2, seed=1), 3) for r in range(2)]
    # rank r takes slots r, r+2, r+4 of the epoch one rank sees whole: same videos and windows; slot 5 wraps
    assert ranks[0] == stream[0:5:2] and ranks[1][:2] == stream[1:5:2] and ranks[1][2][0] == stream[0][0]
    with pytest.raises(ValueError):
        data.ClipSampler(5, rank=2, world_size=2)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_t5_pickles_of_every_protocol_load_and_code_does_not(tmp_path, protocol):
    import pickle

    import numpy as np

    from clips.text import load_text_embedding
    arr = np.arange(6 * 8, dtype=np.float16).reshape(6, 8)
    path = str(tmp_path / f"p{protocol}.pickle")
    with open(path, "wb") as f:
        pickle.dump([arr], f, protocol=protocol)
    emb, mask = load_text_embedding(path, 10, 8)
    assert emb.shape == (10, 8) and int(mask.sum()) == 6 and emb[:6].numpy().tolist() == arr.astype("float32").tolist()

    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))
    with open(path, "wb") as f:
        pickle.dump([Evil()], f, protocol=protocol)
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        load_text_embedding(path, 10, 8)


def test_view_clips_order_alignment_and_cameras_per_latent_frame(capsys):
    from test_stitch import VIEW_SIZE, read_code, stitched_views
    _, out, _ = stitched_views()
    ds = data.ViewClips(out, 9, *VIEW_SIZE, text_len=16, text_dim=8, text="standin", seed=3)
    for index in range(len(ds)):
        sample = ds[(index, 11 + index)]
        assert sample["views"] == ["wrist", "ext_1", "ext_2"] and sample["cameras"] == "real"
        pixels = ((sample["video"].permute(0, 2, 3, 4, 1) + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).numpy()
        assert pixels.shape == (3, 9) + VIEW_SIZE + (3,)
        codes = [[read_code(frame) for frame in view] for view in pixels]
        # [hand_0, head, hand_1] = wrist (camera 3), exterior_1 (1), exterior_2 (2); the same window in each view
        assert [{c["camera"] for c in view} for view in codes] == [{3}, {1}, {2}]
        start = sample["start"]
        assert all([c["frame"] for c in view] == [2 * (start + j) for j in range(9)] for view in codes)
        with np.load(f"{out}/cameras/{sample['stem']}.npz") as f:  # latent k <-> pixel frame start + 4k
            want = f["w2c"][[2, 0, 1]][:, start + 4 * np.arange(3)]
            want_k = f["intrinsics"][[2, 0, 1]][:, start + 4 * np.arange(3)]
        assert sample["w2c"].shape == (3, 3, 3, 4) and torch.equal(sample["w2c"], torch.from_numpy(want))
        assert torch.equal(sample["intrinsics"], torch.from_numpy(want_k))
    with pytest.raises(ValueError, match="4k\\+1"):
        data.ViewClips(out, 8, *VIEW_SIZE, text="standin")
    with pytest.raises(ValueError, match="ViewClips"):
        data.GridClips(out, 9, *VIEW_SIZE, text="standin")
    with pytest.raises(ValueError, match="--layout views"):
        data.ViewClips(stitched(V30)[0], 9, *SIZE, text="standin")
    _, bare, _ = stitched_views(cameras=False)
    capsys.readouterr()
    ds = data.ViewClips(bare, 9, *VIEW_SIZE, text_len=16, text_dim=8, text="standin")
    assert "NO camera parameters" in capsys.readouterr().out
    from base import camera
    w2c, k = camera.fallback_cameras(3, 3, *VIEW_SIZE)
    sample = ds[0]
    assert sample["cameras"] == "fallback" and torch.equal(sample["w2c"], w2c) and torch.equal(sample["intrinsics"], k)


def write_reason1(path, prompt, rows=5, dim=8, dtype=torch.bfloat16, fmt=text.REASON1_FORMAT):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    emb = torch.randn(rows, dim, generator=torch.Generator().manual_seed(len(prompt))).to(dtype)
    save_file({"crossattn_emb": emb}, path, metadata={"prompt": prompt, "encoder": "test", "revision": "0",
                                                      "format": fmt})
    return emb


def test_reason1_embeddings_one_file_per_prompt_and_refusals(tmp_path):
    root = copy_grid(tmp_path)
    videos = data.list_videos(root)
    with pytest.raises(FileNotFoundError, match="--encoder reason1"):
        data.GridClips(root, 93, *SIZE, text_len=6, text_dim=8, text_encoder="reason1")
    want = {v.prompt: write_reason1(text.reason1_path(root, v.prompt), v.prompt) for v in videos}
    assert len(os.listdir(os.path.join(root, "reason1"))) == len(want) == 2  # 3 videos, 2 unique prompts
    ds = data.GridClips(root, 93, *SIZE, text_len=6, text_dim=8, text_encoder="reason1")
    sample = ds[0]
    assert sample["text_emb"].dtype == torch.bfloat16 and sample["text_emb"].shape == (6, 8)
    assert torch.equal(sample["text_emb"][:5], want[sample["prompt"]]) and not sample["text_emb"][5].any()
    assert sample["text_mask"].tolist() == [1] * 5 + [0]
    neg, source = text.negative_embedding(root, 6, 8, text_encoder="reason1")
    assert not neg.any() and "t5.py" in source and "--encoder reason1" in source
    neg_want = write_reason1(os.path.join(root, "reason1", "negative_prompt.safetensors"), "a negative prompt")
    neg, source = text.negative_embedding(root, 6, 8, text_encoder="reason1")
    assert torch.equal(neg[:5], neg_want) and source.endswith("negative_prompt.safetensors")
    path = text.reason1_path(root, videos[0].prompt)
    for bad, match in ((dict(dtype=torch.float32), "BF16"), (dict(fmt="other"), "format"), (dict(dim=9), "shape"),
                       (dict(rows=7), "shape")):
        write_reason1(path, videos[0].prompt, **bad)
        with pytest.raises(ValueError, match=match):
            data.GridClips(root, 93, *SIZE, text_len=6, text_dim=8, text_encoder="reason1")
    write_reason1(path, "another prompt")
    with pytest.raises(ValueError, match="not this video's prompt"):
        data.GridClips(root, 93, *SIZE, text_len=6, text_dim=8, text_encoder="reason1")
    nan = write_reason1(path, videos[0].prompt).index_fill_(1, torch.tensor([2]), float("inf"))
    save_file({"crossattn_emb": nan}, path, metadata={"prompt": videos[0].prompt, "encoder": "test", "revision": "0",
                                                      "format": text.REASON1_FORMAT})
    ds = data.GridClips(root, 93, *SIZE, text_len=6, text_dim=8, text_encoder="reason1")  # values: at every read
    with pytest.raises(ValueError, match=f"{path}: the text embedding holds NaN/Inf values"):
        ds[0]
    with pytest.raises(ValueError, match="text_encoder"):
        data.GridClips(root, 93, *SIZE, text="standin", text_encoder="reason1")


def test_grid_from_views_puts_each_view_in_its_path_b_quadrant():
    views = torch.stack([torch.full((3, 4, 8, 10), v / 10) for v in (1, 2, 3)])  # wrist, ext_1, ext_2
    grid = grid_from_views(views, ("wrist", "ext_1", "ext_2"))
    assert grid.shape == (1, 3, 4, 16, 20)
    assert [grid[0, 0, 0, y, x].item() for y, x in ((0, 0), (0, 10), (8, 0), (8, 10))] == \
        pytest.approx([0.2, 0.3, 0.1, -1.0])
    with pytest.raises(ValueError, match="ext_1, ext_2, wrist"):
        grid_from_views(views[:2], ("wrist", "ext_1"))


def _make_tiny(root):
    tiny.make_tiny_dataset(root)


def test_two_tiny_defaults_started_at_once_build_the_data_once(tiny_grid, tmp_path):
    """Two first runs of the tiny default in a fresh checkout (e.g. a 2-GPU user starting two): the second waits
    for the first's data/tiny_grid (ROOT.lock), then only re-reads it."""
    import multiprocessing
    root = str(tmp_path / "data" / "tiny_grid")
    procs = [multiprocessing.get_context("fork").Process(target=_make_tiny, args=(root,)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0, 0]
    ours, session = ([{k: r[k] for k in ("stem", "sha1", "n_out")} for r in map(json.loads,
                                                                              open(f"{d}/manifest.jsonl"))]
                     for d in (root, tiny_grid))
    assert ours == session and len(ours) > 1
