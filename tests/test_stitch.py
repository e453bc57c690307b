"""stitch.py (and base/lerobot.py, which reads the datasets) on lerobot-written v2.1 / v3.0 datasets
(tests/data/*/README.md): every frame carries its camera id, episode and frame_index as bit blocks, which these tests
decode from the stitched grids."""
import atexit
import csv
import functools
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
import stitch_bench

import stitch
from base import lerobot
from base.camera import fitted_intrinsics

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
V21, V30 = os.path.join(DATA, "lerobot_v21_tiny"), os.path.join(DATA, "lerobot_v30_tiny")
SIZE = (176, 320)  # grid HxW, multiples of 16: cells 88x160, about half the 180x320 sources, bit blocks readable
SRC_LENGTHS = {"lerobot_v21_tiny": {0: 400, 1: 60, 2: 380}, "lerobot_v30_tiny": {0: 373, 1: 372, 2: 410}}
ROOT_TMP = tempfile.mkdtemp(prefix="test-stitch-")
atexit.register(shutil.rmtree, ROOT_TMP, True)


@functools.lru_cache(maxsize=None)
def stitched(src: str) -> tuple:
    """src stitched once per session at SIZE with the default stride 4 / frames 93: (out, summary); test_data uses it."""
    out = os.path.join(ROOT_TMP, os.path.basename(src))
    summary = stitch.stitch(src, out, size=f"{SIZE[0]}x{SIZE[1]}", workers=2 if src == V30 else 1)
    return out, summary


def decode_rgb(path: str, height: int, width: int) -> np.ndarray:
    raw = subprocess.run([stitch.ffmpeg_exe(), "-v", "error", "-i", path, "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
                         capture_output=True, check=True).stdout
    return np.frombuffer(raw, np.uint8).reshape(-1, height, width, 3)


def read_code(cell: np.ndarray) -> dict:
    """The README's frame code from one camera image (any size): mean of each block's centre > 128 is a 1 bit."""
    h, w = cell.shape[:2]
    sx, sy = w / 320, h / 180

    def bits(y_centre, n):
        rows = slice(round((y_centre - 8) * sy), round((y_centre + 8) * sy))
        return [int(cell[rows, round((32 * k + 8) * sx):round((32 * k + 24) * sx)].mean() > 128) for k in range(n)]

    number = lambda b: int("".join(map(str, b)), 2)  # noqa: E731
    top, bottom = bits(24, 10), bits(154, 10)
    return {"episode": number(top[:4]), "camera": number(top[4:6]), "sync": top[6:], "frame": number(bottom)}


def grid_codes(frame: np.ndarray) -> list:
    """Codes of the top-left, top-right and bottom-left cells of one grid frame."""
    h, w = frame.shape[0] // 2, frame.shape[1] // 2
    return [read_code(frame[r * h:(r + 1) * h, c * w:(c + 1) * w]) for r, c in ((0, 0), (0, 1), (1, 0))]


def manifest(out: str) -> dict:
    with open(os.path.join(out, "manifest.jsonl"), encoding="utf-8") as f:
        return {r["stem"]: r for r in map(json.loads, f)}


def skips(out: str) -> dict:
    with open(os.path.join(out, "skips.jsonl"), encoding="utf-8") as f:
        return {r["stem"]: r for r in map(json.loads, f)}


def check_grid_video(path: str, episode: int, stride: int, n_frames: int, size=SIZE):
    """Slot placement, alignment and stride: frame j of each slot shows its camera and frame_index j*stride."""
    frames = decode_rgb(path, *size)
    assert len(frames) == n_frames, path
    h, w = size[0] // 2, size[1] // 2
    for j, frame in enumerate(frames):
        codes = grid_codes(frame)
        assert [c["camera"] for c in codes] == [1, 2, 3], (path, j, codes)  # ext_1 | ext_2 / wrist
        assert all(c["episode"] == episode and c["sync"] == [1, 0, 1, 0] for c in codes), (path, j, codes)
        assert [c["frame"] for c in codes] == [j * stride] * 3, (path, j, codes)  # aligned, stride exact
        assert frame[h:, w:].max() < 24, (path, j)  # bottom-right stays black
    return frames


@pytest.mark.parametrize("src", [V21, V30], ids=["v2.1", "v3.0"])
def test_slots_alignment_stride_and_counts(src):
    out, summary = stitched(src)
    lengths = SRC_LENGTHS[os.path.basename(src)]
    kept = {ep: (n - 1) // 4 + 1 for ep, n in lengths.items() if (n - 1) // 4 + 1 >= 93}
    assert summary["episodes_in"] == 3 == summary["written"] + summary["skipped"]
    assert summary["written"] == len(kept)
    records = manifest(out)
    assert sorted(r["episode_index"] for r in records.values()) == sorted(kept)
    for stem, rec in records.items():
        assert rec["n_out"] == kept[rec["episode_index"]]
        assert rec["cam_frames"] == {s: rec["n_out"] for s in lerobot.SLOTS}
        assert rec["sha1"] == stitch.sha1_file(os.path.join(out, "videos", stem + ".mp4"))
        assert rec["out_fps"] == "15/4" and rec["fit"] == {s: "stretch" for s in lerobot.SLOTS}
        check_grid_video(os.path.join(out, "videos", stem + ".mp4"), rec["episode_index"], 4, rec["n_out"])
    with open(os.path.join(out, "metadata.csv"), encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["video", "prompt"] and len(rows) == 1 + len(kept)
    for video, prompt in rows[1:]:
        stem = os.path.basename(video)[:-4]
        assert prompt == records[stem]["prompt"] == open(os.path.join(out, "metas", stem + ".txt")).read()
        task = stitch.normalize_task(records[stem]["task_raw"])
        assert prompt == stitch.DROID_TEMPLATE.format(task=task) and not task.endswith(".")
    assert sorted(os.listdir(os.path.join(out, "videos"))) == sorted(s + ".mp4" for s in records)


def test_too_short_episode_skipped_with_reason():
    out, summary = stitched(V21)
    assert summary["by_reason"] == {"too_short": 1}
    (rec,) = skips(out).values()
    assert rec["episode_index"] == 1 and rec["reason"] == "too_short" and "60 source frames -> 15" in rec["detail"]


def test_93_frame_episode_is_kept_and_min_frames_94_drops_it(tmp_path):
    out, _ = stitched(V30)  # v3.0 episode 1: 372 frames -> exactly 93 at stride 4
    assert manifest(out)["lerobot_v30_tiny__ep000001"]["n_out"] == 93
    (tmp_path / "eps.txt").write_text("1\n")
    summary = stitch.stitch(V30, str(tmp_path / "out"), size="48x80", min_frames=94, episodes=str(tmp_path / "eps.txt"))
    assert summary["by_reason"] == {"too_short": 1} and summary["written"] == 0


def test_other_stride_is_exact(tmp_path):
    (tmp_path / "eps.txt").write_text("0")
    summary = stitch.stitch(V21, str(tmp_path / "out"), size=f"{SIZE[0]}x{SIZE[1]}", stride=3, frames=9,
                            episodes=str(tmp_path / "eps.txt"))
    assert summary["written"] == 1
    check_grid_video(str(tmp_path / "out" / "videos" / "lerobot_v21_tiny__ep000000.mp4"), 0, 3, (400 - 1) // 3 + 1)


def tree(out: str) -> dict:
    return {os.path.relpath(os.path.join(d, n), out): open(os.path.join(d, n), "rb").read()
            for d, _, names in os.walk(out) for n in names}


def test_kill_mid_run_then_rerun_gives_the_same_outputs(tmp_path):
    reference, _ = stitched(V21)
    out = tmp_path / "out"
    cmd = [sys.executable, stitch.__file__, V21, str(out), "--size", f"{SIZE[0]}x{SIZE[1]}", "--workers", "1"]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # kill (the whole process group, ffmpegs included, like a preempted machine) while the second video is being
    # written: one episode finished, one partial .tmp
    deadline, phase = time.time() + 60, 0
    while time.time() < deadline and proc.poll() is None:
        if phase == 0 and (out / "manifest.jsonl").exists() and (out / "manifest.jsonl").read_text().count("\n") >= 1:
            phase = 1
        if phase == 1 and any(n.endswith(".tmp") for n in os.listdir(out / "videos")):
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.002)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the stitcher finished before it could be killed mid-episode"
    assert len(manifest(str(out))) == 1
    with open(out / "manifest.jsonl", "a") as f:
        f.write('{"stem": "lerobot_v21_tiny__ep0000')  # and a torn line, as a kill during the write leaves
    summary = stitch.stitch(V21, str(out), size=f"{SIZE[0]}x{SIZE[1]}", workers=1)
    assert summary["new"] == 1 and summary["already_done"] == 1 and summary["written"] == 2
    assert tree(str(out)) == tree(reference)  # byte for byte: videos, manifest, skips, csv, metas, recipe
    again = stitch.stitch(V21, str(out), size=f"{SIZE[0]}x{SIZE[1]}", workers=1)
    assert again["new"] == 0 and again["already_done"] == 2 and tree(str(out)) == tree(reference)


def test_rerun_with_another_recipe_is_refused():
    out, _ = stitched(V21)
    with pytest.raises(ValueError, match="another recipe"):
        stitch.stitch(V21, out, size=f"{SIZE[0]}x{SIZE[1]}", stride=3)


def test_another_recipe_names_only_the_settings_that_differ(tmp_path):
    """A rerun into OUT with other settings: what differs, old -> new, in one short line (not both ~1,500-character
    recipes); the refusal comes before any work."""
    first = stitch.make_config({"size": "64x112", "frames": 9})
    stitch.prepare_out(str(tmp_path), first, *stitch.recipe_of(first)[:2])
    other = stitch.make_config({"size": "48x80", "frames": 9, "stride": 3})
    with pytest.raises(ValueError) as e:
        stitch.prepare_out(str(tmp_path), other, *stitch.recipe_of(other)[:2])
    assert str(e.value) == (f"{tmp_path} was built with another recipe ({tmp_path}/RECIPE.json -> this run: size "
                            "[64, 112] -> [48, 80], stride 4 -> 3); rerun with the folder's settings to resume it, or "
                            "stitch into a new OUT")


def test_a_damaged_parquet_is_a_named_skip_and_the_other_episodes_are_stitched(tmp_path, capsys):
    """A truncated frame table: skip reason bad_parquet naming the file and pyarrow's reason (no traceback), in
    skips.jsonl, on stderr and in the last line; the pool's other episodes are written. The first episode's file, read
    at start-up, is a one-line error naming it."""
    src = lerobot.make_synthetic(str(tmp_path / "syn"), lengths=(12, 12, 12))
    path = os.path.join(src, "data", "chunk-000", "episode_000001.parquet")
    os.truncate(path, 500)
    out = str(tmp_path / "out")
    assert stitch.main([src, out, "--size", "48x80", "--frames", "3", "--workers", "2"]) == 1  # 1 of 3 > 10%
    (rec,) = skips(out).values()
    expected = (f"{path}: damaged or unreadable parquet file (pyarrow: Parquet magic bytes not found in footer. Either "
                "the file is corrupted or this is not a parquet file.); re-download or re-export it, then rerun")
    assert (rec["reason"], rec["detail"]) == ("bad_parquet", expected)
    assert sorted(manifest(out)) == ["syn__ep000000", "syn__ep000002"]
    err = capsys.readouterr().err
    assert f"stitch: syn__ep000001: bad_parquet: {expected}" in err and "Traceback" not in err
    assert f"0.1; bad_parquet: 1); the first: syn__ep000001: bad_parquet: {expected}; the reasons are in {out}/" in err
    shutil.copy(os.path.join(src, "data", "chunk-000", "episode_000000.parquet"), path)  # re-exported: a rerun
    assert stitch.main([src, out, "--size", "48x80", "--frames", "3", "--workers", "1"]) == 0  # retries it
    os.truncate(path.replace("000001", "000000"), 500)
    with pytest.raises(ValueError, match="^" + re.escape(path.replace("000001", "000000")) + ": damaged or unreadable"):
        lerobot.open_source(src)


def test_the_raw_lerobot_hint_names_the_size_and_layout_the_run_needs():
    """--data pointing at a raw LeRobot folder: the stitch.py command in the refusal writes the run's clip size (the
    next run would refuse 93x432x768 videos for a 9x64x112 config) and layout."""
    grid = lerobot.unstitched(V21, "--data", 9, 64, 112, views=False)
    assert grid == (f"--data {V21} is a LeRobot dataset (meta/info.json), not a stitched folder: run stitch.py first, "
                    f"`python stitch.py {V21} {V21}_grid --size 64x112 --frames 9`, then pass --data {V21}_grid")
    assert f"`python stitch.py {V21} {V21}_views --layout views --size 64x112 --frames 9`" in \
        lerobot.unstitched(V21, "--data", 9, 64, 112, views=True)
    assert "--size HxW --frames N` (HxW and N: your config's clip" in lerobot.unstitched(V21)  # a caller that can't
    assert lerobot.unstitched(DATA) is None


def test_synthetic_dataset_and_csv_with_commas_quotes_newlines_non_ascii(tmp_path):
    src = lerobot.make_synthetic(str(tmp_path / "syn"))
    with pytest.raises(FileExistsError):
        lerobot.make_synthetic(src)
    template = 'Clip: "{task}",\nsaid the robot; ✓'
    summary = stitch.stitch(src, str(tmp_path / "grid"), size="64x112", frames=9, stride=2, prompt=template)
    assert summary == {"episodes_in": 4, "written": 3, "skipped": 1, "by_reason": {"too_short": 1}, "new": 3,
                       "already_done": 0}
    records = manifest(str(tmp_path / "grid"))
    assert {r["task_raw"] for r in records.values()} == set(lerobot.SYNTHETIC_TASKS)  # raw tasks survive as JSON
    with open(tmp_path / "grid" / "metadata.csv", encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f))
    assert [tuple(r) for r in rows[1:]] == [(f"videos/{s}.mp4", records[s]["prompt"]) for s in sorted(records)]
    assert rows[1][1] == 'Clip: "put the marker, then the cap, in the blue cup",\nsaid the robot; ✓'
    assert rows[2][1] == 'Clip: "öffne die schublade — langsam",\nsaid the robot; ✓'
    for stem, rec in records.items():  # the synthetic frames carry the same code as the lerobot-written datasets
        check_grid_video(str(tmp_path / "grid" / "videos" / f"{stem}.mp4"), rec["episode_index"], 2, rec["n_out"],
                         size=(64, 112))


def test_metadata_csv_parses_for_csv_readers_and_the_upstream_split():
    prompts = {"a": 'with, commas and "quotes"', "b": "line\nbreak", "c": "ünïcødé, ok"}
    text = stitch.metadata_csv({s: {"prompt": p} for s, p in prompts.items()})
    rows = list(csv.reader(io.StringIO(text, newline="")))
    assert rows == [["video", "prompt"]] + [[f"videos/{s}.mp4", prompts[s]] for s in sorted(prompts)]
    # upstream get_t5_embeddings_from_groot_dataset: readlines()[1:], split(",", 1), strip one pair of quotes
    line = stitch.metadata_csv({"c": {"prompt": prompts["c"]}}).splitlines()[1]
    video, prompt = line.split(",", 1)
    assert os.path.basename(video) == "c.mp4" and prompt.strip('"') == prompts["c"]


def copy_meta(src: str, dst) -> str:
    shutil.copytree(src, dst)
    return str(dst)


def test_missing_camera_fails_loudly(tmp_path):
    src = copy_meta(V21, tmp_path / "src")
    info_path = os.path.join(src, "meta", "info.json")
    info = json.load(open(info_path))
    del info["features"]["observation.images.wrist_left"]
    json.dump(info, open(info_path, "w"))
    with pytest.raises(ValueError, match="no camera for grid slot wrist"):
        stitch.stitch(src, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="not a video feature"):
        lerobot.open_source(src, cameras="ext_1=observation.images.exterior_1_left,"
                                         "ext_2=observation.images.exterior_2_left,wrist=observation.state")


def test_missing_video_file_and_short_camera_are_skipped_with_reasons(tmp_path):
    src = copy_meta(V21, tmp_path / "src")
    videos = os.path.join(src, "videos", "chunk-000")
    os.remove(os.path.join(videos, "observation.images.exterior_2_left", "episode_000002.mp4"))
    # episode 0's wrist camera swapped for episode 2's: 380 frames where the parquet says 400
    shutil.copy(os.path.join(videos, "observation.images.wrist_left", "episode_000002.mp4"),
                os.path.join(videos, "observation.images.wrist_left", "episode_000000.mp4"))
    out = str(tmp_path / "out")
    summary = stitch.stitch(src, out, size="48x80")
    assert summary["written"] == 0 and summary["by_reason"] == {"cam_len_mismatch": 1, "missing_file": 1,
                                                                 "too_short": 1}
    reasons = {r["episode_index"]: r for r in skips(out).values()}
    assert "wrist_left gave 95 frames" in reasons[0]["detail"]
    assert "exterior_2_left" in reasons[2]["detail"] and not os.listdir(os.path.join(out, "videos"))


def test_dropped_source_frame_is_caught_by_the_timestamps(tmp_path):
    src = copy_meta(V21, tmp_path / "src")
    wrist = os.path.join(src, "videos", "chunk-000", "observation.images.wrist_left", "episode_000000.mp4")
    # the wrist camera loses frame 50 but keeps every other timestamp: later frames would pair with the wrong time
    subprocess.run([stitch.ffmpeg_exe(), "-v", "error", "-i", wrist, "-vf", "select='not(eq(n,50))'", "-fps_mode",
                    "passthrough", "-c:v", "libx264", "-preset", "ultrafast", "-crf", "18", "-y", wrist + ".mp4"], check=True)
    os.replace(wrist + ".mp4", wrist)
    (tmp_path / "eps.txt").write_text("0")
    out = str(tmp_path / "out")
    summary = stitch.stitch(src, out, size="48x80", episodes=str(tmp_path / "eps.txt"))
    assert summary["by_reason"] == {"misaligned": 1}
    (rec,) = skips(out).values()
    assert "wrist_left: kept frame 13 is the source frame at 3.533" in rec["detail"]  # frame 53, not 52


def test_layout_detection_and_subsets(tmp_path):
    v2, v3 = lerobot.open_source(V21), lerobot.open_source(V30)
    assert (v2.layout, v3.layout) == ("v2", "v3") and v2.fps == v3.fps == 15
    assert v3.task_table == {0: "Place the red block in the bowl.", 1: "Close the laptop lid"}
    assert [round(v3.episodes[e].segments["wrist"][1] * 15) for e in range(3)] == [0, 373, 745]
    cfg = stitch.make_config({"per_task": 1})
    assert [e.index for e in lerobot.select_episodes(v2, cfg)] == [0, 1]
    (tmp_path / "eps.txt").write_text("2, 0\n")
    cfg = stitch.make_config({"episodes": str(tmp_path / "eps.txt")})
    assert [e.index for e in lerobot.select_episodes(v2, cfg)] == [0, 2]
    (tmp_path / "bad.txt").write_text("0 7")
    with pytest.raises(ValueError, match=r"episodes \[7\] are not in"):
        lerobot.select_episodes(v2, stitch.make_config({"episodes": str(tmp_path / "bad.txt")}))
    with pytest.raises(ValueError, match="unknown stitch option"):
        stitch.make_config({"strid": 2})
    for size in ("430x768", "180x320", "432x760"):
        with pytest.raises(ValueError, match="multiples of 16"):
            stitch.make_config({"size": size})
    with pytest.raises(ValueError, match="must contain"):
        stitch.make_config({"prompt": "no field"})
    with pytest.raises(SystemExit):
        stitch.main([V21, str(tmp_path / "o"), "--no-such-flag", "1"])


def test_bench_runs_from_the_command_line(tmp_path, capsys):
    src = lerobot.make_synthetic(str(tmp_path / "syn"), lengths=(20,))
    assert stitch_bench.main([src, "--size", "48x80", "--frames", "5", "--stride", "2"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["episodes_written"] == 1 and result["ratio_wall"] > 0 and result["ratio_cpu"] > 0


def run_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, stitch.__file__, *map(str, args)], capture_output=True, text=True)


def test_user_errors_are_one_line_before_any_work(tmp_path):
    out = tmp_path / "out"
    for args, message in (([V21, out, "--size", "180x320"], "--size 180x320: expected HxW, both multiples of 16"),
                          ([V21, out, "--fit", "zoom"], "--fit zoom"),
                          ([V21], "give SRC OUT"),
                          (["--synthetic", out, "--stride", "2"], "give SRC OUT"),
                          ([tmp_path / "nothing", out], "is not a LeRobot v2/v3 dataset")):
        proc = run_cli(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("stitch.py: error: ") and message in proc.stderr
        assert not out.exists()
    help_text = " ".join(run_cli("--help").stdout.split())  # argparse wraps lines
    assert "--max-skip-fraction" in help_text and "(default: 0.1)" in help_text and "--no-retry-skips" in help_text


def test_documented_command_lines_work_and_progress_shows_without_a_terminal(tmp_path, capsys):
    syn = tmp_path / "syn"
    assert stitch.main(["--synthetic", str(syn)]) == 0 and (syn / "meta" / "info.json").exists()
    out = tmp_path / "out"
    # per task: episodes 0 and 1 (2 repeats 0's task); 1 is too short, so one episode is stitched
    assert stitch.main([V21, str(out), "--per-task", "1", "--size", "48x80", "--workers", "1",
                        "--progress-every", "1"]) == 0
    stdout = capsys.readouterr().out  # pytest's capture is no terminal, like a SLURM log
    assert "stitch lerobot_v21_tiny: 1/1 episodes (1 written, 0 skipped)" in stdout and "ETA" in stdout
    assert sorted(manifest(str(out))) == ["lerobot_v21_tiny__ep000000"]


def test_exit_1_when_nothing_is_written_or_too_many_episodes_fail(tmp_path, capsys):
    assert stitch.main([V30, str(tmp_path / "out"), "--size", "48x80", "--min-frames", "200"]) == 1
    err = capsys.readouterr().err
    assert "holds no video: 3 episodes in, 3 skipped (too_short: 3)" in err and "skips.jsonl" in err
    ok = {"episodes_in": 20, "written": 9, "skipped": 11, "by_reason": {"too_short": 8, "no_task": 2, "misaligned": 1}}
    assert stitch.outcome_problem(ok, 0.1, "OUT") is None  # 1 of 10 long enough failed; filters don't count
    bad = dict(ok, written=8, by_reason={"too_short": 8, "no_task": 2, "misaligned": 1, "ffmpeg_error": 1})
    problem = stitch.outcome_problem(bad, 0.1, "OUT")
    assert "2 of 10 episodes long enough to keep were skipped (20% > --max-skip-fraction 0.1" in problem
    assert stitch.outcome_problem(bad, 0.2, "OUT") is None


def test_frame_table_without_a_column_is_refused_up_front_or_skipped(tmp_path):
    import pyarrow.parquet as pq
    src = copy_meta(V21, tmp_path / "src")

    def drop(episode, column):
        path = os.path.join(src, "data", "chunk-000", f"episode_{episode:06d}.parquet")
        pq.write_table(pq.read_table(path).drop_columns([column]), path)
        return path

    path = drop(2, "timestamp")  # not the first file: found when its episode runs, a skip naming it
    summary = stitch.stitch(src, str(tmp_path / "a"), size="48x80")
    assert summary["by_reason"] == {"missing_column": 1, "too_short": 1}
    assert skips(str(tmp_path / "a"))["src__ep000002"]["detail"] == \
        f"{path}: the frame table has no column timestamp"
    path = drop(0, "frame_index")  # the first file is checked before any work
    with pytest.raises(ValueError, match=f"{path}: the frame table has no column frame_index"):
        stitch.stitch(src, str(tmp_path / "b"), size="48x80")
    assert not (tmp_path / "b").exists()


def test_disk_full_is_named_in_the_skip(tmp_path, monkeypatch):
    (tmp_path / "eps.txt").write_text("0")
    real = stitch.episode_command
    # the grid mp4 goes to /dev/full, where every write fails with ENOSPC (in-process: one worker)
    monkeypatch.setattr(stitch, "episode_command", lambda *a, **k: real(*a, **k)[:-1] + ["/dev/full"])
    out = str(tmp_path / "out")
    summary = stitch.stitch(V21, out, size="48x80", workers=1, episodes=str(tmp_path / "eps.txt"))
    assert summary["by_reason"] == {"write_error": 1}
    (rec,) = skips(out).values()
    assert rec["detail"].startswith(f"ENOSPC writing {out}/videos/lerobot_v21_tiny__ep000000.mp4.tmp: ffmpeg rc ")
    assert "No space left on device" in rec["detail"]
    monkeypatch.setattr(stitch, "run_episode", lambda stem, ep: open("/dev/full", "w").write("x" * 65536))
    stitch._init_worker({"source": lerobot.open_source(V21), "out": out, "cfg": stitch.make_config({})})
    result = stitch.stitch_episode("s", lerobot.open_source(V21).episodes[0])
    assert result["skip"]["reason"] == "write_error" and result["skip"]["detail"].startswith(
        "ENOSPC (No space left on device) writing")


# ------------------------------------------------------------------------------------------- --layout views

VIEW_SIZE = (64, 112)  # the synthetic 90x160 cameras are stretched (aspect within 5%)


@functools.lru_cache(maxsize=None)
def stitched_views(cameras: bool = True) -> tuple:
    """A synthetic dataset (with camera parameters or without) stitched once per session with --layout views at
    stride 2: (src, out, summary); test_data reads it too."""
    src = os.path.join(ROOT_TMP, f"syn_cam{int(cameras)}")
    if not os.path.exists(src):
        lerobot.make_synthetic(src, lengths=(30, 40, 8), cameras=cameras)
    out = os.path.join(ROOT_TMP, f"views_cam{int(cameras)}")
    return src, out, stitch.stitch(src, out, size=f"{VIEW_SIZE[0]}x{VIEW_SIZE[1]}", frames=9, stride=2, workers=1,
                                   layout="views")


def test_views_are_separate_aligned_videos_with_their_cameras_per_output_frame():
    src, out, summary = stitched_views()
    assert (summary["written"], summary["by_reason"]) == (2, {"too_short": 1})
    records = manifest(out)
    with open(os.path.join(out, "RECIPE.json")) as f:
        assert json.load(f)["layout"] == "views"
    for stem, rec in records.items():
        assert list(rec["views"]) == list(lerobot.SLOTS) and rec["cameras"] == "real" and "sha1" not in rec
        for camera, slot in enumerate(lerobot.SLOTS, 1):
            path = os.path.join(out, "videos", f"{stem}.{slot}.mp4")
            assert rec["views"][slot]["sha1"] == stitch.sha1_file(path)
            frames = decode_rgb(path, *VIEW_SIZE)
            assert len(frames) == rec["n_out"] == (rec["src_len"] - 1) // 2 + 1
            codes = [read_code(f) for f in frames]  # the whole frame is this camera: no grid, no black quadrant
            assert all(c["camera"] == camera and c["episode"] == rec["episode_index"] for c in codes), (slot, codes)
            assert [c["frame"] for c in codes] == [2 * j for j in range(len(frames))]
        with np.load(os.path.join(out, "cameras", stem + ".npz")) as f:
            assert list(f["views"]) == list(lerobot.SLOTS)
            assert f["w2c"].shape == (3, rec["n_out"], 3, 4) and f["intrinsics"].shape == (3, rec["n_out"], 4)
            for camera in (1, 2, 3):  # output frame j carries source frame 2j's parameters, at the output size
                want = lerobot.synthetic_w2c(camera, 2 * np.arange(rec["n_out"]))
                np.testing.assert_allclose(f["w2c"][camera - 1], want, atol=1e-6)
                np.testing.assert_allclose(f["intrinsics"][camera - 1], np.tile(
                    [128 * 112 / 160, 128 * 64 / 90, 80 * 112 / 160, 45 * 64 / 90], (rec["n_out"], 1)), rtol=1e-6)
    with open(os.path.join(out, "metadata.csv"), encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f))[1:]
    assert [r[0] for r in rows] == [f"videos/{s}.{v}.mp4" for s in sorted(records) for v in lerobot.SLOTS]
    assert all("three cameras" in r[1] for r in rows)  # the views template, not the grid's
    again = stitch.stitch(src, out, size=f"{VIEW_SIZE[0]}x{VIEW_SIZE[1]}", frames=9, stride=2, workers=1,
                          layout="views")
    assert (again["new"], again["already_done"]) == (0, 2)
    os.remove(os.path.join(out, "cameras", sorted(records)[0] + ".npz"))  # a lost camera file redoes its episode
    assert stitch.stitch(src, out, size=f"{VIEW_SIZE[0]}x{VIEW_SIZE[1]}", frames=9, stride=2, workers=1,
                         layout="views")["new"] == 1
    with pytest.raises(ValueError, match="another recipe"):  # a grid into a views folder
        stitch.stitch(src, out, size=f"{VIEW_SIZE[0]}x{VIEW_SIZE[1]}", frames=9, stride=2, workers=1)


def test_views_without_camera_parameters_say_so_and_grid_recipes_are_unchanged(capsys, tmp_path):
    src, out, summary = stitched_views(cameras=False)
    assert summary["written"] == 2 and not os.listdir(os.path.join(out, "cameras"))
    assert {r["cameras"] for r in manifest(out).values()} == {"absent"}
    grid = stitch.stitch(src, str(tmp_path / "grid"), size="64x112", frames=9, stride=2, workers=1)
    assert grid["written"] == 2
    with open(tmp_path / "grid" / "RECIPE.json") as f:
        assert "layout" not in json.load(f)  # so folders stitched before --layout existed keep their recipe hash
    capsys.readouterr()  # the cached folder may have been stitched (and said so) inside another test: stitch anew
    stitch.stitch(src, str(tmp_path / "views"), size=f"{VIEW_SIZE[0]}x{VIEW_SIZE[1]}", frames=9, stride=2, workers=1,
                  layout="views")
    assert "camera parameters: NONE" in capsys.readouterr().out
    with pytest.raises(ValueError, match="--layout views only"):
        stitch.make_config({"camera_params": "none"})
    for bad in ("1,2,3@4x5", "0,1,2,3@10x10", "a,b,c,d@1x1", "1,1,1,1@0x3"):
        with pytest.raises(ValueError, match="--camera-params"):
            stitch.make_config({"layout": "views", "camera_params": bad})
    assert stitch.parse_camera_params("531,531.5,640,360@720x1280") == ((531, 531.5, 640, 360), (720, 1280))


def droid_port(tmp_path, n: int = 12, shape: int = 6, cameras=("exterior_1_left", "exterior_2_left", "wrist_left"),
               columns=None):
    """A tiny frame table with lerobot's DROID-port camera columns (random poses, or `columns`):
    (Source, Episode, poses {camera: [n,6]})."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    rng = np.random.default_rng(0)
    poses = {c: np.concatenate([rng.normal(size=(n, 3)), rng.uniform(-3, 3, size=(n, 3))], 1) for c in cameras}
    path = str(tmp_path / "episode_000000.parquet")
    columns = columns or {f"camera_extrinsics.{c}": p for c, p in poses.items()}
    pq.write_table(pa.table({"frame_index": np.arange(n), **{k: pa.array(v.astype(np.float32).tolist())
                                                             for k, v in columns.items()}}), path)
    features = {f"camera_extrinsics.{c}": {"dtype": "float32", "shape": [shape]} for c in cameras}
    names = ("exterior_1_left", "exterior_2_left", "wrist_left")
    cams = {s: f"observation.images.{c}" for s, c in zip(lerobot.SLOTS, names)}
    source = lerobot.Source(root=str(tmp_path), name="t", layout="v2", fps=15, cams=cams,
                            cam_hw={s: (180, 320) for s in cams}, task_table={}, episodes=[],
                            cam_params=lerobot.camera_columns(features, cams, "info.json"))
    return source, lerobot.Episode(index=0, length=n, tasks=[], data_path=path, segments={}), poses


def test_droid_port_extrinsics_are_read_inverted_and_rescaled(tmp_path):
    source, ep, poses = droid_port(tmp_path)
    assert source.cam_params["wrist"] == ("droid", "camera_extrinsics.wrist_left", None)
    frames = np.array([0, 4, 8])
    with pytest.raises(ValueError, match="no intrinsics"):
        lerobot.read_cameras(ep, source, frames, None)
    found = lerobot.read_cameras(ep, source, frames, ((530.0, 520.0, 640.0, 360.0), (720, 1280)))
    for slot, name in zip(lerobot.SLOTS, ("exterior_1_left", "exterior_2_left", "wrist_left")):
        w2c, k = found[slot]
        for j, f in enumerate(frames):
            pose = poses[name][f].astype(np.float32).astype(np.float64)
            roll, pitch, yaw = pose[3:]  # scipy's "xyz": extrinsic x, then y, then z
            rx = np.array([[1, 0, 0], [0, np.cos(roll), -np.sin(roll)], [0, np.sin(roll), np.cos(roll)]])
            ry = np.array([[np.cos(pitch), 0, np.sin(pitch)], [0, 1, 0], [-np.sin(pitch), 0, np.cos(pitch)]])
            rz = np.array([[np.cos(yaw), -np.sin(yaw), 0], [np.sin(yaw), np.cos(yaw), 0], [0, 0, 1]])
            cam_to_base = np.eye(4)
            cam_to_base[:3, :3], cam_to_base[:3, 3] = rz @ ry @ rx, pose[:3]
            np.testing.assert_allclose(np.vstack([w2c[j], [0, 0, 0, 1]]), np.linalg.inv(cam_to_base), atol=1e-9)
        np.testing.assert_allclose(k, np.tile([530 / 4, 520 / 4, 160, 90], (3, 1)))  # 1280x720 -> 320x180
    # into a 64x64 view: the 320x180 frame is padded (aspect 1.78 vs 1): scaled to 64x36 and centred at y = 14
    np.testing.assert_allclose(fitted_intrinsics(np.array([132.5, 130.0, 160.0, 90.0]), (180, 320), (64, 64),
                                                        "pad"), [26.5, 26.0, 32.0, 32.0])


def test_malformed_or_partial_camera_parameters_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"shape \[7\], expected \[6\]"):
        droid_port(tmp_path, shape=7)
    with pytest.raises(ValueError, match="not for"):
        droid_port(tmp_path, cameras=("exterior_1_left", "wrist_left"))
    source, ep, poses = droid_port(tmp_path)
    with pytest.raises(ValueError, match="no intrinsics"):
        lerobot.camera_summary(source, "auto")
    assert "REAL" in lerobot.camera_summary(source, ((1.0, 1.0, 1.0, 1.0), (2, 2)))
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pq.read_table(ep.data_path)
    bad = np.array(table["camera_extrinsics.wrist_left"].to_pylist())
    bad[3, 0] = np.nan
    pq.write_table(table.set_column(table.schema.get_field_index("camera_extrinsics.wrist_left"),
                                    "camera_extrinsics.wrist_left", pa.array(bad.tolist())), ep.data_path)
    with pytest.raises(ValueError, match="non-finite"):
        lerobot.read_cameras(ep, source, np.arange(4), ((1.0, 1.0, 1.0, 1.0), (2, 2)))
    features = {"sensors.wrist_left.extrinsic_cv": {"shape": [3, 4]}}
    with pytest.raises(ValueError, match="needs both"):
        lerobot.camera_columns(features, {"wrist": "observation.images.wrist_left"}, "info.json")


def test_droid_port_wrist_camera_moves_with_the_gripper(tmp_path):
    """The port repeats the wrist camera's frame-0 pose in every row; with the gripper pose per frame the camera is
    moved along: T_base_cam(t) = T_base_ee(t) T_ee_cam, DROID's own formula while recording."""
    n, rng = 9, np.random.default_rng(1)
    ee = np.concatenate([rng.normal(size=(n, 3)), rng.uniform(-3, 3, size=(n, 3))], 1).astype(np.float32)
    as_matrix = lambda p: lerobot.pose_matrix(p.astype(np.float64))  # noqa: E731 (tested above against Rz Ry Rx)
    offset = as_matrix(np.array([[0.05, -0.02, 0.1, 0.3, -0.2, 1.4]]))[0]  # camera in the gripper's frame
    wrist0 = as_matrix(ee[:1])[0] @ offset
    euler = np.array([np.arctan2(wrist0[2, 1], wrist0[2, 2]), -np.arcsin(wrist0[2, 0]),
                      np.arctan2(wrist0[1, 0], wrist0[0, 0])])
    fixed = np.tile(np.concatenate([wrist0[:3, 3], euler]), (n, 1))
    columns = {"camera_extrinsics.exterior_1_left": fixed, "camera_extrinsics.exterior_2_left": fixed,
               "camera_extrinsics.wrist_left": fixed, lerobot.EE_POSE_COLUMN: ee}
    source, ep, _ = droid_port(tmp_path, n=n, columns=columns)
    found = lerobot.read_cameras(ep, source, np.arange(0, n, 2), ((1.0, 1.0, 1.0, 1.0), (2, 2)))
    for j, f in enumerate(range(0, n, 2)):
        want = np.linalg.inv(as_matrix(ee[f:f + 1])[0] @ offset)
        np.testing.assert_allclose(found["wrist"][0][j], want[:3], atol=2e-5)  # float32 storage
        np.testing.assert_allclose(found["ext_1"][0][j], np.linalg.inv(wrist0)[:3], atol=2e-5)  # fixed cameras stay


def test_views_of_a_lerobot_written_v30_dataset_are_aligned(tmp_path, capsys):
    """v3.0: every camera's episodes share one AV1 file; each view is cut by timestamp as the grid is."""
    (tmp_path / "eps.txt").write_text("2")  # the last episode: its segments start 49.67 s into the shared files
    out = str(tmp_path / "views")
    summary = stitch.stitch(V30, out, size="96x160", workers=1, layout="views", episodes=str(tmp_path / "eps.txt"))
    assert summary["written"] == 1 and "camera parameters: NONE" in capsys.readouterr().out
    for stem, rec in manifest(out).items():
        assert rec["cameras"] == "absent" and rec["n_out"] == (rec["src_len"] - 1) // 4 + 1
        for camera, slot in enumerate(lerobot.SLOTS, 1):
            frames = decode_rgb(os.path.join(out, "videos", f"{stem}.{slot}.mp4"), 96, 160)
            codes = [read_code(f) for f in frames]
            assert len(frames) == rec["n_out"] and {c["camera"] for c in codes} == {camera}
            assert [c["frame"] for c in codes] == [4 * j for j in range(rec["n_out"])], (stem, slot)
            assert {c["episode"] for c in codes} == {rec["episode_index"]}
