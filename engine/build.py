"""The networks, built in one place, and the iteration-0 init guard that proves a loaded one went in: train.py, bench.py, smoke.py, sample.py and engine/resume.py build the DiT here, and
every command its frozen video tokenizer (build_vae).

make_encoder is train.py's batch -> (latent, Condition), through the VAE built here.

The order is torchtitan's and matters (docs/memory.md):
    meta build -> LoRA / freeze (frozen base in the compute dtype) -> fp8 -> activation checkpointing per block
    -> context parallel -> compile per block -> FSDP2 -> materialise -> seeded init -> strict load -> fp8 base
FSDP2 is collectives.shard_model. Everything up to FSDP works on the meta device, so nothing is allocated until the
shards are; a planner that must see the adapted meta network (`--sac auto`, bench.py's memory formulas) calls
`meta_net`, then `materialise`.
"""
import math
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

import ckpt
import condition
import sac
from base import cp, fp8
from base.camera import stack_views
from base.collectives import agree, comm_device, rank, say, shard_model, world_size
from base.formats import CheckpointError
from base.inits import get_config
from model import DiT, num_params
from nets.edm import denoise
from nets.flops import model_flops
from nets.lora import LORA_TARGETS, adapted_linears, add_lora, check_fp8_shapes, quantize_base, target_linears
from nets.vae import LinearCodec, WanVAE, get_vae_config, latent_frames

RECOMPILE_LIMIT = 16  # per compiled block: room for every variant a GRPO run needs, never a silent eager fallback


@dataclass(kw_only=True)
class NetSpec:
    """What to build. Every entry point fills one from its own config."""
    config: str  # inits.get_config name
    action_dim: int = 0  # an action config's, when not the config's own (0): a net trained from scratch on one's own
    # robot's commands takes its data's (clips/actionclips.network_action_dim; recorded with every step)
    init: str = "random"  # random (the seeded init_weights) or anything ckpt.load takes
    ema: bool = None  # ckpt.load's ema: None = the file's only weights, True / False = its EMA / raw weights
    lora: int = 0  # adapter rank; 0 = every parameter trains
    lora_alpha: float = None  # None = rank (scale 1)
    fp8: bool = False  # LoRA: frozen base in fp8 (after the load); full fine-tune: fp8 GEMMs (base/fp8.py)
    sac_modes: tuple = ()  # one activation-checkpointing mode per block (sac.block_modes); () = none
    compile: bool = False  # torch.compile each block in place (no _orig_mod. in any key)
    dtype: torch.dtype = torch.float32  # the parameters (train.py: fp32 masters; FSDP casts to the compute dtype)
    base_dtype: torch.dtype = None  # LoRA's frozen base (train.py: the compute dtype); None = dtype
    seed: int = 0  # torch.manual_seed before init_weights: the random base and the adapters follow it alone


def net_config(config, action_dim=0):
    """The DiTConfig of --config with a run's own action_dim (0: the config's)."""
    return get_config(config, **({"action_dim": action_dim} if action_dim else {}))


def step_counts(cfg, views):
    """(tokens, FLOPs) per rank and step of train.py's cfg (views: a camera net's, else 0): a cp group shares each
    sample's FLOPs (attention: all tokens, 1/cp of the heads)."""
    shape = (1, 16, max(views, 1) * latent_frames(cfg.frames), cfg.height // 8, cfg.width // 8)
    tokens = shape[2] * (cfg.height // 16) * (cfg.width // 16) * cfg.batch_size * cfg.grad_accum
    flops = model_flops(net_config(cfg.config, cfg.action_dim), shape, cfg.text_len, cfg.lora)[2]
    return tokens, flops * cfg.batch_size * cfg.grad_accum / cfg.cp


def meta_net(spec: NetSpec):
    """The DiT on the meta device with its adapters (or fp8 GEMMs): what planners measure before materialising."""
    with torch.device("meta"):
        net = DiT(net_config(spec.config, spec.action_dim)).to(spec.dtype)
    if spec.lora:
        add_lora(net, spec.lora, spec.lora_alpha or None)
        # the adapted Linears' frozen base in the compute dtype: fp32 would hold 4 B per weight that never trains
        # (14B: 54 GiB instead of 27) for FSDP to cast to bf16 anyway; the adapters keep fp32 masters
        for m in adapted_linears(net):
            m.weight = torch.nn.Parameter(m.weight.to(spec.base_dtype or spec.dtype), requires_grad=False)
        if spec.fp8:
            check_fp8_shapes(net)
    elif spec.fp8:
        fp8.convert_trainable(target_linears(net, LORA_TARGETS))  # same keys; the targets' GEMMs go fp8
    return net


def materialise(net, spec: NetSpec, device, cp_group=None, cp_size=1, verbose=True):
    """Checkpointing, CP, compile, FSDP2 (under torch.distributed), then weights: seeded init, strict load of
    spec.init (a LoRA net may lack only its adapters), fp8 base. Returns net."""
    sac.apply_per_block(net, list(spec.sac_modes) or sac.block_modes("none", 1, len(net.blocks)))
    cp.enable(net, cp_group)  # before compile: the blocks' guards see their final attributes
    if spec.compile:
        # GRPO legitimately runs ~8 variants of a block (batch 1|2|2K, grad on|off, LoRA on|off as the KL reference);
        # past the limit dynamo would fall back to eager in silence, a compiled run that is not: raise instead
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        torch._dynamo.config.fail_on_recompile_limit_hit = True
        for block in net.blocks:
            block.compile()  # in place: no _orig_mod. in any key
    if dist.is_initialized():
        frozen = {m.weight for m in adapted_linears(net)} if spec.fp8 else None  # replaced by fp8 buffers below
        shard_model(net, device, cp_size, ignored=frozen)
    net.to_empty(device=device)
    torch.manual_seed(spec.seed)  # same on every rank, so the DTensor init is one consistent model
    net.init_weights()
    net.init_checksum = None  # what went in: the loaded file's content checksum (a LoRA run's base identity)
    if spec.init != "random":
        report = ckpt.load(net, spec.init, ema=spec.ema, allow_missing=(ckpt.LORA_KEYS,) if spec.lora else (),
                           verbose=verbose)
        net.init_checksum = f"{report.checksum:016x}"
    if spec.fp8 and spec.lora:  # after the load: the base went in whole (and was checked), then is quantised
        quantize_base(net)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return net


def compile_seconds():
    """Seconds spent compiling in this process so far, by dynamo's own timers: every frame compile (inductor's
    forward graphs inside it) plus the backward graphs AOTAutograd compiles lazily at their first backward. A step's
    difference is its compile cost, so a first update's s_per_step minus it is the steady-state cost."""
    times = torch._dynamo.utils.compilation_time_metrics
    return sum(sum(times.get(name, ())) for name in ("_compile.compile_inner", "compile_fx.<locals>.bw_compiler"))


def build(spec: NetSpec, device, cp_group=None, cp_size=1, verbose=True):
    """meta_net then materialise: the network ready to train or sample."""
    return materialise(meta_net(spec), spec, device, cp_group, cp_size, verbose)


def describe(net, spec: NetSpec, n_params):
    """What was built, for the start-up line: parameters (n_params: counted before fp8 replaced the frozen base by
    buffers), trainable ones, LoRA, fp8."""
    n_trainable = sum(p.numel() for p in trainable(net))
    lora = f" (LoRA r={spec.lora})" if spec.lora else ""
    fp8_note = ", fp8 GEMMs (weights and their gradients bf16/fp32)" if spec.fp8 else ""
    if spec.fp8 and spec.lora:
        fp8_note = f", frozen base of {len(adapted_linears(net))} Linears in fp8 ({fp8.fp8_bytes(net) / 2 ** 30:.2f} GiB)"
    return f"{n_params:,} parameters, {n_trainable:,} trainable{lora}{fp8_note}"


def trainable(net):
    """The parameters the optimizer steps (after FSDP: the DTensor ones)."""
    return [p for p in net.parameters() if p.requires_grad]


def training_net(run):
    """train.py's network: its run's settings (run: train.Run) as a NetSpec, with --sac auto's plan (one block
    measured under every mode at this run's shape, rank 0's choice for all ranks), built; (net, its sac modes)."""
    cfg, mcfg = run.cfg, net_config(run.cfg.config, run.cfg.action_dim)
    spec = NetSpec(config=cfg.config, action_dim=cfg.action_dim, init=cfg.init, ema={"": None, "net": False, "net_ema": True}[cfg.ema_weights],
                   lora=cfg.lora, lora_alpha=cfg.lora_alpha or None, fp8=cfg.fp8, sac_modes=(), compile=cfg.compile,
                   dtype=torch.float32, base_dtype=run.compute_dtype, seed=cfg.seed)
    net = meta_net(spec)
    spec.sac_modes = sac.block_modes(cfg.sac, cfg.sac_every, mcfg.num_blocks)
    if cfg.sac == "auto":  # rank 0's choice for all ranks
        latent = (cfg.batch_size, mcfg.in_channels, max(run.views, 1) * latent_frames(cfg.frames), cfg.height // 8,
                  cfg.width // 8)
        auto = agree("--sac auto", lambda: sac.auto_plan(net, run.world, run.device, run.compute_dtype, latent,
                                                               cfg.text_len, cfg.lora, cfg.mem_budget, cfg.fp8)[1],
                          share=True)
        run.say(auto.why)
        spec.sac_modes = auto.modes
    if cfg.init == "random" and run.resume_from is None:  # a resumed run's weights come from its checkpoint
        run.say(f"init: RANDOM weights (--init random): {cfg.config} trains from scratch")
    n_params = num_params(net)  # before fp8 replaces the frozen base by buffers
    materialise(net, spec, run.device, run.cp_group, cfg.cp)
    run.say(f"model: {cfg.config}, {describe(net, spec, n_params)}, sac={cfg.sac}/{cfg.sac_every}, {run.world} "
            f"rank(s) on {run.device.type}" + (f" (dp {run.dp_world} x cp {cfg.cp})" if cfg.cp > 1 else ""))
    return net, spec.sac_modes


def build_vae(name, ckpt_path, device, dtype):
    """The frozen tokenizer of train.py and sample.py. `real` loads ckpt_path (tokenizer.pth) strictly through
    ckpt.load; `tiny` is the LinearCodec (no checkpoint, identical in every process, so sample.py decodes what
    train.py encoded). VAE_CONFIGS["tiny"] is the Wan architecture at width 8, for tests and benchmarks only."""
    if name == "real":
        vae = WanVAE(get_vae_config("real"))
        ckpt.load(vae, ckpt_path)
    elif name == "tiny":
        vae = LinearCodec()
    else:
        raise ValueError(f"vae {name!r}: tiny or real")
    return vae.to(device=device, dtype=dtype).eval().requires_grad_(False)


def make_encoder(run, vae):
    """train.py's to_latent(batch) -> (latent, its Condition: condition.from_batch): views are encoded one by one and stacked on
    latent time. --cache-latents keeps encoded clips in memory by (video, start frame)."""
    cfg, device, views, latent_cache = run.cfg, run.device, run.views, {}

    def to_latent(batch):
        keys = list(zip(batch["stem"], batch["start"].tolist()))
        if "latent" in batch:  # --latents: encoded by cache.py exactly as below (views already stacked)
            latent = batch["latent"].to(device).float()
        elif not (cfg.cache_latents and all(k in latent_cache for k in keys)):
            with torch.no_grad():
                video = batch["video"].to(device, run.compute_dtype)
                latent = vae.encode(video.flatten(0, 1) if views else video).float()
            latent = stack_views(latent, views) if views else latent
            if cfg.cache_latents:
                latent_cache.update(zip(keys, latent))
        else:
            latent = torch.stack([latent_cache[k] for k in keys])
        return latent, condition.from_batch(batch, device, cfg.height, cfg.width, run.compute_dtype,
                                            cfg.conditional_frame_timestep, latent=latent)
    return to_latent



# -----------------------------------------------------------------------------
# The iteration-0 init guard. Measured as a ratio to the loss of predicting zero velocity on the same batch and
# noise: random init (our init_weights) gives ~1.6-1.8, an all-zero output exactly 1.0, a network that denoises at
# all < 1 (~0.5 for a tiny model after 150 steps, tests/test_ckpt.py). Scale-free, unlike the field's absolute
# numbers (~13 random vs 0.3-3 warm for upstream's init and latents).

GUARD_SIGMAS = (0.25, 1.0, 4.0)
GUARD_MAX_RATIO = 0.75


@torch.no_grad()
def guard_loss(net, x0, cond, sigmas=GUARD_SIGMAS, seed=0):
    """(loss, zero_loss): rectified-flow velocity MSE mean((v - (eps - x0))^2) at fixed sigmas with seeded noise,
    and the same MSE for v = 0, given the batch's condition.Condition (x0 is its gt_frames). Conditioning frames (target
    unpredictable there) are left out. Collective under FSDP: every rank passes its own batch; the sums are
    all-reduced so every rank gets the same numbers."""
    g = torch.Generator(device=x0.device).manual_seed(seed * 1000 + rank())
    cond = replace(cond, gt_frames=x0)
    weight = torch.ones_like(x0[:, :1]) if cond.condition_mask is None else 1 - cond.condition_mask.float()
    sums = torch.zeros(3, dtype=torch.float64, device=x0.device)
    for s in sigmas:
        eps = torch.randn(x0.shape, generator=g, device=x0.device, dtype=torch.float32)
        sigma = torch.full((x0.shape[0],), float(s), device=x0.device)
        _, velocity = denoise(net, x0.float() + s * eps, sigma, cond)
        target = eps - x0.float()
        sums += torch.stack([((velocity - target) ** 2 * weight).sum(), (target ** 2 * weight).sum(),
                             weight.sum() * x0.shape[1]]).double()
    if world_size() > 1:
        sums = sums.to(comm_device())
        dist.all_reduce(sums)
    return (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()


def init_guard(loss, zero_loss, max_ratio=GUARD_MAX_RATIO, source=""):
    """Stop (on every rank: the inputs are all-reduced) if the iteration-0 loss looks like an untrained network. It
    runs after load() verified the weights, so a refusal is about the checkpoint's training, not about loading."""
    ratio = loss / zero_loss
    say(f"init guard: iteration-0 loss {loss:.4f} vs zero-velocity loss {zero_loss:.4f}: ratio {ratio:.3f},"
         f" must be < {max_ratio} (random init ~1.7, zero output 1.0, trained ~0.5)")
    if not math.isfinite(ratio) or ratio >= max_ratio:
        raise CheckpointError(f"init guard: the weights of {source or 'the init'} loaded and verified, but its"
                              f" denoising loss is too high for a pretrained start (loss ratio {ratio:.3f} >="
                              f" {max_ratio}): an undertrained checkpoint, or a random one (random init ~1.7, trained"
                              " ~0.5; or a file whose net_ema. copy is meant: --ema-weights). Refusing to train:"
                              " train the base longer, or accept it with train.py --guard-max-ratio R (see"
                              " `python train.py --help`)")
    return ratio
