"""PushT (tasks/pushtworld.py, tasks/pusht.py): the generator writes a LeRobot v2.1 dataset that base/lerobot reads
and stitch.py stitches, whose recorded actions replay the recorded motion exactly; the judge reads the env's own
coverage from the simulator's frames; a tiny train + policyeval against gym-pusht end to end. Skipped, with the
reason, only where gym-pusht is not installed (requirements-dev.txt installs it)."""
import importlib.util
import json
import os

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("gym_pusht") is None,
                                reason="gym-pusht is not installed (pip install -r requirements-dev.txt)")

SHORT = ["--sample-every", "0", "--save-every", "100", "--workers", "0"]


@pytest.fixture(scope="module")
def pusht_data(tmp_path_factory):
    """6 episodes of the cheap families (random play: no planning), written and stitched."""
    from tasks import pushtworld
    out = str(tmp_path_factory.mktemp("pusht") / "pusht")
    grid = pushtworld.generate(out, 6, seed=7, families=("random",), progress=lambda line: None)
    return out + "_lerobot", grid


def test_the_generator_writes_a_lerobot_v21_dataset_whose_actions_replay_its_motion(pusht_data):
    import pyarrow.parquet as pq

    from base.lerobot import open_source
    from tasks import pushtworld
    raw, grid = pusht_data
    source = open_source(raw, cameras="ext_1=observation.image,ext_2=observation.image,wrist=observation.image")
    assert source.layout == "v2" and len(source.episodes) == 6 and source.cam_hw["ext_1"] == (96, 96)
    assert source.features["action"]["shape"] == [2] and source.features["observation.state"]["shape"] == [2]
    with open(os.path.join(raw, "meta", "episodes.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    assert {r["behaviour"] for r in rows} == {"random"}
    with open(os.path.join(grid, "manifest.jsonl"), encoding="utf-8") as f:
        assert len(f.read().splitlines()) == 6  # every episode stitched, with its actions
    assert len(os.listdir(os.path.join(grid, "actions"))) == 6
    table = pq.read_table(source.episodes[0].data_path).to_pydict()
    actions, states = np.array(table["action"], np.float32), np.array(table["observation.state"], np.float32)
    env = pushtworld.make_env(pixels=False)
    env.reset(seed=rows[0]["env_seed"])
    replayed = []
    for action in actions:  # the recorded actions, stepped from the recorded reset: the recorded states, exactly
        replayed.append(np.asarray(env.agent.position, np.float32))
        env.step(action.astype(np.float64))
    assert np.array_equal(np.stack(replayed), states)


@pytest.mark.parametrize("layout", ["grid", "one"])
def test_the_judge_reads_the_envs_coverage_from_the_simulators_frames(layout):
    """Over 6 tasks and two policies that move the T (no planning: seconds), the judge's max coverage is within
    0.05 of the env's own max info["coverage"] on average, and every frame's reading within 0.2: from the grid's
    three cells, and from the camera alone filling the frame (layout "one", a policy's frames)."""
    from tasks import pusht
    tasks = pusht.sample_tasks(6, 3)
    episodes, frames = [], []
    for policy in (pusht.go_to_goal, pusht.random_play):
        run = pusht.run_in_simulator(policy, tasks, layout=layout)
        truth = run["coverage"][:, ::pusht.STRIDE]
        episodes.append(np.abs(run["success"].numpy() - truth[:, 1:].max(1)))
        frames.append(np.abs(pusht.coverage(run["frames"], layout).numpy() - truth))
    assert np.concatenate(episodes).mean() <= 0.05, np.concatenate(episodes)
    assert np.concatenate(frames).max() <= 0.2


def test_the_one_layout_folder_shows_what_the_simulator_renders_for_a_policy(pusht_data):
    """The generator's `_one` folder (stitch.py --layout one) holds the camera over the whole 64x112 frame: its first
    frame is pusht.render(layout="one") of the episode's reset screen, up to the two H.264 passes; the grid folder's
    is the grid render, and the two differ."""
    import subprocess

    from base.video import ffmpeg_exe
    from tasks import pusht, pushtworld
    raw, grid = pusht_data
    with open(os.path.join(raw, "meta", "episodes.jsonl"), encoding="utf-8") as f:
        seed = json.loads(f.readline())["env_seed"]
    env = pushtworld.make_env()
    reset = pushtworld.screen(env.reset(seed=seed)[0])[None]
    for layout, folder in (("grid", grid), ("one", grid[:-len("grid")] + "one")):
        with open(os.path.join(folder, "manifest.jsonl"), encoding="utf-8") as f:
            stem = sorted(json.loads(line)["stem"] for line in f)[0]
        video = subprocess.run([ffmpeg_exe(), "-v", "error", "-i", os.path.join(folder, "videos", stem + ".mp4"),
                                "-frames:v", "1", "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
                               capture_output=True, check=True).stdout
        stored = np.frombuffer(video, np.uint8).reshape(pusht.HEIGHT, pusht.WIDTH, 3).astype(np.float32)
        drawn = (pusht.render(reset, layout)[0].permute(1, 2, 0).numpy() + 1) * 127.5
        other = (pusht.render(reset, "grid" if layout == "one" else "one")[0].permute(1, 2, 0).numpy() + 1) * 127.5
        assert np.abs(stored - drawn).mean() < 3 < np.abs(stored - other).mean(), layout


def test_a_tiny_pusht_world_model_trains_and_ranks_policies_against_gym_pusht(pusht_data, tmp_path):
    """The README's two commands, small: train.py on the stitched PushT folder (4 steps), then policyeval.py --task
    tasks.pusht with three policies of families without planning against the real env."""
    import policyeval
    import train
    from run_utils import check, in_process
    out = str(tmp_path / "run")
    check(in_process(train, ["--config", "tiny-action", "--data", pusht_data[1], "--steps", "4", "--holdout", "1",
                             "--out", out] + SHORT))
    evaluation = str(tmp_path / "eval")
    proc = check(in_process(policyeval, [out, "--task", "tasks.pusht", "--policies",
                                         "tasks.pusht:go_to_goal,tasks.pusht:stand_still,tasks.pusht:random_play",
                                         "--episodes", "2", "--chunks", "1", "--steps", "2", "--videos", "1",
                                         "--out", evaluation]))
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"spearman", "mmrv", "pearson"} <= set(summary)
    for p in summary["policies"].values():
        assert 0 <= p["success_world"] <= 1 and 0 <= p["success_sim"] <= 1
    assert "go_to_goal_ep0.mp4" in os.listdir(evaluation)
