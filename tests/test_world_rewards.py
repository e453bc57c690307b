"""Issue 46's plumbing: world-model rewards that read the true clip (its frames, latent, raw actions) in RL rollouts
and held-out evaluations, their refusals where there is no truth, and the adaptive data weight (its arithmetic, its
logged value, its state resumed bit for bit)."""
import json
import os

import numpy as np
import pytest
import torch

import reward
import train
from clips import fidelity
from engine import rl
from run_utils import check, in_process
from tasks import square

SEEN = []  # what the probe term below was given, per call
SHORT = ["--sample-every", "0", "--workers", "0", "--eval-steps", "2", "--nft-num-steps", "2", "--nft-group-size", "2",
         "--batch-size", "1", "--lora", "2", "--guard-max-ratio", "10"]


def probe(video, truth, truth_latent, action):
    """A term that reads every input and records it."""
    SEEN.append({"video": video.clone(), "truth": truth.clone(), "truth_latent": truth_latent.clone(),
                 "action": action.clone()})
    return torch.zeros(len(video))


def asks_too_much(video, speed):
    """A term naming an input no reward gets."""
    return video.mean((1, 2, 3, 4)) * speed


@pytest.fixture(scope="module")
def base(tiny_action_grid, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("wr") / "base")
    check(in_process(train, ["--config", "tiny-action", "--data", tiny_action_grid, "--steps", "4", "--out", out,
                             "--sample-every", "0", "--workers", "0"]))
    return os.path.join(out, "step_00000004")


def rows(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_a_truth_reading_reward_gets_its_groups_true_clip_and_raw_actions(base, tiny_action_grid, tmp_path):
    """In a rollout the truth is the group's clip decoded as the samples are (its conditioning frame 0 the samples'
    own, its later frames not), its latent the clip's, its actions the clip's raw commands (normalise inverts them);
    in the held-out evaluation the truth's frames 1.. beside the sample's."""
    SEEN.clear()
    check(in_process(train, ["--config", "tiny-action", "--data", tiny_action_grid, "--init", base, "--objective",
                             "nft", "--steps", "1", "--reward", "test_world_rewards:probe", "--out",
                             str(tmp_path / "nft"), *SHORT]))
    held_out = SEEN[0]  # step 0's evaluation: one held-out sample at a time, frames 1..
    rollout = next(s for s in SEEN if len(s["video"]) == 2)  # the update's group of 2 samples, every frame
    assert rollout["video"].shape == (2, 3, 9, 64, 112) and rollout["truth"].shape == (1, 3, 9, 64, 112)
    assert torch.equal(rollout["truth"][:, :, 0], rollout["video"][:1, :, 0])  # frame 0 conditions: the same frame
    assert not torch.equal(rollout["truth"][:, :, 1:], rollout["video"][:1, :, 1:])
    assert rollout["truth_latent"].shape == (1, 16, 3, 8, 14) and rollout["action"].shape == (1, 32, 2)
    commands = {tuple(c) for c in rollout["action"][0].round().tolist()}  # the square's (dx, dy), raw pixels
    assert commands <= {(dx, dy) for dx in range(-8, 9) for dy in range(-4, 5)} and len(commands) >= 1
    assert held_out["video"].shape == held_out["truth"].shape == (1, 3, 8, 64, 112)  # frames 1..


def test_truth_rewards_are_refused_where_there_is_no_truth_and_score_as_documented():
    terms = reward.parse_rewards("clips.fidelity:truth_psnr,tasks.square:follows_actions")
    assert reward.needs_truth(terms) == ["truth_psnr", "follows_actions"] and reward.needs_pixels(terms)
    video = torch.rand(2, 3, 9, 64, 112) * 2 - 1
    with pytest.raises(ValueError, match="'truth_psnr' needs the truth, but score got none .there is no true clip"):
        reward.score(terms, video=video)
    out = reward.score(terms, video=video, truth=video[:1])
    assert out["truth_psnr"][0] > 90 and out["follows_actions"].shape == (2,)
    with pytest.raises(ValueError, match="gets only video, latent, truth, truth_latent, action"):
        reward.parse_rewards("test_world_rewards:asks_too_much")
    frames = square.render(np.array([[[100.0, 50.0]] * 9, [[200.0, 100.0]] * 9], np.float32))
    assert square.follows_actions(frames, frames).tolist() == [0.0, 0.0]
    assert square.follows_actions(frames.flip(0), frames).max() < -0.9  # the other clip's square: ~111 px off
    latent = torch.randn(1, 16, 3, 8, 14)
    assert fidelity.truth_latent_mse(latent, latent).item() == 0.0


def test_the_adaptive_data_weight_doubles_halves_and_stays_in_its_band():
    assert rl.adapted_coef(0.5, 0.2, 0.1, 0.5) == 1.0  # fell more than 1.5 target: more weight on the data
    assert rl.adapted_coef(0.5, 0.01, 0.1, 0.5) == 0.25  # well within: room to learn
    assert rl.adapted_coef(0.5, 0.1, 0.1, 0.5) == 0.5  # within [target / 1.5, 1.5 target]: kept
    assert rl.adapted_coef(0.5 / 64, -1.0, 0.1, 0.5) == 0.5 / 64 and rl.adapted_coef(32.0, 9.0, 0.1, 0.5) == 32.0


def test_the_adaptive_weight_is_logged_refused_without_evaluations_and_resumed_bit_for_bit(base, tiny_action_grid,
                                                                                        tmp_path):
    """3 updates with a held-out evaluation after each: the weight it set logged with each; the same run killed
    after update 2's evaluation (its marker written) and resumed gives the same rows, the weight too."""
    flags = ["--config", "tiny-action", "--data", tiny_action_grid, "--init", base, "--objective", "nft",
             "--nft-data-target", "0.01", "--eval-every", "1", "--save-every", "1", *SHORT]
    proc = in_process(train, flags + ["--steps", "3", "--eval-every", "0", "--out", str(tmp_path / "x")])
    assert proc.returncode == 2 and "--nft-data-target 0.01: adapts --nft-data-coef" in proc.stderr
    whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
    check(in_process(train, flags + ["--steps", "3", "--out", whole]))
    check(in_process(train, flags + ["--steps", "2", "--out", parts]))
    check(in_process(train, flags + ["--steps", "3", "--out", parts]))
    timing = lambda r: {k: v for k, v in r.items() if not k.startswith("s_") and k not in ("tokens_per_s",)}  # noqa
    assert [timing(r) for r in rows(parts)] == [timing(r) for r in rows(whole)]
    coefs = [r["data_coef"] for r in rows(whole) if "data_coef" in r]
    assert len(coefs) == 4 and coefs[0] == 0.5  # step 0's sets the base; each later one doubles, halves or keeps
    assert all(b / a in (0.5, 1.0, 2.0) for a, b in zip(coefs, coefs[1:])), coefs
