"""bench.py --world N --rl grpo|nft: will my RL job fit? One train.py RL update per rank: memory and s/update.

An update is network calls of three kinds: no-grad calls of some batch B (the rollouts; NFT's old-policy forwards;
the KL reference; GRPO's after-step probe), trained forward + backward passes of one sample, and one optimizer step
(GRPO: opt_steps_per_update), plus a VAE decode per sample when a reward reads pixels. How many of each comes from
the objective's own code (nft.sample_group and nft.nft_update, rollout.rollout_group and grpo.grpo_update) run on a
stand-in net that records its calls (count_update), so the plan follows every knob of the config exactly as the run
will. What each costs is measured on this device as rank 0 of N (bench.py's planned_net: train.py's FSDP2 under a
fake process group, this rank's 1/cp of every sample), after --warmup runs (the compiles under --compile). The
projection adds what the ranks exchange: each call all-gathers the net (overlapped with its compute, as bench.py's
step), each trained pass again in backward, one reduce-scatter per optimizer step, and CP's all-to-alls on the
critical path. NFT is planned in its steady state (from update 3 on, the old policy lags: its own forwards).

Contents, top to bottom: the objective's config from the flags -> counting an update's calls -> measuring them ->
the projection and its table.
"""
import collections
import dataclasses
import statistics
import typing

import torch

import condition
import grpo
import nft
import sac
from base import cli
from base.inits import get_config
from benchstep import latent_shape, make_batch, timer, train_step
from condition import map_tensors
from engine import rollout
from engine.build import build_vae
from nets.edm import denoise
from nets.vae import WanVAE, get_vae_config

OBJECTIVES = {"grpo": grpo.GRPOConfig, "nft": nft.NFTConfig}
VAES = ("real", "tiny", "none")  # --rl-vae: the decode a reward that reads pixels runs (none: latent-only rewards)


# -----------------------------------------------------------------------------
# The objective's config: --rl-k, --rl-steps and --rl-set "key=value ..." over its defaults, checked by the config


def parse_set(kind, text):
    """{field: value} from "key=value key=value" (the config's field names; booleans true/false, tuples a,b)."""
    hints, fields = typing.get_type_hints(kind), {f.name: f for f in dataclasses.fields(kind)}
    values = {}
    for item in text.split():
        key, sep, raw = item.partition("=")
        if not sep or key not in fields:
            raise ValueError(f"--rl-set {item!r}: key=value with a key of {kind.__name__} "
                             f"({', '.join(sorted(fields))})")
        if hints[key] is bool:
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"--rl-set {item!r}: true or false")
            values[key] = raw.lower() in ("true", "1")
        elif hints[key] is tuple:
            values[key] = cli.tuple_type(fields[key].default_factory() if fields[key].default is dataclasses.MISSING
                                         else fields[key].default)(raw)
        else:
            values[key] = hints[key](raw)
    return values


def check(b):
    """--rl plans with --world only; its flags do nothing without it (b: a bench.BenchConfig)."""
    unused = [flag for flag, on in (("--rl-k", b.rl_k != 4), ("--rl-steps", b.rl_steps),
                                    ("--rl-groups", b.rl_groups != 1), ("--rl-set", b.rl_set),
                                    ("--rl-vae", b.rl_vae != "real")) if on]
    if not b.rl and unused:
        raise ValueError(f"{', '.join(unused)} do(es) nothing without --rl grpo|nft: drop it or add --rl")
    if b.rl and (not b.world or b.grpo):
        raise ValueError(f"--rl {b.rl} plans an update as rank 0 of --world N ranks: pass --world (and not --grpo)")
    if b.rl and (b.rl_groups < 1 or b.rl_vae not in VAES):
        raise ValueError(f"--rl-groups {b.rl_groups} (>= 1), --rl-vae {b.rl_vae!r} ({' | '.join(VAES)})")


def rl_config(b):
    """--rl's config (grpo.GRPOConfig or nft.NFTConfig): its defaults, --rl-set, K from --rl-k, the sampler steps from
    --rl-steps (0: the default). As train.py does, batched GRPO rollouts and --compile imply recompute_old_logp."""
    if b.rl not in OBJECTIVES:
        raise ValueError(f"--rl {b.rl!r}: grpo or nft")
    values = parse_set(OBJECTIVES[b.rl], b.rl_set)
    for key, flag in (("group_size", "--rl-k"), ("num_steps", "--rl-steps")):
        if key in values:
            raise ValueError(f"--rl-set {key}=...: pass {flag} instead")
    values["group_size"] = b.rl_k
    if b.rl_steps:
        values["num_steps"] = b.rl_steps
    cfg = OBJECTIVES[b.rl](**values)
    if b.rl == "grpo" and (b.compile or cfg.rollout_batch != "none") and not cfg.recompute_old_logp:
        if "recompute_old_logp" in values:
            raise ValueError("--rl-set recompute_old_logp=false with --compile or a batched rollout_batch: train.py "
                             "refuses it (the ratio would not start at 1)")
        cfg = dataclasses.replace(cfg, recompute_old_logp=True)
    return cfg


# -----------------------------------------------------------------------------
# Counting: the objective's code on a stand-in net


class CallRecorder(torch.nn.Module):
    """Stands in for the DiT: the families read net.cfg and call net(x, t, cond); each call is recorded as (batch,
    grad enabled) and returns x * w (one trainable scalar, so the update's backward and optimizer step run)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg, self.calls = cfg, []
        self.w = torch.nn.Parameter(torch.ones(()))

    def forward(self, x, t, cond):
        self.calls.append((x.shape[0], torch.is_grad_enabled()))
        return x * self.w


def standin_conditions(b, mcfg, groups):
    """One Condition per group on a 2 x 2 latent of the plan's frames (the call counts do not depend on H, W)."""
    gt = torch.zeros(1, 16, latent_shape(b)[2], 2, 2)
    emb = torch.zeros(1, 1, mcfg.crossattn_proj_in_channels)
    return [condition.standin(mcfg, gt, emb, neg_crossattn_emb=emb, views=b.views, cond_frames=b.cond_frames,
                              key=(0, g)) for g in range(groups)]


def count_update(b, cfg, mcfg):
    """Per rank and update: {"rollout": {B: no-grad calls}, "frozen": {B: the update's no-grad calls}, "trained":
    forward + backward passes (B = 1), "samples" (decodes), "opt_steps", "store_elements": latent elements the
    rollouts keep until the update ends, per stand-in latent element}. GRPO: averaged over the window starts."""
    conds = standin_conditions(b, mcfg, b.rl_groups)
    K, shape = cfg.group_size, tuple(conds[0].gt_frames.shape[1:])
    advantages = [torch.tensor([1.0 - 2 * (k % 2) for k in range(K)]) for _ in conds]  # all non-zero: all train
    starts = [None]
    if b.rl == "grpo" and cfg.window_size:
        lo, hi = cfg.window
        starts = list(range(lo, hi - cfg.window_size + 1))
    rolled, updated, store = collections.Counter(), collections.Counter(), 0
    for start in starts:
        net = CallRecorder(mcfg)
        generator, params = torch.Generator().manual_seed(0), [net.w]
        optimizer = torch.optim.SGD(params, lr=0.0)
        if b.rl == "nft":
            x0s = [nft.sample_group(net, cond, shape, cfg, generator) for cond in conds]
            rolled.update(net.calls)
            net.calls = []
            steady = nft.decay_at(cfg, 10 ** 9) == 0  # from update 3 on the old policy lags theta (unless d is 0)
            nft.nft_update(net, optimizer, params, [net.w.detach().clone()], conds, x0s, advantages, cfg, generator,
                           old_is_current=steady)
            store += sum(x.numel() for x in x0s)
        else:
            ros = [rollout.rollout_group(net, cond, shape, cfg, generator, window_start=start) for cond in conds]
            rolled.update(net.calls)
            share = 1.0 / cfg.probe_every if cfg.probe_every else 0.0  # of updates that run the after-step probe
            for probe, weight in ((True, share), (False, 1.0 - share)):  # the mean update over the probe cadence
                if not weight:
                    continue
                net.calls = []
                grpo.grpo_update(net, optimizer, params, ros, advantages, cfg, data_generator=generator,  # + data term
                                 probe=probe)
                updated.update({call: weight * n for call, n in collections.Counter(net.calls).items()})
            net.calls = []
            store += sum(ro.states.numel() + sum(u.numel() for u in ro.uncond.values()) for ro in ros)
        updated.update(net.calls)
    n = len(starts)
    if any(B != 1 for B, grad in updated if grad):
        raise RuntimeError(f"a trained call of batch > 1: {dict(updated)}")  # the plan times B = 1 passes
    return dict(rollout={B: c / n for (B, grad), c in sorted(rolled.items())},
                frozen={B: c / n for (B, grad), c in sorted(updated.items()) if not grad},
                trained=sum(c for (_, grad), c in updated.items() if grad) / n, samples=b.rl_groups * K,
                opt_steps=getattr(cfg, "opt_steps_per_update", 1),
                store_elements=store / n / conds[0].gt_frames.numel())


# -----------------------------------------------------------------------------
# Measuring: each kind of call on train.py's network as rank 0 of N (inside bench.planned_net)


def measure(fn, steps, warmup, device):
    """(median s, peak GiB of the timed runs or None on the CPU) of fn after warmup runs."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        t = timer(device)
        fn()
        times.append(t())
    peak = round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda" else None
    return statistics.median(times), peak


def measure_calls(b, net, counts, device):
    """{call: (s, peak GiB)}: "trained" (train_step: a forward + backward of one sample, benchstep's loss),
    "optimizer" (train.py's AdamW over the adapters), "nograd_b<B>" for every batch the update calls with, and
    "decode" (one sample through --rl-vae, bf16 on the GPU as train.py holds it; its weights stay resident, as in
    train.py, while the rest is measured)."""
    cuda, mcfg = device.type == "cuda", get_config(b.config)
    dtype = torch.bfloat16 if cuda else torch.float32
    vae = None
    if b.rl_vae != "none":  # built first: train.py holds it for the whole run
        vae = (WanVAE(get_vae_config("real")).to(device=device, dtype=dtype).eval().requires_grad_(False)
               if b.rl_vae == "real" else build_vae("tiny", None, device, dtype))
    trainable = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-5, fused=cuda)  # its state exists from the first step on
    batch = make_batch(b, mcfg, device, torch.float32)
    train_step(net, batch, trainable)
    optimizer.step()

    @torch.no_grad()
    def nograd(B):
        cond = map_tensors(batch["cond"], lambda t: t.expand(B, *t.shape[1:]))
        denoise(net, batch["x0"].expand(B, *batch["x0"].shape[1:]), batch["sigma"].expand(B), cond)
    calls = {"trained": lambda: train_step(net, batch, trainable), "optimizer": optimizer.step}
    calls.update({f"nograd_b{B}": (lambda B=B: nograd(B)) for B in sorted({*counts["rollout"], *counts["frozen"]})})
    if vae is not None:
        _, C, T, H, W = latent_shape(b)
        z = torch.randn(1, C, T // b.views, H, W, device=device, dtype=dtype)

        @torch.no_grad()
        def decode():  # a views sample decodes each view (rl.Scoring.decode)
            for _ in range(b.views):
                vae.decode(z)
        calls["decode"] = decode
    out = {}
    for name, fn in calls.items():
        out[name] = measure(fn, b.steps, b.warmup, device)
        print(f"  measured {name}: {out[name][0]:.4f} s, peak {out[name][1]} GiB", flush=True)
    return out


# -----------------------------------------------------------------------------
# The projection per rank and update


def forward_gather_s(net, world, dtype, link_gb_s):
    """Seconds one forward's all-gathers of the whole net take on the link (each FSDP unit once; 0 on one rank)."""
    if world == 1:
        return 0.0
    elements = sum(sac.shard_numel(p, world) for _, params, _ in sac.fsdp_units(net) for p in params) * world
    return (world - 1) / world * elements * dtype.itemsize / (link_gb_s * 1e9)


def project(b, net, res, counts, costs):
    """s per update per rank by phase: every call at max(its compute, its all-gathers) plus CP's all-to-alls (bench.py's
    step model, applied per call), the optimizer step with its reduce-scatter and the unhideable edges, the decodes."""
    cuda, mcfg, world = b.device == "cuda", get_config(b.config), res["world"]
    dtype = torch.bfloat16 if cuda else torch.float32
    gather = forward_gather_s(net, world, dtype, b.link_gb_s)
    shape = latent_shape(b)
    recompute = sum(res["sac"].get(m, 0) for m in res["sac"] if m != "none")

    def cp_s(B, trained):  # sac.cp_traffic counts forward and backward (and replays): a no-grad call is half of it
        sent = sac.cp_traffic(mcfg, (B, *shape[1:]), b.cp, dtype, recompute if trained else 0, b.link_gb_s)
        return sent["cp_comm_s"] if trained else sent["cp_comm_s"] / 2

    def nograd_s(calls):
        return sum(n * (max(costs[f"nograd_b{B}"][0], gather) + cp_s(B, False)) for B, n in calls.items())
    ring = (world - 1) / world / (b.link_gb_s * 1e9)  # s per byte handed to a ring collective
    # a trained pass gathers in forward and again in backward; its gradients reduce once per optimizer step
    trained_s = counts["trained"] * (max(costs["trained"][0], ring * res["allgather_bytes"]) + cp_s(1, True))
    reduce_s = ring * res["reduce_scatter_bytes"]
    phases = dict(rollout=nograd_s(counts["rollout"]), update=nograd_s(counts["frozen"]) + trained_s,
                  optimizer=counts["opt_steps"] * (costs["optimizer"][0] + reduce_s + res["exposed_s"]),
                  decode=counts["samples"] * costs["decode"][0] if "decode" in costs else 0.0)
    store = counts["store_elements"] * shape[1] * shape[2] * shape[3] * shape[4] * 4  # fp32 rollouts, whole samples
    peaks = {name: peak for name, (_, peak) in costs.items()}
    # microseconds in the record: a phase is a sum of rounded costs, and 4 decimals left its check a rounding short
    return dict(rl_phases_s={k: round(v, 6) for k, v in phases.items()}, rl_s_per_update=round(sum(phases.values()), 6),
                rl_calls={k: counts[k] for k in ("rollout", "frozen", "trained", "samples", "opt_steps")},
                rl_costs_s={name: round(s, 6) for name, (s, _) in costs.items()}, rl_peaks_gib=peaks,
                rl_rollout_store_gib=round(store / 2**30, 3),
                rl_peak_gib=round(max(p for p in peaks.values()) + store / 2**30, 2) if cuda else None)


def run(b, planned_net):
    """The RL plan row: bench.run_plan's header (the network as rank 0 of N), the update's counts, costs and
    projection. planned_net: bench.planned_net (passed in: bench imports this file)."""
    cfg = rl_config(b)
    if not b.lora:
        raise ValueError(f"--rl {b.rl} trains LoRA adapters only (as train.py): pass --lora RANK (e.g. 32)")
    counts = count_update(b, cfg, get_config(b.config))
    device = torch.device(b.device)
    with planned_net(b) as (net, res, _):
        res.update(rl=b.rl, rl_config=dataclasses.asdict(cfg), rl_groups=b.rl_groups, rl_vae=b.rl_vae,
                   rl_fp8_base=b.fp8)  # main refuses --fp8 --lora beyond one rank
        costs = measure_calls(b, net, counts, device)
    if res["status"] == "ok":
        res.update(project(b, net, res, counts, costs))
    return res


def table(res):
    """The RL row's main numbers as a few lines for a person."""
    cfg = res["rl_config"]
    head = (f"plan: {res['rl']} update of {res['config']} on {res['world']} rank(s) (cp {res['cp']}), rank 0 on "
            f"{res['gpu']}: K {cfg['group_size']}, {cfg['num_steps']} steps, {res['rl_groups']} group(s) a dp group, "
            f"LoRA r={res['lora']}{' (fp8 base)' * res['rl_fp8_base']}, sac {res['sac']}"
            f"{', compiled' * res['compile']}")
    if res["status"] != "ok":
        return f"{head}\n  {res['status']}: {res.get('error', '')}"
    calls, phases = res["rl_calls"], res["rl_phases_s"]
    return "\n".join([
        head,
        f"  calls per rank   rollout {calls['rollout']} (batch: calls), update {calls['trained']:g} trained + "
        f"{calls['frozen']} no-grad, {calls['opt_steps']} optimizer step(s); {calls['samples']} samples decoded by "
        f"--rl-vae {res['rl_vae']}",
        f"  measured         {res['rl_costs_s']} s",
        f"  per update       {' + '.join(f'{k} {v:.1f}' for k, v in phases.items())} = {res['rl_s_per_update']:.1f} s",
        f"  memory per rank  peak {res['rl_peak_gib']} GiB (per call {res['rl_peaks_gib']}, rollouts kept "
        f"{res['rl_rollout_store_gib']} GiB)" if res["rl_peak_gib"] is not None else
        "  memory per rank  (CPU: no allocator statistics)"])
