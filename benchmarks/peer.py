"""`python benchmarks/bench.py --vs diffusers`: our training step against diffusers', each side in a fresh process.

    python benchmarks/bench.py --vs diffusers --config v2w-2b --sac block --compile --vs-standalone   # a table + JSON
    python benchmarks/bench.py --vs diffusers --config v2w-14b --lora 32 --sac block --compile --steps 3 --warmup 1
    python benchmarks/bench.py --vs diffusers --vs-side stock --config v2w-2b --sac block --compile   # stock alone
    python benchmarks/bench.py --vs diffusers-vae                                   # WanVAE vs AutoencoderKLWan
    python benchmarks/bench.py --vs diffusers --sweep --compile --timeout 1200   # BENCHMARKS.md's rows

diffusers (0.42.1) is a benchmark-only dependency (PEFT too, for the stock side's --lora), imported only here and in
peer_net.py. The DiT case runs its sides one after the other, each in a new process, so nothing one side sets or
leaves (flags, the SDPA priority order, compile caches, allocator state, memory) reaches another:
- ours: `python benchmarks/bench.py` with the same step flags, exactly what BENCHMARKS.md measures;
- diffusers (`--vs-side peer`): peer_net.to_diffusers: a CosmosTransformer3DModel built by diffusers from its
  config, our seeded weights copied into its own parameters; benchstep.train_step drives it behind our DiT.forward
  signature (PeerNet): the same batch (benchstep.make_batch), EDM preconditioning and loss (model.denoise), forward +
  backward, no optimizer step, the median of --steps after --warmup (benchstep.timer), the peak by
  max_memory_allocated after a reset. After the timed steps one eager forward of each network gives `parity`. LoRA:
  our lora.LoRALinear on their Linears by the same class swap (the adapter code is ours on both sides);
- stock (`--vs-standalone`, or `--vs-side stock` alone): a diffusers user's step: the model from its config with
  diffusers' random init, LoRA through its add_adapter (PEFT, adapters in the model's dtype), the network's inputs
  for bench's batch computed once; only diffusers' forward, the loss and the backward are timed.
Both diffusers sides: gradient checkpointing (`enable_gradient_checkpointing`, their only recompute) iff ours
recomputes anything (--sac != none); --compile: `compile_repeated_blocks(fullgraph=True)`, their regional compile
(0.42.1 lists no `_repeated_blocks`, so we name CosmosTransformerBlock on the instance); everything else at torch's
defaults, as in a diffusers user's process: TF32 off, no allocator setting, the SDPA dispatcher's own order (ours
sets TF32 and expandable segments for itself). Each records `global_state` before its first step and `sdpa_choice`
(the backend SDPA picks there for the step's attention) after its last. --vs-standalone fails with one line when
the two diffusers times differ by more than --vs-tolerance (3%).
Why processes (issue 23): in one process our attention's `sdpa_kernel(..., set_priority=True)` ran first and, on
exit, wrote back the order it had read: torch's not yet initialised one, flash first (torch installs its cuDNN-first
Hopper default once, lazily, at the first SDPA call). Every later SDPA call of the process, diffusers' included, then
ran flash instead of cuDNN. The peer also held our tensors (assigned into a meta-built model), not its own.
The VAE case: vae.WanVAE vs AutoencoderKLWan (peer_net.vae_to_diffusers), encode and decode of one random video at
--frames x --height x --width in --dtype, in one process (both call SDPA without a kernel context), each side as its
pipeline runs it (ours: cfg.temporal_window frames per encoder call; theirs: 4, clamped output), peak above the
weights and input (as `benchmarks/vae_bench.py --bench`). --config tiny* also picks the tiny VAE (CPU tests).

What stays theirs: per-frame times go in as [B, 1, T, 1, 1], which they expand to every token (their adaLN MLPs
then run per token, ours per frame); attention through their dispatcher (PyTorch's SDPA choice; ours puts cuDNN first).

Contents, top to bottom: the sides (timing, process state, peer, stock) -> the cases -> table -> sweep -> main.
"""
import dataclasses
import gc
import importlib.metadata
import importlib.util
import json
import os
import statistics
import subprocess
import sys

import torch
import torch._dynamo.config
import torch._inductor.config
from torch._dynamo.utils import counters
from torch.nn.attention import SDPBackend, _cur_sdpa_kernel_backends

import benchstep
import sac
from base import cli
from base.inits import get_config
from nets.vae import WanVAE, get_vae_config
from peer_net import (
    PeerNet,
    build_stock,
    compare,
    diffusers_inputs,
    diffusers_lora_targets,
    import_diffusers,
    their_decode,
    their_encode,
    to_diffusers,
    transformer_kwargs,
    vae_to_diffusers,
    velocity,
    weights,
)

PEFT_MISSING = ("--lora with stock diffusers (--vs-standalone, --vs-side stock) needs PEFT, diffusers' LoRA backend "
                "(pip install peft>=0.17.0); or drop --vs-standalone")
CASES = ("diffusers", "diffusers-vae")
BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench.py")  # each side's command
SIDES = ("peer", "stock")
# environment variables that change a step's kernels or allocator, recorded in each side's global_state
ENV_KNOBS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "DIFFUSERS_ATTN_BACKEND",
             "TORCH_CUDNN_SDPA_DEPRIORITIZED", "CUBLAS_WORKSPACE_CONFIG", "CUDA_LAUNCH_BLOCKING", "NVIDIA_TF32_OVERRIDE")




def _gib(nbytes):
    return round(nbytes / 2**30, 2)


def _free(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def time_steps(step, b, device):
    """bench.run's timing of step() (it returns the loss): --warmup calls, a peak reset, the median of --steps."""
    cuda = device.type == "cuda"
    try:
        times, loss = benchstep.timed_steps(step, b.warmup, b.steps, device)
        if not torch.isfinite(loss):
            raise RuntimeError(f"non-finite loss {loss.item()}")
    except torch.OutOfMemoryError as e:
        return dict(status="OOM", error=str(e).split("\n")[0][:300],
                    peak_gib=_gib(torch.cuda.max_memory_allocated()) if cuda else None)
    return dict(status="ok", step_s=round(statistics.median(times), 4), step_times=[round(x, 4) for x in times],
                peak_gib=_gib(torch.cuda.max_memory_allocated()) if cuda else None,
                reserved_gib=_gib(torch.cuda.max_memory_reserved()) if cuda else None, loss=round(loss.item(), 5))


def _changed(config):
    """The names of a torch config module's settings that are not at their defaults (set in code or by env)."""
    return sorted(k for k in config._config if not config._is_default(k))


def global_state():
    """The process-wide settings a step's speed can depend on, as JSON: each diffusers side records them before its
    first step (tests hold them to a fresh interpreter's: a diffusers user's process)."""
    mm, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    return dict(matmul_tf32=mm.allow_tf32, matmul_precision=torch.get_float32_matmul_precision(),
                reduced_bf16=mm.allow_bf16_reduced_precision_reduction,
                reduced_fp16=mm.allow_fp16_reduced_precision_reduction,
                cudnn=dict(enabled=cudnn.enabled, benchmark=cudnn.benchmark, deterministic=cudnn.deterministic,
                           tf32=cudnn.allow_tf32),
                deterministic=torch.are_deterministic_algorithms_enabled(),
                default_dtype=str(torch.get_default_dtype()), sdpa_enabled=[k.name for k in _cur_sdpa_kernel_backends()],
                sdpa_order=torch._C._get_sdp_priority_order(),
                dynamo=_changed(torch._dynamo.config), inductor=_changed(torch._inductor.config),
                env={k: os.environ.get(k) for k in ENV_KNOBS})


def sdpa_choice(cfg, b, device, dtype):
    """The SDPA backend torch's dispatcher picks in this process for the step's self-attention (its tokens, heads
    and head size, diffusers' [B, S, H, D] layout, with grad). Asked after the timed steps: the asking sets torch's
    lazy default order (cuDNN first on Hopper) where no SDPA call has yet."""
    _, _, T, H, W = benchstep.latent_shape(b)
    tokens = T // cfg.patch_temporal * (H // cfg.patch_spatial) * (W // cfg.patch_spatial)
    q = torch.empty(1, tokens, cfg.num_heads, cfg.head_dim, device=device, dtype=dtype, requires_grad=True)
    choice = torch._fused_sdp_choice(*(q.transpose(1, 2),) * 3)
    return {int(v): k for k, v in SDPBackend.__members__.items()}.get(choice, str(choice))


def time_diffusers(model, b, cfg, step):
    """diffusers' own recompute and compile set on `model`, then step(trainable) timed; the side's JSON entry."""
    device, dtype = torch.device(b.device), getattr(torch, b.dtype)
    gc_on = b.sac != "none"
    if gc_on:
        model.enable_gradient_checkpointing()
    if b.compile:
        model._repeated_blocks = ["CosmosTransformerBlock"]  # unset in 0.42.1 (see the docstring)
        model.compile_repeated_blocks(fullgraph=True)
    trainable = [p for p in model.parameters() if p.requires_grad]
    state = global_state()
    res = time_steps(lambda: step(trainable), b, device)
    res.update(mode=("GC" if gc_on else "no GC") + (" + compile" if b.compile else ""), global_state=state,
               trainable_params=sum(p.numel() for p in trainable), trainable_dtypes=sorted({str(p.dtype).replace(
                   "torch.", "") for p in trainable}))
    if res["status"] == "ok":  # (after an OOM the probe's own tensor could fail too)
        res["sdpa_choice"] = sdpa_choice(cfg, b, device, dtype)
    if b.compile:
        res.update(graph_breaks=sum(counters["graph_break"].values()), unique_graphs=counters["stats"]["unique_graphs"])
    return res


def run_peer(b):
    """--vs-side peer: diffusers' model with our seeded weights copied in, timed through bench's step (the same batch,
    preconditioning and loss as ours); after the timed steps, the parity of one eager forward of each network."""
    device, dtype = torch.device(b.device), getattr(torch, b.dtype)
    cfg = get_config(b.config)
    peer = to_diffusers(weights(b, device, dtype))  # our copy is freed on return
    _free(device)
    batch, wrapped = benchstep.make_batch(b, cfg, device, dtype), PeerNet(peer, cfg)
    res = time_diffusers(peer, b, cfg, lambda trainable: benchstep.train_step(wrapped, batch, trainable))
    if res["status"] == "ok":
        for p in peer.parameters():
            p.grad = None
        net = weights(b, device, dtype)  # the same seed: the same values
        with torch.no_grad(), torch.compiler.set_stance("force_eager"):
            res["parity"] = compare(velocity(wrapped, batch), velocity(net, batch))
    return res


def stock_inputs(b, cfg, device, dtype):
    """The diffusers call's keyword arguments and the loss's target and weights for bench's batch, computed once:
    what a training loop hands the network each step (model.denoise's preconditioning, run here on a recorder)."""
    batch, seen = benchstep.make_batch(b, cfg, device, dtype), {}

    def record(x, t, cond):
        seen.update(diffusers_inputs(cfg, dtype, x, t, cond))
        return torch.zeros_like(x)
    velocity(record, batch)
    return seen, batch["eps"] - batch["x0"], 1 - batch["cond"].condition_mask


def run_stock(b):
    """--vs-side stock: a diffusers user's step. The model from its config with diffusers' random init, LoRA through
    diffusers' add_adapter (PEFT, adapters in the model's dtype), its own checkpointing and regional compile; the
    timed step is only diffusers' forward, the loss and the backward."""
    device, dtype = torch.device(b.device), getattr(torch, b.dtype)
    cfg = get_config(b.config)
    model = build_stock(cfg, device, dtype)
    if b.lora:
        from peft import LoraConfig  # optional: only this side needs it (diffusers' LoRA backend)
        model.requires_grad_(False)
        model.add_adapter(LoraConfig(r=b.lora, lora_alpha=b.lora, target_modules=diffusers_lora_targets()))
    kwargs, target, keep = stock_inputs(b, cfg, device, dtype)
    _free(device)

    def step(trainable):
        for p in trainable:
            p.grad = None
        out = model(**kwargs, return_dict=False)[0]
        loss = ((out.float() - target) ** 2 * keep).mean()
        loss.backward()
        return loss
    res = time_diffusers(model, b, cfg, step)
    if b.lora:
        res["mode"] += f", PEFT {importlib.metadata.version('peft')} LoRA"
    return res


def _run_json(cmd, timeout):
    """A bench.py subprocess's last JSON line (its stderr passed on), or an entry saying why there is none."""
    args = " ".join(cmd[2:])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(args=args, status="timeout", timeout_s=timeout)
    sys.stderr.write(proc.stderr)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return dict(args=args, status="error", rc=proc.returncode, stderr=proc.stderr[-1500:])
    row = json.loads(lines[-1])
    if proc.returncode:  # a row written, then a failed check (--vs-standalone): both kept
        row.update(rc=proc.returncode, error=(proc.stderr.strip().splitlines() or [""])[-1])
    return row


def _flags(b, drop):
    """b's fields that differ from BenchConfig's defaults, as bench.py flags, less the names in `drop`."""
    flags = []
    for f in dataclasses.fields(b):
        value = getattr(b, f.name)
        if f.name in drop or value == f.default:
            continue
        flag = cli.flag(f.name)
        flags += [flag if value else "--no-" + flag[2:]] if isinstance(value, bool) else [flag, str(value)]
    return flags


def side_command(b, side):
    """The command of one side of a --vs diffusers case: ours is plain `python benchmarks/bench.py` with the step
    flags; the diffusers sides add --vs-side and keep torch's defaults (no --no-tf32)."""
    drop = {"vs", "vs_side", "vs_standalone", "vs_tolerance", "sweep", "out", "timeout"} | ({"tf32"} if side != "ours"
                                                                                           else set())
    vs = [] if side == "ours" else ["--vs", b.vs, "--vs-side", side]
    return [sys.executable, BENCH, *vs, *_flags(b, drop)]


def run_dit(b):
    """Our step, then diffusers' with our weights (then stock diffusers with --vs-standalone), each in a fresh
    process: one row."""
    diffusers = import_diffusers()
    sides = {"ours": "ours", "diffusers": "peer", **({"stock": "stock"} if b.vs_standalone else {})}
    row = {}
    for key, side in sides.items():
        row[key] = _run_json(side_command(b, side), b.timeout)
        row[key]["cmd"] = "python benchmarks/bench.py " + " ".join(side_command(b, side)[2:])
    ours = row["ours"]
    ours["mode"] = b.sac + (" + compile" if b.compile else "")
    case = f"{b.config} {f'LoRA r={b.lora}' if b.lora else 'full FT'}, --sac {b.sac}"
    row.update(vs="diffusers", case=case, diffusers_version=diffusers.__version__, torch=torch.__version__,
               device=ours.get("gpu"), dtype=b.dtype, parity=row["diffusers"].get("parity"),
               ratio=_ratio(row["diffusers"], ours))
    if b.vs_standalone:
        row.update(ratio_standalone=_ratio(row["stock"], ours),
                   standalone_vs_in_bench=_ratio(row["stock"], row["diffusers"]))
    return row


def _ratio(num, den):
    return round(num["step_s"] / den["step_s"], 3) if num.get("status") == den.get("status") == "ok" else None


def check_agreement(row, tolerance):
    """--vs-standalone: the in-bench diffusers step must time as stock diffusers does, within `tolerance` (one line)."""
    theirs, stock = row["diffusers"], row["stock"]
    if row["standalone_vs_in_bench"] is None:
        raise ValueError(f"--vs-standalone: nothing to compare: in-bench diffusers {theirs.get('status')}, standalone "
                         f"{stock.get('status')} (the JSON line above has the errors)")
    gap = row["standalone_vs_in_bench"] - 1
    if abs(gap) > tolerance:
        raise ValueError(f"--vs-standalone: in-bench diffusers {theirs['step_s']:.3f} s and standalone diffusers "
                         f"{stock['step_s']:.3f} s differ by {gap:+.1%} (> {tolerance:.0%}): the --vs number is not a "
                         f"diffusers user's; compare the sides' global_state and sdpa_choice in the JSON line")


def _measure(fn, b, device):
    """(median seconds over --steps after --warmup calls, peak GiB above what was live before; None on CPU)."""
    cuda = device.type == "cuda"
    for _ in range(b.warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base, times = torch.cuda.memory_allocated() if cuda else 0, []
    for _ in range(b.steps):
        t = benchstep.timer(device)
        fn()  # the result is dropped at once: every call starts from the same live memory
        times.append(t())
    peak = _gib(torch.cuda.max_memory_allocated() - base) if cuda else None
    return dict(s=round(statistics.median(times), 4), times=[round(x, 4) for x in times], peak_gib=peak)


def run_vae(b):
    """Our WanVAE and AutoencoderKLWan on the same weights and video: encode and decode, one row."""
    diffusers = import_diffusers()
    device, dtype = torch.device(b.device), getattr(torch, b.dtype)
    name = "tiny" if b.config.startswith("tiny") else "real"
    torch.manual_seed(b.seed)
    with torch.device(device):
        ours = WanVAE(get_vae_config(name))  # default init: time and memory do not depend on the values
    ours = ours.to(dtype).eval().requires_grad_(False)
    peer = vae_to_diffusers(ours)
    g = torch.Generator(device=device).manual_seed(b.seed + 1)
    video = (torch.rand(1, 3, b.frames, b.height, b.width, device=device, generator=g) * 2 - 1).to(dtype)
    latent = ours.encode(video)
    parity = dict(encode=compare(their_encode(peer, video), latent),
                  decode=compare(their_decode(peer, latent), ours.decode(latent).clamp(-1, 1)))  # theirs clamps
    _free(device)
    window = ours.cfg.temporal_window
    sides = dict(ours=dict(encode=_measure(lambda: ours.encode(video), b, device),
                           decode=_measure(lambda: ours.decode(latent), b, device),
                           mode=f"{window} frames per encoder call"),
                 diffusers=dict(encode=_measure(lambda: their_encode(peer, video), b, device),
                                decode=_measure(lambda: their_decode(peer, latent), b, device),
                                mode="4 frames per encoder call"))
    ratio = {op: round(sides["diffusers"][op]["s"] / sides["ours"][op]["s"], 3) for op in ("encode", "decode")}
    case = f"Wan VAE ({name}) encode / decode {b.frames}x{b.height}x{b.width} {b.dtype}"
    return dict(vs="diffusers-vae", case=case, diffusers_version=diffusers.__version__, torch=torch.__version__,
                device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu", dtype=b.dtype,
                video=[1, 3, b.frames, b.height, b.width], latent=list(latent.shape), parity=parity, ratio=ratio,
                **sides)


# -----------------------------------------------------------------------------
# The table


def _cell(seconds, gib, mode=None):
    text = f"{seconds:.3f} s" + ("" if gib is None else f", {gib:.1f} GiB")
    return text + (f" ({mode})" if mode else "")


def _side(row, who):
    side = row[who]
    if row["vs"] == "diffusers-vae":
        return " / ".join(_cell(side[op]["s"], side[op]["peak_gib"]) for op in ("encode", "decode")) + \
            f" ({side['mode']})"
    if side["status"] != "ok":
        return f"{side['status']} ({side.get('mode', '-')})"
    return _cell(side["step_s"], side["peak_gib"], side["mode"])


def _x(ratio):
    return "-" if ratio is None else f"{ratio:.2f}x"


def table(rows):
    """The markdown ratio table (ratio = diffusers' time / ours: above 1, ours is faster); with --vs-standalone the
    stock diffusers run, its ratio and its time over the in-bench diffusers step's."""
    stock = any("stock" in row for row in rows)
    lines = ["| case | nanocosmos | diffusers | ratio |" + " diffusers standalone | ratio | standalone / in-bench |"
             * stock, "|---|---|---|---|" + "---|---|---|" * stock]
    for row in rows:
        if "vs" not in row:  # a sweep entry that produced no row
            lines.append(f"| {row['args']} | {row['status']} | {row['status']} | - |" + " - | - | - |" * stock)
            continue
        ratio = row["ratio"]
        ratio = " / ".join(f"{ratio[op]:.2f}x" for op in ("encode", "decode")) if isinstance(ratio, dict) else _x(ratio)
        line = f"| {row['case']} | {_side(row, 'ours')} | {_side(row, 'diffusers')} | {ratio} |"
        if stock:
            line += (f" {_side(row, 'stock')} | {_x(row['ratio_standalone'])} | {_x(row['standalone_vs_in_bench'])} |"
                     if "stock" in row else " - | - | - |")
        lines.append(line)
    return "\n".join(lines)


# -----------------------------------------------------------------------------
# Sweep: the BENCHMARKS.md rows, each in its own process (an OOM or a crash in one leaves the others running)

SWEEP = ["--config v2w-2b --sac selective",
         "--config v2w-2b --sac block",
         "--config v2w-14b --lora 32 --sac block --steps 3 --warmup 1",
         "--vs diffusers-vae"]


def sweep_commands(b):
    """One bench.py command line per SWEEP entry: the parent's other flags forwarded, the entry's winning."""
    skip = {"sweep", "out", "vs", "config", "sac", "lora", "every"}  # the entries set these
    cmds = []
    for entry in SWEEP:  # the VAE runs eager on both sides, in one process
        drop = skip | ({"compile", "vs_standalone", "vs_tolerance"} if "diffusers-vae" in entry else set())
        cmds.append([sys.executable, BENCH, "--vs", "diffusers", *_flags(b, drop),
                     *entry.split()])
    return cmds


def sweep(b):
    rows = []
    for cmd in sweep_commands(b):
        row = _run_json(cmd, b.timeout * (2 + b.vs_standalone))  # --timeout is per side (process) of a case
        row["cmd"] = "python benchmarks/bench.py " + " ".join(cmd[2:])
        benchstep.emit(row, b.out)
        rows.append(row)
    print(table(rows), flush=True)
    return rows


# -----------------------------------------------------------------------------
# main (bench.py --vs ...)


def check(b):
    """--vs takes bench.py's step flags; the flags of its other modes are refused."""
    if b.vs not in CASES:
        raise ValueError(f"--vs {b.vs!r}: valid: {', '.join(CASES)}")
    for flag, on in (("--world", b.world), ("--cp", b.cp != 1), ("--parity", b.parity), ("--ckpt-load", b.ckpt_load),
                     ("--profile", b.profile), ("--offload", b.offload), ("--every", b.every != 1),
                     ("--views", b.views != 1), ("--mem-budget", b.mem_budget), ("--fp8", b.fp8)):
        if on:
            raise ValueError(f"{flag} does nothing with --vs {b.vs} (diffusers has no counterpart): drop it")
    if b.sac == "auto":
        raise ValueError("--sac auto does nothing with --vs (diffusers has one recompute mode to set against ours): "
                         "pick none | block | mm | attn | selective")
    sac.validate(b.sac, b.every)
    benchstep.latent_shape(b)
    if b.steps < 1 or b.warmup < 0:
        raise ValueError(f"--steps {b.steps} must be >= 1 and --warmup {b.warmup} >= 0")
    if b.vs == "diffusers-vae" and (b.lora or b.compile or b.vs_side or b.vs_standalone):
        raise ValueError("--lora, --compile, --vs-side and --vs-standalone do nothing with --vs diffusers-vae (the "
                         "VAE runs eager, frozen, both sides in one process): drop them")
    if b.vs == "diffusers":
        transformer_kwargs(get_config(b.config))
    check_sides(b)


def check_sides(b):
    """--vs-side, --vs-standalone and --vs-tolerance: checked, and PEFT found where a stock LoRA step needs it."""
    if b.vs_side not in ("", *SIDES):
        raise ValueError(f"--vs-side {b.vs_side!r}: valid: {', '.join(SIDES)} (or none: the whole case)")
    if b.vs_side and (b.sweep or b.vs_standalone):
        raise ValueError("--vs-side runs one side alone: drop --sweep and --vs-standalone")
    if b.vs_side and not b.tf32:
        raise ValueError("--no-tf32 does nothing with --vs-side (the diffusers sides keep torch's defaults): drop it")
    if b.vs_tolerance <= 0 or (b.vs_tolerance != 0.03 and not b.vs_standalone):
        raise ValueError(f"--vs-tolerance {b.vs_tolerance}: a fraction > 0, and only with --vs-standalone")
    if b.lora and (b.vs_standalone or b.vs_side == "stock") and importlib.util.find_spec("peft") is None:
        raise ValueError(PEFT_MISSING)


def main(b):
    """bench.py's entry for --vs: the sweep, one side (its JSON line), or one case (a table, then its JSON line);
    with --vs-standalone a disagreement of the two diffusers sides is one line (after the row is written)."""
    check(b)
    import_diffusers()  # the one-line refusal before any work
    if b.sweep:
        return sweep(b)
    if b.vs_side:
        row = run_peer(b) if b.vs_side == "peer" else run_stock(b)
        row.update(side=b.vs_side, config=b.config, lora=b.lora, sac=b.sac, compile=b.compile, torch=torch.__version__,
                   diffusers=import_diffusers().__version__, gpu=torch.cuda.get_device_name() if b.device == "cuda"
                   else b.device)
        return benchstep.emit(row, b.out)
    row = run_dit(b) if b.vs == "diffusers" else run_vae(b)
    print(table([row]), flush=True)
    benchstep.emit(row, b.out)
    if b.vs_standalone:
        check_agreement(row, b.vs_tolerance)
    return row
