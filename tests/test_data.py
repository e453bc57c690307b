"""data.py: clips from stitched grids (the v3.0 tiny dataset has videos of 94, 93 and 103 frames), embeddings,
skipping of broken videos, and the deterministic resumable sampler."""
import os
import pickle
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch.utils.data import DataLoader

import data
import t5
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
    small = data.GridClips(out, frames=93, height=16, width=16, text="standin", text_len=4, text_dim=2)
    assert {small[(0, seed)]["start"] for seed in range(12)} == {0, 1}  # a 94-frame video: both windows occur


def test_random_window_is_contiguous_resized_and_reproducible():
    out, _ = stitched(V30)
    ds = data.GridClips(out, frames=9, height=SIZE[0] // 2 * 2, width=SIZE[1], text="standin", text_len=16, text_dim=8)
    starts = set()
    for seed in range(6):
        sample = ds[(2, seed)]
        starts.add(sample["start"])
        assert 0 <= sample["start"] <= 103 - 9
        assert clip_frames(sample) == [[4 * (sample["start"] + j)] * 3 for j in range(9)]
        assert torch.equal(sample["video"], ds[(2, seed)]["video"])  # same seed, same clip
    assert len(starts) > 1
    small = data.GridClips(out, frames=5, height=48, width=80, text="standin", text_len=16, text_dim=8)[0]
    assert small["video"].shape == (3, 5, 48, 80)
    cropped = data.GridClips(out, frames=5, height=64, width=64, fit="crop", text="standin", text_len=4, text_dim=2)
    assert cropped[0]["video"].shape == (3, 5, 64, 64)


def test_too_short_videos_are_skipped_and_counted_at_construction():
    out, _ = stitched(V30)
    ds = data.GridClips(out, frames=100, height=48, width=80, text="standin", text_len=4, text_dim=2)
    assert [v.stem for v in ds.videos] == [STEMS[2]]
    assert {s: r.split(":")[0] for s, r in ds.skipped.items()} == {STEMS[0]: "too_short", STEMS[1]: "too_short"}
    with pytest.raises(ValueError, match="no usable video"):
        data.GridClips(out, frames=200, height=48, width=80, text="standin")


def test_truncated_and_lying_videos_are_skipped_and_workers_survive(tmp_path, capsys):
    root = copy_grid(tmp_path)
    first = os.path.join(root, "videos", STEMS[0] + ".mp4")
    with open(first, "rb") as f:
        head = f.read()[: os.path.getsize(first) // 2]
    with open(first, "wb") as f:
        f.write(head)  # truncated mid-file, as a killed copy leaves it
    shutil.copy(os.path.join(root, "videos", STEMS[1] + ".mp4"), os.path.join(root, "videos", STEMS[2] + ".mp4"))
    ds = data.GridClips(root, frames=95, height=48, width=80, text="standin", text_len=4, text_dim=2)
    assert [v.stem for v in ds.videos] == [STEMS[2]]  # the manifest says 103 frames; the file now has 93
    with pytest.raises(RuntimeError, match="every video failed"):
        ds[0]
    ds = data.GridClips(root, frames=9, height=48, width=80, text="standin", text_len=4, text_dim=2)
    sample = ds[(0, 0)]
    assert sample["stem"] == STEMS[1] and sample["skipped"] == 1 and STEMS[0] in ds.failed
    assert "skipping" in capsys.readouterr().err
    sampler = data.ClipSampler(len(ds), seed=3)
    loader = DataLoader(ds, batch_size=2, sampler=sampler, num_workers=2)
    batches = [b for _, b in zip(range(3), loader)]
    assert all(b["video"].shape == (2, 3, 9, 48, 80) for b in batches)
    assert STEMS[0] not in {s for b in batches for s in b["stem"]}
    assert sum(int(b["skipped"].sum()) for b in batches) >= 1  # workers reported what they passed over


def test_text_embeddings_upstream_pickle_and_safetensors(tmp_path):
    root = copy_grid(tmp_path)
    with pytest.raises(FileNotFoundError, match="t5.py"):  # a real config without embeddings fails clearly
        data.GridClips(root, frames=9, height=48, width=80)
    calls = []

    def fake_t5(prompts):  # (tokens, 1024), one row per word; deterministic per prompt
        calls.extend(prompts)
        return [np.full((len(p.split()), 1024), len(p) / 1000, np.float32) for p in prompts]

    counts = t5.write_embeddings(root, fake_t5, batch=1)
    assert counts == {"videos": 3, "unique_prompts": 2, "files": 3} and len(calls) == 2  # once per unique prompt
    assert t5.write_embeddings(root, fake_t5)["files"] == 0  # a rerun only fills gaps
    with open(os.path.join(root, "t5_xxl", STEMS[1] + ".pickle"), "rb") as f:
        (arr,) = pickle.load(f)
    assert arr.dtype == np.float16 and arr.shape[1] == 1024
    os.remove(os.path.join(root, "t5_xxl", STEMS[2] + ".pickle"))
    save_file({"text_emb": torch.ones(7, 1024, dtype=torch.float16)}, os.path.join(root, "t5_xxl", STEMS[2] +
                                                                                    ".safetensors"))
    ds = data.GridClips(root, frames=9, height=48, width=80)
    one = ds[1]
    assert one["text_emb"].shape == (512, 1024) and one["text_emb"].dtype == torch.float32
    assert int(one["text_mask"].sum()) == len(arr) and torch.equal(one["text_emb"][:len(arr)],
                                                                   torch.from_numpy(arr.astype(np.float32)))
    assert one["text_emb"][len(arr):].abs().sum() == 0
    assert int(ds[2]["text_mask"].sum()) == 7 and ds[2]["text_emb"][:7].eq(1).all()
    with pytest.raises(ValueError, match="expected"):
        data.GridClips(root, frames=9, height=48, width=80, text_dim=16)[1]


def test_embedding_pickle_cannot_run_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    path = tmp_path / "x.pickle"
    path.write_bytes(pickle.dumps([Evil()]))
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        data.load_text_embedding(str(path), 512, 1024)


def test_standin_embedding_is_deterministic_per_prompt():
    a, mask = data.standin_text_embedding("put the cup down", 16, 8)
    assert a.shape == (16, 8) and mask.tolist() == [1] * 4 + [0] * 12 and a[4:].abs().sum() == 0
    assert torch.equal(a, data.standin_text_embedding("put the cup down", 16, 8)[0])
    assert not torch.equal(a, data.standin_text_embedding("put the cup up", 16, 8)[0])


def test_upstream_layout_without_manifest(tmp_path):
    root = copy_grid(tmp_path)
    os.remove(os.path.join(root, "manifest.jsonl"))
    ds = data.GridClips(root, frames=93, height=48, width=80, text="standin", text_len=4, text_dim=2)
    assert [v.frames for v in ds.videos] == [None] * 3  # counted on first use instead
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
    from data import load_text_embedding
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
