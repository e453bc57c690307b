"""Chained NFT (--nft-chain-chunks, issue 52) through train.py on the tiny action data: a group's conditioning frame
is the last frame of the chunks the model itself rolled out first (recomputed here with engine/generate.rollout and
the same seed), the reward reads the true continuation of the LAST chunk, and bad or unused settings are refused in
one line."""
import copy
import os
import re

import pytest
import torch

import condition
import nft
import reward
import train
from engine import chain
from engine.build import build_vae
from engine.generate import rollout
from nets.family import family_of
from run_utils import check, in_process, rerun_last_step, step_rows
from test_train import dcp_tensors

CHAIN = ["--config", "tiny-action", "--objective", "nft", "--lora", "4", "--steps", "1", "--save-every", "1",
         "--sample-every", "0", "--holdout", "4", "--batch-size", "1", "--nft-group-size", "2", "--nft-num-steps", "2",
         "--eval-steps", "2", "--reward", "clips.fidelity:truth_psnr"]


def test_the_chain_is_the_models_own_and_the_reward_reads_the_last_chunks_truth(tiny_action_grid, tmp_path,
                                                                               monkeypatch):
    seen = {"windows": [], "steps": [], "scores": []}
    real_window, real_step, real_score = chain.window, nft.train_step, reward.score

    def window(clips, index, start):
        item = real_window(clips, index, start)
        seen["windows"].append(item)
        return item

    def train_step(net, optimizer, params, old, conds, *args, **kwargs):  # the net as the chain saw it (update 0)
        seen["steps"].append((copy.deepcopy(net), conds))
        return real_step(net, optimizer, params, old, conds, *args, **kwargs)

    def score(terms, **inputs):
        seen["scores"].append(inputs)
        return real_score(terms, **inputs)
    monkeypatch.setattr(chain, "window", window)
    monkeypatch.setattr(nft, "train_step", train_step)
    monkeypatch.setattr(reward, "score", score)
    out = str(tmp_path / "chain")
    check(in_process(train, [*CHAIN, "--data", tiny_action_grid, "--out", out, "--nft-chain-chunks", "3"]))
    row = step_rows(out)[1]
    assert row["ctx_chunks"] == 2 and row["forwards"] > 2 * 2 and row["s_chain"] > 0, row
    net, (cond,) = seen["steps"][0]
    items = seen["windows"][:3]  # update 0's chain: chunks 1..3 of one episode, the last the rewarded one
    assert [i["start"] for i in items] == [items[0]["start"] + j * 8 for j in range(3)]
    vae = build_vae("tiny", "", torch.device("cpu"), torch.float32)
    _, k, _, seed = nft.chain_draw(train.parse_config([*CHAIN, "--data", tiny_action_grid, "--out", out,
                                                    "--nft-chain-chunks", "3"]), [1000] * 36, 0, 0, 0)
    assert k == 3
    records = [condition.from_batch(condition.as_batch(i), "cpu", 64, 112, torch.float32, -1.0) for i in items[:2]]
    grid = family_of(net.cfg).sampler_defaults("random", "tiny-action")[0]
    chunks = rollout(net, vae, items[0]["video"][None, :, :1], records, 9, 2, 0.0, seed, grid, torch.float32)
    own = torch.cat([chunks[-1][0, :, -1:].float(), items[2]["video"][:, 1:]], dim=1)
    latent = vae.encode(own[None]).float()
    assert torch.equal(cond.gt_frames, latent)  # the model's own last frame, then chunk 3's true frames
    assert not torch.equal(latent[:, :, 0], vae.encode(items[2]["video"][None]).float()[:, :, 0])
    assert torch.equal(cond.action[0], items[2]["action"])  # chunk 3's true actions
    rollout_scores = [s for s in seen["scores"] if s["video"].shape[0] == 2]  # the group's (evaluation: 1 sample)
    assert torch.equal(rollout_scores[0]["truth"], vae.decode(latent).float())  # rewarded against chunk 3's truth


def test_a_true_share_of_the_groups_starts_unchained_from_a_true_frame(tiny_action_grid, tmp_path):
    out = str(tmp_path / "mix")
    argv = [*CHAIN, "--data", tiny_action_grid, "--out", out, "--nft-chain-chunks", "2", "--nft-chain-true-share",
            "0.5", "--batch-size", "2", "--steps", "3", "--save-every", "3"]
    check(in_process(train, argv))
    cfg = train.parse_config(argv)
    got = [row["ctx_chunks"] for step, row in sorted(step_rows(out).items()) if step > 0]
    ks = [[nft.chain_draw(cfg, [1000] * 36, step, 0, row)[1] for row in range(2)] for step in range(3)]
    assert got == [sum(k - 1 for k in step) for step in ks]  # a k = 1 group generates no context
    assert {1, 2} <= {k for step in ks for k in step}, ks  # both kinds drawn in these 6 groups


@pytest.mark.parametrize("argv, message", [
    (["--nft-chain-chunks", "4"], r"has 25 frames, 4 chained chunks of 9 need 33; pass --nft-chain-chunks 3 or fewer"),
    (["--nft-chain-chunks", "0"], r"chain_chunks=0: >= 1"),
    (["--nft-chain-chunks", "2", "--nft-guidance", "2"], r"the chain's context is generated without CFG"),
    (["--nft-chain-true-share", "0.5"], r"chain_true_share=0.5: in \[0, 1\), and > 0 only with chain_chunks > 1"),
    (["--objective", "grpo", "--nft-chain-chunks", "2"], r"--nft-chain-chunks does nothing with --objective grpo")])
def test_bad_or_unused_chain_settings_are_refused_in_one_line(tiny_action_grid, tmp_path, argv, message):
    proc = in_process(train, [*CHAIN, "--data", tiny_action_grid, "--out", str(tmp_path / "x"), *argv])
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert re.search(message, proc.stderr), proc.stderr
    assert not os.path.exists(tmp_path / "x")


def test_a_resumed_chained_run_ends_bit_for_bit_equal(tiny_action_grid, tmp_path):
    """The chains depend on (seed, step, rank, row) and the old policy, saved with every checkpoint: a run resumed
    from its step 2 redoes step 3 exactly (the same context, rewards, update and weights)."""
    args = [*CHAIN, "--data", tiny_action_grid, "--nft-chain-chunks", "2", "--nft-chain-true-share", "0.5",
            "--batch-size", "2", "--steps", "3", "--save-every", "1", "--nft-decay-rate", "0.5"]
    ref, resumed = rerun_last_step(train, args, str(tmp_path), 3)
    want, got = (step_rows(d)[3] for d in (ref, resumed))
    assert all(got[k] == want[k] for k in ("loss", "reward_mean", "ctx_chunks", "forwards", "old_decay")), (got, want)
    a, b = (dcp_tensors(os.path.join(d, "step_00000003"), "model.") for d in (ref, resumed))
    assert a and a.keys() == b.keys() and all(torch.equal(v, b[k]) for k, v in a.items())
