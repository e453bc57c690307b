"""bench.py --world N (the planner) and sac.py against reality on CPU: W = 1 equals a run without process group,
a real gloo 2-rank run holds exactly the per-rank bytes the planner predicts, and the FSDP traffic formula equals
the bytes the collectives are handed (counted at dispatch). docs/memory.md, "Before you queue a job", has the model.
"""
import json

import pytest
import torch

import bench
import peer_net
import rlplan
import sac
from base import collectives
from base.inits import get_config
from dist_utils import run_dist
from model import DiT
from nets.lora import add_lora

SMALL = ["--device", "cpu", "--dtype", "float32", "--config", "tiny", "--frames", "5", "--height", "64", "--width",
         "64", "--text-len", "8", "--steps", "1", "--warmup", "0"]


def run(*flags, shard=True):
    return bench.run_plan(bench.parse_args(SMALL + list(flags)), shard=shard)


def meta_model(lora):
    with torch.device("meta"):
        net = DiT(get_config("tiny"))
    if lora:
        add_lora(net, lora)
    return net


def test_world_1_equals_a_run_without_process_group():
    one, plain = run("--world", "1", "--sac", "block"), run("--world", "1", "--sac", "block", shard=False)
    assert one["sharded"] and not plain["sharded"]
    assert one["state_measured_rank0"] == plain["state_measured_rank0"] == one["state_formula_rank0"]
    assert one["flops_counted"] == plain["flops_counted"] > 0
    assert one["observed_allgather_bytes"] == one["allgather_bytes"] == 0  # one rank: FSDP2 calls no collective
    assert one["observed_reduce_scatter_bytes"] == one["reduce_scatter_bytes"] == 0
    assert one["link_bytes_per_rank"] == 0 and one["projected_step_s"] == one["compute_s"]
    st = one["state_measured_rank0"]  # full fine-tune in fp32: params, grads, 2 AdamW moments + a step per tensor
    n, tensors = one["params"], len(list(meta_model(0).parameters()))
    assert st == dict(params=4 * n, grads=4 * n, optimizer=8 * n + 4 * tensors)


@pytest.mark.parametrize("world,sac,lora", [(4, "block", 0), (3, "selective", 3), (2, "none", 0)])
def test_traffic_formula_equals_counted_collectives(world, sac, lora):
    res = run("--world", str(world), "--sac", sac, "--lora", str(lora))
    assert res["observed_allgather_bytes"] == res["allgather_bytes"] > 0
    assert res["observed_reduce_scatter_bytes"] == res["reduce_scatter_bytes"] > 0
    assert res["state_measured_rank0"] == res["state_formula_rank0"]
    assert res["link_bytes_per_rank"] == round((world - 1) / world * (res["allgather_bytes"]
                                                                       + res["reduce_scatter_bytes"]))
    assert res["projected_bounds_s"][0] <= res["projected_step_s"] <= res["projected_bounds_s"][1]
    if lora:  # frozen bases are gathered, not reduce-scattered: the grads moved are the adapters' only
        assert res["reduce_scatter_bytes"] < res["allgather_bytes"] / 10


def test_traffic_by_hand():
    """2 blocks: the first gathered twice (resharded after forward), the last, final layer and root once (fp32)."""
    net, world = meta_model(0), 2
    size = lambda m: sum(p.numel() for p in m.parameters()) * 4  # noqa: E731 (tiny: every dim 0 splits evenly)
    blocks = size(net.blocks[0]) + size(net.blocks[1])
    t = sac.fsdp_traffic(net, world, torch.float32, 100.0)
    assert t["allgather_bytes"] == size(net) + size(net.blocks[0])
    assert t["reduce_scatter_bytes"] == size(net)
    edge = 2 * (size(net) - blocks - size(net.final_layer) + size(net.blocks[0]))  # root and block 0, AG + RS
    assert t["exposed_s"] == pytest.approx(edge / 2 / 100e9)


def _gloo_step(rank, world):
    """A real 2-rank train.py step (shard_model, AdamW) per LoRA setting: local-shard bytes and collectives."""
    args = bench.parse_args(SMALL)
    out = {}
    for lora in (0, 3):  # r = 3: adapters with 3 rows split 2 + 1, so the ranks differ
        torch.manual_seed(0)
        net = meta_model(lora)
        collectives.shard_model(net, torch.device("cpu"))
        net.to_empty(device="cpu")
        net.init_weights()
        trainable = [p for p in net.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=1e-5)
        batch = bench.make_batch(args, net.cfg, torch.device("cpu"), torch.float32)
        with sac.CollectiveBytes() as counted:
            bench.train_step(net, batch, trainable)
            optimizer.step()
        out[lora] = dict(state=sac.state_measured(net, optimizer), allgather=counted.allgather,
                         reduce_scatter=counted.reduce_scatter)
    return out


def test_gloo_two_ranks_hold_what_the_planner_predicts():
    ranks = run_dist(_gloo_step, 2, 240)
    for lora in (0, 3):
        planned = run("--world", "2", "--lora", str(lora))
        for r in range(2):
            assert ranks[r][lora]["state"] == sac.state_formula(meta_model(lora), 2, r)
            assert ranks[r][lora]["allgather"] == planned["allgather_bytes"]
            assert ranks[r][lora]["reduce_scatter"] == planned["reduce_scatter_bytes"]
        assert ranks[0][lora]["state"] == planned["state_measured_rank0"]
    assert ranks[0][3]["state"] != ranks[1][3]["state"]  # the uneven split is really exercised


def test_main_prints_a_table_then_one_json_line(capsys):
    bench.main(SMALL + ["--world", "2", "--sac", "attn"])
    lines = capsys.readouterr().out.strip().splitlines()
    res = json.loads(lines[-1])
    assert lines[0].startswith("plan: tiny on 2 rank(s)") and any("projected" in ln for ln in lines[:-1])
    assert res["status"] == "ok" and res["sac"] == {"attn": 2} and res["compute_s"] > 0


def test_auto_plan_takes_camera_configs():
    """train.py may plan an agibot (camera) net: the meta forward gets camera maps, cam_encoder is in the block."""
    with torch.device("meta"):
        net = DiT(get_config("p25-tiny-agibot"))
    costs, auto, fixed = sac.auto_plan(net, 2, torch.device("cpu"), torch.float32, (1, 16, 6, 8, 8), 8, 0, 1.0)
    assert len(auto.modes) == 2 and fixed > sum(sac.state_formula(net, 2, 0).values())
    assert costs["none"].saved_bytes > costs["block"].saved_bytes > 0


def test_auto_runs_and_applies_its_choice(capsys):
    res = run("--world", "2", "--sac", "auto", "--mem-budget", "1")
    fastest = min(res["auto_costs"], key=lambda m: res["auto_costs"][m]["seconds"])
    assert res["sac"] == {fastest: 2}  # 1 GiB is plenty for the tiny model: every mix fits, the fastest wins
    assert f"sac auto: {fastest} x2" in capsys.readouterr().out
    assert res["auto_predicted_peak_gib"] < 1 and set(res["auto_costs"]) == {"none", "selective", "mm", "attn", "block"}


@pytest.mark.parametrize("flags,match", [
    (["--sac", "auto"], "--sac auto needs --mem-budget"),
    (["--world", "2", "--sac", "auto"], "--sac auto needs --mem-budget"),
    (["--world", "2", "--mem-budget", "10"], "--mem-budget needs --sac auto"),
    (["--world", "2", "--sac", "auto", "--mem-budget", "10", "--every", "2"], "--every 2 does nothing"),
    (["--world", "2", "--parity"], "--parity does nothing with --world"),
    (["--world", "2", "--sac", "blockwise"], "valid: none, block"),
    (["--world", "2", "--dtype", "bfloat16"], "pass --dtype float32"),
    (["--world", "2", "--link-gb-s", "0"], "--link-gb-s 0.0"),
    (["--world", "2", "--config", "p25-tiny-agibot"], "a camera net needs --views >= 2"),
    (["--world", "2", "--views", "3"], "--views 3 with --config tiny"),
])
def test_planner_flags_checked(flags, match):
    with pytest.raises(ValueError, match=match):
        bench.check_plan(bench.parse_args(SMALL + flags))


def test_views_step_feeds_the_camera_net_its_stacked_latent_and_map(capsys):
    """--views 3: agibot's latent has 3x the frames, its camera map goes in (a camera net refuses a missing one)."""
    args = ["--device", "cpu", "--dtype", "float32", "--config", "p25-tiny-agibot", "--views", "3", "--frames", "9",
            "--height", "64", "--width", "64", "--text-len", "16", "--steps", "1", "--warmup", "0", "--sac", "block"]
    bench.main(args)
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["status"] == "ok" and res["latent"] == [1, 16, 9, 8, 8] and res["tokens"] == 3 * 3 * 4 * 4
    with pytest.raises(ValueError, match="--views"):
        bench.main(args[:5] + ["p25-tiny", "--views", "3"])
    with pytest.raises(ValueError, match="--views"):
        bench.main(args[:5] + ["p25-tiny-agibot"])


@pytest.mark.parametrize("world,cp,sac,net", [(8, 4, "block", "tiny-h4"), (4, 2, "none", "tiny-h4"),
                                               (4, 2, "selective", "tiny-h4"), (4, 2, "block", "p25-tiny-agibot")])
def test_cp_plan_alltoall_formula_equals_counted(world, cp, sac, net):
    """--cp C: rank 0 runs 1/C of the frames; the all-to-all bytes it hands the cp group equal sac.cp_traffic (a
    block recomputed under SAC replays its exchange), and the FSDP formulas still hold over the dp x cp ranks. The
    camera net: 3 views x 2 latent frames stacked on time, its camera map split with them."""
    shape = ["--frames", "13"] if net == "tiny-h4" else ["--views", "3"]
    res = run("--world", str(world), "--cp", str(cp), "--sac", sac, "--config", net, *shape,
              "--link-gb-s", "0.001")  # a slow link: the exchange's seconds show in the rounded projection
    assert res["status"] == "ok" and res["cp"] == cp
    assert res["observed_alltoall_bytes"] == res["alltoall_bytes"] > 0
    assert res["observed_allgather_bytes"] == res["allgather_bytes"]
    assert res["observed_reduce_scatter_bytes"] == res["reduce_scatter_bytes"]
    assert res["state_measured_rank0"] == res["state_formula_rank0"]
    assert res["cp_link_bytes_per_rank"] == round(res["alltoall_bytes"] * (cp - 1) / cp)
    assert res["cp_comm_s"] == res["cp_link_bytes_per_rank"] / 1e6  # 0.001 GB/s
    bounds = res["projected_bounds_s"]
    # each number is rounded to 1e-4 on its own: their sum may round one step past the bound's
    assert res["compute_s"] + res["cp_comm_s"] <= bounds[0] + 2e-4 and bounds[0] <= res["projected_step_s"] <= bounds[1]


def test_cp_traffic_by_hand():
    """tiny-h4 at latent [1, 16, 4, 8, 8]: L = 4 x 4 x 4 = 64 tokens of width 64; per self-attention 4 tensors of
    L/C x D fp32 in forward and 4 in backward, 2 blocks, plus 4 per recomputed block."""
    cfg = get_config("tiny-h4")
    one = sac.cp_traffic(cfg, (1, 16, 4, 8, 8), 1, torch.float32, 0, 100.0)
    assert one == dict(alltoall_bytes=0, cp_link_bytes_per_rank=0, cp_comm_s=0.0)
    t = sac.cp_traffic(cfg, (1, 16, 4, 8, 8), 2, torch.float32, 1, 100.0)
    handed = 4 * (64 // 2) * 64 * 4 * (2 * 2 + 1)
    assert t["alltoall_bytes"] == handed and t["cp_link_bytes_per_rank"] == handed // 2
    assert t["cp_comm_s"] == pytest.approx(handed / 2 / 100e9)


def test_cp_refusals():
    with pytest.raises(ValueError, match="--cp 2 must divide --world 3"):
        bench.main(SMALL + ["--world", "3", "--cp", "2"])
    with pytest.raises(ValueError, match="--cp 4: tiny has 2 heads"):
        bench.main(SMALL + ["--world", "4", "--cp", "4", "--frames", "13"])
    with pytest.raises(ValueError, match="--cp 2: 3 latent frames"):
        bench.main(SMALL + ["--world", "4", "--cp", "2", "--frames", "9"])
    with pytest.raises(ValueError, match="--cp 2 needs --world N"):
        bench.main(SMALL + ["--cp", "2"])


def test_no_cuda_is_one_line_naming_a_command_that_runs_here(monkeypatch):
    """bench.py defaults to --device cuda: on a CPU machine that is one line (not a CUDA assert), and the CPU command
    it names runs."""
    import run_utils
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    proc = run_utils.in_process(bench, ["--world", "8", "--config", "v2w-14b", "--sac", "block"])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no CUDA device is visible" in proc.stderr
    (script, argv), = run_utils.suggested(proc.stderr)
    assert script == "bench" and run_utils.check(run_utils.in_process(bench, argv)).stdout.count('"status": "ok"') == 1


# -----------------------------------------------------------------------------
# --world N --rl grpo|nft: one RL update per rank, from the objective's own calls and their measured costs

def rl_flags(*flags):
    return bench.parse_args(SMALL + ["--world", "1", "--lora", "4", *flags])


@pytest.mark.parametrize("config,flags,want", [
    # NFT, Predict2: 10 AB2 steps + the clean pass, K in one call; steady state: the old policy's K forwards; the
    # shipped data term (--nft-data-coef 0.5): one more trained pass for the group
    ("tiny", ["--rl", "nft", "--rl-k", "12"], dict(rollout={12: 11.0}, frozen={1: 12.0}, trained=13.0)),
    # Predict2.5's UniPC: one call a step; rollout_batch 2: K / 2 calls a step; 2 levels, the KL reference, the data
    # term (a trained pass per group), and the on-policy schedule (decay 0: the trained forward is v_old)
    ("p25-tiny", ["--rl", "nft", "--rl-steps", "5", "--rl-groups", "2", "--rl-set",
                  "rollout_batch=2 timesteps=2 kl_coef=0.1 data_coef=1 decay_rate=0"],
     dict(rollout={2: 20.0}, frozen={1: 16.0}, trained=18.0)),
    # GRPO's defaults: (N + 1) x K x 2 branches of B = 1; N - 1 trained steps a trajectory and the shipped data
    # term's pass for the group (--grpo-data-coef 0.005); the probe's 2 x 7 calls
    ("tiny", ["--rl", "grpo"], dict(rollout={1: 72.0}, frozen={1: 14.0}, trained=29.0)),
    # --grpo-probe-every: the mean update over the cadence (half the updates probe; none)
    ("tiny", ["--rl", "grpo", "--rl-set", "probe_every=2"], dict(rollout={1: 72.0}, frozen={1: 7.0}, trained=29.0)),
    ("tiny", ["--rl", "grpo", "--rl-set", "probe_every=0"], dict(rollout={1: 72.0}, frozen={}, trained=29.0)),
    # the 14B fast path (docs/benchmarks-log.md, window start 2): 35 B = 2 calls, 5 forward + backward passes and
    # the data term's, the KL reference 5 B = 2 calls, the probe 4 B = 1 calls
    ("tiny", ["--rl", "grpo", "--rl-steps", "10", "--rl-set", "window_size=2 window_range=2,4 same_latent=true "
              "kl_coef=0.004 rollout_batch=cfg"], dict(rollout={2: 35.0}, frozen={1: 4.0, 2: 5.0}, trained=6.0)),
])
def test_rl_plan_counts_the_objectives_own_calls(config, flags, want):
    b = rl_flags("--config", config, *flags)
    counts = rlplan.count_update(b, rlplan.rl_config(b), get_config(config))
    assert {k: counts[k] for k in want} == want
    assert counts["samples"] == b.rl_groups * b.rl_k and counts["opt_steps"] == 1


def test_rl_plan_projects_counts_times_measured_costs(capsys):
    """One rank (no link): each phase is its calls times their measured seconds; the table, then one JSON line."""
    bench.main(SMALL + ["--world", "1", "--lora", "4", "--sac", "block", "--rl", "nft", "--rl-k", "2", "--rl-steps",
                        "2", "--rl-vae", "tiny"])
    lines = capsys.readouterr().out.strip().splitlines()
    res = json.loads(lines[-1])
    assert res["status"] == "ok" and any(ln.startswith("plan: nft update of tiny on 1 rank(s)") for ln in lines)
    cost, phases = res["rl_costs_s"], res["rl_phases_s"]
    assert res["rl_calls"]["rollout"] == {"2": 3.0} and res["rl_calls"]["frozen"] == {"1": 2.0}
    assert phases["rollout"] == pytest.approx(3 * cost["nograd_b2"], abs=2e-4)
    assert res["rl_calls"]["trained"] == 3.0  # K = 2 and the shipped data term's one pass for the group
    assert phases["update"] == pytest.approx(2 * cost["nograd_b1"] + 3 * cost["trained"], abs=2e-4)
    assert phases["decode"] == pytest.approx(2 * cost["decode"], abs=2e-4) and cost["decode"] > 0
    assert res["rl_s_per_update"] == pytest.approx(sum(phases.values()), abs=2e-4)


def test_rl_plan_under_cp_splits_each_call_and_counts_the_exchange():
    """--world 4 --cp 2 (dp 2): every call runs this rank's frames through the all-to-alls (the fake group); on a slow
    link the projection carries each call's exchange on top of the measured compute."""
    b = bench.parse_args(SMALL + ["--world", "4", "--cp", "2", "--frames", "13", "--lora", "4", "--sac", "block",
                                  "--rl", "grpo", "--rl-k", "2", "--rl-steps", "3", "--rl-vae", "none",
                                  "--link-gb-s", "0.001"])
    res = rlplan.run(b, bench.planned_net)
    assert res["status"] == "ok" and res["cp"] == 2 and "decode" not in res["rl_costs_s"]
    calls, cost = res["rl_calls"], res["rl_costs_s"]
    compute = sum(n * cost[f"nograd_b{B}"] for B, n in calls["rollout"].items())
    assert res["rl_phases_s"]["rollout"] > compute + 1.0  # the exchange at 1 MB/s: seconds, against ms of compute


@pytest.mark.parametrize("flags,match", [
    (["--rl-k", "8"], "--rl-k do.* nothing without --rl"),
    (["--rl", "nft", "--grpo", "2"], "pass --world .and not --grpo."),
    (["--rl", "ppo"], "--rl 'ppo': grpo or nft"),
    (["--rl", "nft", "--rl-set", "beta"], "--rl-set 'beta': key=value"),
    (["--rl", "nft", "--rl-set", "kl_coeff=1"], "key of NFTConfig"),
    (["--rl", "nft", "--rl-set", "group_size=8"], "pass --rl-k instead"),
    (["--rl", "nft", "--rl-set", "adaptive_weight=maybe"], "true or false"),
    (["--rl", "nft", "--rl-k", "4", "--rl-set", "rollout_batch=3"], "rollout_batch=3"),
    (["--rl", "grpo", "--rl-set", "rollout_batch=cfg recompute_old_logp=false"], "train.py refuses it"),
    (["--rl", "nft", "--rl-vae", "big"], "--rl-vae 'big'"),
    (["--rl", "nft", "--lora", "0"], "pass --lora RANK"),
])
def test_rl_plan_flags_checked(flags, match):
    with pytest.raises(ValueError, match=match):
        b = bench.parse_args(SMALL + ["--lora", "4"] + (["--world", "1"] if "--grpo" not in flags else []) + flags)
        rlplan.check(b)
        rlplan.run(b, bench.planned_net)


def test_rl_plan_runs_the_fp8_base_on_one_rank_only(monkeypatch):
    """--fp8 --lora: train.py holds the e4m3 base whole on every rank, which one rank is: --world 1 --rl runs every
    call through fp8.linear; more ranks stay refused."""
    from base import fp8
    calls, fp8_linear = [], fp8.linear
    monkeypatch.setattr(fp8, "linear", lambda *a, **k: calls.append(1) or fp8_linear(*a, **k))
    res = rlplan.run(rl_flags("--fp8", "--rl", "nft", "--rl-k", "2", "--rl-steps", "2", "--rl-vae", "none"),
                     bench.planned_net)
    assert res["status"] == "ok" and res["rl_fp8_base"] and len(calls) > 0
    with pytest.raises(ValueError, match="--fp8 --lora with --world"):
        bench.main(SMALL + ["--world", "2", "--lora", "4", "--fp8", "--rl", "nft"])


def test_an_action_net_gets_a_stand_in_chunk_in_the_step_and_the_rl_plan(capsys):
    """bench.py feeds an action config (tiny-action) a random chunk of its shape, as smoke.py and sac.auto_plan do: a
    step and an NFT update's plan run (without one the net refuses: "pass Condition.action"); --vs diffusers, whose
    network takes no actions, refuses it in one line."""
    action = ["--config", "tiny-action", "--sac", "block"]
    bench.main(SMALL + action)
    bench.main(SMALL + action + ["--world", "1", "--lora", "4", "--rl", "nft", "--rl-k", "2"])
    rows = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines() if line.startswith("{")]
    assert [r["config"] for r in rows] == ["tiny-action"] * 2 and rows[0]["status"] == "ok" and rows[1]["plan"]
    with pytest.raises(ValueError, match="action_dim 64: CosmosTransformer3DModel takes no actions"):
        peer_net.transformer_kwargs(get_config("tiny-action"))
