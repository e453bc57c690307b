"""Issue 36 items 3-6: actions through the conditioning record (SFT, held-out batches, samples, RL, evaluate.py),
action_gap_db, and long rollouts of chained chunks, on the tiny-action preset's own synthetic data."""
import json
import os

import numpy as np
import pytest
import torch

import evaluate
import sample
import train
from base import cli, lerobot
from clips import actionclips, tiny
from clips.fidelity import view_metrics
from condition import uncond
from nets.vae import LinearCodec
from run_utils import check, script, script_beside

SHORT = ["--sample-every", "0", "--save-every", "100", "--workers", "0"]


@pytest.fixture(scope="module")
def action_grid(tiny_action_grid):
    return tiny_action_grid


@pytest.fixture(scope="module")
def action_run(action_grid, tmp_path_factory):
    """A short tiny-action SFT run on it (the test of the actions' effect trains its own, longer)."""
    out = str(tmp_path_factory.mktemp("runs") / "act")
    train.main(["--config", "tiny-action", "--data", action_grid, "--steps", "20", "--out", out] + SHORT)
    return out


def test_an_action_config_refuses_a_folder_without_actions_and_a_plain_config_says_it_trains_without(
        action_grid, tmp_path, capsys):
    plain = str(tmp_path / "plain")
    os.makedirs(plain)
    with pytest.raises(ValueError) as e:
        actionclips.open_clips("tiny-action", plain, 9, 64, 112, text="standin", text_len=16, text_dim=1024)
    assert "\n" not in str(e.value) and plain in str(e.value) and "stitch.py" in str(e.value)
    clips = actionclips.open_clips("tiny", action_grid, 9, 64, 112, text="standin", text_len=16, text_dim=1024)
    assert "takes none (action_dim 0): trained and sampled on the videos alone" in capsys.readouterr().out
    assert "action" not in clips[0]
    with pytest.raises(ValueError, match="the latent cache holds no actions"):
        train.main(["--config", "tiny-action", "--data", action_grid, "--latents", str(tmp_path)] + SHORT)


def test_actions_travel_in_the_record_to_sft_held_out_batches_and_cfgs_uncond_branch(action_grid, action_run):
    cfg = train.parse_config(["--config", "tiny-action", "--data", action_grid, "--out", action_run] + SHORT)
    run = train.setup(cfg)
    dataset, n_train, _ = train.load_data(run)
    to_latent = train.make_encoder(run, __import__("engine.build", fromlist=["build"]).build_vae("tiny", "", run.device, torch.float32))
    latent, cond = to_latent(torch.utils.data.default_collate([dataset[(0, 3)]]))
    assert cond.action.shape == (1, 8, 8) and torch.equal(cond.action[0], dataset[(0, 3)]["action"])
    assert uncond(cond).action is cond.action  # CFG's uncond branch drops the prompt, never the actions
    _, batches, _ = train.held_out_batches(run, dataset, n_train, to_latent)
    held = actionclips.episode_chunks(dataset, n_train, 1)[0]  # the first held-out episode's window at frame 0
    assert torch.equal(batches[0][1].action, held)
    rows = [json.loads(line) for line in open(os.path.join(action_run, "metrics.jsonl"))]
    assert rows[-1]["step"] == 20 and np.isfinite(rows[-1]["eval_loss"])


def test_action_configs_sample_at_guidance_0_unless_told_and_tiny_action_takes_its_preset(action_run):
    """Upstream samples its action net without CFG: train.py's preset for every action config, and sample.py's default
    for an action run; a --guidance given wins. tiny-action's preset: 6000 steps at 3e-3, 4 held out."""
    cfg = train.parse_config(["--config", "tiny-action"])
    assert (cfg.guidance, cfg.steps, cfg.lr, cfg.holdout) == (0.0, 6000, 3e-3, 4)
    folder = json.load(open(os.path.join(action_run, "config.json")))["data"]
    assert train.parse_config(["--config", "v2w-2b-action", "--data", folder, "--init", "random", "--vae", "tiny"]
                              ).guidance == 0.0
    assert train.parse_config(["--config", "tiny-action", "--guidance", "3"]).guidance == 3.0
    assert train.parse_config(["--config", "tiny"]).guidance == 7.0
    assert sample.parse_config(["--ckpt", action_run]).guidance == 0.0
    assert sample.parse_config(["--ckpt", action_run, "--guidance", "2"]).guidance == 2.0


def test_sample_chains_three_chunks_under_the_episodes_actions_or_a_files(action_run, tmp_path, capsys):
    out = str(tmp_path / "roll.mp4")
    sample.main(["--ckpt", action_run, "--chunks", "3", "--steps", "2", "--out", out])
    said = capsys.readouterr().out
    assert "its frame 0 and its own actions (3 chunk(s))" in said and "25 frames: 3 chunk(s) of 9" in said
    np.savez(tmp_path / "a.npz", action=np.zeros((16, 8), np.float32))
    with pytest.raises(ValueError, match=r"needs an `action` array of \(24, 8\)"):
        sample.main(["--ckpt", action_run, "--chunks", "3", "--actions", str(tmp_path / "a.npz"), "--out", out])
    sample.main(["--ckpt", action_run, "--chunks", "2", "--steps", "2", "--actions", str(tmp_path / "a.npz"),
                 "--out", out])
    assert "17 frames: 2 chunk(s) of 9" in capsys.readouterr().out
    with pytest.raises(ValueError, match="needs --actions FILE.npz"):
        sample.parse_config(["--ckpt", action_run, "--image", out])


def test_evaluate_scores_each_chunk_of_a_rollout_and_the_action_gap(action_run, tmp_path, capsys):
    evaluate.main([action_run, "--clips", "2", "--steps", "2", "--chunks", "3", "--plot", str(tmp_path / "c.png")])
    lines = capsys.readouterr().out.splitlines()
    result = json.loads(lines[-1])["runs"][0]["metrics"]
    head = next(line for line in lines if line.startswith("run "))
    assert "action_gap_db" in head and "chunk3/psnr" in head
    assert result["chunk1/psnr"] == result["psnr"]  # chunk 1 is the ordinary held-out generation
    assert result["action_gap_db"] == pytest.approx(result["psnr"] - result["psnr_other_actions"])
    assert all(np.isfinite(result[f"chunk{k}/psnr"]) for k in (1, 2, 3))
    # per chunk: the same chained rollout under other commands; chunk 1's is action_gap_db itself (same frame, noise)
    assert "chunk3/action_gap_db" in head and result["chunk1/action_gap_db"] == result["action_gap_db"]
    assert all(np.isfinite(result[f"chunk{k}/action_gap_db"]) for k in (2, 3))


def test_rl_rollouts_and_their_held_out_evaluation_carry_the_actions(action_run, tmp_path, monkeypatch):
    from engine import rl
    seen = []
    real = rl.from_first_frame
    monkeypatch.setattr(rl, "from_first_frame", lambda net, vae, truth, cond, *a: seen.append(cond.action) or
                        real(net, vae, truth, cond, *a))
    train.main(["--config", "tiny-action", "--data", json.load(open(os.path.join(action_run, "config.json")))["data"],
                "--objective", "nft", "--init", os.path.join(action_run, "step_00000020"), "--lora", "4", "--steps",
                "1", "--eval-steps", "1", "--nft-group-size", "2", "--batch-size", "1", "--out", str(tmp_path / "nft"),
                "--workers", "0", "--sample-every", "0", "--guard-max-ratio", "10"])
    assert seen and all(a is not None and a.shape == (1, 8, 8) for a in seen)


def test_a_model_that_ignores_its_actions_scores_an_action_gap_of_exactly_zero(action_run, tmp_path, capsys,
                                                                               monkeypatch):
    import model
    monkeypatch.setattr(model.DiT, "_action", lambda self, action, B, Tp, dtype: torch.zeros(B, 1, self.cfg.action_dim,
                                                                                         dtype=dtype))
    evaluate.main([action_run, "--clips", "2", "--steps", "2", "--plot", str(tmp_path / "c.png")])
    metrics = json.loads(capsys.readouterr().out.splitlines()[-1])["runs"][0]["metrics"]
    assert metrics["action_gap_db"] == 0.0 and np.isfinite(metrics["psnr"])


def square_clip(positions, rows, cell=(32, 56)):
    """tiny-action's 2x2 grid [1, 3, T, H, W] in [-1, 1] (cameras 1-3 and a black cell) at the source rows `rows`,
    drawn by lerobot.code_frame with the square at `positions` (no video codec, no resize)."""
    frames = []
    for r in rows:
        ext_1, ext_2, wrist = (lerobot.code_frame(0, c, r, *cell, square=positions[r]) for c in (1, 2, 3))
        frames.append(np.concatenate([np.concatenate([ext_1, ext_2], 1), np.concatenate([wrist, 0 * wrist], 1)]))
    return torch.from_numpy(np.stack(frames)).permute(3, 0, 1, 2)[None].float() / 127.5 - 1


def test_a_perfect_model_of_the_tiny_action_data_would_score_an_action_gap_well_above_the_target():
    """The ceiling of action_gap_db on tiny-action's data: the tiny codec's reconstruction of a held-out clip against
    that of the same first frame moved by the other held-out episode's commands. With the clock's bit bands and a
    24-pixel square it was 0.36 dB, under the issue's 0.5 dB for any model; a plain frame and a 48-pixel square: 3.9."""
    codec, (lo, hi) = LinearCodec(), np.array(lerobot.SQUARE_RANGE).T
    rows, gaps = np.arange(9) * 4, []
    for ep, other in ((8, 9), (9, 8)):  # the preset's held-out episodes
        truth_pos, _ = lerobot.square_commands(ep, 40)
        moved = [truth_pos[0]]
        for step in lerobot.square_commands(other, 40)[1][:32]:  # the square replayed under the other commands
            moved.append(np.clip(moved[-1] + step, lo, hi))
        truth = square_clip(truth_pos, rows)
        psnr = [view_metrics(codec.decode(codec.encode(v)), truth, "grid", (32, 56))["psnr"].item()
                for v in (truth, square_clip(moved, rows))]
        gaps.append(psnr[0] - psnr[1])
    assert min(gaps) > 2.0, gaps


@pytest.mark.skipif(not os.environ.get("NANOCOSMOS_SLOW"), reason="trains two tiny nets for 6000 steps each (~8 min on "
                    "2 cores, side by side): NANOCOSMOS_SLOW=1 pytest -k follows_its_actions")
def test_the_tiny_preset_follows_its_actions_better_than_the_same_net_trained_without_them(tmp_path):
    """Issue 36's sign test, through the entry points: the README's `python train.py --config tiny-action`, and the
    tiny net without actions trained the same way (steps, lr, held-out episodes, guidance 0) on the same folder;
    evaluate.py scores both on the same held-out clips and noise. The action net must beat the one without actions on
    held-out PSNR with the true actions, and score action_gap_db > 0.5 dB (the issue's target)."""
    data = os.path.abspath(train.tiny_data("tiny-action"))  # the scripts run in the repo root: absolute paths
    tiny.make_tiny_dataset(data, actions=True)  # once, before the two runs read it
    preset = [f"--{k.replace('_', '-')}={v}" for k, v in cli.recipe("tiny_action").items()]
    act, plain = os.path.abspath("act"), os.path.abspath("plain")
    beside = script_beside(["--config", "tiny", "--data", data, "--guidance", "0", *preset, "--out", plain])
    check(script(["--config", "tiny-action", "--data", data, "--out", act], timeout=1500))
    check(beside.result(timeout=1500))
    out = check(script([act, plain, "--draws", "2", "--plot", str(tmp_path / "c.png")], name="evaluate.py")).stdout
    act, plain = (row["metrics"] for row in json.loads(out.splitlines()[-1])["runs"])
    print(out)
    assert act["psnr"] > plain["psnr"] and act["action_gap_db"] > 0.5, (act, plain)
