"""Own-context SFT (ownctx.py) through train.py on the tiny action data: the conditioning frame really is the model's
own generation (recomputed here with engine/generate.rollout and the same seed), both action-net families train, too
short episodes and another objective's flags are refused in one line, and a resumed run ends bit for bit equal."""
import copy
import os
import re

import pytest
import torch

import condition
import ownctx
import train
from engine import chain
from engine.build import build_vae
from engine.generate import rollout
from nets.family import family_of
from run_utils import check, in_process, rerun_last_step, step_rows
from test_train import dcp_tensors

TINY = ["--steps", "2", "--save-every", "2", "--sample-every", "0", "--warmup", "1", "--holdout", "4"]


def test_the_context_is_the_models_own_rollout_and_the_target_the_truth(tiny_action_grid, tmp_path, monkeypatch):
    seen = {"windows": [], "steps": []}
    real_window, real_step = chain.window, ownctx.sft_step

    def window(clips, index, start):
        item = real_window(clips, index, start)
        seen["windows"].append(item)
        return item

    def sft_step(net, optimizer, trainable, cfg, batches, step, rank, world):  # the net as the context saw it
        seen["steps"].append((copy.deepcopy(net), batches, cfg))
        return real_step(net, optimizer, trainable, cfg, batches, step, rank, world)
    monkeypatch.setattr(chain, "window", window)
    monkeypatch.setattr(ownctx, "sft_step", sft_step)
    out = str(tmp_path / "own")
    check(in_process(train, ["--config", "tiny-action", "--objective", "ownctx", "--data", tiny_action_grid, "--out",
                             out, "--ownctx-true-share", "0", "--ownctx-context-steps", "3", *TINY]))
    got = step_rows(out)
    assert all(got[s]["ctx_chunks"] >= 1 and got[s]["ctx_calls"] == 4 * got[s]["ctx_chunks"] for s in (1, 2)), got
    net, batches, cfg = seen["steps"][0]
    (latent, cond), = batches
    k = got[1]["ctx_chunks"] + 1
    items = seen["windows"][:k]  # step 0's windows: chunks 1..k of one episode, the last the target
    assert [i["start"] for i in items] == [items[0]["start"] + j * 8 for j in range(k)]
    vae = build_vae("tiny", "", torch.device("cpu"), torch.float32)
    _, _, _, seed = ownctx.draw(cfg, 36, [1000] * 36, 0, 0, 0, 0)
    records = [condition.from_batch(condition.as_batch(i), "cpu", 64, 112, torch.float32, -1.0) for i in items[:-1]]
    grid = family_of(net.cfg).sampler_defaults(cfg.init, cfg.config)[0]
    chunks = rollout(net, vae, items[0]["video"][None, :, :1], records, 9, 3, 0.0, seed, grid, torch.float32)
    own = torch.cat([chunks[-1][0, :, -1:].float(), items[-1]["video"][:, 1:]], dim=1)
    assert torch.equal(latent[0], vae.encode(own[None]).float()[0])  # the model's frame, then the true window
    true = vae.encode(items[-1]["video"][None]).float()[0]
    assert not torch.equal(latent[0, :, 0], true[:, 0]) and torch.equal(cond.gt_frames, latent)
    assert torch.equal(cond.action[0], items[-1]["action"])  # the target's true actions



def test_predict25_action_net_trains_on_its_own_context(tiny_action_grid, tmp_path):
    out = str(tmp_path / "p25")
    check(in_process(train, ["--config", "p25-tiny-action", "--objective", "ownctx", "--data", tiny_action_grid,
                             "--out", out, "--ownctx-true-share", "0", "--ownctx-context-steps", "2", *TINY]))
    got = step_rows(out)  # the flow family's UniPC: one call a step
    assert all(got[s]["ctx_chunks"] >= 1 and got[s]["ctx_calls"] == 2 * got[s]["ctx_chunks"] for s in (1, 2)), got
    assert torch.isfinite(torch.tensor(got[2]["eval_loss"]))


@pytest.mark.parametrize("argv, message", [
    (["--ownctx-chunks", "4"], r"has 25 frames, 4 chained chunks of 9 need 33; pass --ownctx-chunks 3 or fewer"),
    (["--objective", "sft", "--ownctx-chunks", "2"], r"--ownctx-chunks does nothing with --objective sft"),
    (["--ownctx-true-share", "1"], r"0 <= true_share < 1"),
    (["--guidance", "3"], r"the context is generated without CFG")])
def test_too_short_episodes_and_unused_or_bad_settings_are_refused_in_one_line(tiny_action_grid, tmp_path, argv,
                                                                               message):
    args = ["--config", "tiny-action", "--objective", "ownctx", "--data", tiny_action_grid, "--out",
            str(tmp_path / "x"), *TINY, *argv]
    proc = in_process(train, args)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert re.search(message, proc.stderr), proc.stderr
    assert not os.path.exists(tmp_path / "x")


def test_a_resumed_run_ends_bit_for_bit_equal(tiny_action_grid, tmp_path):
    """The draws depend on (seed, step, sample) only and the objective holds no state of its own: a run resumed
    from its step 2 redoes step 3 exactly (the same context, loss, gradient and weights)."""
    args = ["--config", "tiny-action", "--objective", "ownctx", "--data", tiny_action_grid, "--ownctx-context-steps",
            "2", "--ownctx-true-share", "0.5", "--steps", "3", "--save-every", "1", "--sample-every", "0", "--warmup",
            "1", "--holdout", "4"]
    ref, resumed = rerun_last_step(train, args, str(tmp_path), 3)
    want, got = step_rows(ref)[3], step_rows(resumed)[3]
    assert all(got[k] == want[k] for k in ("loss", "grad_norm", "ctx_chunks", "ctx_calls")), (got, want)
    a, b = (dcp_tensors(os.path.join(d, "step_00000003"), "model.") for d in (ref, resumed))
    assert a and a.keys() == b.keys() and all(torch.equal(v, b[k]) for k, v in a.items())
