"""Memory and speed of one DiT training step at the DROID shape, and "will my job fit?" for N ranks.

    python benchmarks/bench.py --config v2w-2b --sac selective          # one JSON line
    python benchmarks/bench.py --config v2w-14b --lora 32 --sac block --steps 3
    python benchmarks/bench.py --sweep --out bench.jsonl    # the sweep table (docs/benchmarks-log.md), a process each
    python benchmarks/bench.py --device cpu --dtype float32 --config tiny --frames 9 --height 64 --width 64 --text-len 16
    python benchmarks/bench.py --ckpt-load --size-gb 28 --dir /tmp/x --format pt   # ckpt.load vs `cat file > /dev/null`
    python benchmarks/bench.py --world 8 --config v2w-14b --sac block   # the planner: a table, then one JSON line
    python benchmarks/bench.py --world 8 --config v2w-14b --sac auto --mem-budget 75   # fastest mix in 75 GiB
    python benchmarks/bench.py --world 8 --cp 8 --config v2w-14b --height 704 --width 1280 --sac block   # 720p on 8
    python benchmarks/bench.py --grpo 4 --config v2w-14b --lora 32 --fp8 --sac block --compile   # GRPO's calls
    python benchmarks/bench.py --world 8 --config v2w-14b --lora 32 --sac block --rl nft --rl-k 12   # an RL update

Without --world: forward + backward, no optimizer step. The model is built on `meta`, materialised in bf16 on the
GPU with random weights (no download), and trained on random latents [1, 16, T, H/8, W/8] (T = 1 + (frames-1)/4, the
Wan VAE's compression) with a 512 x 1024 text embedding and the video2world condition mask. Model FLOPs come from the
explicit formula in `nets/flops.model_flops`; MFU is against a bf16 matmul peak measured in the same process.
With --world N: train.py's step (fp32 master weights, collectives.shard_model's FSDP2, bf16 compute, AdamW) as rank 0 of N
ranks under a fake process group: per-rank memory, compute s/step, FSDP bytes moved and a projected step time
(docs/memory.md, "Before you queue a job"). An out-of-memory is reported as status "OOM", not a crash. With --cp C
rank 0 runs its 1/C of the frames through base/cp.py's all-to-alls (the fake group hands its input back), so memory and
compute are its share; the exchange's bytes come from sac.cp_traffic and are added to the projected step.
With --world N --rl grpo|nft: one RL update of train.py per rank instead of a step (benchmarks/rlplan.py).
"""
import contextlib
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

# run as `python benchmarks/bench.py`, sys.path[0] is benchmarks/: the library modules (model, build, ...) are one up
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# before torch is imported: growable segments keep fragmentation from turning a fit into an OOM. Not under --vs, whose
# diffusers sides (peer.py) keep the environment they were given, as a diffusers user's process would
if not any(a == "--vs" or a.startswith("--vs=") for a in sys.argv[1:]):
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import loadbench  # noqa: E402  (bench.py --load: checkpoint load speed)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

import grpo  # noqa: E402
import peer  # noqa: E402  (bench.py --vs; peer.py imports benchstep, never bench)
import rlplan  # noqa: E402  (bench.py --world --rl: an RL update's plan)
import sac  # noqa: E402
from base import cli, cp  # noqa: E402
from base.inits import get_config  # noqa: E402
from benchstep import build_net, emit, latent_shape, make_batch, timed_steps, timer, train_step  # noqa: E402
from engine import build, rollout  # noqa: E402
from model import num_params  # noqa: E402
from nets.family import family_of  # noqa: E402
from nets.flops import matmul_peak, model_flops  # noqa: E402
from nets.lora import add_lora, quantize_base  # noqa: E402


@dataclass
class BenchConfig:
    config: str = "v2w-2b"  # DiT config (inits.CONFIGS)
    sac: str = "selective"  # activation checkpointing: none | block | mm | attn | selective | auto (docs/memory.md)
    every: int = 1  # checkpoint every N-th block only
    lora: int = 0  # LoRA rank; 0 = full fine-tune
    fp8: bool = False  # fp8 GEMMs in the block Linears, as train.py --fp8 (LoRA: the frozen base stored in fp8)
    frames: int = 93  # pixel frames; latent T = vae.latent_frames(frames)
    height: int = 432  # pixels
    width: int = 768  # pixels
    text_len: int = 512  # text-embedding tokens
    cond_frames: int = 1  # latent conditioning frames (video2world; with --views: of views 2.., frame-init mask)
    views: int = 1  # camera views stacked on the latent time axis (p25-2b-agibot: 3, with a fallback-rig camera map)
    steps: int = 5  # timed steps; the median is reported
    warmup: int = 2  # untimed steps first (allocator growth, cuDNN plans, compile)
    compile: bool = False  # torch.compile each block in place (state_dict keys unchanged)
    offload: bool = False  # keep tensors saved for backward (under `block`: the block inputs) in pinned host memory
    parity: bool = False  # instead of timing: the v2w reference case on this device in fp32 and bf16 vs upstream
    tf32: bool = True  # TF32 for the fp32 LoRA adapter matmuls; bf16 matmuls are unaffected
    device: str = "cuda"  # cuda | cpu
    dtype: str = "bfloat16"  # weights and compute: bfloat16 | float32
    seed: int = 0  # random weights and inputs
    profile: str = ""  # write a per-kernel time table here (one extra profiled step) and add shares to the JSON
    sweep: bool = False  # run SWEEP, each entry in its own subprocess, forwarding --compile/--steps/...
    out: str = ""  # also append the JSON line(s) to this file
    timeout: int = 300  # seconds per sweep entry (--vs: per side of a case)
    ckpt_load: bool = False  # instead of a step: ckpt.load of a synthetic bf16 checkpoint vs cat (uses --device)
    size_gb: float = 28.0  # --ckpt-load: checkpoint size (14B block shapes; < 1 GB: tiny shapes)
    dir: str = ""  # --ckpt-load: where the synthetic checkpoint is written once and reused
    format: str = "pt"  # --ckpt-load: pt (release-style, net. keys) | safetensors (our keys)
    threads: int = 8  # --ckpt-load: ckpt.load reader threads
    world: int = 0  # N >= 1: plan one train.py step (FSDP2 + AdamW) as rank 0 of N ranks on this device; 0: no plan
    cp: int = 1  # --world: train.py --cp C, ranks splitting each sample's latent frames (C divides N): rank 0's frames
    link_gb_s: float = 450.0  # --world: link bandwidth per rank and direction, GB/s (NVLink 4: 450; IB NDR 400G: 50)
    mem_budget: float = 0.0  # --sac auto: per-rank memory budget in GiB; picks the fastest per-block mix that fits
    vs: str = ""  # diffusers: the same step on diffusers' CosmosTransformer3DModel with our weights, each side in its
    # own process, and the ratio table (diffusers-vae: WanVAE vs AutoencoderKLWan; peer.py)
    vs_side: str = ""  # --vs diffusers: one side alone here: peer (diffusers, our weights) | stock (a diffusers user's)
    vs_standalone: bool = False  # --vs diffusers: also time stock diffusers; fail if it and the in-bench side differ
    vs_tolerance: float = 0.03  # --vs-standalone: the largest |standalone / in-bench - 1| accepted
    grpo: int = 0  # K >= 2: instead of a step, GRPO's network calls at this shape (Predict2 nets, needs --lora):
    # a rollout step of K states in each rollout_batch layout, the KL reference, one training micro-step
    rl: str = ""  # --world: plan one RL update of train.py --objective grpo|nft per rank instead of an SFT step
    rl_k: int = 4  # --rl: K samples per group
    rl_steps: int = 0  # --rl: sampler steps of a rollout (0: the objective's default, GRPO 8, NFT 10)
    rl_groups: int = 1  # --rl: groups per dp group and update (train.py --batch-size)
    rl_set: str = ""  # --rl: other knobs of its config, "key=value ..." (e.g. "window_size=2 same_latent=true")
    rl_vae: str = "real"  # --rl: decode each sample as a pixel reward does: real (Wan, random weights) | tiny | none


# The sweep table (docs/benchmarks-log.md): v2w-2b full FT under every mode, v2w-14b LoRA r=32 under block, attn.
SWEEP = [
    "--config v2w-2b --sac none",
    "--config v2w-2b --sac mm",
    "--config v2w-2b --sac attn",
    "--config v2w-2b --sac selective",
    "--config v2w-2b --sac block",
    "--config v2w-14b --lora 32 --sac block --steps 3 --warmup 1",
    "--config v2w-14b --lora 32 --sac attn --steps 3 --warmup 1",
]


def parse_args(argv=None):
    """argparse generated from BenchConfig (base/cli.py): --text-len, --ckpt-load, --no-tf32, ...; unknown flags: an error."""
    return cli.parse(BenchConfig, argv, description=__doc__)


# -----------------------------------------------------------------------------
# Planner (--world N): one train.py step as rank 0 of N ranks, on this one device; the formulas are in sac.py ("Will my job fit?")


def plan_header(b: BenchConfig, net, world, shard, traffic, cp_size):
    """The planner row's settings, sizes, formula FLOPs and memory, and FSDP traffic (before anything runs)."""
    shape, cuda = latent_shape(b), b.device == "cuda"
    formula = [sac.state_formula(net, world, r) for r in range(world)]
    return dict(plan=True, config=b.config, world=world, sharded=shard, lora=b.lora, compile=b.compile,
                offload=b.offload, latent=list(shape), text_len=b.text_len, device=b.device, torch=torch.__version__,
                gpu=torch.cuda.get_device_name() if cuda else "cpu", params=num_params(net),
                trainable=sum(p.numel() for p in net.parameters() if p.requires_grad),
                flops_step_3x=model_flops(get_config(b.config), shape, b.text_len, b.lora)[1],
                state_formula_rank0=formula[0], state_formula_min_over_ranks=min(sum(f.values()) for f in formula),
                **traffic, link_gb_s=b.link_gb_s, cp=cp_size)


@contextlib.contextmanager
def planned_net(b: BenchConfig, shard=True):
    """train.py's network as rank 0 of `b.world` ranks, for the body of the with: yields (net, res: the plan header,
    traffic). W > 1: a fake process group (collectives are no-ops of the right shapes, so this device holds exactly
    rank 0's shards and runs the real kernels); W = 1: a real one-rank group, as train.py on one GPU. shard=False: no
    process group (train.py on a CPU without torchrun), for comparison. An out-of-memory in the body is the row's
    status "OOM", not a crash."""
    device, cuda = torch.device(b.device), b.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32  # train.py's compute dtype (fp32 master weights)
    torch.manual_seed(b.seed)
    torch.backends.cuda.matmul.allow_tf32 = b.tf32
    cfg, shape, world = get_config(b.config), latent_shape(b), b.world if shard else 1
    cp_size = b.cp if shard else 1
    # train.py's network: fp32 master weights, LoRA's frozen base in the compute dtype (LoRA's fp8 base, whole on
    # every rank, is refused in main, except for --rl on one rank, where whole is all there is)
    fp8_base = b.fp8 and b.lora and bool(b.rl) and world == 1
    spec = build.NetSpec(config=b.config, lora=b.lora, fp8=(b.fp8 and not b.lora) or fp8_base, compile=b.compile,
                         base_dtype=dtype, seed=b.seed)
    net = build.meta_net(spec)
    traffic = sac.fsdp_traffic(net, world, dtype, b.link_gb_s)
    res = plan_header(b, net, world, shard, traffic, cp_size)
    modes = sac.block_modes(b.sac, b.every, cfg.num_blocks)
    if b.sac == "auto":
        costs, auto, fixed = sac.auto_plan(net, world, device, dtype, shape, b.text_len, b.lora, b.mem_budget, b.fp8)
        print(auto.why, flush=True)
        modes = auto.modes
        res.update(mem_budget_gib=b.mem_budget, auto_fixed_gib=round(fixed / 2**30, 2),
                   auto_costs={m: dataclasses.asdict(c) for m, c in costs.items()},
                   auto_predicted_peak_gib=round(auto.peak_bytes / 2**30, 2))
    spec.sac_modes = tuple(modes)
    res["sac"] = {m: modes.count(m) for m in dict.fromkeys(modes)}
    res.update(sac.cp_traffic(cfg, shape, cp_size, dtype, sum(m != "none" for m in modes), b.link_gb_s))
    if shard and world == 1:
        dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    elif shard:
        from torch.testing._internal.distributed.fake_pg import FakeStore
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:  # as train.py: sac -> cp -> compile -> FSDP2 (the function train.py shards with) -> init
        build.materialise(net, spec, device, cp.make_mesh(device.type, world, cp_size)[2] if shard else None, cp_size)
        yield net, res, traffic
        if set(modes) != {"none"}:
            sac.check_first_step(modes)
        res["status"] = "ok"
    except torch.OutOfMemoryError as e:
        res.update(status="OOM", error=str(e).split("\n")[0][:300])
    finally:
        if shard:
            dist.destroy_process_group()
    res.update(peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
               reserved_gib=round(torch.cuda.max_memory_reserved() / 2**30, 2) if cuda else None)


def run_plan(b: BenchConfig, shard=True):
    """Forward, backward and AdamW step of train.py's model as rank 0 of `b.world` ranks (planned_net)."""
    device, cuda = torch.device(b.device), b.device == "cuda"
    with planned_net(b, shard) as (net, res, traffic):
        trainable = [p for p in net.parameters() if p.requires_grad]  # after fully_shard: the DTensor parameters
        optimizer = torch.optim.AdamW(trainable, lr=1e-5, betas=(0.9, 0.99), weight_decay=0.1, eps=1e-8,
                                      fused=cuda)  # as train.py builds it
        batch = make_batch(b, get_config(b.config), device, torch.float32)  # train.py feeds fp32 latents and text

        def step():
            loss = train_step(net, batch, trainable)
            optimizer.step()
            return loss
        if not b.compile:  # the first step: collectives and executed FLOPs counted (dynamo and dispatch modes clash)
            # FLOPs only without resharding: FlopCounterMode's module hooks keep FSDP2's resharded blocks alive
            # (measured on an H200: v2w-14b W = 8 --sac block OOM at 138 GiB with it, peak 43.8 GiB without)
            count_flops = FlopCounterMode(display=False) if res["world"] == 1 else contextlib.nullcontext()
            with sac.CollectiveBytes() as counted, count_flops as flops:
                step()
            res.update(observed_allgather_bytes=counted.allgather, observed_reduce_scatter_bytes=counted.reduce_scatter,
                       observed_alltoall_bytes=counted.alltoall)
            if flops is not None:
                res["flops_counted"] = flops.get_total_flops()
        times, loss = timed_steps(step, b.warmup, b.steps, device)
        res.update(state_measured_rank0=sac.state_measured(net, optimizer), loss=round(loss.item(), 5))
    if res["status"] == "ok":
        res.update(projected_step(res, times, traffic, res["cp"], device, torch.bfloat16 if cuda else torch.float32))
    return res


def projected_step(res, times, traffic, cp_size, device, dtype):
    """The step time of W ranks: measured compute plus the FSDP traffic it cannot hide and CP's all-to-alls."""
    compute_s = statistics.median(times)
    cp_s = res["cp_comm_s"]  # the all-to-alls block their attention: on the critical path, not overlapped
    projected = traffic["exposed_s"] + max(compute_s, traffic["comm_s"] - traffic["exposed_s"]) + cp_s
    # each rank of a cp group does 1/C of the sample's FLOPs (attention too: all tokens, 1/C of the heads)
    mfu = res["flops_step_3x"] / cp_size / projected / matmul_peak(device, dtype) if device.type == "cuda" else None
    return dict(compute_s=round(compute_s, 4), step_times=[round(x, 4) for x in times],
                projected_step_s=round(projected, 4), projected_bounds_s=[
                    round(max(compute_s, traffic["comm_s"]) + cp_s, 4), round(compute_s + traffic["comm_s"] + cp_s, 4)],
                mfu_projected=round(mfu, 4) if mfu is not None else None)


def plan_table(res):
    """The JSON line's main numbers as a few lines for a person."""
    gib, st = (lambda n: f"{n / 2**30:.3g}"), res.get("state_measured_rank0", res["state_formula_rank0"])
    return "\n".join([
        f"plan: {res['config']} on {res['world']} rank(s), rank 0 on {res['gpu']}: sac {res['sac']}, "
        f"{'LoRA r=' + str(res['lora']) if res['lora'] else 'full fine-tune'}{', compiled' * res['compile']}",
        f"  state per rank   params {gib(st['params'])} + grads {gib(st['grads'])} + AdamW {gib(st['optimizer'])} "
        f"= {gib(sum(st.values()))} GiB",
        f"  memory per rank  {res['status']}: peak allocated {res['peak_gib']} GiB, reserved {res['reserved_gib']} GiB"
        if res["peak_gib"] is not None else "  memory per rank  (CPU: no allocator statistics, only the state above)",
        f"  FSDP traffic     all-gather {res['allgather_bytes'] / 1e9:.3g} GB + reduce-scatter "
        f"{res['reduce_scatter_bytes'] / 1e9:.3g} GB -> {res['link_bytes_per_rank'] / 1e9:.3g} GB per rank, "
        f"{res['comm_s']:.3f} s at {res['link_gb_s']:g} GB/s ({res['exposed_s']:.3f} s not overlappable)",
        *([f"  CP all-to-all    --cp {res['cp']}: {res['alltoall_bytes'] / 1e9:.3g} GB handed -> "
           f"{res['cp_link_bytes_per_rank'] / 1e9:.3g} GB per rank, {res['cp_comm_s']:.3f} s (on the critical path)"]
          if res["cp"] > 1 else []),
        f"  step             compute {res['compute_s']:.3f} s (median of {len(res['step_times'])}) -> projected "
        f"{res['projected_step_s']:.3f} s (bounds {res['projected_bounds_s'][0]:.3f} .. "
        f"{res['projected_bounds_s'][1]:.3f})"
        if res["status"] == "ok" else f"  step             {res['status']}: {res.get('error', '')}"])


# -----------------------------------------------------------------------------
# Profile: where the GPU time goes


def kernel_category(name):
    n = name.lower()
    if any(k in n for k in ("fmha", "flash", "sdpa", "attention", "attn")):
        return "attention"
    if any(k in n for k in ("gemm", "nvjet", "xmma", "cutlass", "cublas", "triton_tem", "matmul", "aten::mm",
                            "aten::addmm", "aten::bmm")):
        return "matmul"
    if n.startswith("triton_"):
        return "fused(triton)"
    return "elementwise/other"


def profile_step(model, batch, trainable, device, path):
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        train_step(model, batch, trainable)
        if device.type == "cuda":
            torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        if device.type == "cuda":
            if e.device_type != torch.autograd.DeviceType.CUDA:
                continue
            us = e.self_device_time_total
        else:  # CPU: aten ops' own time stands in for kernels (code-path test only)
            if not e.key.startswith("aten::"):
                continue
            us = e.self_cpu_time_total
        if us > 0:
            rows.append((us, e.count, e.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows) or 1.0
    shares = {}
    for us, _, name in rows:
        shares[kernel_category(name)] = shares.get(kernel_category(name), 0.0) + us / total
    with open(path, "w") as f:
        f.write(f"# kernel time {total / 1e6:.3f} s in one step; shares {json.dumps(shares)}\n")
        f.write("# us  count  share  category  name\n")
        for us, n, name in rows[:60]:
            f.write(f"{us:12.0f} {n:6d} {us / total:6.1%}  {kernel_category(name):18s} {name[:160]}\n")
    return {k: round(v, 4) for k, v in sorted(shares.items(), key=lambda kv: -kv[1])}, total / 1e6


# -----------------------------------------------------------------------------
# One benchmark, and the sweep


def run(b: BenchConfig):
    device, dtype = torch.device(b.device), getattr(torch, b.dtype)
    torch.manual_seed(b.seed)
    torch.backends.cuda.matmul.allow_tf32 = b.tf32
    cfg = get_config(b.config)
    shape = latent_shape(b)
    fwd, step_3x, step_needed = model_flops(cfg, shape, b.text_len, b.lora)
    tokens = (shape[2] // cfg.patch_temporal) * (shape[3] // cfg.patch_spatial) * (shape[4] // cfg.patch_spatial)
    res = dict(config=b.config, sac=b.sac, every=b.every, lora=b.lora, fp8=b.fp8, compile=b.compile, offload=b.offload,
               latent=list(shape),
               tokens=tokens, text_len=b.text_len, dtype=b.dtype, device=b.device, torch=torch.__version__,
               gpu=torch.cuda.get_device_name() if device.type == "cuda" else "cpu", tf32=b.tf32,
               flops_fwd=fwd, flops_step_3x=step_3x, flops_step_needed=step_needed)
    cuda = device.type == "cuda"
    peak = matmul_peak(device, dtype)  # measured again after the timed steps (clocks up); the larger one is used
    res["matmul_peak_tflops"] = round(peak / 1e12, 1)
    modes = sac.block_modes(b.sac, b.every, cfg.num_blocks)
    if b.sac == "auto":  # the plan with this step's resident state: weights and gradients in --dtype, no optimizer
        net = build.meta_net(build.NetSpec(config=b.config, lora=b.lora, dtype=dtype))
        costs, auto, fixed = sac.auto_plan(net, 1, device, dtype, shape, b.text_len, b.lora, b.mem_budget, b.fp8,
                                            fixed_bytes=sac.resident_bytes(net, b.fp8))
        print(auto.why, flush=True)
        modes = auto.modes
        res.update(sac={m: modes.count(m) for m in dict.fromkeys(modes)}, mem_budget_gib=b.mem_budget,
                   auto_predicted_peak_gib=round(auto.peak_bytes / 2**30, 2))
    try:
        t0 = time.perf_counter()
        model, trainable = build_net(b, device, dtype, modes)
        batch = make_batch(b, cfg, device, dtype)
        res["weights_gib"] = round(torch.cuda.memory_allocated() / 2**30, 2) if cuda else None
        res["trainable_params"] = sum(p.numel() for p in trainable)
        sac.reset_counters()
        for i in range(b.warmup):
            t = timer(device)
            train_step(model, batch, trainable)
            res.setdefault("warmup_s", []).append(round(t(), 3))
        if set(modes) & {"mm", "attn", "selective"}:
            res["saved"] = sac.check_first_step(modes)  # raises if the save list missed the kernels that ran
            res["saved_ops"] = dict(sac.SAVED)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        times = []
        for i in range(b.steps):
            measure = {"before": torch.cuda.memory_allocated()} if cuda and i == 0 else None
            t = timer(device)
            loss = train_step(model, batch, trainable, measure)
            times.append(t())
            if measure:
                res["act_gib"] = round(measure["act_bytes"] / 2**30, 2)
        if not torch.isfinite(loss):
            raise RuntimeError(f"non-finite loss {loss.item()}")
        med = statistics.median(times)
        peak = max(peak, matmul_peak(device, dtype))
        res["matmul_peak_tflops"] = round(peak / 1e12, 1)
        res.update(status="ok", step_s=round(med, 4), step_times=[round(x, 4) for x in times],
                   tflops=round(step_3x / med / 1e12, 1), mfu=round(step_3x / med / peak, 4),
                   tokens_per_s=round(tokens / med, 1),
                   peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
                   reserved_gib=round(torch.cuda.max_memory_reserved() / 2**30, 2) if cuda else None,
                   loss=round(loss.item(), 5), wall_s=round(time.perf_counter() - t0, 1))
        if b.lora:
            res["mfu_needed"] = round(step_needed / med / peak, 4)
        if b.compile:
            from torch._dynamo.utils import counters
            res["graph_breaks"] = sum(counters["graph_break"].values())
            res["unique_graphs"] = counters["stats"]["unique_graphs"]
        if b.profile:
            res["profile"], res["profile_kernel_s"] = profile_step(model, batch, trainable, device, b.profile)
    except torch.OutOfMemoryError as e:
        res.update(status="OOM", error=str(e).split("\n")[0][:300],
                   peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None)
    return res


# -----------------------------------------------------------------------------
# GRPO's network calls (--grpo K): what one update's phases cost per sample, per rollout layout (docs/grpo.md §13)


def run_grpo(b: BenchConfig):
    """s per call and per sample through the net, the median of --steps after --warmup (compile): a rollout step's
    two CFG branches of K states (rollout.branch_predictions, no autograd) in each layout, the KL reference of one
    state (LoRA off, layout cfg), and one training micro-step (grpo.training_log_prob: the cond branch with
    autograd, the uncond reused, then backward). Peak memory per phase."""
    device, dtype = torch.device(b.device), getattr(torch, b.dtype)
    torch.manual_seed(b.seed)
    cfg = get_config(b.config)
    net, trainable = build_net(b, device, dtype, sac.block_modes(b.sac, b.every, cfg.num_blocks))
    batch = make_batch(b, cfg, device, dtype)
    K, shape = b.grpo, latent_shape(b)[1:]
    g = torch.Generator(device=device).manual_seed(b.seed + 2)
    cond = dataclasses.replace(batch["cond"], neg_crossattn_emb=torch.randn(
        batch["cond"].crossattn_emb.shape, device=device, generator=g).to(dtype))
    gcfg = grpo.GRPOConfig(group_size=K, num_steps=2, recompute_old_logp=True)
    family = family_of(cfg)  # its 2-step rollout grid: a stochastic step 0, a deterministic last step
    sigmas, timesteps = family.rollout_grid(2)
    (alpha, beta), last = [rollout.step_coefficients("ddim_eta", sigmas[i], sigmas[i + 1], eta, family)
                           for i, eta in enumerate((0.5, 0.0))]
    states = family.initial_state(torch.randn(K, 3, *shape, device=device, generator=g))
    ro = rollout.Rollout(cond=cond, family=family, sigmas=sigmas, timesteps=timesteps, alphas=[alpha, last[0]],
                         betas=[beta, last[1]], train_steps=[0],
                         states=states, log_probs=torch.zeros(K, 2, device=device), x0_final=None,
                         uncond={(k, 0): torch.randn(1, *shape, device=device, generator=g) for k in range(K)},
                         old_log_probs=torch.zeros(K, 2, device=device))

    def micro_step():
        logp, _ = grpo.training_log_prob(net, ro, [0], 0, gcfg, reuse_uncond=True)
        logp.sum().backward()
        for p in trainable:
            p.grad = None
    calls = {f"rollout_{layout}": (lambda layout=layout: rollout.branch_predictions(
        net, states[:, 0], states[:, 0], 0, ro.grid, cond, dataclasses.replace(gcfg, rollout_batch=layout)), 2 * K)
        for layout in rollout.ROLLOUT_BATCHES}
    calls["reference_cfg"] = (lambda: grpo.reference_mean(net, ro, 0, 0, dataclasses.replace(
        gcfg, rollout_batch="cfg")), 2)
    calls["train_micro_step"] = (micro_step, 1)
    res = dict(config=b.config, lora=b.lora, fp8=b.fp8, compile=b.compile, sac=b.sac, K=K, latent=list(shape),
               torch=torch.__version__, gpu=torch.cuda.get_device_name() if device.type == "cuda" else "cpu")
    for name, (fn, samples) in calls.items():
        for _ in range(b.warmup):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(b.steps):
            t = timer(device)
            fn()
            times.append(t())
        med = statistics.median(times)
        res[name] = dict(s=round(med, 4), s_per_sample=round(med / samples, 4), samples=samples,
                         peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda"
                         else None)
        print(json.dumps({name: res[name]}), flush=True)  # a run cut short by a time limit keeps what it measured
    return res


def sweep(b: BenchConfig, argv):
    """Each SWEEP entry in its own process (an OOM or a crash in one leaves the others running)."""
    skip = {"--sweep", "--out", "--config", "--sac", "--lora", "--every", "--timeout"}  # the entry sets these
    forwarded, i = [], 0
    while i < len(argv):  # forward the parent's other flags (e.g. --compile, --steps) to every entry
        key = argv[i].split("=")[0]
        takes_value = "=" not in argv[i] and i + 1 < len(argv) and not argv[i + 1].startswith("--")
        if key not in skip:
            forwarded += argv[i:i + 1 + takes_value]
        i += 1 + takes_value
    for entry in SWEEP:
        cmd = [sys.executable, os.path.abspath(__file__), *forwarded, *entry.split()]  # the entry wins
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=b.timeout)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if lines:
                res = json.loads(lines[-1])
            else:
                res = dict(args=entry, status="error", rc=proc.returncode, stderr=proc.stderr[-1500:])
        except subprocess.TimeoutExpired:
            res = dict(args=entry, status="timeout", timeout_s=b.timeout)
        res["cmd"] = "python benchmarks/bench.py " + " ".join([*forwarded, *entry.split()])
        emit(res, b.out)


@torch.no_grad()
def parity(b: BenchConfig):
    """The upstream v2w reference case (CPU fp32 outputs) run here in fp32, bf16 and bf16 with the fp8 base (--fp8):
    how close is this device, and what does fp8 add to bf16's error?"""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from safetensors.torch import load_file

    import check_reference
    stem = os.path.join(ROOT, "tests", "data", "reference", "v2w_lora_cond")
    case, io = json.load(open(stem + ".json")), load_file(stem + ".io.safetensors")
    res = dict(parity="v2w_lora_cond", device=b.device, torch=torch.__version__)
    for dtype, quantized in ((torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True)):
        net = check_reference.build_dit_case(case, stem + ".weights.safetensors").to(b.device, dtype)
        if quantized:  # as `--lora R --fp8` holds it: fresh adapters (B = 0: the same function), the base in fp8
            add_lora(net, 4)
            quantize_base(net)
        kwargs = check_reference.call_kwargs(case["call"]["forward_kwargs"], io, net.cfg)
        kwargs = {k: v.to(b.device) if torch.is_tensor(v) else v for k, v in kwargs.items()}
        activity = torch.profiler.ProfilerActivity.CUDA if b.device.startswith("cuda") else torch.profiler.ProfilerActivity.CPU
        with torch.profiler.profile(activities=[activity]) as prof:
            out = check_reference.forward(net, kwargs).float().cpu()
        ref = io["out.y_B_C_T_H_W"]
        name = str(dtype).replace("torch.", "") + ("_fp8" if quantized else "")
        res[f"{name}_max_abs"] = (out - ref).abs().max().item()
        res[f"{name}_rel_rms"] = ((out - ref).square().mean() / ref.square().mean()).sqrt().item()
        res[f"{name}_attention_kernels"] = sorted({e.name[:80] for e in prof.events() if any(
            w in e.name.lower() for w in ("attention", "fmha", "cudnn", "flash"))})[:8]
    return res


def check_views(b: BenchConfig):
    if (b.views > 1) != bool(get_config(b.config).camera_channels):
        raise ValueError(f"--views {b.views} with --config {b.config}: views stack on time only in a camera net "
                         "(p25-2b-agibot: --views 3); a camera net needs --views >= 2")


def check_auto(b: BenchConfig):
    if (b.sac == "auto") != (b.mem_budget > 0):
        raise ValueError("--sac auto needs --mem-budget GiB (> 0, per rank), and --mem-budget needs --sac auto")
    if b.sac == "auto" and b.every != 1:
        raise ValueError(f"--every {b.every} does nothing with --sac auto (it picks a mode per block): drop it")
    sac.validate("block" if b.sac == "auto" else b.sac, b.every)


def check_plan(b: BenchConfig):
    """--world: the planner's flags checked, the ones it would not use refused."""
    check_auto(b)
    for flag, on in (("--parity", b.parity), ("--sweep", b.sweep), ("--ckpt-load", b.ckpt_load),
                     ("--profile", b.profile)):
        if on:
            raise ValueError(f"{flag} does nothing with --world (the planner): drop it")
    cp.check_split(b.cp, b.config, get_config(b.config).num_heads, latent_shape(b)[2], b.frames)
    if b.world % b.cp:
        raise ValueError(f"--cp {b.cp} must divide --world {b.world} (world = dp x cp)")
    if b.cp > 1 and b.sac == "auto":
        raise ValueError("--cp with --sac auto: the auto plan measures a block without CP (as train.py refuses it); "
                         "compare --sac modes with --cp instead")
    check_views(b)
    want = "bfloat16" if b.device == "cuda" else "float32"
    if b.dtype != want:
        raise ValueError(f"--dtype {b.dtype}: with --world the step computes as train.py does on {b.device} "
                         f"({want}, fp32 master weights): pass --dtype {want}")
    if b.link_gb_s <= 0 or b.steps < 1:
        raise ValueError(f"--link-gb-s {b.link_gb_s} and --steps {b.steps} must be > 0")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    b = parse_args(argv)
    if b.device.startswith("cuda") and not torch.cuda.is_available():  # before any model: one line, not an assert
        raise ValueError(f"--device {b.device}: no CUDA device is visible (torch.cuda.is_available() is False): run "
                         "bench.py where a GPU is, or pass --device cpu --dtype float32 with a CPU-sized config, e.g. "
                         "`python benchmarks/bench.py --world 8 --config tiny --device cpu --dtype float32 --frames 9 "
                         "--height 64 --width 112 --text-len 16`")
    if b.vs:  # the same step on diffusers (peer.py: the only importer of diffusers, a benchmark-only dependency)
        return peer.main(b)
    if b.fp8 and b.lora and b.world and not (b.rl and b.world == 1):
        raise ValueError("--fp8 --lora with --world: not planned (train.py --fp8 holds the frozen base whole on every "
                         "rank in e4m3, the planner runs it as FSDP shards); measure one GPU without --world (or "
                         "--world 1 --rl), or let train.py --sac auto size it (its plan counts the fp8 base)")
    check_auto(b)
    rlplan.check(b)
    if b.world:
        check_plan(b)
        res = rlplan.run(b, planned_net) if b.rl else run_plan(b)
        print(rlplan.table(res) if b.rl else plan_table(res), flush=True)
        return emit(res, b.out)
    if b.cp != 1:
        raise ValueError(f"--cp {b.cp} needs --world N (the planner runs train.py's CP step as rank 0 of N)")
    check_views(b)
    if b.grpo:
        if b.grpo < 2 or not b.lora:
            raise ValueError(f"--grpo {b.grpo}: needs K >= 2 and --lora RANK; got --lora {b.lora}")
        return emit(run_grpo(b), b.out)
    if b.ckpt_load:
        if not b.dir or b.format not in ("pt", "safetensors"):
            raise ValueError(f"--ckpt-load needs --dir DIR and --format pt|safetensors, got {b.dir!r} {b.format!r}")
        return loadbench.load_speed(b.size_gb, b.dir, b.format, b.device, b.threads)
    if b.parity:
        return emit(parity(b), b.out)
    if b.sweep:
        return sweep(b, argv)
    emit(run(b), b.out)


if __name__ == "__main__":
    cli.main(main)
