"""policyeval.py and engine/world.py: the world model's closed loop is generate.rollout's chain, the plug-ins are
refused in one line before any model is built, the agreement metrics by hand, and one small run end to end."""
import json
import os
import sys

import numpy as np
import pytest
import torch

import policyeval
import train
from base.inits import get_config
from condition import Condition
from engine.generate import join, rollout
from engine.world import closed_loop, model_world
from model import build_model
from nets.vae import LinearCodec
from run_utils import check, in_process
from tasks import square

SHORT = ["--sample-every", "0", "--save-every", "100", "--workers", "0"]


@pytest.fixture(scope="module")
def action_run(tiny_action_grid, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("runs") / "act")
    check(in_process(train, ["--config", "tiny-action", "--data", tiny_action_grid, "--steps", "4", "--out", out]
                     + SHORT))
    return out


def test_the_world_models_closed_loop_is_generate_rollouts_chain_bit_for_bit():
    """The same actions, fed by a policy chunk by chunk, give generate.rollout's chunks to the bit (batch 1); in a
    batch of 3 each episode's chunks are its own whatever shares its batch (per-episode noise)."""
    torch.manual_seed(0)
    net, vae = build_model(get_config("tiny-action")).eval(), LinearCodec()
    text = torch.randn(1, 16, 1024)
    raw = torch.randn(3, 2 * 32, 2)  # 2 chunks of 32 raw actions, 3 episodes
    normalise = lambda a: np.asarray(a).reshape(*np.asarray(a).shape[:-2], 8, 8) * 0.5  # noqa: E731 (a stand-in)
    first = torch.rand(3, 3, 1, 64, 112) * 2 - 1

    def replay(frames, info):  # the episodes' recorded actions, chunk by chunk
        return raw[info["rows"], 32 * info["chunk"]: 32 * (info["chunk"] + 1)]
    chains = []
    for e in range(3):
        conds = [Condition(crossattn_emb=text, action=torch.from_numpy(normalise(raw[e:e + 1, 32 * k: 32 * (k + 1)])))
                 for k in range(2)]
        chains.append(rollout(net, vae, first[e:e + 1], conds, 9, 3, 0.0, 100 * e, "karras", torch.float32))
    step = model_world(net, vae, Condition(crossattn_emb=text), normalise, 9, 3, 0.0, [0], "karras", torch.float32,
                       first[:1])
    one = closed_loop(step, replay, "replay", first[:1], {"rows": [0]}, 2, (1, 32, 2))["frames"]
    # frame 0 is the start frame itself (rollout's chunk 0 holds its codec reconstruction there); every later frame:
    assert torch.equal(one[:, :, :1], first[:1]) and torch.equal(one[:, :, 1:], join(chains[0])[:, :, 1:])
    step = model_world(net, vae, Condition(crossattn_emb=text.expand(3, -1, -1)), normalise, 9, 3, 0.0, [0, 100, 200],
                       "karras", torch.float32, first)
    batch = closed_loop(step, replay, "replay", first, {"rows": [0, 1, 2]}, 2, (3, 32, 2))["frames"]
    for e in range(3):
        torch.testing.assert_close(batch[e:e + 1, :, 1:], join(chains[e])[:, :, 1:], rtol=0, atol=1e-5)


def test_plugins_are_refused_in_one_line_before_any_model(action_run, tiny_action_grid, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "mine.py").write_text(
        "import torch\n"
        "def short(frames, info): return torch.zeros(len(frames), 5, 2)\n"
        "def transposed(frames, info): return torch.zeros(len(frames), 2, info['steps'])\n"
        "def flat(frames, info): return torch.zeros(len(frames), info['steps'] * 2)\n"
        "def nan(frames, info): return torch.full((len(frames), info['steps'], 2), float('nan'))\n"
        "def half(frames, info): return torch.full((len(frames) + 1,), 0.5)\n"
        "def above(frames, info): return torch.full((len(frames),), 2.0)\n")
    base = [action_run, "--episodes", "2", "--chunks", "1", "--steps", "1", "--videos", "0", "--out",
            str(tmp_path / "o")]

    def refused(*flags, says):
        proc = in_process(policyeval, base + list(flags))
        assert proc.returncode == 2 and says in proc.stderr and proc.stderr.count("error:") == 1, proc.stderr
    refused("--policies", "nosuchmodule:fn", says="--policies 'nosuchmodule:fn': no module 'nosuchmodule'")
    refused("--policies", "mine:nothing", says="--policies 'mine:nothing': module 'mine'")
    refused("--policies", "mine", says="--policies 'mine': give module:function")
    refused("--policies", "mine.py:short", says="give the module, not its file: mine:short")
    refused("--judge", "mine:nothing", says="has no function 'nothing'")
    refused("--task", "nosuchtask", says="--task 'nosuchtask': cannot be imported")
    refused("--task", "mine", says="--task mine: has no sample_tasks or first_frames")
    refused("--task", "held-out", says="--policies: none given, and --task held-out has no POLICIES")
    refused("--policies", "mine:short", says="mine:short returned actions of shape (2, 5, 2); expected finite [2, 32, 2]")
    refused("--policies", "mine:transposed", says="returned actions of shape (2, 2, 32); expected finite [2, 32, 2]")
    refused("--policies", "mine:flat", says="returned actions of shape (2, 64); expected finite [2, 32, 2]")
    refused("--policies", "mine:nan", says="mine:nan returned actions of shape (2, 32, 2) with NaN/Inf")
    refused("--judge", "mine:half", says="--judge returned (3,) values")
    refused("--judge", "mine:above", says="expected [2] successes in [0, 1]")
    refused("--episodes", "0", says="--episodes 0")
    plain = str(tmp_path / "plain")  # a net without actions, on the same folder
    check(in_process(train, ["--data", tiny_action_grid, "--steps", "1", "--out", plain] + SHORT))
    proc = in_process(policyeval, [plain] + base[1:])
    assert proc.returncode == 2 and "takes no actions (action_dim 0)" in proc.stderr, proc.stderr


def test_agreement_by_hand():
    world, sim = [0.9, 0.7, 0.6, 0.0], [1.0, 0.5, 0.8, 0.0]
    assert policyeval.mmrv(world, sim) == pytest.approx((0.0 + 0.3 + 0.3 + 0.0) / 4)  # policies 2 and 3 swapped
    assert policyeval.mmrv(sim, sim) == 0.0
    assert policyeval.pearson(policyeval.ranks(np.array(world)), policyeval.ranks(np.array(sim))) == pytest.approx(0.8)
    assert list(policyeval.ranks(np.array([0.0, 0.5, 0.0]))) == [0.5, 2.0, 0.5]
    assert policyeval.ranking(world, sim)["calibration"] == pytest.approx((0.1 + 0.2 + 0.2 + 0.0) / 4)


def test_calibration_and_each_familys_ranking_by_hand():
    """agreement: calibration is the mean |world - sim| success over the policies; each family of 2+ policies ranked
    alone; the judge's agreement with the simulator's own state over every simulator episode."""
    frames = torch.zeros(2, 3, 9, 4, 4)
    def result(world, sim, family, state=None):
        return {"world": frames, "sim": frames, "success_world": torch.tensor(world), "success_sim": torch.tensor(sim),
                "family": family, "state_sim": None if state is None else torch.tensor(state)}
    results = {"a": result([1.0, 1.0], [1.0, 1.0], "one", [1.0, 1.0]), "b": result([0.0, 1.0], [1.0, 0.0], "one",
                                                                                    [1.0, 1.0]),
               "c": result([0.0, 0.0], [0.0, 0.0], "two"), "d": result([1.0, 0.0], [0.0, 0.0], "lone")}
    summary = policyeval.agreement(results, chunks=1, frames=9)
    assert summary["calibration"] == pytest.approx((0 + 0 + 0 + 0.5) / 4)  # success rates: b is 0.5 in both
    assert list(summary["families"]) == ["one"]  # "two" and "lone" hold one policy each
    assert summary["families"]["one"]["calibration"] == 0.0 and summary["families"]["one"]["policies"] == 2
    assert summary["judge_vs_state"] == 0.75  # b's second episode: the judge says 0, the state 1
    assert summary["policies"]["d"]["family"] == "lone" and "calibration" in policyeval.table(summary)


def test_a_small_evaluation_end_to_end(action_run, tmp_path):
    """Two reference policies, 4 episodes, 2 chunks: result.json, the table, a JSON line, side-by-side mp4s."""
    out = str(tmp_path / "eval")
    proc = check(in_process(policyeval, [action_run, "--policies", "tasks.square:go_to_target,tasks.square:stand_still",
                                         "--episodes", "4", "--chunks", "2", "--steps", "2", "--batch", "3",
                                         "--videos", "1", "--out", out]))
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    with open(os.path.join(out, "result.json")) as f:
        assert json.load(f) == summary
    policies = summary["policies"]
    assert list(policies) == ["tasks.square:go_to_target", "tasks.square:stand_still"]
    assert policies["tasks.square:go_to_target"]["success_sim"] == 1.0
    assert policies["tasks.square:stand_still"]["success_sim"] == 0.0
    assert {"spearman", "pearson", "mmrv", "calibration", "false_success", "psnr_per_chunk", "s_per_chunk",
            "s_first_chunk", "s_per_chunk_warm", "warnings"} <= set(summary) and summary["s_per_chunk_warm"] > 0
    assert summary["judge_vs_state"] == 1.0 and policies["tasks.square:stand_still"]["family"] == "reference"
    assert len(policies["tasks.square:stand_still"]["psnr_per_chunk"]) == 2
    assert sorted(os.listdir(out)) == ["go_to_target_ep0.mp4", "ranking.png", "result.json", "stand_still_ep0.mp4"]
    assert "Spearman" in proc.stdout and "false success" in proc.stdout
    assert sys.modules["tasks.square"] is square  # the default task is tasks/square.py


def test_held_out_mode_starts_at_frame_0_keeps_finished_policies_and_says_what_it_lacks(action_run, tmp_path,
                                                                                        monkeypatch, capsys):
    """--task held-out: every episode starts at its held-out video's frame 0 (not a random window), the repeats are
    said; a policy copied from tasks/square.py (info["task"]["target"]) fails naming itself and the keys there, and
    the policies evaluated before it stay in a partial result.json; actions far outside the data's range are warned
    about; no ranking.png and world-model-alone mp4s are said."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "heldmine.py").write_text(
        "import torch\n"
        "def still(frames, info): return torch.zeros(len(frames), info['steps'], info['action_dim'])\n"
        "def far(frames, info): return torch.full((len(frames), info['steps'], info['action_dim']), 1e4)\n"
        "def copied(frames, info): return info['task']['target']\n"
        "def judge(frames, info): return torch.zeros(len(frames))\n")
    out = str(tmp_path / "o")
    base = [action_run, "--task", "held-out", "--judge", "heldmine:judge", "--episodes", "3", "--chunks", "1",
            "--steps", "1", "--videos", "1", "--out", out]
    proc = check(in_process(policyeval, base + ["--policies", "heldmine:still,heldmine:far"]))
    assert "WARNING: heldmine:far: 100.0% of its action values outside the data's range" in proc.stdout
    assert not [line for line in proc.stdout.splitlines() if line.startswith("policyeval: WARNING: heldmine:still:")
                and "outside the data" in line]
    assert "heldmine:still: the world model's frames change" in proc.stdout  # a 4-step world model: noise, said
    assert "no ranking.png" in proc.stdout and "world model alone" in proc.stdout
    assert sorted(os.listdir(out)) == ["far_ep0_world.mp4", "result.json", "still_ep0_world.mp4"]
    run = policyeval.open_run(action_run)
    n = 2 * len(run.held_out) + 1
    capsys.readouterr()
    tasks, first = policyeval.start_states(policyeval.PolicyEvalConfig(run=action_run, task="held-out", episodes=n),
                                           None, run)
    assert f"{n} episodes start from the {len(run.held_out)} held-out episodes' frame 0" in capsys.readouterr().out
    for e in range(n):
        video = run.dataset.videos[int(tasks["video"][e])]
        assert tasks["stem"][e] == video.stem
        frame0 = torch.from_numpy(policyeval.cache.data.read_clip(video.path, 0, 1, 64, 112)[0]).permute(2, 0, 1)
        assert torch.equal(first[e, :, 0], frame0.float().div(127.5).sub(1.0))
    proc = in_process(policyeval, base + ["--policies", "heldmine:still,heldmine:copied"])
    assert proc.returncode == 2 and proc.stderr.count("error:") == 1, proc.stderr
    assert "policy heldmine:copied" in proc.stderr and "KeyError" in proc.stderr and "'stem'" in proc.stderr
    with open(os.path.join(out, "result.json")) as f:
        kept = json.load(f)
    assert kept["partial"] and list(kept["policies"]) == ["heldmine:still"] and "heldmine:copied" in kept["error"]


def test_a_world_of_noise_and_a_single_policy_are_said():
    calm = torch.zeros(2, 3, 9, 8, 8)
    calm[:, :, 1:] += 0.05
    noise = torch.rand(2, 3, 9, 8, 8) * 2 - 1
    summary = {"policies": {"a:calm": {"frame_change": policyeval.frame_change(calm), "max_action_sd": 1.0},
                            "a:noise": {"frame_change": policyeval.frame_change(noise), "max_action_sd": 1.0}}}
    said = policyeval.warnings(summary, data_change=0.01)
    assert len(said) == 1 and said[0].startswith("a:noise: the world model's frames change") and "noise" in said[0]
    one = {"policies": {"a:x": {"success_world": 0.5, "success_sim": 0.5}}, "spearman": float("nan"),
           "pearson": float("nan"), "mmrv": 0.0, "calibration": 0.0, "false_success": None, "families": {},
           "judge_vs_state": None}
    assert "nan: one policy" in policyeval.table(one)


def test_action_guidance_guides_along_the_action_alone_and_is_refused_with_prompt_guidance():
    """--action-guidance G (docs/policyeval.md "Action guidance"): CFG's uncond branch keeps the prompt and takes the
    still command (Condition.neg_action) in place of the action: x0 + G (x0 - x0_still); without neg_action the
    uncond branch is upstream's (the negative prompt, the same action)."""
    from dataclasses import replace
    from condition import has_uncond, uncond
    from nets import edm
    torch.manual_seed(0)
    net = build_model(get_config("tiny-action")).eval()
    text, neg, action, still = torch.randn(1, 4, 1024), torch.randn(1, 4, 1024), torch.randn(1, 8, 8), torch.zeros(1, 8, 8)
    cond = Condition(crossattn_emb=text, neg_crossattn_emb=neg, action=action)
    assert uncond(cond).crossattn_emb is neg and uncond(cond).action is action
    guided = replace(cond, neg_action=still)
    assert uncond(guided).crossattn_emb is text and uncond(guided).action is still
    assert has_uncond(replace(guided, neg_crossattn_emb=None)) and not has_uncond(replace(cond, neg_crossattn_emb=None))
    x, sigma = torch.randn(1, 16, 3, 8, 8), torch.full((1,), 3.0)
    with torch.no_grad():
        x0, x0_still = (edm.denoise(net, x, sigma, replace(cond, action=a))[0] for a in (action, still))
        assert torch.allclose(edm.guided_x0_fn(net, replace(guided, neg_crossattn_emb=None), 2.0)(x, sigma),
                              x0 + 2.0 * (x0 - x0_still), atol=1e-5)
    for bad in (dict(action_guidance=-1.0), dict(action_guidance=1.0, guidance=2.0)):
        with pytest.raises(ValueError, match="--action-guidance"):
            policyeval.PolicyEvalConfig(run="r", **bad)
