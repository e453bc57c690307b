"""agent.py (a policy run as policyeval.py's policy plug-in) and the success flags the policy's returns come from:
the run loaded strictly or refused in one line, a chunk of the task's length in the data's units, best-of-N keeping
the highest value of candidates that include the N=1 sample, policyeval refusing before any model is built; stitch.py
keeping a LeRobot dataset's next.success / next.reward as each episode's flag."""
import json
import os

import numpy as np
import pytest
import torch

import agent
from base.actions import action_file, read_arrays
from run_utils import check, in_process


@pytest.fixture(scope="module")
def policy_run(tiny_action_grid, tmp_path_factory):
    import train
    out = str(tmp_path_factory.mktemp("runs") / "policy")
    check(in_process(train, ["--objective", "policy", "--policy-success", "all", "--data", tiny_action_grid, "--out",
                             out, "--steps", "2", "--save-every", "2", "--batch-size", "2",
                             "--policy-eval-samples", "2"]))
    return out


def info_for(run, steps, proprio=True):
    with open(os.path.join(run, "policy_stats.json")) as f:
        stats = json.load(f)
    state = (np.array(stats["observation.state"]["min"]) + np.array(stats["observation.state"]["max"])) / 2
    return {"task": {"episode": np.arange(2)}, "steps": steps, "action_dim": 2, "seed": 3, "chunk": 1,
            **({"proprio": np.stack([state, state + 1]).astype(np.float32)} if proprio else {})}, stats


def test_agent_acts_in_the_data_units_and_best_of_n_keeps_the_highest_value(policy_run):
    frames = torch.rand(2, 3, 3, 64, 112) * 2 - 1
    info, stats = info_for(policy_run, steps=12)  # 12 actions of a chunk-8 policy: a second sub-chunk, imagined
    one = agent.Agent(policy_run, 1, device="cpu")
    actions = one(frames, info)
    assert actions.shape == (2, 12, 2) and torch.isfinite(actions).all()
    low, high = np.array(stats["action"]["min"]), np.array(stats["action"]["max"])
    assert (actions.numpy() >= low - 1e-4).all() and (actions.numpy() <= high + 1e-4).all()
    assert not torch.equal(actions, one(frames, dict(info, chunk=2)))
    assert torch.equal(actions, one(frames, info))  # noise from (seed, episode, chunk) alone
    three = agent.Agent(policy_run, 3, device="cpu", score="policy")
    best = three(frames, info)
    # candidate 0 of each episode is the N=1 sample (the same noise draw): the kept value is at least its value
    assert (three.last_values >= one.last_values - 1e-6).all() and (three.last_spread > 0).all()
    planned = agent.Agent(policy_run, 3, device="cpu")  # scored by a world-model sample of each candidate
    assert planned(frames, info).shape == best.shape == actions.shape and (planned.last_spread > 0).all()
    assert not torch.equal(planned.last_values, three.last_values)
    explored = agent.Agent(policy_run, 3, device="cpu", explore=0.5)  # candidates 1, 2 shifted, then scored
    keys = [(3, "agent", 0, 1, 0)]
    offsets = explored.offsets(keys, 3)
    assert offsets.shape == (3, 2) and not offsets[0].any() and offsets[1:].abs().min() > 0
    assert torch.equal(offsets, explored.offsets(keys, 3)) and not torch.equal(offsets, explored.offsets(
        [(3, "agent", 1, 1, 0)], 3))  # from the key alone
    assert explored(frames, info).shape == actions.shape and (explored.last_spread > 0).all()
    assert not torch.equal(explored.last_values, planned.last_values)
    for bad, score in (("-1", "world_model"), ("x", "world_model"), ("0.1", "policy")):
        with pytest.raises(ValueError, match="POLICY_EXPLORE"):
            agent.explore_setting(bad, score)
    with pytest.raises(ValueError, match="POLICY_SCORE"):
        agent.Agent(policy_run, 3, score="value")
    with pytest.raises(ValueError, match="info has no 'proprio'"):
        one(frames, info_for(policy_run, 8, proprio=False)[0])
    with pytest.raises(ValueError, match="trained at"):
        one(frames[..., :56], info)


def test_agent_refuses_what_is_not_a_policy_run(policy_run, tiny_action_grid, tmp_path, monkeypatch):
    import policyeval
    import train
    with pytest.raises(ValueError, match="POLICY_RUN is not set"):
        agent.run_of("")
    with pytest.raises(ValueError, match="not a train.py run directory"):
        agent.run_of(str(tmp_path))
    sft = str(tmp_path / "sft")
    check(in_process(train, ["--data", tiny_action_grid, "--out", sft, "--steps", "1", "--save-every", "1",
                             "--sample-every", "0", "--eval-every", "0"]))
    with pytest.raises(ValueError, match="objective sft, not a policy run"):
        agent.run_of(sft)
    for bad in ("0", "x", "-2"):
        with pytest.raises(ValueError, match="POLICY_BEST_OF"):
            agent.best_of_setting(bad)
    # policyeval asks the plug-in first (act.prepare): refused before its own run is even opened
    monkeypatch.setenv(agent.BEST_OF_ENV, "2")
    monkeypatch.setenv(agent.RUN_ENV, sft)
    refused = in_process(policyeval, [str(tmp_path / "no-run"), "--policies", "agent:act"])
    assert refused.returncode == 2 and "not a policy run" in refused.stderr, refused.stderr
    monkeypatch.setenv(agent.RUN_ENV, policy_run)
    assert agent.prepare().best_of == 2 and agent.prepare() is agent.prepare()
    # the tiny layout has proprio slots, which policyeval's world model cannot give: refused before its run is opened
    refused = in_process(policyeval, [str(tmp_path / "no-run"), "--policies", "agent:act"])
    assert refused.returncode == 2 and "has proprio slots" in refused.stderr and "--policy-layout" in refused.stderr


def test_a_policy_knows_the_layout_of_its_frames(tmp_path):
    """agent.frame_layout: a stitch.py --layout one folder's RECIPE.json says "one" (the simulator must render that;
    policyeval's world model gives grids, so prepare_for_policyeval refuses it); a grid folder's, or none, "grid"."""
    assert agent.frame_layout(str(tmp_path)) == "grid"
    for written, read in (({"stride": 4}, "grid"), ({"stride": 4, "layout": "one"}, "one")):
        with open(tmp_path / "RECIPE.json", "w") as f:
            json.dump(written, f)
        assert agent.frame_layout(str(tmp_path)) == read


def test_stitch_keeps_each_episode_success_flag(tmp_path):
    """next.success (any row true) or else next.reward (any row >= 1) -> actions/<stem>.npz `success`; a dataset with
    neither writes none (and the policy refuses it unless --policy-success all: test_policy.py)."""
    import stitch
    from base.lerobot_write import write_v21
    rng = np.random.default_rng(0)

    def episode(success, column):
        n = 12
        cols = {"observation.state": rng.random((n, 2)), "action": rng.random((n, 2))}
        if column:
            cols[column] = np.zeros((n, 1)) + (np.arange(n)[:, None] == 7) * (1.0 if success else 0.5)
        return {"frames": {"observation.image": rng.integers(0, 255, (n, 32, 32, 3), dtype=np.uint8)},
                "task": "push", "columns": cols}
    for k, column in enumerate(("next.success", "next.reward", None)):
        src = str(tmp_path / f"src{k}")
        write_v21(src, [episode(True, column), episode(False, column)], fps=10)
        out = str(tmp_path / f"out{k}")
        key = "observation.image"
        stitch.stitch(src, out, stride=4, frames=3, size="64x112", workers=1, fit="stretch",
                      cameras=f"ext_1={key},ext_2={key},wrist={key}")
        flags = [read_arrays(action_file(out, f"src{k}__ep{i:06d}"), ("action", "success")).get("success")
                 for i in range(2)]
        if column is None:
            assert flags == [None, None]
        else:  # next.success 0.5 counts as true (> 0); next.reward 0.5 does not reach 1
            assert [f.tolist() for f in flags] == [[1.0], [1.0 if column == "next.success" else 0.0]], column


def test_a_released_policy_pt_loads_strictly_through_init(tiny_action_grid, tmp_path):
    """`--init FILE.pt` (a released Cosmos-Policy checkpoint: the Predict2 DiT's state dict under `net.`, no new key)
    loads strictly into the policy objective's net: here a fabricated .pt of the tiny DiT's key table (random values,
    so the init guard's ratio is loosened for it alone); one unexpected key and the run is refused before training."""
    import train
    from base.inits import get_config
    from model import DiT
    state = {f"net.{k}": v for k, v in DiT(get_config("tiny")).state_dict().items()}
    good, bad = str(tmp_path / "policy.pt"), str(tmp_path / "extra.pt")
    torch.save(state, good)
    torch.save(dict(state, **{"net.action_head.weight": torch.zeros(2, 2)}), bad)
    common = ["--objective", "policy", "--policy-success", "all", "--data", tiny_action_grid, "--steps", "1",
              "--save-every", "1", "--batch-size", "2", "--policy-eval-samples", "2", "--guard-max-ratio", "100"]
    ran = in_process(train, common + ["--init", good, "--out", str(tmp_path / "ok")])
    check(ran)
    assert "missing 0, unexpected 0, shape mismatch 0" in ran.stdout + ran.stderr
    refused = in_process(train, common + ["--init", bad, "--out", str(tmp_path / "no")])
    assert refused.returncode != 0 and "action_head" in refused.stdout + refused.stderr
    assert not os.path.isdir(tmp_path / "no" / "step_00000001")


def test_a_policy_run_acts_inside_policyeval(tiny_action_grid, tmp_path, monkeypatch):
    """policyeval.py --policies agent:act: a policy run of a layout without proprio slots (a world model gives none)
    acts in the tiny-action world model and in tasks/square's simulator; policyeval's 32-action chunks come from its
    chunk of 8, chained on its own predicted futures, best of 2."""
    import policyeval
    import train
    act, run, out = str(tmp_path / "act"), str(tmp_path / "policy"), str(tmp_path / "eval")
    check(in_process(train, ["--config", "tiny-action", "--data", tiny_action_grid, "--steps", "2", "--out", act,
                             "--sample-every", "0", "--workers", "0"]))
    check(in_process(train, ["--objective", "policy", "--policy-success", "all", "--policy-layout",
                             "blank,image:grid,action,future_image:grid,value", "--data", tiny_action_grid, "--steps",
                             "2", "--batch-size", "2", "--policy-eval-samples", "2", "--out", run]))
    monkeypatch.setenv(agent.RUN_ENV, run)
    monkeypatch.setenv(agent.BEST_OF_ENV, "2")
    proc = check(in_process(policyeval, [act, "--policies", "agent:act,tasks.square:stand_still", "--episodes", "2",
                                         "--chunks", "1", "--steps", "2", "--videos", "0", "--out", out]))
    row = json.loads(proc.stdout.strip().splitlines()[-1])["policies"]["agent:act"]
    assert 0 <= row["success_world"] <= 1 and 0 <= row["success_sim"] <= 1, row
