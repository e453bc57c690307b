"""tasks/square.py: the tiny-action world's simulator against the stitched data, the judge's locator, and the graded
reference policies (32 tasks, 3 chunks) in the simulator."""
import json
import os
import shutil
import subprocess

import numpy as np
import pytest
import torch

import stitch
from base import lerobot, squareworld
from base.cli import recipe
from base.inits import get_config
from base.video import ffmpeg_exe, read_clip
from tasks import square

TINY = recipe("tiny")  # the tiny preset's clips (recipes/tiny.py)

TOLERANCE = 0.25  # per-pixel |sim - stitched| in [-1, 1] units: twice the H.264 passes' measured worst, 0.125 (16/255)


@pytest.fixture(scope="module")
def action_grid(tmp_path_factory) -> tuple:
    """train.make_tiny_dataset(actions=True)'s data with few episodes: (LeRobot folder, stitched folder). Episodes 2
    and 4 move, each into a border (clipped steps); 0, 1 and 3 are too short and skipped."""
    root = tmp_path_factory.mktemp("square")
    raw = stitch.make_synthetic(str(root / "raw"), lengths=(8, 8, 44, 8, 40), cameras=True, motion="actions")
    out = str(root / "grid")
    stitch.stitch(raw, out, stride=square.STRIDE, frames=TINY["frames"], workers=1,
                  size=f"{TINY['height']}x{TINY['width']}")
    return raw, out


def stitched(out: str) -> list:
    """[(stem, frames [1, 3, n, H, W] in [-1, 1] as data.py gives them, state [n, 2], action [n-1, stride, 2])]."""
    videos = []
    with open(os.path.join(out, "manifest.jsonl"), encoding="utf-8") as f:
        for rec in map(json.loads, f):
            clip = read_clip(os.path.join(out, "videos", rec["stem"] + ".mp4"), 0, rec["n_out"], square.HEIGHT,
                             square.WIDTH)
            with np.load(os.path.join(out, "actions", rec["stem"] + ".npz")) as a:
                videos.append((rec["stem"], torch.from_numpy(clip).permute(3, 0, 1, 2)[None].float() / 127.5 - 1,
                               a["state"], a["action"]))
    return videos


def test_the_simulator_is_the_tiny_action_worlds_settings():
    assert (square.FRAMES, square.HEIGHT, square.WIDTH) == (TINY["frames"], TINY["height"],
                                                            TINY["width"])
    assert square.STEPS * 2 == get_config("tiny-action").action_dim == 64


def test_the_simulator_reproduces_the_stitched_frames_from_the_first_position_and_the_actions(action_grid):
    """The H.264 passes (make_synthetic's crf 18, stitch's crf 15) leave mean |error| 0.0013 and at most 0.125; a square
    one command step (4 pixels of 320x180, 0.7 cell pixel) off is >= 0.74 off at its edges in every frame it moves."""
    videos = stitched(action_grid[1])
    assert len(videos) == 2
    for stem, truth, state, action in videos:
        path = square.step(state[:1], action.reshape(1, -1, 2))  # [1, 4(n-1)+1, 2]
        assert np.array_equal(path[0, ::square.STRIDE], state)  # the simulator's motion is the data's
        error = (square.render(path[:, ::square.STRIDE]) - truth).abs()
        assert error.max() <= TOLERANCE and error.mean() < 0.003, (stem, error.max(), error.mean())
        moved = np.clip(state + (4, 0), square.LOW, square.HIGH)  # one step of (4, 0) more
        off = (square.render(moved[None]) - truth).abs().amax((0, 1, 3, 4))  # per frame
        differs = torch.from_numpy((moved != state).any(1))
        assert differs.any() and (off[differs] > TOLERANCE).all(), (stem, off)


def test_render_is_stitch_pys_own_filter_graph_bit_for_bit_without_the_codecs(action_grid, tmp_path):
    """Sources re-encoded losslessly (x264 qp 0 keeps the yuv420p planes) and stitch.episode_command writing raw
    frames: what render gives, to the bit."""
    raw = str(tmp_path / "lossless")
    shutil.copytree(action_grid[0], raw)
    source = lerobot.open_source(raw)
    cfg = stitch.make_config({"stride": square.STRIDE, "frames": square.FRAMES,
                              "size": f"{square.HEIGHT}x{square.WIDTH}"})
    fits = {s: stitch.fit_policy(cfg, source.cam_hw[s], stitch.cell_hw(cfg)) for s in lerobot.SLOTS}
    for ep in [e for e in source.episodes if e.length >= 33]:
        corners, _ = lerobot.square_commands(ep.index, ep.length)
        for camera, slot in enumerate(lerobot.SLOTS, 1):
            frames = b"".join(lerobot.code_frame(ep.index, camera, k, *square.SOURCE_HW, corners[k]).tobytes()
                              for k in range(ep.length))
            subprocess.run([ffmpeg_exe(), "-loglevel", "error", "-f", "rawvideo", "-pix_fmt", "rgb24", "-s",
                            f"{square.SOURCE_HW[1]}x{square.SOURCE_HW[0]}",
                            "-framerate", "15", "-i", "pipe:0", "-c:v", "libx264", "-qp", "0", "-pix_fmt", "yuv420p",
                            "-y", ep.segments[slot][0]], input=frames, check=True)
        path = str(tmp_path / f"{ep.index}.rgb")
        subprocess.run(stitch.episode_command(ep, source, cfg, fits, ["-loglevel", "error", "-f", "rawvideo",
                                                                      "-pix_fmt", "rgb24", "-y", path], False),
                       check=True)
        ours = square.render(corners[None, ::square.STRIDE])[0]
        theirs = torch.from_numpy(np.fromfile(path, np.uint8).reshape(-1, square.HEIGHT, square.WIDTH, 3))
        assert torch.equal(ours, theirs.permute(3, 0, 1, 2).float() / 127.5 - 1)


def test_locate_finds_the_square_within_a_pixel_along_every_border_and_the_judge_reads_the_target_box():
    xs, ys = np.arange(0, 257, 2), np.arange(0, 117, 2)  # SQUARE_RANGE's even corners (code_frame: odd ones round)
    corners = np.concatenate([np.stack([xs, np.full_like(xs, y)], 1) for y in (0, 58, 116)] +
                             [np.stack([np.full_like(ys, x), ys], 1) for x in (0, 128, 256)]).astype(np.float32)
    centre, found = square.locate(square.render(corners[:, None]))
    assert found.all() and (centre[:, 0] - (torch.from_numpy(corners) + 32)).abs().max() < 1.0
    blank = torch.full((2, 3, 1, square.HEIGHT, square.WIDTH), -1.0)  # black: no square
    centre, found = square.locate(blank)
    assert not found.any() and centre.isnan().all()
    target = np.array([[100, 50]] * 5, np.float32)  # the box [100, 164) x [50, 114): centres inside up to 31 off
    at = target + np.array([[0, 0], [-30, 30], [30, -30], [-34, 0], [0, 34]], np.float32)
    frames = square.render(np.stack([target, at], 1))  # the last frame counts
    assert square.judge(frames, {"chunk": 0, "task": {"target": target}}).tolist() == [1, 1, 1, 0, 0]
    assert square.judge(blank, {"chunk": 0, "task": {"target": target[:2]}}).tolist() == [0, 0]
    with pytest.raises(ValueError, match=r"judge: info\['task'\]\['target'\] of shape \(5, 2\) for 2 videos"):
        square.judge(blank, {"chunk": 0, "task": {"target": target}})


def test_mark_outlines_the_target_box_in_each_camera_cell_and_changes_no_judgement():
    """policyeval's mp4s draw the goal (tasks.square:mark): a white box outline around the target in the three camera
    cells, the black cell and the input untouched, and the judge reads the marked frames as it reads the plain ones."""
    target = np.array([[100, 50]] * 5, np.float32)
    at = target + np.array([[0, 0], [-30, 30], [30, -30], [-34, 0], [0, 34]], np.float32)
    frames = square.render(np.stack([target, at], 1))
    marked = square.mark(frames, {"target": target})
    h, w = square.HEIGHT // 2, square.WIDTH // 2
    changed = (marked != frames).any(1).any(1)  # [B, H, W]
    assert changed.any() and not changed[:, h:, w:].any() and not (frames == 1.0).all(1).any()  # input untouched
    x0, y0 = int(100 * w / 320), int(50 * h / 180)
    for top, left in ((0, 0), (0, w), (h, 0)):
        assert (marked[:, :, :, top + y0, left + x0] == 1.0).all()  # the box's corner, white in every cell
    info = {"chunk": 0, "task": {"target": target}}
    assert square.judge(marked, info).tolist() == square.judge(frames, info).tolist() == [1, 1, 1, 0, 0]


def test_the_reference_policies_are_graded_in_the_simulator():
    """32 tasks, 3 chunks: go_to_target always, the epsilon policies in order, random commands rarely, and standing
    still or going the wrong way never (both by construction)."""
    tasks = square.sample_tasks(32, seed=0)
    assert np.array_equal(tasks["start"], square.sample_tasks(32, seed=0)["start"])
    assert ((np.abs(tasks["target"] - tasks["start"]) >= lerobot.ACTION_SQUARE).any(1)).all()  # never overlapping
    rate = {name: square.run_in_simulator(policy, tasks, chunks=3, seed=0)["success"][-1].mean().item()
            for name, policy in square.POLICIES.items()}
    print("success in the simulator:", {k: round(v, 3) for k, v in rate.items()})
    assert rate["go_to_target"] == 1.0 and rate["stand_still"] == rate["wrong_way"] == 0.0, rate
    graded = [rate[k] for k in ("go_to_target", "epsilon_25", "epsilon_50", "epsilon_75", "random_commands")]
    assert all(a > b for a, b in zip(graded, graded[1:])) and graded[-1] < 0.25, rate
    # every frame, as a world-model rollout chains them: chunk k starts at chunk k-1's last frame
    run = square.run_in_simulator(square.epsilon_50, tasks, chunks=3, seed=0)
    assert tuple(run["frames"].shape) == (32, 3, 1 + 3 * (square.FRAMES - 1), square.HEIGHT, square.WIDTH)
    assert torch.equal(run["frames"][:, :, ::square.FRAMES - 1], square.render(run["positions"][:, ::square.STEPS]))
    assert run["success"][-1].mean().item() == rate["epsilon_50"] and run["positions"].shape == (32, 97, 2)
    np.testing.assert_allclose(run["positions"], square.step(tasks["start"], run["actions"].numpy()), atol=1e-3)


def test_each_policy_returns_one_command_a_chunk_of_the_shape_info_asks_and_stands_still_without_a_square():
    tasks = square.sample_tasks(4, seed=1)
    frames = square.render(tasks["start"][:, None])
    for steps, action_dim in ((square.STEPS, 2), (12, 7)):
        info = {"chunk": 1, "task": tasks, "steps": steps, "action_dim": action_dim, "seed": 3}
        for policy in square.REFERENCE:
            name = policy.__name__
            actions = policy(frames, info)
            assert actions.shape == (4, steps, action_dim) and actions.dtype == torch.float32, name
            assert torch.isfinite(actions).all() and (actions[:, :, 2:] == 0).all(), name
            corners = square.seen(frames)[0]  # one command held for the chunk, cut at the borders where it sees them
            ends = [square.step(corners, np.broadcast_to(c, (4, steps, 2))) for c in square.COMMANDS]
            assert all(any(np.array_equal(np.diff(e[b], axis=0), actions[b, :, :2].numpy()) for e in ends)
                       for b in range(4)), name
            blank = policy(torch.full_like(frames, -1.0), info)
            assert (blank == 0).all(), name  # no square found: stand still
    info = {"chunk": 0, "task": tasks, "steps": square.STEPS, "action_dim": 2, "seed": 0}
    assert (square.go_to_target(frames, info) != 0).flatten(1).any(1).all()  # no start is inside its target
    with pytest.raises(ValueError, match="locate: frames of shape"):
        square.go_to_target(frames[:, :, 0], info)
    def five_steps(frames, info):
        return square.wrong_way(frames, info)[:, :5]
    with pytest.raises(ValueError, match=r"five_steps returned actions of shape \(4, 5, 2\)"):
        square.run_in_simulator(five_steps, tasks, chunks=1)


def test_the_other_families_are_graded_in_the_simulator_and_act_within_the_datas_range():
    """16 tasks, 3 chunks: within each family of tasks/square.py the policies' success falls (ties allowed) from the
    first to the last, which succeeds at most a quarter as often as the first; every action within +-RATE_MAX, zero
    where no square is seen; the judge agrees with the simulator's own state in nearly every episode."""
    tasks = square.sample_tasks(16, seed=0)
    rate, agree = {}, []
    for policy in square.OTHERS:
        run = square.run_in_simulator(policy, tasks, chunks=3, seed=0)
        rate[policy.__name__] = run["success"][-1].mean().item()
        world = type("World", (), {"path": run["positions"]})
        agree.append(square.state_success(world, tasks) == run["success"][-1].numpy())
        assert (np.abs(run["actions"].numpy()) <= squareworld.RATE_MAX + 1e-6).all(), policy.__name__
    print("success in the simulator:", rate)
    for family in set(square.FAMILY_DATA) - {"reference"}:
        graded = [rate[p.__name__] for p in square.OTHERS if p.family == family]
        assert len(graded) >= 3 and all(a >= b for a, b in zip(graded, graded[1:])), (family, graded)
        assert graded[-1] <= graded[0] / 4, (family, graded)
    assert np.mean(agree) >= 0.9
    info = {"chunk": 0, "task": tasks, "steps": square.STEPS, "action_dim": 3, "seed": 0}
    blank = torch.full((16, 3, 1, square.HEIGHT, square.WIDTH), -1.0)
    assert all((policy(blank, info) == 0).all() for policy in square.OTHERS)
    assert set(square.FAMILY_DATA.values()) <= set(lerobot.BEHAVIOURS)


def test_the_mixture_moves_the_square_by_its_actions_in_every_family_and_leaves_one_out_on_request(tmp_path):
    """make_synthetic(motion="actions"): every BEHAVIOURS family in turn, named per episode in episodes.jsonl; the
    square's position moves by exactly the recorded action; without=(family,) leaves it out, an unknown name is
    one line, and a folder written with another exclusion is refused by check_synthetic."""
    families = list(lerobot.BEHAVIOURS)
    for e in range(2 * len(families)):
        position, action = lerobot.square_commands(e, 120)
        assert np.array_equal(position[1:], position[:-1] + action[:-1]), e  # float32, exactly
        assert (np.abs(action) <= squareworld.RATE_MAX).all() and (action != 0).any(), e
    moves = {f: np.abs(np.diff(lerobot.square_commands(e, 200)[1], axis=0)).mean() for e, f in enumerate(families)}
    assert moves["switch"] > moves["held"] and moves["noisy"] > moves["held"], moves  # changes inside a chunk
    lengths = (10,) * (len(families) + 1)
    src = lerobot.make_synthetic(str(tmp_path / "src"), lengths=lengths, height=18, width=32, motion="actions",
                                 without=("goal",))
    with open(os.path.join(src, "meta", "episodes.jsonl")) as f:
        named = [json.loads(line)["behaviour"] for line in f]
    assert "goal" not in named and set(named) == set(families) - {"goal"}
    assert named == [lerobot.episode_behaviour(e, ("goal",)) for e in range(len(lengths))]
    lerobot.check_synthetic(src, lengths, "actions", stitched="grid", without=("goal",))
    with pytest.raises(ValueError, match="other square commands than this version's"):
        lerobot.check_synthetic(src, lengths, "actions", stitched="grid")
    says = r"behaviours without \['goals'\]: unknown \['goals'\]; the families are held"
    with pytest.raises(ValueError, match=says) as e:
        lerobot.make_synthetic(str(tmp_path / "bad"), lengths=lengths, motion="actions", without=("goals",))
    assert "\n" not in str(e.value) and not os.path.exists(tmp_path / "bad")
    with pytest.raises(ValueError, match="none left"):
        lerobot.check_behaviours(families)
