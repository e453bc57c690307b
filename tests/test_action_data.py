"""Issue 45 items 1-4 and 6: actions are data. A run's fingerprint covers its actions and their statistics; sample.py
--actions checks the layout of what it reads (and takes stitch.py's own files, normalised); damaged or odd action files
are one line naming the file; action_gap_db never compares a clip's actions with themselves; a net trained from
scratch takes its action_dim from one's own robot's data, and a loaded one names the fixes that work."""
import json
import os
import shutil
import types

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import evaluate
import sample
import stitch
import train
from base import actions, lerobot
from clips import actionclips
from clips.actionclips import ActionClips, episode_chunks, other_actions, read_actions_file
from run_utils import check, in_process

SHORT = ["--sample-every", "0", "--workers", "0"]
TEXT = dict(text="standin", text_len=16, text_dim=1024)


@pytest.fixture(scope="module")
def action_copy(tiny_action_grid, tmp_path_factory):
    """A copy of the tiny-action folder the tests may edit (the session's is read only), and a 1-step run on it."""
    root = str(tmp_path_factory.mktemp("act") / "grid")
    shutil.copytree(tiny_action_grid, root)
    out = os.path.join(os.path.dirname(root), "run")
    check(in_process(train, ["--config", "tiny-action", "--data", root, "--steps", "1", "--out", out] + SHORT))
    return root, out


def stems(root):
    return sorted(os.path.basename(p)[:-4] for p in os.listdir(os.path.join(root, "actions")))


def rewrite(path, **changes):
    """The actions file at path rewritten with some arrays changed (np.savez, as stitch.py writes it); its bytes."""
    with np.load(path) as f:
        arrays = {k: f[k] for k in f.files}
    with open(path, "wb") as f:
        np.savez(f, **{**arrays, **changes})
    return open(path, "rb").read()


def test_a_resume_or_evaluate_py_on_edited_actions_or_statistics_is_refused_naming_what_changed(action_copy):
    """Item 1: the same sizes, other values (the manifest records only sizes): a resumed run and evaluate.py refuse,
    naming the actions or action_stats.json, as they do for the videos."""
    root, out = action_copy
    held = os.path.join(root, "actions", stems(root)[-1] + ".npz")  # a held-out episode (the last in name order)
    original = open(held, "rb").read()
    with np.load(held) as f:
        edited = rewrite(held, action=-f["action"])
    assert len(edited) == len(original) and edited != original
    try:
        proc = in_process(train, ["--config", "tiny-action", "--data", root, "--steps", "2", "--out", out] + SHORT)
        assert proc.returncode == 2 and "the actions of its episodes changed in" in proc.stderr, proc.stderr
        assert "\n" not in proc.stderr.strip()
        proc = in_process(evaluate, [out, "--clips", "1", "--steps", "1", "--plot", os.path.join(root, "..", "c.png")])
        assert proc.returncode == 2 and "the actions of its episodes changed in" in proc.stderr, proc.stderr
    finally:
        open(held, "wb").write(original)
    stats_path = os.path.join(root, actions.STATS_FILE)
    original = open(stats_path).read()
    stats = json.loads(original)
    stats["action"]["std"] = [2 * s for s in stats["action"]["std"]]  # another dataset's normalisation
    try:
        open(stats_path, "w").write(json.dumps(stats, indent=1))
        proc = in_process(train, ["--config", "tiny-action", "--data", root, "--steps", "2", "--out", out] + SHORT)
        assert proc.returncode == 2 and "action_stats.json changed" in proc.stderr, proc.stderr
    finally:
        open(stats_path, "w").write(original)


def test_sample_actions_take_the_chunk_layout_or_a_stitched_file_never_a_reshape(action_copy, tmp_path, capsys):
    """Item 2: a (2, 32) array is not the (8, 8) chunk in another order; stitch.py's raw actions/<stem>.npz is
    normalised with the run's statistics (the episode's own chunks, exactly); an .npy is read; without --image the
    first frame is the held-out episode's, with --actions too, and the line says so."""
    root, out = action_copy
    clips = ActionClips(root, 9, 64, 112, **TEXT)
    folder = lambda: clips.actions  # noqa: E731
    np.savez(tmp_path / "flat.npz", action=np.zeros((2, 32), np.float32))
    with pytest.raises(ValueError, match=r"needs an `action` array of \(8, 8\).*holds \(2, 32\)"):
        read_actions_file(str(tmp_path / "flat.npz"), 8, 8, folder)
    for name, wrong, cause in (("t.npz", np.zeros((8, 24), np.float32), "transposed"),
                               ("f.npz", np.zeros(192, np.float32), "flattened")):
        np.savez(tmp_path / name, action=wrong)
        with pytest.raises(ValueError, match=rf"holds \({wrong.shape[0]},.*\({cause}\?"):
            read_actions_file(str(tmp_path / name), 24, 8, folder)
    last = len(clips.videos) - 1
    stitched = os.path.join(root, "actions", clips.videos[last].stem + ".npz")
    chunk, what = read_actions_file(stitched, 24, 8, folder)
    assert "stitch.py's raw [N, 4, 2]" in what and "its first 24 of 24 transitions, normalised" in what
    assert "its first 16 of 24 transitions, 8 later ones unused" in read_actions_file(stitched, 16, 8, folder)[1]
    assert torch.equal(chunk, torch.cat(episode_chunks(clips, last, 3), dim=1))
    np.save(tmp_path / "a.npy", chunk[0, :8].numpy())
    assert torch.equal(read_actions_file(str(tmp_path / "a.npy"), 8, 8, folder)[0], chunk[:, :8])
    sample.main(["--ckpt", out, "--steps", "1", "--chunks", "3", "--actions", stitched, "--out",
                 str(tmp_path / "s.mp4")])
    said = capsys.readouterr().out
    assert f"{clips.videos[last].path}: its frame 0 (the last episode of {root}: a run's held-out one), under the " \
           f"actions of {stitched}" in said


def test_damaged_or_odd_action_files_are_one_line_naming_the_file(action_copy, tmp_path):
    """Item 3: a flipped byte (zip's CRC), an object array, an actions file shorter than its video (sample.py's
    --chunks), and (stitch.py) a LeRobot episode without its action column, each named for what it is."""
    root, out = action_copy
    good = os.path.join(root, "actions", stems(root)[0] + ".npz")
    data = bytearray(open(good, "rb").read())
    data[200] ^= 0xFF
    (tmp_path / "flip.npz").write_bytes(bytes(data))
    np.savez(tmp_path / "obj.npz", action=np.array([None] * 64, dtype=object).reshape(8, 8))
    for name, cause in (("flip.npz", "BadZipFile"), ("obj.npz", "Object arrays cannot be loaded")):
        proc = in_process(sample, ["--ckpt", out, "--steps", "1", "--actions", str(tmp_path / name), "--out",
                                   str(tmp_path / "s.mp4")])
        assert proc.returncode == 2 and str(tmp_path / name) in proc.stderr and cause in proc.stderr, proc.stderr
    clips = ActionClips(root, 9, 64, 112, **TEXT)
    original = open(good, "rb").read()
    try:  # in the training data: a counted skip (the next video), named, as a video that fails to decode
        open(good, "wb").write(bytes(data))
        item = clips[(0, 0)]
        assert item["skipped"] == 1 and clips.failed[stems(root)[0]].startswith(f"bad_action: {good}: damaged")
    finally:
        open(good, "wb").write(original)
    clips = ActionClips(root, 9, 64, 112, **TEXT)
    path = os.path.join(root, "actions", clips.videos[-1].stem + ".npz")
    original = open(path, "rb").read()
    try:
        with np.load(path) as f:
            clips.actions.problems = {}  # the size check at start-up passed: the file changed since
            rewrite(path, action=f["action"][:10])
        with pytest.raises(ValueError, match=r"the actions of .*: bad_action: .* holds action \(10, 4, 2\)"):
            episode_chunks(clips, len(clips.videos) - 1, 3)
    finally:
        open(path, "wb").write(original)
    src = lerobot.make_synthetic(str(tmp_path / "src"), lengths=(12, 10, 14), motion="actions")
    table = os.path.join(src, "data", "chunk-000", "episode_000001.parquet")
    pq.write_table(pq.read_table(table).drop_columns(["action"]), table)
    summary = stitch.stitch(src, str(tmp_path / "grid"), size="48x80", frames=5, stride=2, workers=1)
    (rec,) = [json.loads(line) for line in open(tmp_path / "grid" / "skips.jsonl")]
    assert summary["by_reason"] == {"bad_action": 1} and "has no action column" in rec["detail"], rec


def test_action_gap_never_compares_a_clip_with_its_own_actions_and_the_json_says_what_it_used(action_copy, capsys):
    """Item 4: one command held for the whole chunk reverses into itself: negated instead (the mean command: shifted
    by one sd); another clip with the same commands is passed over; evaluate.py's JSON names each clip's substitute."""
    held = torch.ones(1, 8, 8)
    (swap,), (what,) = other_actions([held], ["a"])
    assert not torch.equal(swap, held) and what == "its own negated (mirrored about the mean)"
    assert other_actions([torch.zeros(1, 8, 8)], ["a"])[1] == ["its own shifted by one sd"]
    moving = torch.arange(64.0).reshape(1, 8, 8)
    assert other_actions([held, held.clone(), moving], ["a", "b", "c"])[1] == ["c's actions", "c's actions",
                                                                                 "a's actions"]
    _, out = action_copy
    evaluate.main([out, "--clips", "1", "--steps", "1", "--plot", os.path.join(os.path.dirname(out), "c.png")])
    said = capsys.readouterr().out
    clip = json.loads(said.splitlines()[-1])["runs"][0]["clips"][0]
    assert clip["other_actions"].startswith("its own") and f"action_gap_db of {clip['stem']}: against" in said


def test_an_action_net_from_scratch_takes_the_datas_action_dim_and_a_loaded_one_names_fixes_that_work(
        action_copy, tmp_path, capsys):
    """Item 6: `--config tiny-action --data my_act` with 8-dim commands trains (its action_dim 256 said and recorded;
    sample.py and evaluate.py rebuild it); a network loaded from --init keeps its 64 and the refusal names the
    --frames / stride that give 64, or training from scratch; 7-dim commands: no stride gives 64, said."""
    src = lerobot.make_synthetic(str(tmp_path / "src"), lengths=(40,) * 5, motion="actions", action_width=8)
    mine = str(tmp_path / "my_act")
    stitch.stitch(src, mine, size="64x112", frames=9, stride=4, workers=1)
    run = str(tmp_path / "mine")
    proc = check(in_process(train, ["--config", "tiny-action", "--data", mine, "--steps", "1", "--out", run] + SHORT))
    assert "takes its action_dim from " + mine + ": 256 (its clips' 8-value commands at stride 4)" in proc.stdout
    assert json.load(open(os.path.join(run, "config.json")))["action_dim"] == 256
    check(in_process(sample, ["--ckpt", run, "--steps", "1", "--out", str(tmp_path / "s.mp4")]))
    check(in_process(evaluate, [run, "--clips", "1", "--steps", "1", "--plot", str(tmp_path / "c.png")]))
    released = os.path.join(action_copy[1], "step_00000001")  # a tiny-action net of 64
    proc = in_process(train, ["--config", "tiny-action", "--data", mine, "--init", released, "--steps", "1", "--out",
                              str(tmp_path / "refused")] + SHORT)
    assert proc.returncode == 2 and "takes action_dim=64" in proc.stderr and "--frames 9 on a folder stitched at " \
        "--stride 1" in proc.stderr and "from scratch (--init random)" in proc.stderr, proc.stderr
    bridge = types.SimpleNamespace(frames=9, stride=4, action_width=7, root="R", action_dim=224)
    bridge.width = lambda per_frame=False: 224
    with pytest.raises(ValueError, match="no clip of 7-value commands gives 64"):
        actions.FolderActions.check_action_dim(bridge, 64, "tiny-action")
    assert actionclips.network_action_dim("tiny", "random", 0, None) == 0
