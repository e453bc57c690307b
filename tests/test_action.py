"""Action conditioning (issue 36): the action-conditioned DiT against upstream's class (tests/data/action, written by
tests/check_reference_action.py), the released 2B key table, and the refusals."""
import glob
import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader

import check_reference
import ckpt
import stitch
from base import actions, lerobot, squareworld
from base.inits import config_from_upstream, get_config
from clips import tiny
from clips.actionclips import ActionClips, ViewActionClips
from condition import Condition
from model import DiT
from test_stitch import V21, V30, manifest, skips

ACTION = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "action")
BOUND = 2e-5


def test_network_matches_upstream_action_conditioned_dit():
    meta = json.load(open(os.path.join(ACTION, "action_dit.json")))
    net = check_reference.build_dit_case(meta, os.path.join(ACTION, "action_dit.weights.safetensors"))  # strict
    io = load_file(os.path.join(ACTION, "action_dit.io.safetensors"))
    seen = {}

    def keep_first(name):  # the first call's intermediates (a hook that returns a value would replace the output)
        def hook(module, args, out):
            seen.setdefault(name, out)
        return hook

    for name in ("action_embedder_B_D", "action_embedder_B_3D", "t_embedding_norm"):
        getattr(net, name).register_forward_hook(keep_first(name))
    outputs = {}
    for out_name, call in meta["calls"].items():
        cond = Condition(crossattn_emb=io[call["crossattn_emb"]], padding_mask=io[call["padding_mask"]],
                         condition_mask=io[call["condition_video_input_mask_B_C_T_H_W"]], action=io[call["action"]])
        with torch.no_grad():
            outputs[out_name] = net(io[call["x_B_C_T_H_W"]], io[call["timesteps_B_T"]], cond)
        assert (outputs[out_name] - io[out_name]).abs().max() <= BOUND, out_name
    for ours, theirs in (("action_embedder_B_D", "action_emb_B_D"), ("action_embedder_B_3D", "action_emb_B_3D"),
                         ("t_embedding_norm", "t_embedding_norm_out")):
        assert (seen[ours] - io[f"dbg.{theirs}"]).abs().max() <= BOUND, theirs
    # the action moves the output by far more than the bound, so the comparison above can fail on a wrong action path
    assert (io["out.y_B_C_T_H_W"] - io["out.y_action_2"]).abs().max() > 1000 * BOUND
    assert (outputs["out.y_B_C_T_H_W"] - outputs["out.y_action_2"]).abs().max() > 1000 * BOUND


def test_released_2b_action_key_table_loads_strictly_into_v2w_2b_action():
    # a released file: net. keys, bf16 (docs/predict2.md); every key of upstream's module tree at the released shape
    table, model, entries, report = check_reference.released_key_report(
        os.path.join(ACTION, "action_released_keys.json"), "v2w-2b-action",
        "Cosmos-Predict2-2B-Sample-Action-Conditioned key table")
    assert table["num_parameters"] == 2_024_923_136
    assert report.ok, report.details()
    assert len(report.loaded) == len(model) == 578 and not report.allowed_missing
    assert len(report.ignored) == 113 + 4  # TE _extra_state and upstream's accum_* counters, nothing else
    assert all(k.endswith("._extra_state") or k.startswith("net.accum_") for k in report.ignored)
    # without the action embedders (v2w-2b), the same table is refused and the 8 action keys are named
    with torch.device("meta"):
        plain = DiT(get_config("v2w-2b"))
    report, _ = ckpt.build_report(ckpt.model_entries(plain), entries, "table")
    assert not report.ok and sorted(report.unexpected) == sorted(k for k in entries if "action_embedder" in k)


def test_each_action_embedder_moves_the_output_and_silent_ones_leave_the_base_network():
    """tiny-action whose embedders output zeros is the tiny network bit for bit: the action only adds (to the time
    embedding and to the adaLN-LoRA input), and each of the two paths on its own changes the output."""
    torch.manual_seed(0)
    net, plain = DiT(get_config("tiny-action")).eval(), DiT(get_config("tiny")).eval()
    plain.load_state_dict({k: v for k, v in net.state_dict().items() if "action_embedder" not in k})
    x, t, text, action = torch.randn(2, 16, 3, 8, 8), torch.rand(2, 3), torch.randn(2, 4, 1024), torch.randn(2, 8, 8)
    with torch.no_grad():
        base, full = plain(x, t, Condition(crossattn_emb=text)), net(x, t, Condition(crossattn_emb=text, action=action))
        for p in net.action_embedder_B_3D.fc2.parameters():
            p.zero_()
        time_path = net(x, t, Condition(crossattn_emb=text, action=action))
        for p in net.action_embedder_B_D.fc2.parameters():
            p.zero_()
        silent = net(x, t, Condition(crossattn_emb=text, action=action))
    assert torch.equal(silent, base)
    assert (time_path - base).abs().max() > 1e-3 and (full - time_path).abs().max() > 1e-3


def test_action_after_norm_adds_the_embedding_past_the_norm_and_is_off_in_every_upstream_config():
    """DiTConfig.action_after_norm (tiny action worlds, docs/policyeval.md): a silent embedding leaves the net as it
    is; a live one is added past t_embedding_norm, so twice the embedding moves the output, where before the norm
    (upstream's place) a large embedding's size is normalised away; no upstream config or mapping turns it on."""
    from dataclasses import replace
    from base.inits import CONFIGS
    torch.manual_seed(0)
    before = DiT(get_config("tiny-action")).eval()
    after = DiT(replace(get_config("tiny-action"), action_after_norm=True)).eval()
    after.load_state_dict(before.state_dict())
    x, t, text, action = torch.randn(2, 16, 3, 8, 8), torch.rand(2, 3), torch.randn(2, 4, 1024), torch.randn(2, 8, 8)
    cond = Condition(crossattn_emb=text, action=action)
    with torch.no_grad():
        assert not torch.equal(before(x, t, cond), after(x, t, cond))
        out = {}
        for scale in (1e3, 2e3):  # an embedding far larger than the time sinusoid, then twice that
            for net in (before, after):
                net.action_embedder_B_D.fc2.weight.mul_(scale)
                out[net, scale] = net(x, t, cond)
                net.action_embedder_B_D.fc2.weight.div_(scale)
        for p in (*before.action_embedder_B_D.fc2.parameters(), *after.action_embedder_B_D.fc2.parameters()):
            p.zero_()
        assert torch.equal(before(x, t, cond), after(x, t, cond))
    assert (out[before, 1e3] - out[before, 2e3]).abs().max() < 1e-3 * (out[after, 1e3] - out[after, 2e3]).abs().max()
    assert not any(c.action_after_norm for name, c in CONFIGS.items() if not name.startswith("tiny-action"))
    assert not config_from_upstream("ActionConditionedMinimalV1LVGDiT", {"action_dim": 84}).action_after_norm
    with pytest.raises(ValueError, match="action_after_norm without action_dim"):
        DiT(replace(get_config("tiny"), action_after_norm=True))


def test_action_dim_mismatch_and_missing_action_are_refused_in_one_line():
    net = DiT(get_config("tiny-action")).eval()
    x, t, text = torch.randn(1, 16, 3, 8, 8), torch.rand(1), torch.randn(1, 4, 1024)
    with pytest.raises(ValueError) as e:
        net(x, t, Condition(crossattn_emb=text, action=torch.randn(1, 12, 7)))
    assert "\n" not in str(e.value) and "84" in str(e.value) and "action_dim is 64" in str(e.value) and "[1, 8, 8]" in str(e.value)
    with pytest.raises(ValueError, match="action_dim=64: pass Condition.action"):
        net(x, t, Condition(crossattn_emb=text))
    with pytest.raises(ValueError, match="action_dim=0"):
        DiT(get_config("tiny"))(x, t, Condition(crossattn_emb=text, action=torch.randn(1, 8, 8)))
    with pytest.raises(ValueError, match="action_dim is missing"):
        config_from_upstream("ActionConditionedMinimalV1LVGDiT", {"model_channels": 64})
    with pytest.raises(ValueError, match="not a kwarg"):
        config_from_upstream("MinimalV1LVGDiT", {"action_dim": 84})


# -----------------------------------------------------------------------------
# stitch.py writes the actions beside the videos; ActionClips returns each clip's chunk (base/actions.py, clips/actionclips.py)


def frame_table(src: str, episode: int) -> dict:
    """action, observation.state [rows, dims] of one episode, read straight from the dataset's parquet files."""
    files = sorted(glob.glob(os.path.join(src, "data", "chunk-000", "*.parquet")))
    table = pa.concat_tables([pq.read_table(f) for f in files]).to_pydict()
    rows = [i for i, e in enumerate(table["episode_index"]) if e == episode]
    assert [table["frame_index"][i] for i in rows] == list(range(len(rows)))
    return {k: np.array([table[k][i] for i in rows], np.float32) for k in ("action", "observation.state")}


def make_v20(tmp_path) -> str:
    """The v2.1 tiny dataset as LeRobot v2.0 lays it out: meta/stats.json over all frames, no episodes_stats.jsonl."""
    src = tmp_path / "lerobot_v20_tiny"
    shutil.copytree(os.path.join(V21, "meta"), src / "meta")
    for sub in ("data", "videos"):
        os.symlink(os.path.join(V21, sub), src / sub)
    (src / "meta" / "episodes_stats.jsonl").unlink()
    info = json.loads((src / "meta" / "info.json").read_text())
    (src / "meta" / "info.json").write_text(json.dumps({**info, "codebase_version": "v2.0"}))
    rows = {k: np.concatenate([frame_table(V21, e)[k] for e in range(3)]).astype(np.float64)
            for k in ("action", "observation.state")}
    (src / "meta" / "stats.json").write_text(json.dumps({k: {"mean": v.mean(0).tolist(), "std": v.std(0).tolist(),
                                                             "min": v.min(0).tolist(), "max": v.max(0).tolist(),
                                                             "count": [len(v)]} for k, v in rows.items()}))
    return str(src)


@pytest.mark.parametrize("version", ["v2.0", "v2.1", "v3.0"])
def test_stitch_writes_each_episodes_actions_aligned_to_the_kept_frames(version, tmp_path, capsys):
    src = {"v2.0": lambda: make_v20(tmp_path), "v2.1": lambda: V21, "v3.0": lambda: V30}[version]()
    out = str(tmp_path / "out")
    summary = stitch.stitch(src, out, size="48x80", frames=9, stride=4, workers=1)
    assert (summary["written"], summary["skipped"]) == (3, 0)
    assert capsys.readouterr().out.count("stitch: actions: action [8] and observation.state [8]") == 1
    for stem, rec in manifest(out).items():
        n, rows = rec["n_out"], frame_table(src, rec["episode_index"])
        with np.load(os.path.join(out, "actions", stem + ".npz")) as f:
            action, state, kept = f["action"], f["state"], f["frame_index"]
        assert rec["actions"] == {"action_dim": 8, "state_dim": 8,
                                  "bytes": os.path.getsize(os.path.join(out, "actions", stem + ".npz"))}
        assert action.shape == (n - 1, 4, 8) and state.shape == (n, 8) and np.array_equal(kept, 4 * np.arange(n))
        # transition j = the commands of source rows 4j .. 4j+3 (between kept frames j and j+1), in order
        assert np.array_equal(action, rows["action"][: 4 * (n - 1)].reshape(n - 1, 4, 8))
        assert np.array_equal(state, rows["observation.state"][kept])
    stats = json.load(open(os.path.join(out, actions.STATS_FILE)))
    if version == "v2.1":  # pooled from the per-episode statistics: those of all frames at once
        assert stats["source"] == "meta/episodes_stats.jsonl, pooled over 3 episodes"
        every = np.concatenate([frame_table(src, e)["action"] for e in range(3)]).astype(np.float64)
        np.testing.assert_allclose(stats["action"]["mean"], every.mean(0), atol=1e-6)
        np.testing.assert_allclose(stats["action"]["std"], every.std(0), atol=1e-6)
        assert stats["action"]["count"] == len(every) == 840
    else:
        meta = json.load(open(os.path.join(src, "meta", "stats.json")))
        assert stats["source"] == "meta/stats.json"
        assert all(stats[k][s] == meta[k][s] for k in ("action", "observation.state") for s in ("mean", "std"))


@pytest.fixture(scope="module")
def square_data(tmp_path_factory) -> tuple:
    """make_synthetic(motion="actions") stitched as grids at stride 4 (tiny-action's clips: 9 frames): (src, out)."""
    root = tmp_path_factory.mktemp("square")
    # episodes 0 and 1 hold still for their first 40 frames (a (0, 0) command, or one into a wall); episode 2 moves
    src = lerobot.make_synthetic(str(root / "src"), lengths=(40, 36, 44, 8), motion="actions")
    out = str(root / "grid")
    stitch.stitch(src, out, size="96x176", frames=9, stride=4, workers=1)
    return src, out


def square_corner(cell: np.ndarray) -> np.ndarray:
    """The yellow square's top-left corner (x, y) in 320x180 pixels, from its pixels in one camera cell."""
    ys, xs = np.nonzero((cell[..., 0] > 180) & (cell[..., 1] > 180) & (cell[..., 2] < 90))
    h, w = cell.shape[:2]
    half = (lerobot.ACTION_SQUARE - 1) / 2  # from the centre of its pixels to its top-left one
    return np.array([xs.mean() * 320 / w - half, ys.mean() * 180 / h - half])


def test_action_clips_pack_the_commands_between_kept_frames_and_the_square_moves_by_them(square_data):
    src, out = square_data
    ds = ActionClips(out, frames=9, height=96, width=176, text="standin", normalize=False)
    ds.actions.check_action_dim(get_config("tiny-action").action_dim, "tiny-action")  # 8 transitions x 4 x 2
    with pytest.raises(ValueError) as e:
        ds.actions.check_action_dim(get_config("v2w-2b-action").action_dim, "v2w-2b-action")
    assert "\n" not in str(e.value) and "action_dim=84" in str(e.value) and "give 64" in str(e.value)
    moving = 0
    for index in range(len(ds)):
        sample = ds[(index, 7)]
        rows = frame_table(src, manifest(out)[sample["stem"]]["episode_index"])
        s = sample["start"]
        assert sample["action"].shape == (8, 8) and sample["state"].shape == (9, 2)
        assert np.array_equal(sample["action"].numpy(), rows["action"][4 * s: 4 * (s + 8)].reshape(8, 8))
        assert np.array_equal(sample["state"].numpy(), rows["observation.state"][4 * (s + np.arange(9))])
        # the motion between two kept frames is the sum of the commands packed for that transition
        moved = sample["state"][1:] - sample["state"][:-1]
        assert torch.equal(moved, sample["action"].view(8, 4, 2).sum(1))
        moving += bool(moved.abs().sum() > 0)
        pixels = ((sample["video"].permute(1, 2, 3, 0) + 1) * 127.5).round().numpy()  # [T, H, W, 3]
        seen = np.stack([square_corner(pixels[k, :48, :88]) for k in range(9)])  # in the top-left cell
        # where the state says, to about one cell pixel (3.6 source pixels); the square moves up to 32 a frame
        assert np.abs(seen - sample["state"].numpy()).max() < 4.0
    assert moving > 0
    raw, normed = ds[(0, 7)], ActionClips(out, frames=9, height=96, width=176, text="standin")[(0, 7)]
    stats = json.load(open(os.path.join(out, actions.STATS_FILE)))["action"]
    expect = (raw["action"].view(8, 4, 2) - torch.tensor(stats["mean"])) / torch.tensor(stats["std"])
    torch.testing.assert_close(normed["action"], expect.view(8, 8).float())
    batch = next(iter(DataLoader(ds, batch_size=2, sampler=[(0, 1), (1, 2)])))
    net = DiT(get_config("tiny-action")).eval()
    with torch.no_grad():  # the chunk is what the tiny action network takes
        y = net(torch.randn(2, 16, 3, 12, 22), torch.rand(2), Condition(crossattn_emb=batch["text_emb"],
                                                                       action=batch["action"]))
    assert y.shape == (2, 16, 3, 12, 22)


def test_views_layout_writes_the_same_actions_and_view_clips_return_them(square_data, tmp_path):
    src, grid = square_data
    out = str(tmp_path / "views")
    stitch.stitch(src, out, size="48x80", frames=9, stride=4, workers=1, layout="views")
    for stem in manifest(out):
        with np.load(os.path.join(out, "actions", stem + ".npz")) as a, \
                np.load(os.path.join(grid, "actions", stem + ".npz")) as b:
            assert all(np.array_equal(a[k], b[k]) for k in ("action", "state", "frame_index"))
    sample = ViewActionClips(out, frames=9, height=48, width=80, text="standin", normalize=False)[(0, 3)]
    assert sample["video"].shape[:3] == (3, 3, 9) and sample["action"].shape == (8, 8)


def test_a_dataset_without_action_is_said_once_and_stitched_as_before(tmp_path, capsys):
    src = lerobot.make_synthetic(str(tmp_path / "src"), lengths=(12, 10))
    with_actions = stitch.stitch(src, str(tmp_path / "with"), size="48x80", frames=5, stride=2, workers=1)
    info = json.loads(open(os.path.join(src, "meta", "info.json")).read())
    for key in ("action", "observation.state"):
        del info["features"][key]
    open(os.path.join(src, "meta", "info.json"), "w").write(json.dumps(info))
    for path in glob.glob(os.path.join(src, "data", "chunk-000", "*.parquet")):
        pq.write_table(pq.read_table(path).drop(["action", "observation.state"]), path)
    capsys.readouterr()
    without = stitch.stitch(src, str(tmp_path / "without"), size="48x80", frames=5, stride=2, workers=1)
    said = capsys.readouterr().out
    assert said.count("actions: NONE") == 1 and with_actions == without
    assert sorted(os.listdir(tmp_path / "without")) == ["RECIPE.json", "manifest.jsonl", "metadata.csv", "metas",
                                                        "skips.jsonl", "videos"]
    old = {s: {k: v for k, v in r.items() if k != "actions"} for s, r in manifest(str(tmp_path / "with")).items()}
    assert manifest(str(tmp_path / "without")) == old  # the same records, the actions entry aside
    with pytest.raises(ValueError, match="have no actions .* restitch into a new folder"):
        ActionClips(str(tmp_path / "without"), frames=5, height=48, width=80, text="standin")


def test_bad_actions_are_named_skips_statistics_fall_back_and_a_rerun_redoes_a_lost_file(tmp_path, capsys):
    src = lerobot.make_synthetic(str(tmp_path / "src"), lengths=(12, 10, 14), motion="actions")
    path = os.path.join(src, "data", "chunk-000", "episode_000001.parquet")
    table = pq.read_table(path)
    bad = np.array(table["action"].to_pylist(), np.float32)
    bad[5, 1] = np.nan
    pq.write_table(table.set_column(table.schema.get_field_index("action"), "action",
                                    pa.FixedSizeListArray.from_arrays(pa.array(bad.ravel()), 2)), path)
    os.remove(os.path.join(src, "meta", "episodes_stats.jsonl"))  # no statistics of its own: computed
    out = str(tmp_path / "out")
    summary = stitch.stitch(src, out, size="48x80", frames=5, stride=2, workers=1)
    assert summary["by_reason"] == {"bad_action": 1}
    (rec,) = skips(out).values()
    assert rec["detail"] == f"{path}: column action of episode 1 holds NaN/Inf (row 5)"
    stats = json.load(open(os.path.join(out, actions.STATS_FILE)))
    assert stats["source"] == "computed from the 2 episodes' actions/*.npz"
    every = np.concatenate([np.load(p)["action"].reshape(-1, 2) for p in sorted(glob.glob(f"{out}/actions/*.npz"))])
    assert stats["action"]["count"] == len(every) and np.allclose(stats["action"]["mean"], every.mean(0))
    lost = os.path.join(out, "actions", "src__ep000002.npz")
    before = open(lost, "rb").read()
    os.remove(lost)  # a lost file: a counted skip at start-up, as a lost video, until a rerun redoes it
    ds = ActionClips(out, frames=5, height=48, width=80, text="standin")
    assert ds.skipped == {"src__ep000002": f"missing_file: {lost}"} and len(ds) == 1
    assert stitch.stitch(src, out, size="48x80", frames=5, stride=2, workers=1)["new"] == 1
    assert open(lost, "rb").read() == before  # redone, the same bytes
    ds = ActionClips(out, frames=5, height=48, width=80, text="standin")
    np.savez(lost, action=np.zeros((3, 1, 4)), state=np.zeros((4, 2)))  # changed after start-up: a skip at first use
    index = [v.stem for v in ds.videos].index("src__ep000002")
    sample = ds[(index, 0)]
    assert sample["stem"] != "src__ep000002" and sample["skipped"] == 1
    assert ds.failed["src__ep000002"].startswith(f"bad_action: {lost} holds action (3, 1, 4)")
    (tmp_path / "bad_stats").mkdir()
    shutil.copytree(os.path.join(src, "meta"), tmp_path / "bad_stats" / "meta")
    for sub in ("data", "videos"):
        os.symlink(os.path.join(src, sub), tmp_path / "bad_stats" / sub)
    (tmp_path / "bad_stats" / "meta" / "stats.json").write_text(json.dumps({"action": {"mean": [0.0]}}))
    with pytest.raises(ValueError, match="stats.json: no usable statistics of 'action'"):
        stitch.stitch(str(tmp_path / "bad_stats"), str(tmp_path / "o2"), size="48x80", frames=5, stride=2)
    assert not os.path.exists(tmp_path / "o2")  # refused before any work


def test_a_tiny_source_from_another_generator_version_is_refused_not_reused(tmp_path, monkeypatch):
    """tiny.make_tiny_dataset never trains on a stale folder: other episode lengths, other square commands (an older
    COMMAND_HOLD or square size), or a stitched folder whose source is gone are each one line naming the folders."""
    src = lerobot.make_synthetic(str(tmp_path / "src"), lengths=(12, 10, 8), motion="actions")
    lerobot.check_synthetic(src, (12, 10, 8), "actions", stitched="grid")  # this version's: accepted
    with pytest.raises(ValueError, match=r"3 episodes, this version writes 2\): delete .*src and grid"):
        lerobot.check_synthetic(src, (12, 10), "actions", stitched="grid")
    monkeypatch.setattr(squareworld, "COMMAND_HOLD", (3, 10))  # the commands before issue 36's preset
    with pytest.raises(ValueError, match="other square commands than this version's") as e:
        lerobot.check_synthetic(src, (12, 10, 8), "actions", stitched="grid")
    assert "\n" not in str(e.value)
    root = tmp_path / "data" / "tiny_action_grid"
    root.mkdir(parents=True)
    with pytest.raises(ValueError, match="tiny_action_grid exists but .*tiny_action_lerobot, its source, does not"):
        tiny.make_tiny_dataset(str(root), actions=True)


def test_tiny_dataset_repeat_is_for_the_action_episodes_only(tmp_path):
    """make_tiny_dataset(repeat=N) (tests/family_sweep.py --data-repeat): a positive count, action episodes only;
    refused before anything is written."""
    for kwargs in (dict(repeat=2), dict(actions=True, repeat=0), dict(actions=True, orbit=True, repeat=2)):
        with pytest.raises(ValueError, match="repeat="):
            tiny.make_tiny_dataset(str(tmp_path / "grid"), **kwargs)
    assert not os.listdir(tmp_path)
