"""Predict2.5's per-latent-frame action net (ActionChunkConditionedMinimalV1LVGDiT, config p25-*-action) against
upstream's class run on the CPU (tests/check_reference_p25_action.py wrote tests/data/p25_action): the outputs of five
calls, the per-frame action embeddings, the key table of the release, and what one latent frame's actions reach."""
import json
import os

import pytest
import torch
from safetensors.torch import load_file

import check_reference
import ckpt
from base.inits import config_from_upstream, get_config
from condition import Condition
from model import DiT
from nets import flow
from nets.family import family_of

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "p25_action")
BOUND = 2e-5


@pytest.fixture(scope="module")
def case():
    meta = json.load(open(os.path.join(DATA, "p25_action.json")))
    net = check_reference.build_dit_case(meta, os.path.join(DATA, "p25_action.weights.safetensors"))  # strict
    return meta, net, load_file(os.path.join(DATA, "p25_action.io.safetensors"))


def embeddings(net):
    """Hooks keeping each call's action MLP outputs and the per-frame embeddings added (after the zero row and mask)."""
    seen = []
    added = net._per_frame

    def per_frame(emb, mask, group):
        out = added(emb, mask, group)
        seen.append(out)
        return out
    net._per_frame = per_frame
    return seen


def test_the_per_latent_frame_action_net_matches_upstream(case):
    meta, net, io = case
    assert net.cfg.action_per_frame and net.cfg.action_dim == 4 * 7 and family_of(net.cfg) is flow
    seen = embeddings(net)
    for name, call in meta["calls"].items():
        kwargs = check_reference.call_kwargs({k: v for k, v in call["forward_kwargs"].items() if k != "action"}, io,
                                             net.cfg)
        kwargs["action"] = io[call["forward_kwargs"]["action"]]  # [B, 12, 7]: upstream's layout, ours too
        seen.clear()
        with torch.no_grad():
            out = check_reference.forward(net, kwargs)
        assert (out - io[call["output"]]).abs().max() <= BOUND, name
        prefix = "dbg." if name == "main" else f"dbg.{name}."
        for ours, theirs in zip(seen, ("action_emb_B_T_D", "action_emb_B_T_3D")):
            assert (ours - io[prefix + theirs]).abs().max() <= BOUND, (name, theirs)
    # the action and the mask move the output by far more than the bound: a wrong action path cannot pass above
    assert (io["out.y_B_C_T_H_W"] - io["out.y_action_2_B_C_T_H_W"]).abs().max() > 1000 * BOUND
    assert (io["out.y_B_C_T_H_W"] - io["out.y_mask2_B_C_T_H_W"]).abs().max() > 1000 * BOUND


def test_one_latent_frames_actions_change_that_frames_embedding_only(case):
    """action_2 redraws actions 4..7 (latent frame 2's): its embedding changes there alone (latent frame 0's is
    exactly zero); the output changes everywhere, through attention."""
    meta, net, io = case
    seen = embeddings(net)
    outs = []
    for name in ("main", "action_2"):
        kwargs = check_reference.call_kwargs({k: v for k, v in meta["calls"][name]["forward_kwargs"].items()
                                              if k != "action"}, io, net.cfg)
        kwargs["action"] = io[meta["calls"][name]["forward_kwargs"]["action"]]
        with torch.no_grad():
            outs.append(check_reference.forward(net, kwargs))
    main, other = seen[0], seen[2]  # the time-embedding path of each call
    changed = [t for t in range(main.shape[1]) if not torch.equal(main[:, t], other[:, t])]
    assert changed == [2] and not main[:, 0].any()
    assert all((outs[0][:, :, t] - outs[1][:, :, t]).abs().max() > 1e-4 for t in range(outs[0].shape[2]))


def test_released_key_table_loads_strictly_into_p25_2b_action():
    table, model, _, report = check_reference.released_key_report(
        os.path.join(DATA, "p25_action_released_keys.json"), "p25-2b-action",
        "Cosmos-Predict2.5-2B robot/action-cond key table")
    assert table["num_parameters"] == 2_126_767_104
    assert report.ok, report.details()
    assert all(k.endswith("._extra_state") or k.startswith("net.accum_") for k in report.ignored)
    with torch.device("meta"):
        per_clip = DiT(get_config("p25-2b", action_dim=4 * 7))  # the same keys: only the forward differs
    assert set(ckpt.model_entries(per_clip)) == set(model)


def test_wrong_actions_and_a_predict2_timestep_scale_are_refused_in_one_line():
    torch.manual_seed(0)
    net = DiT(get_config("p25-tiny-action")).eval()
    x, t, text = torch.randn(1, 16, 3, 8, 8), torch.rand(1), torch.randn(1, 4, 96)
    with torch.no_grad():
        net(x, t, Condition(crossattn_emb=text, action=torch.randn(1, 8, 8)))  # 8 transitions x (4 x 2): 2 x 32
        with pytest.raises(ValueError, match=r"\(1, 7, 8\) \(56 values a sample\): expected .* = \[1, 8, 8\]; .* 32"):
            net(x, t, Condition(crossattn_emb=text, action=torch.randn(1, 7, 8)))
    with pytest.raises(ValueError, match="action_per_frame config with timestep_scale 1"):
        family_of(get_config("p25-tiny-action", timestep_scale=1.0))


@pytest.mark.parametrize("config", ["p25-tiny-action", "tiny-action"])
def test_a_transposed_or_flat_action_chunk_is_refused_naming_the_layout(config):
    """Both nets take exactly [B, transitions, dims]: the same values transposed (moved the output by up to 1.4 when
    only the count was checked) or flat are refused in one line naming the expected layout."""
    net = DiT(get_config(config)).eval()
    width = 96 if config.startswith("p25") else 1024
    x, t, text = torch.randn(1, 16, 3, 8, 8), torch.rand(1), torch.randn(1, 4, width)
    if config == "tiny-action":  # per clip: 8 transitions x 8; a 5-latent-frame clip would need 16 x 4
        good = torch.randn(1, 8, 8)
    else:  # per latent frame: 4 transitions a latent frame, 8 values each; 5 latent frames: 16 x 8
        x, good = torch.randn(1, 16, 5, 8, 8), torch.randn(1, 16, 8)
    with torch.no_grad():
        net(x, t, Condition(crossattn_emb=text, action=good))
        for wrong, cause in ((good.flatten(1), "flattened"), (good.transpose(1, 2), "transposed")):
            if wrong.shape == good.shape:
                continue  # square: a transposition is not visible in the shape
            with pytest.raises(ValueError, match=r"expected \[B, transitions, dims\] = \[1, \d+, \d+\] \(" + cause) as e:
                net(x, t, Condition(crossattn_emb=text, action=wrong))
            assert "\n" not in str(e.value)


def test_a_non_default_hidden_dim_in_action_embedder_matches_upstream(case):
    """Upstream's class built with hidden_dim_in_action_embedder 40 (not 4 x 48; tests/check_reference_p25_action.py's
    p25_action_hidden case) loads strictly and gives upstream's output on the main call's inputs."""
    meta, _, io = case
    hidden = json.load(open(os.path.join(DATA, "p25_action_hidden.json")))
    net = check_reference.build_dit_case(hidden, os.path.join(DATA, "p25_action_hidden.weights.safetensors"))
    assert net.cfg.action_hidden_dim == 40 and net.action_embedder_B_3D.fc1.weight.shape == (40, 28)
    call = meta["calls"]["main"]["forward_kwargs"]
    kwargs = check_reference.call_kwargs({k: v for k, v in call.items() if k != "action"}, io, net.cfg)
    kwargs["action"] = io[call["action"]]
    with torch.no_grad():
        out = check_reference.forward(net, kwargs)
    theirs = load_file(os.path.join(DATA, "p25_action_hidden.io.safetensors"))["out.y_B_C_T_H_W"]
    assert (out - theirs).abs().max() <= BOUND and (theirs - io["out.y_B_C_T_H_W"]).abs().max() > 1000 * BOUND


def test_upstream_hidden_dim_in_action_embedder_is_taken_and_a_compression_ratio_not_4_refused():
    kwargs = {**json.load(open(os.path.join(DATA, "p25_action.json")))["config"]["kwargs"],
              "hidden_dim_in_action_embedder": 40}
    cfg = config_from_upstream("ActionChunkConditionedMinimalV1LVGDiT", kwargs)
    assert cfg.action_hidden_dim == 40 and cfg.action_dim == 28
    net = DiT(cfg)
    assert net.action_embedder_B_D.fc1.weight.shape == (40, 28) and net.action_embedder_B_3D.fc2.weight.shape == (
        3 * cfg.model_channels, 40)
    assert config_from_upstream("ActionChunkConditionedMinimalV1LVGDiT", {**kwargs, "hidden_dim_in_action_embedder":
                                                                          None}).action_hidden_dim == 0
    with pytest.raises(ValueError, match="temporal_compression_ratio=2: ours is 4"):
        config_from_upstream("ActionChunkConditionedMinimalV1LVGDiT", {**kwargs, "temporal_compression_ratio": 2})
