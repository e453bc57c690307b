"""policy.py (Cosmos-Policy): inject/extract round trips, the per-type mask table, no loss on conditioning slots, the
hybrid noise draw, the 80 -> 4 sampler, the data's returns and statistics, and a few steps through train.py (on the
session's tiny-action folder, which other tests build anyway: the recipe's orbit folder has the same layout)."""
import json
import math
import os
import shutil

import numpy as np
import pytest
import torch

import policy
from base.actions import action_file, read_arrays
from run_utils import check, in_process

POLICY = ["--objective", "policy", "--policy-success", "all"]  # the tiny-action folder has no success flags


@pytest.mark.parametrize("n", [16, 21, 1])  # 16 divides the 16x2x4 frame, 21 does not, 1: the value
def test_inject_extract_round_trip(n):
    values = torch.rand(3, n, dtype=torch.float64) * 2 - 1
    frame = policy.inject(values, (16, 2, 4))
    assert frame.shape == (3, 16, 2, 4)
    assert torch.equal(frame.flatten(1)[:, :n], values) and torch.equal(frame.flatten(1)[:, n: 2 * n], values)
    torch.testing.assert_close(policy.extract(frame, n), values, rtol=0, atol=1e-12)
    if 128 % n:  # the tail is cut: a partial copy, left out of the mean
        assert torch.equal(frame.flatten(1)[:, 128 // n * n:], values[:, :128 % n])
    with pytest.raises(ValueError, match="do not fit one latent frame"):
        policy.inject(torch.zeros(1, 129), (16, 2, 4))


def test_min_max_normalisation_round_trip():
    low, high = np.array([-8.0, 0.0, 3.0]), np.array([8.0, 116.0, 3.0])  # the last dim constant
    x = np.array([[-8.0, 116.0, 3.0], [4.0, 29.0, 3.0]])
    unit = policy.to_unit(x, low, high)
    np.testing.assert_allclose(unit, [[-1, 1, 0], [0.5, -0.5, 0]], atol=1e-7)
    np.testing.assert_allclose(policy.from_unit(unit, low, high)[:, :2], x[:, :2], atol=1e-5)


def test_mask_table_per_sample_type():
    """Clean (conditioning) slots per sample type: policy conditions on the current state; world model also on the
    action; value on everything but the value. 1 = clean."""
    table = {t: [int(c) for c in policy.condition_slots("libero", t)] for t in policy.SAMPLE_TYPES}
    # blank, proprio, wrist, agentview, action, future proprio, future wrist, future agentview, value
    assert table == {"policy": [1, 1, 1, 1, 0, 0, 0, 0, 0],
                     "world_model": [1, 1, 1, 1, 1, 0, 0, 0, 0],
                     "value": [1, 1, 1, 1, 1, 1, 1, 1, 0]}
    assert len(policy.slots("robocasa")) == 11 and len(policy.slots("tiny")) == 7
    assert [int(c) for c in policy.condition_slots("robocasa", "world_model")] == [1] * 6 + [0] * 5
    for bad in ("proprio,action,value", "blank,image,action,value", "blank,action,action,value", "blank,jump,value"):
        with pytest.raises(ValueError, match="--policy-layout"):
            policy.slots(bad)


class VelocityNet(torch.nn.Module):
    """A stand-in network whose output is one parameter, so the loss's gradient w.r.t. the output is readable."""

    def __init__(self, shape):
        super().__init__()
        self.out = torch.nn.Parameter(torch.randn(shape))
        self.seen = []

    def forward(self, x, t_B_T, cond):
        self.seen.append((x.detach().clone(), t_B_T.detach().clone()))
        return self.out


def batch_condition(x0, types, layout="tiny"):
    items = [{"text_emb": torch.zeros(4, 8)} for _ in types]
    return policy.condition_of(items, x0, layout, types, x0.device, torch.float32)


def test_conditioning_slots_carry_no_loss():
    x0 = torch.randn(3, 16, 7, 2, 4)
    types = ["policy", "world_model", "value"]
    net = VelocityNet(x0.shape)
    loss = policy.policy_loss(net, x0, batch_condition(x0, types), [1, 2, 3], loss_scale=10.0)
    loss.backward()
    per_slot = net.out.grad.abs().sum(dim=(1, 3, 4))  # [B, slots]
    for b, t in enumerate(types):
        clean = torch.tensor(policy.condition_slots("tiny", t))
        assert (per_slot[b][clean] == 0).all() and (per_slot[b][~clean] > 0).all(), (t, per_slot[b])
    # the clean slots enter the network as they are (no noise), told sigma 1e-4
    x_in, t_in = net.seen[0]
    clean = torch.tensor(policy.condition_slots("tiny", "policy"))
    assert torch.equal(x_in[0][:, clean], x0[0][:, clean])
    assert torch.allclose(t_in[0][clean], torch.tensor(1e-4 / (1 + 1e-4)))


def test_hybrid_sigma_draw():
    g = torch.Generator().manual_seed(0)
    frames = 9
    sigma = np.array([policy.draw_sigma(g, frames) for _ in range(20000)]) / math.sqrt(frames)
    # E[ln sigma] = 0.7 ln 4 + 0.3 E[ln U(1, 85)], E[ln U(1, 85)] = (85 ln 85 - 84) / 84
    expected = 0.7 * math.log(4) + 0.3 * (85 * math.log(85) - 84) / 84
    assert abs(np.log(sigma).mean() - expected) < 0.04, np.log(sigma).mean()
    above = (sigma > 85).mean()  # only the log-normal's tail: 0.7 P(N(ln 4, 1.2) > ln 85) = 0.7 * 0.0055
    assert abs(above - 0.7 * 0.0055) < 0.002, above


def test_sampler_80_to_4_in_five_calls_conditioning_kept():
    x0 = torch.randn(2, 16, 7, 2, 4)
    net = VelocityNet(x0.shape)
    cond = batch_condition(x0, ["policy", "policy"])
    out = policy.sample(net, cond, torch.randn(x0.shape))
    assert len(net.seen) == 5  # 4 solver steps and a clean pass
    generated = ~torch.tensor(policy.condition_slots("tiny", "policy"))
    sigmas = [float(t[0, generated][0] / (1 - t[0, generated][0])) for _, t in net.seen]
    np.testing.assert_allclose([sigmas[0], sigmas[-1]], [80.0, 4.0], rtol=1e-5)
    assert all(a > b for a, b in zip(sigmas, sigmas[1:-1]))  # decreasing; the clean pass at the last level, 4
    assert sigmas[-2] > sigmas[-1] or math.isclose(sigmas[-2], sigmas[-1], rel_tol=1e-6)
    assert torch.equal(out[:, :, ~generated], x0[:, :, ~generated])


def test_orbit_expert_acts_on_the_position_alone():
    """The tiny policy's expert: its command is a function of the square's position (a policy can read it off one
    frame), and the square moves by it exactly."""
    from base import lerobot
    pos, act = lerobot.square_commands(3, 100, orbit=True)
    assert len({tuple(a) for a in act[:-1]}) > 3  # it turns
    for p, a, nxt in zip(pos[:-1], act[:-1], pos[1:]):
        (x_lo, x_hi), (y_lo, y_hi) = lerobot.SQUARE_RANGE
        command = np.array(lerobot.orbit_command(p))
        np.testing.assert_array_equal(a, np.clip(p + command, (x_lo, y_lo), (x_hi, y_hi)) - p)
        np.testing.assert_array_equal(nxt, p + a)


def test_orbit_episodes_are_written_and_checked(tmp_path):
    """make_synthetic(motion="orbit") writes the expert's positions as observation.state; check_synthetic tells an
    orbit folder from an actions one (the tiny policy's folder is rebuilt, never reused from the other)."""
    from base import lerobot
    root = lerobot.make_synthetic(str(tmp_path / "orbit"), lengths=(12, 10), motion="orbit")
    lerobot.check_synthetic(root, (12, 10), "orbit", stitched="X")
    with pytest.raises(ValueError, match="other square commands"):
        lerobot.check_synthetic(root, (12, 10), "actions", stitched="X")


def test_policy_data_returns_and_statistics(tiny_action_grid, tmp_path):
    text = dict(text_len=4, text_dim=8, text="standin", seed=0, text_encoder="t5")
    with pytest.raises(ValueError, match="no success flag.*--policy-success all"):  # values need returns
        policy.PolicyData(tiny_action_grid, "tiny", chunk=8, gamma=0.99, height=64, width=112, text=text)
    data = policy.PolicyData(tiny_action_grid, "tiny", chunk=8, gamma=0.99, height=64, width=112, text=text,
                             success="all")
    assert data.stride == 4 and data.steps == 2 and (data.action_dim, data.state_dim) == (2, 2)
    with pytest.raises(ValueError, match="multiple of"):
        policy.PolicyData(tiny_action_grid, "tiny", chunk=6, gamma=0.99, height=64, width=112, text=text,
                          success="all")
    with pytest.raises(ValueError, match="layout views"):  # libero's cameras are a views folder's
        policy.PolicyData(tiny_action_grid, "libero", chunk=8, gamma=0.99, height=64, width=112, text=text,
                          success="all")
    arrays = read_arrays(action_file(tiny_action_grid, data.episodes[0]["video"].stem), ("action", "state"))
    last = data.starts(0)[-1]  # its future frame is the episode's last: return 1 (success there)
    item = data.item(0, last)
    assert torch.equal(item["raw_action"], torch.from_numpy(arrays["action"][last: last + 2].reshape(-1)))
    assert item["value"].item() == 1.0 and item["action"].shape == (16,) and item["image:grid"].shape == (3, 64, 112)
    assert item["action"].abs().max() <= 1 and item["proprio"].abs().max() <= 1
    first = data.item(0, 0)
    steps = (len(arrays["state"]) - 1 - 2) * 4
    assert math.isclose(first["value"].item(), 2 * 0.99 ** steps - 1, rel_tol=1e-6)
    low, high = np.array(data.record()["action"]["min"]), np.array(data.record()["action"]["max"])
    # a failed episode (an npz `success` flag of 0, as stitch.py writes from next.success): return -1
    copy = str(tmp_path / "copy")
    shutil.copytree(tiny_action_grid, copy)
    for e, ep in enumerate(data.episodes):
        path = action_file(copy, ep["video"].stem)
        np.savez(path, **read_arrays(path, ("action", "state")), success=np.array([float(e > 0)], np.float32))
    failed = policy.PolicyData(copy, "tiny", chunk=8, gamma=0.99, height=64, width=112, text=text)
    assert not failed.success(0) and failed.item(0, last)["value"].item() == -1.0 and failed.success(1)
    np.testing.assert_allclose(policy.from_unit(first["action"].numpy().reshape(-1, 2), low, high),
                               arrays["action"][0:2].reshape(-1, 2), atol=1e-5)


def test_policy_trains_through_train_py(tiny_action_grid, tmp_path):
    import train
    out = str(tmp_path / "run")
    check(in_process(train, [*POLICY, "--data", tiny_action_grid, "--out", out, "--steps", "2",
                             "--save-every", "2", "--batch-size", "2", "--grad-accum", "2",
                             "--policy-eval-samples", "2"]))
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert rows[0]["step"] == 0 and rows[-1]["step"] == 2, rows
    for key in ("eval_loss", "eval_action_l1", "eval_action_l1_raw", "eval_action_l1_zero", "eval_psnr",
                "eval_value_error", "eval_proprio_l1", "eval_wm_psnr", "eval_wm_value_error", "eval_wm_proprio_l1"):
        assert all(math.isfinite(r[key]) for r in (rows[0], rows[-1])), key
    assert math.isfinite(rows[1]["loss"]) and rows[1]["grad_norm"] > 0
    with open(os.path.join(out, "policy_stats.json")) as f:
        stats = json.load(f)
    with open(os.path.join(tiny_action_grid, "action_stats.json")) as f:
        folder = json.load(f)
    assert stats["chunk"] == 8 and stats["action"]["min"] == folder["action"]["min"] and len(stats["layout"]) == 7
    # no new parameters or keys: the policy's checkpoint loads strictly into the plain tiny DiT (ckpt.load refuses a
    # missing, unexpected or reshaped key), as a released Cosmos-Policy file loads into v2w-2b (docs/policy.md)
    import ckpt
    from base.inits import get_config
    from model import DiT
    plain = DiT(get_config("tiny"))
    report = ckpt.load(plain, os.path.join(out, "step_00000002"), verbose=False)
    assert sorted(report.loaded) == sorted(plain.state_dict()) and not report.unexpected, report
    refused = in_process(train, [*POLICY, "--data", tiny_action_grid, "--out", str(tmp_path / "r2"),
                                 "--lora", "4"])  # refused before anything is built
    assert refused.returncode == 2 and "drop --lora" in refused.stderr, refused.stderr
    assert not os.path.exists(tmp_path / "r2")
    refused = in_process(train, [*POLICY, "--data", tiny_action_grid, "--out", str(tmp_path / "r3"),
                                 "--text-dropout", "0.1"])  # SFT's knob: nothing silently ignored
    assert refused.returncode == 2 and "--text-dropout does nothing with --objective policy" in refused.stderr


@pytest.mark.parametrize("layout,frames,chunk", [("libero", 9, 16), ("robocasa", 11, 32)])
def test_2b_layouts_on_the_unchanged_predict2_2b(layout, frames, chunk):
    """At 224 px the LIBERO (9 latent frames, 1,764 tokens) and RoboCasa (11) samples run through the plain v2w-2b
    net (meta device: shapes only), whose keys and shapes are exactly upstream's Predict2-2B-Video2World table: the
    key table of a released Cosmos-Policy checkpoint, which adds no parameter (`python ckpt.py check --config v2w-2b
    hf://nvidia/Cosmos-Policy-LIBERO-Predict2-2B/Cosmos-Policy-LIBERO-Predict2-2B.pt` loads the file strictly)."""
    import ckpt
    from base.inits import get_config
    from model import DiT
    with open(os.path.join(os.path.dirname(__file__), "data", "reference", "released_configs_keys.json")) as f:
        spec = json.load(f)["configs"]["_PREDICT2_VIDEO2WORLD_NET_2B"]
    with torch.device("meta"):
        net = DiT(get_config("v2w-2b"))
    ours = {k: tuple(v.shape) for k, v in net.state_dict().items()
            if not k.startswith("blocks.") or k.startswith("blocks.0.")}
    table = spec[[k for k in spec if k.startswith("keys_nonblock_and_block0")][0]]
    assert ours == {k: tuple(s) for k, s, _, kind in table if kind != "extra_state" and not ckpt.is_ignorable(k)}
    x0 = torch.zeros(1, 16, frames, 28, 28, device="meta")
    assert len(policy.slots(layout)) == frames and frames * (28 // 2) ** 2 == {9: 1764, 11: 2156}[frames]
    assert chunk * 7 <= 16 * 28 * 28  # the action chunk (7-dim) fits one latent frame
    cond = policy.condition_of([{"text_emb": torch.zeros(512, 1024, device="meta")}], x0, layout, ["policy"],
                               torch.device("meta"), torch.float32)
    assert net(x0, torch.zeros(1, frames, device="meta"), cond).shape == x0.shape


def test_policy_resume_is_bitwise(tiny_action_grid, tmp_path):
    """Samples and noise come from (seed, step, micro-batch, rank) only: 1 step, a restart, 1 more step gives the
    uninterrupted run's loss, gradient norm and validation bit for bit."""
    import train
    common = [*POLICY, "--data", tiny_action_grid, "--batch-size", "2", "--save-every", "1",
              "--policy-eval-samples", "2"]
    straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
    check(in_process(train, common + ["--out", straight, "--steps", "2"]))
    check(in_process(train, common + ["--out", split, "--steps", "1"]))
    check(in_process(train, common + ["--out", split, "--steps", "2"]))
    last = [[json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))][-1] for out in (straight, split)]
    keys = [k for k in last[0] if k == "loss" or k == "grad_norm" or k.startswith("eval_")]
    assert len(keys) > 5 and all(last[0][k] == last[1][k] for k in keys), (last, keys)


def test_views_folder_feeds_the_libero_layout(tmp_path):
    """A views folder (stitch.py --layout views) gives each camera its own slots: the libero layout's wrist and ext_1
    images are those cameras' own frames, and a sample encodes to its 9 latent frames."""
    import stitch
    from base import lerobot
    from base.video import read_clip
    from nets.vae import LinearCodec
    src = lerobot.make_synthetic(str(tmp_path / "src"), lengths=(24, 20, 20), motion="orbit")
    root = str(tmp_path / "views")
    stitch.stitch(src, root, stride=4, frames=1, size="64x112", workers=1, layout="views")
    text = dict(text_len=4, text_dim=8, text="standin", seed=0, text_encoder="t5")
    data = policy.PolicyData(root, "libero", chunk=8, gamma=0.99, height=64, width=112, text=text, success="all")
    item = data.item(1, 2)
    for camera in ("wrist", "ext_1"):
        frames = read_clip(data.episodes[1]["video"].views[camera].path, 0, 5, 64, 112)
        truth = torch.from_numpy(frames).permute(0, 3, 1, 2).float() / 127.5 - 1
        assert torch.equal(item[f"image:{camera}"], truth[2]) and torch.equal(item[f"future_image:{camera}"], truth[4])
    assert not torch.equal(item["image:wrist"], item["image:ext_1"])
    x0 = policy.encode_batch(LinearCodec(), [item, data.item(0, 0)], "libero", torch.device("cpu"), torch.float32)
    assert x0.shape == (2, 16, 9, 8, 14)
    with pytest.raises(ValueError, match="not both"):
        policy.PolicyData(root, "blank,proprio,image:grid,image:wrist,action,value", chunk=8, gamma=0.99, height=64,
                          width=112, text=text, success="all")
