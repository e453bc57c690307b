r"""The 1-step GRPO smoke test: one rollout group, rewards, advantages, one LoRA update, and PASS criteria.

    python smoke.py                       # tiny DiT + tiny VAE on CPU, well under a minute
    python smoke.py --config p25-tiny-agibot   # Predict2.5's rectified-flow rollouts, 3 views + camera map
    python smoke.py --config v2w-14b --device cuda --frames 93 --height 432 --width 768 \
        --grpo-group-size 2 --grpo-num-steps 8 --sac block

Random weights unless --init names a checkpoint (loaded strictly through ckpt.load). The base net is built on the
meta device and materialised directly in its final dtype (bf16 on CUDA), so a 14B model never exists in fp32;
the LoRA adapters are fp32. Prints time and peak memory per phase and the MFU of the rollout and of the update
against a bf16 matmul peak measured in the same run (GPU only), then each criterion, then `SMOKE PASS` or `SMOKE FAIL: ...`.
"""
import math
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import torch
from torch.utils.flop_counter import FlopCounterMode

import condition
import grpo
import reward
import sac
from base import camera, cli
from base.camera import split_views
from base.inits import TINY_CONFIGS, get_config
from clips.data import VIEW_ORDER
from engine import build, rl
from engine.rollout import LOG_SQRT_2PI, rollout_group
from grpo import GRPOConfig
from nets.family import family_of
from nets.flops import matmul_peak, model_flops
from nets.vae import WanVAE, get_vae_config, latent_frames

VIEWS = len(VIEW_ORDER)  # a camera net's views (robot/multiview-agibot: 3)


@dataclass(frozen=True)
class SmokeConfig:
    config: str = "tiny"  # inits.CONFIGS name (p25-*: rectified flow; camera nets: 3 views stacked on time)
    device: str = "cpu"  # cpu | cuda
    dtype: str = "auto"  # base weights: auto = bf16 on cuda, fp32 on cpu; fp32 | bf16. LoRA is always fp32
    frames: int = 9  # pixel frames, 4k + 1 (93 -> 24 latent frames)
    height: int = 64  # pixels, multiple of 16 (VAE x8, then 2x2 patches)
    width: int = 64  # pixels, multiple of 16
    cond_frames: int = 1  # conditioning latent frames (1 = one input image)
    text_tokens: int = 512  # T5 sequence length of the (random) prompt embeddings
    lora_rank: int = 32  # Predict2's 14B preset: r = 32, alpha = 32 -> 143,917,056 parameters
    lora_alpha: float = 32.0  # LoRA alpha (scale alpha / rank)
    sac: str = "none"  # activation checkpointing mode passed to sac.apply (none | block | mm | attn | selective)
    init: str = "random"  # base weights: random, or anything ckpt.load accepts (named init, path, hf://...)
    vae: str = "auto"  # tiny | real (architecture; random weights); auto = tiny for the tiny DiTs, else real
    seed: int = 0  # weights, condition and rollout noise
    count_flops: str = "false"  # also run FlopCounterMode (true | false | auto = cuda): it defeats activation
    # checkpointing's memory savings (the 14B update went out of memory at 137 GiB under it); MFU uses nets/flops.model_flops
    # (on CPU the counter's per-op Python dispatch costs ~10x on the tiny model, and it cannot count CPU attention)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)  # the GRPO knobs, as train.py's --grpo-* (docs/grpo.md)

    def __post_init__(self):
        for name, valid in (("dtype", ("auto", "fp32", "bf16")), ("vae", ("auto", "tiny", "real")),
                            ("count_flops", ("auto", "true", "false")), ("device", ("cpu", "cuda"))):
            if getattr(self, name) not in valid:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)!r}; valid: {valid}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is visible")
        if (self.frames - 1) % 4 or self.height % 16 or self.width % 16:
            raise ValueError(f"--frames must be 4k+1 and --height/--width multiples of 16, got "
                             f"{self.frames}x{self.height}x{self.width}")


def parse_args(argv=None):
    """argparse generated from SmokeConfig's fields (base/cli.py); unknown flags are an error."""
    return cli.parse(SmokeConfig, argv, description=__doc__.split("\n")[0])


# -----------------------------------------------------------------------------
# Phases: wall time and peak memory, synchronised


class Phases:
    def __init__(self, device):
        self.device, self.rows = device, []

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextmanager
    def __call__(self, name):
        self.sync()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        start = time.perf_counter()
        yield
        self.sync()
        seconds = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated(self.device) / 2 ** 30 if self.device.type == "cuda" else None
        self.rows.append((name, seconds, peak))
        print(f"phase {name:<8} {seconds:8.2f} s   peak " + (f"{peak:6.2f} GiB" if peak is not None else "n/a (cpu)"),
              flush=True)

    def peak(self):
        peaks = [p for _, _, p in self.rows if p is not None]
        return max(peaks) if peaks else None


@contextmanager
def flop_count(enabled):
    counter = FlopCounterMode(display=False) if enabled else None
    if counter is None:
        yield None
        return
    with counter:
        yield counter


# -----------------------------------------------------------------------------
# Model, VAE and one group's condition


def build_policy(cfg: SmokeConfig, device, dtype):
    """The DiT as train.py builds it (engine/build.py): base in `dtype`, strict load of --init (all but the adapters),
    LoRA adapters in fp32, activation checkpointing --sac."""
    spec = build.NetSpec(config=cfg.config, init=cfg.init, lora=cfg.lora_rank, lora_alpha=cfg.lora_alpha, dtype=dtype,
                         sac_modes=tuple(sac.block_modes(cfg.sac, 1, get_config(cfg.config).num_blocks)),
                         seed=cfg.seed)
    net = build.build(spec, device)
    return net, build.trainable(net)


def build_vae(cfg: SmokeConfig, device, dtype):
    name = cfg.vae if cfg.vae != "auto" else ("tiny" if cfg.config in TINY_CONFIGS else "real")
    torch.manual_seed(cfg.seed + 2)
    with torch.device(device):
        vae = WanVAE(get_vae_config(name))
    return vae.to(dtype).eval(), name


def make_condition(cfg: SmokeConfig, mcfg, latent_shape, device):
    """Random stand-ins for the cached text embeddings (T5, or Reason1's width for Predict2.5) and the encoded first
    frame of one group; a camera net gets its views' frame-init mask and the fallback rig's Pluecker map, an action
    net a random action chunk."""
    g = torch.Generator(device=device).manual_seed(cfg.seed + 3)
    emb = torch.randn(2, cfg.text_tokens, mcfg.crossattn_proj_in_channels, generator=g, device=device)
    gt = torch.randn(1, *latent_shape, generator=g, device=device)
    return condition.standin(mcfg, gt, emb[:1], neg_crossattn_emb=emb[1:], generator=g,
                             views=VIEWS if mcfg.camera_channels else 0, cond_frames=cfg.cond_frames,
                             pixels=(cfg.height, cfg.width), key=("smoke-episode", "smoke task"),
                             conditional_frame_timestep=family_of(mcfg).sampler_defaults(cfg.init, cfg.config)[1])


# -----------------------------------------------------------------------------
# The smoke


def main(argv=None):
    cfg = parse_args(argv)
    device = torch.device(cfg.device)
    dtype = {"auto": torch.bfloat16 if device.type == "cuda" else torch.float32, "fp32": torch.float32,
             "bf16": torch.bfloat16}[cfg.dtype]
    count_flops = {"auto": device.type == "cuda", "true": True, "false": False}[cfg.count_flops]
    views = VIEWS if get_config(cfg.config).camera_channels else 1  # a camera net: the views stacked on latent time
    latent_shape = (16, views * latent_frames(cfg.frames), cfg.height // 8, cfg.width // 8)
    gcfg = cfg.grpo
    K = gcfg.group_size
    print(f"smoke config: {asdict(cfg)}")
    print(f"latent {latent_shape}, base dtype {dtype}, torch {torch.__version__}", flush=True)
    phases = Phases(device)

    with phases("build"):
        net, params = build_policy(cfg, device, dtype)
        optimizer = grpo.lora_optimizer(net, params, gcfg)
        vae, vae_name = build_vae(cfg, device, dtype)
    n_lora = sum(p.numel() for p in params)
    mcfg = net.cfg
    print(f"DiT {cfg.config}: {sum(p.numel() for p in net.parameters()) - n_lora:,} base params ({dtype}), "
          f"{n_lora:,} LoRA params (fp32, r={cfg.lora_rank}); VAE '{vae_name}' with random weights; sac {cfg.sac}")
    peak_flops = None  # an MFU is a GPU number: on CPU there is no bf16 tensor-core peak to hold it against
    if device.type == "cuda":
        with phases("peak"):
            peak_flops = matmul_peak(device, torch.bfloat16)
        print(f"measured matmul peak: {peak_flops / 1e12:.1f} TFLOP/s (bf16 8192^3 matmul, nets/flops.matmul_peak)")

    cond = make_condition(cfg, mcfg, latent_shape, device)
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    with phases("rollout"), flop_count(count_flops) as counter:
        rollout = rollout_group(net, cond, latent_shape, gcfg, generator)
    rollout_flops = counter.get_total_flops() if counter else None
    rollout_seconds = phases.rows[-1][1]

    with phases("decode"):  # one sample at a time: decoding memory does not grow with K
        if views > 1:  # each view decoded on its own, then scored as Path B's 2x2 grid
            video = torch.cat([camera.grid_from_views(vae.decode(split_views(rollout.x0_final[k: k + 1], views)),
                                                      VIEW_ORDER) for k in range(K)]).float()
        else:
            video = torch.cat([vae.decode(rollout.x0_final[k: k + 1]) for k in range(K)]).float()
    with phases("reward"):
        scores = reward.grid_rewards(video)
    rewards = scores["reward"]
    advantages = rl.group_advantages(rewards, [cond.key] * K, eps=gcfg.adv_eps, clip=gcfg.adv_clip,
                                       global_std=gcfg.global_std, ddof=gcfg.std_ddof)
    print(f"video {tuple(video.shape)}, rewards {rewards.tolist()}, advantages {advantages.tolist()}")
    print("raw reward statistics: " + ", ".join(f"{k} {v.tolist()}" for k, v in scores.items() if k != "reward"))

    with phases("update"), flop_count(count_flops) as counter:
        stats = grpo.grpo_update(net, optimizer, params, [rollout], [advantages.to(device)], gcfg,
                                 data_generator=generator)  # the shipped data term (--grpo-data-coef) on the clip
    update_flops = counter.get_total_flops() if counter else None
    update_seconds = phases.rows[-1][1]
    sac_check = None
    if cfg.sac != "none":
        try:  # raises when the mode's save list matched no kernel that ran: report it as a failed criterion
            sac_check = (sac.check_first_step(cfg.sac), True)
        except RuntimeError as err:
            sac_check = (str(err), False)

    print_costs(cfg, mcfg, latent_shape, stats, peak_flops, (rollout_flops, rollout_seconds),
                (update_flops, update_seconds))
    peak = phases.peak()
    print(f"peak memory over all phases: {peak:.2f} GiB = {peak * 2 ** 30 / 1e9:.2f} GB" if peak is not None
          else "peak memory: n/a on cpu")
    print(f"update stats: { {k: v for k, v in stats.items()} }")
    criteria = smoke_criteria(cfg, mcfg, latent_shape, rollout, rewards, advantages, stats, n_lora)
    if sac_check is not None:
        criteria.append((f"sac {cfg.sac}: saved-op counts after the first step", *sac_check))
    for name, value, ok in criteria:
        print(f"[{'PASS' if ok else 'FAIL'}] {name}: {value}")
    failed = [name for name, _, ok in criteria if not ok]
    print("SMOKE PASS" if not failed else "SMOKE FAIL: " + "; ".join(failed), flush=True)
    return 0 if not failed else 1



def print_costs(cfg, mcfg, latent_shape, stats, peak_flops, rollout_cost, update_cost):
    """Model FLOPs (formula) and, when counted, executed FLOPs of the rollout and the update, with their MFU."""
    (rollout_flops, rollout_seconds), (update_flops, update_seconds) = rollout_cost, update_cost
    gcfg = cfg.grpo
    K, N = gcfg.group_size, gcfg.num_steps
    n_forwards = K * (N + 1) * (2 if gcfg.guidance else 1)
    n_micro = max(1, stats["micro_steps"])
    fwd, _, step_needed = model_flops(mcfg, (1, *latent_shape), cfg.text_tokens, cfg.lora_rank)
    model_rollout = n_forwards * fwd  # formula FLOPs: recompute not counted (bench.py's convention)
    model_update = n_micro * (step_needed + (fwd if gcfg.guidance else 0))  # + the no-grad uncond forward
    def mfu(flops, seconds):
        return f"MFU {flops / seconds / peak_flops:.1%}" if peak_flops else "MFU n/a on CPU"
    print(f"rollout: {n_forwards} forwards, {model_rollout:.3e} model FLOP, {mfu(model_rollout, rollout_seconds)}"
          f"; update: {n_micro} micro-steps, {model_update:.3e} model FLOP (LoRA: no frozen weight grads, recompute "
          f"not counted), {mfu(model_update, update_seconds)}")
    if rollout_flops:
        print(f"rollout: {n_forwards} forwards, {rollout_flops:.3e} FLOP counted, {rollout_seconds / n_forwards:.3f} "
              f"s/forward, {mfu(rollout_flops, rollout_seconds)}")
    if update_flops:
        print(f"update: {n_micro} micro-steps (fwd + bwd + uncond fwd), {update_flops:.3e} FLOP counted (incl. "
              f"activation recompute), {update_seconds / n_micro:.3f} s/micro-step, "
              f"{mfu(update_flops, update_seconds)}")
    if peak_flops is None and (rollout_flops or update_flops):
        print("note: on CPU FlopCounterMode does not count attention (the CPU SDPA kernel has no FLOP formula)")


def smoke_criteria(cfg, mcfg, latent_shape, rollout, rewards, advantages, stats, n_lora):
    """(name, value, ok) per pass criterion of the smoke."""
    gcfg = cfg.grpo
    K, N = gcfg.group_size, gcfg.num_steps
    sigma_check = []
    for i in range(N):
        if rollout.betas[i] > 0:
            expected = -math.log(rollout.betas[i]) - LOG_SQRT_2PI - 0.5
            sigma_check.append(abs(float(rollout.log_probs[:, i].mean()) - expected))
    adv_std = float(advantages.std(correction=0))
    expected_adv_std = expected_advantage_std(rewards, gcfg)
    expected_lora = mcfg.num_blocks * cfg.lora_rank * (24 * mcfg.model_channels + 2 * mcfg.crossattn_emb_channels)
    C, T, H, W = latent_shape
    criteria = [
        ("rollout shapes", (tuple(rollout.states.shape), tuple(rollout.log_probs.shape)),
         tuple(rollout.states.shape) == (K, N + 1, C, T, H, W) and tuple(rollout.log_probs.shape) == (K, N)),
        ("logp_old mean within 0.05 of -log(beta) - 1.4189 per step", max(sigma_check, default=math.nan),
         max(sigma_check, default=math.inf) < 0.05),
        ("reward std > 0", float(rewards.std(correction=0)), float(rewards.std(correction=0)) > 0),
        (f"advantage std (ddof {gcfg.std_ddof}, eps {gcfg.adv_eps}) == {expected_adv_std:.6f}", adv_std,
         abs(adv_std - expected_adv_std) < 1e-6),
        ("log_prob.requires_grad and grad_fn", (stats["logp_requires_grad"], stats["logp_has_grad_fn"]),
         bool(stats["logp_requires_grad"] and stats["logp_has_grad_fn"])),
        ("first-inner-step ratio == 1 exactly", stats["first_ratio"], stats["first_ratio"] == 1.0),
        ("every logp_new == logp_old bitwise before the step (max |dlogp|)", stats["first_max_abs_dlogp"],
         bool(stats["first_logp_equal"])),
        ("grad norm finite and > 0", stats["grad_norm"], all(math.isfinite(g) and g > 0 for g in stats["grad_norm"])
         and bool(stats["grad_norm"])),
        ("gradients on LoRA params only (base params with grad)", stats["grads_outside_params"],
         stats["grads_outside_params"] == [0] * stats["opt_steps"] and stats["opt_steps"] == 1),
        (f"LoRA params == blocks * r * (24 D + 2 * 1024) = {expected_lora:,}", n_lora, n_lora == expected_lora),
        ("loss finite", stats["loss"], math.isfinite(stats["loss"])),
    ]
    return criteria


def expected_advantage_std(rewards, gcfg: grpo.GRPOConfig):
    """The advantage std one group must have under the configured convention, by the hand formula."""
    r = rewards.double().cpu()
    sd = float(r.std(correction=gcfg.std_ddof))
    if sd == 0:
        return 0.0
    return float(r.std(correction=0)) / (sd + gcfg.adv_eps)


if __name__ == "__main__":
    cli.main(main)
