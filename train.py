"""Fine-tune Cosmos-Predict2 (and Predict2.5: its rectified-flow loss, flow.py) video2world on robot-grid videos.

    python train.py                                            # tiny built-in default, CPU, a few minutes
    torchrun --nproc_per_node=8 train.py --config v2w-14b --init droid --data DIR
    torchrun --nproc_per_node=8 train.py --config v2w-2b --init 2b-480p-16fps --data DIR --sac block
    python train.py --objective nft --init out/step_00001000 --lora 4 --out runs/tiny-nft     # DiffusionNFT (--nft-*)
    python train.py --objective grpo --init out/step_00001000 --lora 4 --out runs/tiny-grpo   # GRPO (--grpo-*)
    python train.py --config p25-tiny --out runs/p25-tiny      # the Predict2.5 tiny default

Flags not given take the preset of --config: tiny, p25-tiny (data/tiny_grid, 9x64x112, 1000 steps at lr 2e-3,
warm-up 20, the tiny codec, 2 held-out videos; an RL objective: TINY_RL) or every other config (93x432x768, 20k
steps at lr 2^-14.5, warm-up 1000, the real VAE). The RL objectives have their own optimizer flags (--grpo-lr, ...;
--nft-lr, ...): the SFT ones are refused with them.
One script, top to bottom: config -> setup -> data -> run directory -> model -> optimizer -> resume -> loop.
"""
import dataclasses
import hashlib
import importlib.util
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

import cache
import ckpt
import cli
import collectives
import cp
import data
import flow
import formats
import fp8
import grpo
import inits
import lerobot
import nft
import resume
import reward
import plan
import rl
import sac
import sample as sampling
import stitch
import vae as vae_lib
from grpo import GRPOConfig
from nft import NFTConfig
from lora import LORA_TARGETS, LoRALinear, add_lora, check_fp8_shapes, quantize_base, target_linears
from model import DiT, condition_mask, denoise, get_config, is_p25, matmul_peak, model_flops, num_params
from camera import stack_views, views_map
from collectives import all_mean, any_rank, ranks_any, shard_model
from sample import TINY_CONFIGS, standin_text, tiny_data  # tiny configs and their text

# -----------------------------------------------------------------------------
# Config: every field is a --flag (cli.py: the comment is its --help); unknown flags are an error. 0 / "" / -1 mean
# "from the preset" (TINY for --config tiny, REAL otherwise), filled only where the flag was not given.


@dataclass
class TrainConfig:
    config: str = "tiny"  # DiT config (model.CONFIGS): tiny, v2w-2b, v2w-14b, p25-tiny, p25-2b, p25-14b, ...
    init: str = ""  # droid | 2b-480p-16fps | 14b-720p-10fps | PATH | hf://org/repo/file@rev | random ("" = random for tiny)
    ema_weights: str = ""  # net | net_ema: which copy of a release file that holds both ("" = the only one); net_ema on a step dir: its saved EMA
    guard_max_ratio: float = 0.75  # init guard: iteration-0 loss / zero-velocity loss must stay below (random ~1.6)
    data: str = ""  # stitched folder (stitch.py), read only; the tiny default builds its own in data/tiny_grid
    out: str = "out"  # run directory: config.json, checkpoints, metrics.jsonl, loss.png, samples
    vae: str = ""  # tiny | real
    vae_ckpt: str = ""  # tokenizer.pth (Wan2.1 VAE) for --vae real
    frames: int = 0  # pixel frames per clip (4k+1)
    height: int = 0  # pixels, a multiple of 16
    width: int = 0  # pixels, a multiple of 16
    text_len: int = 512  # text-embedding tokens (T5: 512)
    batch_size: int = 1  # clips per rank per step (GRPO: groups per rank per update)
    grad_accum: int = 1  # SFT micro-batches per optimizer step
    steps: int = 0  # optimizer steps (GRPO: updates)
    lr: float = 0.0  # SFT peak learning rate (GRPO: --grpo-lr)
    warmup: int = -1  # SFT linear warm-up steps, then cosine decay (GRPO: --grpo-warmup)
    lr_min_ratio: float = 0.1  # SFT cosine decay to lr * this
    weight_decay: float = 0.1  # SFT AdamW weight decay (GRPO: --grpo-weight-decay)
    beta1: float = 0.9  # SFT AdamW beta1 (GRPO: --grpo-betas)
    beta2: float = 0.99  # SFT AdamW beta2 (GRPO: --grpo-betas)
    grad_clip: float = 1.0  # SFT gradient clipping (GRPO: --grpo-max-grad-norm)
    max_nonfinite: int = 3  # steps (GRPO: updates) in a row with a NaN/Inf loss or gradient norm, each skipped (no
    # update, logged), before the run stops naming the likely cause
    loss_scale: float = 10.0  # Predict2: upstream's loss_scale; only matters against grad_clip (2.5 has none)
    high_sigma_ratio: float = 0.05  # Predict2: upstream's predict2_video2world_fsdp_* value
    conditional_frame_timestep: float = -1.0  # Predict2.5: -1 = conditional frames share the noisy frames' time (pre-
    # training); 0.1 = they get timestep 0.1, t = 1e-4; default: upstream's for --init (0.1 for p25-2b-post, agibot)
    text_dropout: float = 0.2  # SFT: probability of training a sample without its prompt (for CFG)
    sac: str = "none"  # activation checkpointing: none | block | mm | attn | selective | auto (docs/memory.md)
    mem_budget: float = 0.0  # --sac auto: per-rank memory budget in GiB; the fastest per-block mix that fits
    sac_every: int = 1  # checkpoint every N-th block only
    compile: bool = False  # torch.compile each block in place (keys unchanged)
    cp: int = 1  # context parallelism: ranks that split each sample's latent frames (Ulysses, cp.py, docs/memory.md)
    lora: int = 0  # LoRA rank; 0 = full fine-tune
    lora_alpha: float = 0.0  # LoRA alpha; 0 = rank (scale 1)
    fp8: bool = False  # fp8 GEMMs in the block Linears (fp8.py): LoRA holds its frozen base in fp8 (half the memory);
    # a full fine-tune keeps its weights and runs forward and input-gradient GEMMs in fp8, weight gradients in bf16
    ema: float = 0.0  # power-EMA rate s (upstream 0.1); 0 = off
    save_every: int = 0  # checkpoint every N steps; 0 = only at the end and on SIGTERM/SIGUSR1
    keep: int = 3  # complete checkpoints kept (>= 2)
    sample_every: int = 0  # write a sample mp4 every N steps (0 = never; the tiny default: every 100)
    sample_steps: int = 35  # sampler steps of those samples
    guidance: float = 7.0  # CFG of the sample videos, upstream convention x0_c + g (x0_c - x0_u) (rollouts: --grpo-guidance)
    seed: int = 0  # every random draw depends on (seed, step, sample, purpose) only
    device: str = ""  # cuda | cpu (default: cuda when available)
    workers: int = 2  # DataLoader worker processes per rank
    holdout: int = -1  # videos (the last in name order) kept out of training for evaluation; -1: 2%, at least 1
    cache_latents: bool = False  # keep encoded clips in memory by (video, start frame): small datasets only
    latents: str = ""  # a cache.py folder of --data's encoded windows: train on them, no VAE encoding per step
    objective: str = "sft"  # sft | grpo | nft (the RL objectives train LoRA adapters: need --lora)
    reward: str = "default"  # GRPO reward: default (reward.py) and/or module:function plug-ins, comma-separated, each =WEIGHT optional
    wandb: str = ""  # project name; needs `pip install wandb`
    eval_every: int = 0  # held-out evaluation every N steps besides each save (RL: also before the first update)
    eval_steps: int = 35  # RL: deterministic sampler steps of the held-out evaluation (eval_reward_*)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)  # GRPO knobs (--objective grpo; docs/grpo.md)
    nft: NFTConfig = field(default_factory=NFTConfig)  # DiffusionNFT knobs (--objective nft; docs/nft.md)


TINY = dict(data="data/tiny_grid", vae="tiny", frames=9, height=64, width=112, steps=1000, lr=2e-3, warmup=20,
            save_every=500, sample_every=500, text_len=16, workers=0, cache_latents=True, holdout=2)
# RL on a tiny config (from the tiny SFT checkpoint, docs/grpo.md "The tiny default"): 8 samples a group, 4 groups an
# update, a held-out evaluation every 5 updates
TINY_RL = dict(steps=30, save_every=15, sample_every=15, eval_every=5, eval_steps=20, batch_size=4,
               reward="reward:wrist_brightness", grpo=dict(group_size=8, lr=3e-3), nft=dict(group_size=8, lr=3e-3))
REAL = dict(vae="real", frames=93, height=432, width=768, steps=20000, lr=2 ** -14.5, warmup=1000, save_every=200,
            sample_every=1000)
# Loss knobs of one model family (True: Predict2.5's flow.py loss only; False: Predict2's EDM loss only)
FAMILY_ONLY = {"loss_scale": False, "high_sigma_ratio": False, "conditional_frame_timestep": True}
# Flags that only shape the SFT optimizer or batch: with an RL objective they would be silently unused (the RL
# configs have their own: --grpo-lr, --nft-lr, ...)
SFT_ONLY = {"lr": "lr", "warmup": "warmup", "lr_min_ratio": "(constant after the warm-up)",
            "weight_decay": "weight_decay", "beta1": "betas", "beta2": "betas", "grad_clip": "max_grad_norm",
            "grad_accum": "(RL accumulates over samples and steps itself)", "text_dropout": "(rollouts keep the prompt)"}


def parse_config(argv):
    """Dataclass defaults, then the TINY or REAL preset, then the flags given on the command line."""
    given = cli.parse_flags(TrainConfig, argv, description=__doc__)  # argparse rejects unknown flags
    name = given.get("config", TrainConfig.config)
    preset = dict(TINY, data=tiny_data(name)) if name in TINY_CONFIGS else REAL
    if name in TINY_CONFIGS and given.get("objective", TrainConfig.objective) != "sft":
        preset.update(TINY_RL)
    return validate(cli.build(TrainConfig, preset, given), given)


def validate(cfg, given=None):
    """Fail fast, before anything is built or written: every setting is used, validated or refused."""
    given = cli.flatten(given or {})
    mcfg = get_config(cfg.config)  # raises with the valid names
    if cfg.objective not in rl.OBJECTIVES:
        raise ValueError(f"--objective {cfg.objective!r}: valid are {', '.join(rl.OBJECTIVES)}")
    unused = {}
    views = len(data.VIEW_ORDER) if mcfg.camera_channels else 1  # stacked on latent time, split with it
    cp.check_split(cfg.cp, cfg.config, mcfg.num_heads, vae_lib.latent_frames(cfg.frames) * views, cfg.frames)
    if cfg.cp > 1 and cfg.objective == "nft":
        raise ValueError(f"--cp {cfg.cp} with --objective nft: NFT's rewards, advantages and loss scale count global "
                         "ranks, not cp groups (not done yet; GRPO composes with --cp); use --cp 1")
    if cfg.cp > 1 and cfg.sac == "auto":
        raise ValueError(f"--cp {cfg.cp} with --sac auto: the auto plan measures a block without CP; pick a --sac mode"
                         f" with `bench.py --world N --cp {cfg.cp}` (docs/memory.md)")
    unused.update(validate_objective(cfg, given))
    if cfg.lora == 0:
        unused.update({k: "without --lora" for k in ("lora_alpha",) if k in given})
    if cfg.sac in ("none", "auto"):
        unused.update({k: f"with --sac {cfg.sac}" for k in ("sac_every",) if k in given})
    if (cfg.sac == "auto") != (cfg.mem_budget > 0):
        raise ValueError("--sac auto needs --mem-budget GiB (> 0, per rank), and --mem-budget needs --sac auto")
    if cfg.vae != "real":
        unused.update({k: "without --vae real" for k in ("vae_ckpt",) if k in given})
    if cfg.sample_every == 0:
        unused.update({k: "with --sample-every 0" for k in ("sample_steps", "guidance") if k in given})
    unused.update({k: f"with --config {cfg.config} (a {'Predict2.5' if p25_only else 'Predict2'} loss setting)"
                   for k, p25_only in FAMILY_ONLY.items() if k in given and p25_only != is_p25(mcfg)})
    if unused:
        raise ValueError("; ".join(f"{cli.flag(k)} does nothing {why}" for k, why in unused.items())
                         + ": drop it (nothing is silently ignored)")
    if cfg.objective != "sft":
        reward.parse_rewards(cfg.reward)  # imports the plug-ins now: a typo fails before any model is built
    if cfg.ema_weights not in ("", "net", "net_ema"):
        raise ValueError(f"--ema-weights {cfg.ema_weights!r}: net or net_ema")
    if cfg.save_every < 0:
        raise ValueError(f"--save-every {cfg.save_every}: >= 0 (0 = only at the end and on a signal)")
    if is_p25(mcfg) and "conditional_frame_timestep" not in given:  # upstream's value for the checkpoint
        cfg.conditional_frame_timestep = inits.checkpoint_defaults(cfg.init, cfg.config)[1]
    if cfg.conditional_frame_timestep != -1 and not 0 <= cfg.conditional_frame_timestep < 1000:
        raise ValueError(f"--conditional-frame-timestep {cfg.conditional_frame_timestep}: -1 (the noisy frames' "
                         "time) or a timestep in [0, 1000) (0.1: t = 1e-4)")
    if not cfg.init:
        if cfg.config not in TINY_CONFIGS:
            raise ValueError(f"--config {cfg.config} needs an explicit --init (droid, 2b-480p-16fps, a path, ... "
                             "or 'random' to really train from scratch)")
        cfg.init = "random"
    if cfg.init == "random":
        for k in ("ema_weights", "guard_max_ratio"):
            if k in given:
                raise ValueError(f"{cli.flag(k)} does nothing with --init random (no checkpoint is loaded)")
    elif not (cfg.init in ckpt.NAMED_INITS or cfg.init.startswith("hf://")):
        ckpt.resolve_source(cfg.init)  # a local path: it exists and has a checkpoint format (hub names: in main)
    sac.make_checkpoint_fn("block" if cfg.sac == "auto" else cfg.sac)  # raises with the valid modes
    if min(cfg.sac_every, cfg.grad_accum, cfg.batch_size, cfg.steps, cfg.max_nonfinite) < 1 or cfg.eval_every < 0:
        raise ValueError("--sac-every, --grad-accum, --batch-size, --steps and --max-nonfinite must be >= 1, "
                         "--eval-every >= 0")
    if cfg.keep < 2:
        raise ValueError(f"--keep {cfg.keep}: at least 2, so a save in progress never leaves nothing to resume from")
    if (cfg.frames - 1) % 4 or cfg.height % 16 or cfg.width % 16:
        raise ValueError(f"clip {cfg.frames}x{cfg.height}x{cfg.width}: frames must be 4k+1, height/width multiples of 16")
    if cfg.latents:
        if "cache_latents" in given:
            raise ValueError("--cache-latents does nothing with --latents (the windows are read from the cache): drop "
                             "it")
        cfg.cache_latents = False  # the tiny preset's in-memory cache: the disk cache replaces it
        if not os.path.isdir(cfg.latents):
            raise ValueError(f"--latents {cfg.latents}: no such folder; build it with `python cache.py --data "
                             f"{cfg.data or 'DATA'} --out {cfg.latents} ...` (docs/cache.md)")
    if cfg.vae not in ("tiny", "real"):
        raise ValueError(f"--vae {cfg.vae!r}: tiny or real")
    if cfg.vae == "real" and not cfg.vae_ckpt:
        raise ValueError("--vae real needs --vae-ckpt PATH (tokenizer/tokenizer.pth of a Cosmos-Predict2 repo)")
    if cfg.vae == "real" and not os.path.isfile(cfg.vae_ckpt):
        raise ValueError(f"--vae-ckpt {cfg.vae_ckpt}: no such file (tokenizer/tokenizer.pth of a Cosmos-Predict2 repo)")
    if cfg.wandb and importlib.util.find_spec("wandb") is None:
        raise ValueError(f"--wandb {cfg.wandb}: wandb is not installed (pip install wandb); it is optional")
    if not 0 <= cfg.ema < 1 or cfg.lora < 0 or cfg.guidance < 0:  # guidance < 0 steers away from the prompt
        raise ValueError(f"--ema {cfg.ema} must be in [0,1), --lora {cfg.lora} >= 0, --guidance {cfg.guidance} >= 0")
    if cfg.device not in ("", "cuda", "cpu"):
        raise ValueError(f"--device {cfg.device!r}: cuda or cpu")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is visible (torch.cuda.is_available() is False)")
    if os.path.exists(cfg.out) and not os.path.isdir(cfg.out):
        raise ValueError(f"--out {cfg.out} is a file: pass a directory (new or a run to resume)")
    check_data(cfg, given)
    return cfg


def check_data(cfg, given):
    """--data is a folder stitch.py wrote (the tiny default's own is built by train.py), and what text it gives."""
    if not synthetic_data(cfg) and not os.path.isdir(cfg.data):
        raise ValueError(f"--data {cfg.data!r}: no such folder (build one with `python stitch.py SRC DIR`)"
                         if cfg.data else "--data DIR is needed: a folder written by stitch.py")
    if not synthetic_data(cfg) and lerobot.unstitched(cfg.data):
        raise ValueError(lerobot.unstitched(cfg.data))
    if not standin_text(cfg.config, cfg.data) and cfg.config in TINY_CONFIGS and "text_len" not in given:
        cfg.text_len = TrainConfig.text_len  # tiny on a folder with t5_xxl/: T5's 512 tokens, not the stand-in's 16


def validate_objective(cfg, given):
    """The objective's own checks; returns {flag: why it would do nothing} for the flags it leaves unused."""
    others = [o for o in rl.MAY_CHANGE if o != cfg.objective]  # the other RL objectives' knobs
    unused = {k: f"with --objective {cfg.objective}" for k in given
              if k.split(".")[0] in others or (cfg.objective == "sft" and k in ("reward", "eval_steps"))}
    if cfg.objective != "sft" and "guidance" in given:  # samples and evaluation use the policy's own CFG
        unused["guidance"] = f"with --objective {cfg.objective} (its samples use {cli.flag(cfg.objective)}-guidance)"
    if cfg.objective == "sft":
        return unused
    if not cfg.lora:
        raise ValueError(f"--objective {cfg.objective} trains LoRA adapters only: pass --lora RANK (e.g. 32)")
    unused.update({k: f"with --objective {cfg.objective} (use "
                   + (alt if alt.startswith("(") else cli.flag(f"{cfg.objective}.{alt}")) + ")"
                   for k, alt in SFT_ONLY.items() if k in given})
    if cfg.eval_steps < 1:
        raise ValueError(f"--eval-steps {cfg.eval_steps}: the held-out evaluation needs >= 1 sampler step")
    if cfg.objective == "grpo":
        if cfg.grpo.eta <= 0:
            raise ValueError(f"--grpo-eta {cfg.grpo.eta}: a noiseless rollout has no log-prob to train (use > 0)")
        if cfg.compile and not cfg.grpo.recompute_old_logp:
            if "grpo.recompute_old_logp" in given:  # a compiled training forward rounds unlike the eager rollout
                raise ValueError("--compile with --no-grpo-recompute-old-logp: the compiled training graph rounds "
                                 "differently from the rollout's, so the ratio would not start at 1")
            cfg.grpo = dataclasses.replace(cfg.grpo, recompute_old_logp=True)
    return unused


def synthetic_data(cfg):
    """Only the tiny default's own folder is ever written by train.py; any other --data is read, never written."""
    return cfg.config in TINY_CONFIGS and os.path.normpath(cfg.data) == os.path.normpath(tiny_data(cfg.config))


# -----------------------------------------------------------------------------
# Setup: torchrun environment -> process group; one device per rank


def setup_distributed(cfg):
    device_type = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    distributed = "RANK" in os.environ or device_type == "cuda"
    if distributed:
        if "RANK" not in os.environ:  # one GPU without torchrun: a 1-rank group, so FSDP2 does the bf16 compute too
            os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                              MASTER_PORT=os.environ.get("MASTER_PORT", "29511"))
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        local = int(os.environ.get("LOCAL_RANK", 0))
    else:
        rank, world, local = 0, 1, 0
    device = torch.device(device_type, local) if device_type == "cuda" else torch.device("cpu")
    if device_type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return distributed, rank, world, device


def sample_seed(*keys):
    """A 63-bit seed from a tuple of counters: every random draw depends only on (seed, step, sample, purpose),
    so a resumed or re-sharded run draws exactly the same numbers as an uninterrupted one."""
    digest = hashlib.blake2b(repr(keys).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


# -----------------------------------------------------------------------------
# The video2world training loss, as upstream (Predict2Video2WorldModel) draws it


def draw_sample_noise(cfg, latent_C_T_H_W, seed):
    """sigma, eps, number of conditioning latent frames and text-drop flag for one sample."""
    g = torch.Generator().manual_seed(seed)
    T = latent_C_T_H_W.shape[1]
    log_sigma = torch.randn((), generator=g, dtype=torch.float64)
    sigma = log_sigma.exp() * (math.sqrt(T) if T > 1 else 1.0)  # adjust_video_noise: x sqrt(latent frames)
    if torch.rand((), generator=g) < cfg.high_sigma_ratio:  # occasional very high noise, log-uniform in [200, 1e5]
        sigma = torch.exp(math.log(200) + torch.rand((), generator=g, dtype=torch.float64) * math.log(1e5 / 200))
    eps = torch.randn(latent_C_T_H_W.shape, generator=g)
    n_cond = int(torch.randint(1, 3, (), generator=g)) if T > 1 else 0  # 1 or 2 conditioning latent frames
    drop_text = bool(torch.rand((), generator=g) < cfg.text_dropout)
    return float(sigma), eps, n_cond, drop_text


def training_loss(net, cfg, latent, text_emb, seeds, camera=None):
    """Predict2.5 configs: flow.training_loss. Predict2: (1+s)^2/s^2 |x0_hat - x0|^2 equals |v_hat - (eps - x0)|^2
    exactly; we use the velocity form (no 1e8 weights at small sigma). Conditioning frames add 0 (replaced)."""
    if is_p25(get_config(cfg.config)):  # a camera net: views stacked on time, agibot's frame-init mask
        mask_fn = None if camera is None else lambda x, n: flow.multiview_condition_mask(x, len(data.VIEW_ORDER), n)
        return flow.training_loss(net, latent, text_emb, seeds, cfg.text_dropout, cfg.conditional_frame_timestep,
                                  camera, mask_fn)
    draws = [draw_sample_noise(cfg, latent[b], s) for b, s in enumerate(seeds)]
    sigma = torch.tensor([d[0] for d in draws], device=latent.device)
    eps = torch.stack([d[1] for d in draws]).to(latent.device)
    n_cond = torch.tensor([d[2] for d in draws], device=latent.device)
    keep_text = torch.tensor([0.0 if d[3] else 1.0 for d in draws], device=latent.device).view(-1, 1, 1)
    x_sigma = latent + sigma.view(-1, 1, 1, 1, 1) * eps
    mask = condition_mask(latent, n_cond)
    _, velocity = denoise(net, x_sigma, sigma, text_emb * keep_text, gt_frames=latent,
                          condition_mask_B_1_T_H_W=mask)
    err = (velocity - (eps - latent)).square() * (1 - mask)
    return err.mean() * cfg.loss_scale


def lr_at(cfg, step):
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.lr_min_ratio + (1 - cfg.lr_min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def ema_beta(step, rate):
    """Upstream's power EMA: beta = (1 - 1/(step+1))^(gamma+1), gamma the largest real root of
    x^3 + 7x^2 + (16 - s^-2) x + (12 - s^-2)."""
    roots = np.roots([1, 7, 16 - rate ** -2, 12 - rate ** -2])
    gamma = max(r.real for r in roots if abs(r.imag) < 1e-9)
    return (1 - 1 / (step + 1)) ** (gamma + 1)


# -----------------------------------------------------------------------------
# Small helpers for the loop: the tiny dataset, resume settings, evaluation, one SFT / GRPO step
# (the run directory's lock, metrics log, loss.png and evaluation markers live in resume.py)


def make_tiny_dataset(root, views=False):
    """Synthetic LeRobot episodes (stitch.make_synthetic, with camera poses) stitched into a small grid or views
    folder. The grid and the views folder beside it come from one LeRobot folder (`tiny_lerobot` next to root), so
    their videos share stems: the same episodes, as a Path A and a Path B run compare them (evaluate.py). Under a
    lock (tiny_lerobot.lock): a second tiny default started at once waits, then only re-reads the finished folders."""
    raw = os.path.join(os.path.dirname(root) or ".", "tiny_lerobot")
    os.makedirs(os.path.dirname(os.path.abspath(raw)), exist_ok=True)
    with resume.claim(raw + ".lock", "", wait=True):
        if not os.path.exists(raw):  # 6 usable episodes (the tiny preset holds out 2: 4 train, shards evenly over 1,
            # 2 or 4 ranks) and 1 too short to use
            stitch.make_synthetic(raw, lengths=(48, 40, 8, 56, 44, 52, 60), cameras=True)
        stitch.stitch(raw, root, stride=4, frames=TINY["frames"], size=f"{TINY['height']}x{TINY['width']}", workers=1,
                      layout="views" if views else "grid")


def on_signal(stop, signum, say):
    """A stop request, acted on after the step (then saved, exit 0); a second Ctrl-C aborts at once (cli.main: one
    line, exit 130), losing the steps since the last save."""
    if signum == signal.SIGINT and stop["signal"] == signal.SIGINT:
        raise KeyboardInterrupt
    if signum == signal.SIGINT:
        say("\ntrain: Ctrl-C: finishing this step, then saving and exiting 0 (Ctrl-C again: abort now, losing the "
            "steps since the last save)")
    stop["signal"] = signum


def ignore_sigint(worker_id):
    """DataLoader workers share the terminal's process group: a Ctrl-C for the run must not kill them mid-step."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def resume_keys(cfg):
    """The settings a resumed run must share with the saved one (shapes, init, data, objective, GRPO's sampler and
    objective); all others (steps, optimizer, memory and logging settings) may change and are reported."""
    keys = ["config", "init", "ema_weights", "lora", "lora_alpha", "objective", "vae", "vae_ckpt", "frames", "height",
            "width", "text_len", "batch_size", "grad_accum", "seed", "data", "holdout", "ema", "latents"]
    if cfg.objective != "sft":
        keys += rl.resume_keys(cfg)
    return keys


def config_hash(cfg):
    flat = cli.flatten(dataclasses.asdict(cfg))
    return hashlib.sha256(json.dumps({k: flat[k] for k in resume_keys(cfg)}, sort_keys=True,
                                     default=list).encode()).hexdigest()[:16]


def check_resume_settings(out, cfg):
    """Before anything is built or written: the newest complete checkpoint's settings against this run's. Changed
    must-keep settings are refused, naming them; other changes are returned (applied from the resume point)."""
    path = resume.find_resume(out)
    if path is None:
        return None, {}
    # a setting added since the save (e.g. --latents) is taken at its default, which is how that run was trained
    saved = {**cli.flatten(dataclasses.asdict(TrainConfig())), **cli.flatten(formats.read_meta(path)["extra"]["config"])}
    now = cli.flatten(json.loads(json.dumps(dataclasses.asdict(cfg))))  # tuples as lists, like the saved JSON
    refused = {k: (saved.get(k), now[k]) for k in resume_keys(cfg) if saved.get(k) != now[k]}
    if refused:
        why = " (LoRA checkpoints hold only adapters: the base comes from --init)" if "init" in refused and \
            (saved.get("lora") or now["lora"]) else ""
        raise ValueError(f"{out} was written with other settings, (saved, now): {refused}; a resumed run must keep "
                         f"them{why}. Use a new --out")
    return path, {k: (saved.get(k), v) for k, v in now.items() if saved.get(k) != v}


@torch.no_grad()
def evaluate(net, cfg, batches):
    """Held-out loss on fixed clips with fixed noise: comparable across checkpoints and runs."""
    losses = [training_loss(net, cfg, latent, text, [sample_seed(cfg.seed, "eval", i, b) for b in range(len(latent))],
                            camera) for i, (latent, text, camera) in enumerate(batches)]
    return {"eval_loss": all_mean(torch.stack(losses).mean().item(), batches[0][0].device)}


def sft_step(net, optimizer, trainable, cfg, next_batch, step, rank, world):
    """One SFT optimizer step over grad_accum micro-batches; returns (mean loss on this rank, grad norm, None). A loss
    or gradient norm that is NaN/Inf on any rank skips the step on every rank (the gradients are dropped, the weights
    and the optimizer state stay as they were); the third value is then its likely cause (nonfinite_cause)."""
    loss_sum, bad_batch = 0.0, False
    for micro in range(cfg.grad_accum):
        latent, text, camera = next_batch()
        bad_batch |= not all(bool(torch.isfinite(x).all()) for x in (latent, text, camera) if x is not None)
        seeds = [sample_seed(cfg.seed, step, (micro * world + rank) * cfg.batch_size + b) for b in range(len(latent))]
        loss = training_loss(net, cfg, latent, text, seeds, camera) / cfg.grad_accum
        loss.backward()
        loss_sum += loss.item()
    grad_norm = torch.nn.utils.clip_grad_norm_(trainable, cfg.grad_clip)
    grad_norm = (grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm).item()
    device = trainable[0].device
    bad_loss, bad_batch, bad_grad = ranks_any([not math.isfinite(loss_sum), bad_batch, not math.isfinite(grad_norm)],
                                              device)
    if not (bad_loss or bad_grad):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norm, nonfinite_cause(cfg, trainable, bad_loss, bad_batch, device) if bad_loss or bad_grad \
        else None


def nonfinite_cause(cfg, trainable, bad_loss, bad_batch, device):
    """Collective: the likely cause of a skipped SFT step, from what was NaN/Inf on any rank."""
    scale = "" if is_p25(get_config(cfg.config)) else f", or --loss-scale {cfg.loss_scale:g} too large"
    if bad_batch:
        return "a NaN/Inf in the batch (the clips' latents, text embeddings or cameras): check the data"
    weights = [p.to_local() if hasattr(p, "to_local") else p for p in trainable]
    if any_rank(not all(bool(torch.isfinite(w).all()) for w in weights), device):
        return f"NaN/Inf weights: an earlier update overflowed (--lr {cfg.lr:g} too high{scale})"
    return (f"the loss overflowed from finite inputs and weights (--lr {cfg.lr:g} too high{scale})" if bad_loss else
            f"the gradients overflowed from a finite loss (--lr {cfg.lr:g} too high{scale})")


def nonfinite_fields(cause):
    """The metrics fields of an SFT step: nonfinite_steps (as GRPO's), and for a skipped step why."""
    return {"nonfinite_steps": 0} if cause is None else {"nonfinite_steps": 1, "skipped": "nonfinite",
                                                          "nonfinite": cause}


def nonfinite_eval(result, path):
    """'' for a finite held-out evaluation, else the WARNING that the save line ends with."""
    bad = [k for k, v in result.items() if isinstance(v, float) and not math.isfinite(v)]
    return f"; WARNING: a NaN/Inf held-out {', '.join(bad)}: {path} is `latest`, but rotation keeps the newest " \
        "checkpoint with a finite evaluation (resume.rotate)" if bad else ""


def count_nonfinite(row, streak, cfg):
    """Steps in a row with skipped (NaN/Inf) updates, ending at row's; FloatingPointError, one line naming the step
    and the likely cause, when they reach --max-nonfinite (the row is logged first)."""
    if not row.get("nonfinite_steps"):
        return 0
    streak += 1
    if streak >= cfg.max_nonfinite:
        knob = f"--{cfg.objective}-lr {getattr(cfg, cfg.objective).lr:g}" if cfg.objective != "sft" else "--lr"
        cause = row.get("nonfinite") or f"NaN/Inf {cfg.objective.upper()} gradients ({knob} too high?)"
        raise FloatingPointError(
            f"step {row['step']}: {streak} steps in a row with a NaN/Inf loss or gradient norm (--max-nonfinite "
            f"{cfg.max_nonfinite}), each skipped: {cause}. The weights are those before step {row['step'] - streak + 1}"
            f" and every checkpoint in {cfg.out} holds finite weights: resume from it with a lower learning rate, or "
            "fix the data")
    return streak


# -----------------------------------------------------------------------------
# Main: setup -> run directory -> data -> model -> optimizer -> resume -> loop -> checkpoint


USER_ERRORS = (ValueError, OSError, ckpt.CheckpointError, FloatingPointError)  # one line, exit 2 (cli.main)


def main(argv=None):
    cfg = parse_config(sys.argv[1:] if argv is None else argv)
    distributed, rank, world, device = setup_distributed(cfg)
    master = rank == 0
    # --cp C: the C ranks of a cp group train on the same clips with the same noise; data and seeds go by dp rank
    dp_rank, dp_world, cp_group = cp.make_mesh(device.type, world, cfg.cp)
    say = (lambda *a: print(*a, flush=True)) if master else (lambda *a: None)
    compute_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    mcfg = get_config(cfg.config)

    # data: read (and checked) before anything is written; clips of cfg.frames frames, encoded online by the VAE
    if synthetic_data(cfg):  # (re)stitching a finished folder only re-reads its manifest; a killed one resumes
        if master:
            make_tiny_dataset(cfg.data, views=bool(mcfg.camera_channels))
        if distributed:
            dist.barrier()
    tiny = cfg.config in TINY_CONFIGS
    text_dim = mcfg.crossattn_proj_in_channels  # the embedding on disk (Predict2.5: before the net's crossattn_proj)
    text_encoder = "reason1" if is_p25(mcfg) and not tiny else "t5"  # Predict2.5 reads <data>/reason1/<sha1>
    views = len(data.VIEW_ORDER) if mcfg.camera_channels else 0  # a camera net trains on separate views (agibot)
    standin = standin_text(cfg.config, cfg.data)  # the tiny default's stand-in text, or embedding files
    if tiny and not synthetic_data(cfg):
        say(f"text: {cfg.data}/t5_xxl's T5 embeddings" if not standin else f"text: stand-in embeddings of {cfg.data}'s "
            f"prompts ({'p25-tiny* text is 96 wide: no released encoder writes it' if is_p25(mcfg) else 'no t5_xxl/'})")
    text_source = dict(text_len=cfg.text_len, text_dim=text_dim, text="standin" if standin else "t5", seed=cfg.seed,
                       text_encoder=text_encoder)
    if cfg.latents:  # the encoded windows of cache.py, checked against this run's VAE, clip settings and videos
        dataset = cache.LatentClips(cfg.latents, cfg.data, cfg.frames, cfg.height, cfg.width, vae=cfg.vae,
                                    vae_ckpt=cfg.vae_ckpt, dtype="bf16" if device.type == "cuda" else "fp32",
                                    **text_source)
    else:
        dataset = (data.ViewClips if views else data.GridClips)(cfg.data, cfg.frames, cfg.height, cfg.width,
                                                                 **text_source)
    holdout = cfg.holdout if cfg.holdout >= 0 else max(1, len(dataset) // 50)
    n_train = len(dataset) - holdout
    if n_train < 1:
        raise ValueError(f"--holdout {holdout} leaves no video of {len(dataset)} in {cfg.data} to train on")

    # run directory: claimed (one train.py per --out), settings checked against its checkpoint, then config.json
    lock = collectives.agree(f"claiming --out {cfg.out}", lambda: resume.claim_out(cfg.out) if master else None)
    resume_path, changed = collectives.agree("checking the run's saved settings",
                                             lambda: check_resume_settings(cfg.out, cfg), share=True)
    if changed:
        say(f"resume: settings changed since {resume_path}, applied from its step on: "
            + ", ".join(f"{cli.flag(k)} {old} -> {new}" for k, (old, new) in changed.items()))
    if cfg.init != "random":  # hub names resolve (and download) now, before any model is built
        collectives.agree(f"resolving --init {cfg.init}", lambda: ckpt.resolve_source(cfg.init))
    if master:
        resume.write_atomic(os.path.join(cfg.out, "config.json"), json.dumps(dataclasses.asdict(cfg), indent=1))
    terms = reward.parse_rewards(cfg.reward) if cfg.objective != "sft" else None
    if terms is not None:
        say(rl.reward_line(cfg, terms))

    sampler = data.ClipSampler(n_train, rank=dp_rank, world_size=dp_world, seed=cfg.seed)
    neg_text = None  # the uncond branch of CFG in GRPO rollouts and samples
    if cfg.objective != "sft" or cfg.sample_every:
        neg_text, source = data.negative_embedding(cfg.data, cfg.text_len, text_dim, standin=standin,
                                                   text_encoder=text_encoder)
        neg_text = neg_text[None]
        say(f"negative prompt: {source}")
    vae = vae_lib.build_vae(cfg.vae, cfg.vae_ckpt, device, compute_dtype)
    latent_cache = {}

    def to_latent(batch):
        """(latent, text, camera): views are encoded one by one and stacked on latent time, with their Pluecker map
        built here on the device (~570 MB fp32 per 93x432x768 sample: too big for the DataLoader); camera None else."""
        keys = list(zip(batch["stem"], batch["start"].tolist()))
        camera = None if not views else views_map(batch["w2c"].to(device), batch["intrinsics"].to(device),
                                                  cfg.height, cfg.width).to(compute_dtype)
        if "latent" in batch:  # --latents: encoded by cache.py exactly as below (views already stacked)
            return batch["latent"].to(device).float(), batch["text_emb"].to(device), camera
        if not (cfg.cache_latents and all(k in latent_cache for k in keys)):
            with torch.no_grad():
                video = batch["video"].to(device, compute_dtype)
                latent = vae.encode(video.flatten(0, 1) if views else video).float()
            latent = stack_views(latent, views) if views else latent
            if not cfg.cache_latents:
                return latent, batch["text_emb"].to(device), camera
            latent_cache.update(zip(keys, latent))
        return torch.stack([latent_cache[k] for k in keys]), batch["text_emb"].to(device), camera

    # model: meta build -> LoRA/freeze -> activation checkpointing -> compile -> FSDP -> materialise -> load
    with torch.device("meta"):
        net = DiT(mcfg)
    frozen_base = []
    if cfg.lora:
        add_lora(net, cfg.lora, cfg.lora_alpha or None)
        # the adapted Linears' frozen base in the compute dtype: fp32 would hold 4 B per weight that never trains (14B:
        # 54 GiB instead of 27) for FSDP to cast to bf16 anyway; the adapters keep fp32 masters
        frozen_base = [m for m in net.modules() if isinstance(m, LoRALinear)]
        for m in frozen_base:
            m.weight = torch.nn.Parameter(m.weight.to(compute_dtype), requires_grad=False)
        if cfg.fp8:
            check_fp8_shapes(net)
    elif cfg.fp8:
        # same keys; the GEMMs of the LoRA targets' Linears go fp8
        fp8.convert_trainable(target_linears(net, LORA_TARGETS))
    sac_modes = sac.block_modes(cfg.sac, cfg.sac_every, mcfg.num_blocks)
    if cfg.sac == "auto":  # one block measured under every mode at this run's shape; rank 0's choice for all ranks
        latent = (cfg.batch_size, mcfg.in_channels, max(views, 1) * vae_lib.latent_frames(cfg.frames),
                  cfg.height // 8, cfg.width // 8)
        auto = collectives.agree("--sac auto", lambda: plan.auto_plan(net, world, device, compute_dtype, latent,
                                                                      cfg.text_len, cfg.lora, cfg.mem_budget,
                                                                      cfg.fp8)[1], share=True)
        say(auto.why)
        sac_modes = auto.modes
    sac.apply_per_block(net, sac_modes)
    cp.enable(net, cp_group)  # before compile: the blocks' guards see their final attributes
    if cfg.compile:
        for block in net.blocks:
            block.compile()  # in place: no _orig_mod. in any key
    if distributed:
        shard_model(net, device, cfg.cp, ignored={m.weight for m in frozen_base} if cfg.fp8 else None)
    net.to_empty(device=device)
    torch.manual_seed(cfg.seed)  # same on every rank, so the DTensor init is one consistent model
    net.init_weights()
    if cfg.init == "random":
        say(f"init: RANDOM weights (--init random): {cfg.config} trains from scratch")
    else:
        ckpt.load(net, cfg.init, ema={"": None, "net": False, "net_ema": True}[cfg.ema_weights],
                  allow_missing=(ckpt.LORA_KEYS,) if cfg.lora else ())
    n_params = num_params(net)
    if cfg.fp8 and cfg.lora:  # after the load: the base went in whole (and was checked), then is quantised in place
        quantize_base(net)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    trainable = [p for p in net.parameters() if p.requires_grad]
    say(f"model: {cfg.config}, {n_params:,} parameters, {sum(p.numel() for p in trainable):,} trainable"
        f"{f' (LoRA r={cfg.lora})' if cfg.lora else ''}"
        + (f", frozen base of {len(frozen_base)} Linears in fp8 ({fp8.fp8_bytes(net) / 2 ** 30:.2f} GiB)"
           if cfg.fp8 and cfg.lora else ", fp8 GEMMs (weights and their gradients bf16/fp32)" if cfg.fp8 else "")
        + f", sac={cfg.sac}/{cfg.sac_every}, {world} rank(s) on {device.type}"
        + (f" (dp {dp_world} x cp {cfg.cp})" if cfg.cp > 1 else ""))

    # optimizer: AdamW with the objective's own settings (SFT: warm-up + cosine; GRPO/NFT: constant after a warm-up)
    rl_cfg = rl.config_of(cfg) if cfg.objective != "sft" else None
    betas, weight_decay = ((cfg.beta1, cfg.beta2), cfg.weight_decay) if rl_cfg is None else \
        (tuple(rl_cfg.betas), rl_cfg.weight_decay)
    step_lr = (lambda s: lr_at(cfg, s)) if rl_cfg is None else (lambda s: rl.lr_at(cfg, s))
    optimizer = torch.optim.AdamW(trainable, lr=step_lr(0), betas=betas, weight_decay=weight_decay, eps=1e-8,
                                  fused=device.type == "cuda")
    say(f"optimizer: AdamW betas {betas}, weight decay {weight_decay}, " + (
        f"lr {cfg.lr:g} (warm-up {cfg.warmup}, cosine to x{cfg.lr_min_ratio}), clip {cfg.grad_clip}"
        if rl_cfg is None else f"lr {rl_cfg.lr:g} (warm-up {rl_cfg.warmup}, then constant), clip "
        f"{rl_cfg.max_grad_norm}"))
    ema = [p.detach().clone() for p in trainable] if cfg.ema else None
    trainable_names = [n for n, p in net.named_parameters() if p.requires_grad]  # the order of `trainable`
    old = rl.old_adapters(cfg, net)  # NFT's old policy (its sampler), saved and resumed with the weights
    ema_state = {**({"ema": dict(zip(trainable_names, ema))} if cfg.ema else {}),
                 **({"nft_old": old} if old else {})} or None  # saved at every save, resumed

    # resume from OUT/latest if there is one: model, optimizer, EMA, step and data position
    state = resume.resume(cfg.out, net, optimizer, extra_state=ema_state)
    start_step = state["step"] if state else 0
    if state:
        if state["sampler"]["world_size"] != dp_world:
            raise ValueError(f"{cfg.out}: its data position is for {state['sampler']['world_size']} data-parallel "
                             f"groups, this run has {dp_world} (ranks / --cp); resume with ranks / --cp = "
                             f"{state['sampler']['world_size']} (--cp may change), or use a new --out")
        sampler.load_state_dict(state["sampler"])
        for group in optimizer.param_groups:  # the checkpoint restored its own; this run's flags win (said above)
            group.update(betas=betas, weight_decay=weight_decay)
    loader = iter(torch.utils.data.DataLoader(dataset, batch_size=cfg.batch_size, sampler=sampler,
                                              num_workers=cfg.workers, persistent_workers=cfg.workers > 0,
                                              worker_init_fn=ignore_sigint if cfg.workers else None))

    # evaluation clips (and the init guard's batch): the held-out videos, never trained on, or with --holdout 0 fixed
    # clips of training videos; fixed windows and noise, and the same number of batches on every rank (collectives)
    eval_ids = list(range(n_train, len(dataset))) or list(range(n_train))
    held_batches = [to_latent(torch.utils.data.default_collate(
        [dataset[(eval_ids[slot % len(eval_ids)], data.seed_of(cfg.seed, 1, slot))]]))
        for slot in (i * dp_world + dp_rank for i in range(2))]
    say(f"evaluation: {'held-out videos ' + str(eval_ids) if holdout else 'fixed clips of training videos'}")

    def held_out():  # SFT: the held-out loss; RL: the held-out rewards of the deterministic sampler (rl.evaluate)
        if cfg.objective == "sft":
            return evaluate(net, cfg, held_batches)
        return rl.evaluate(net, vae, cfg, held_batches, neg_text, terms,
                           lambda i, b, d: sample_seed(cfg.seed, "rl-eval", dp_rank, i, b, d))
    if state and not resume.eval_marker_valid(os.path.join(cfg.out, f"step_{start_step:08d}")):
        # killed between the save and its evaluation: a missing or partial result is re-run, never assumed done
        result = held_out()
        if master:
            resume.write_eval_marker(os.path.join(cfg.out, f"step_{start_step:08d}"), dict(result, step=start_step))
        say(f"evaluated the resumed checkpoint step {start_step}: {result}")

    if start_step == 0 and cfg.init != "random":  # prove that the pretrained weights went in before training
        latent, text, camera = held_batches[0]
        mask = flow.multiview_condition_mask(latent, views, 1) if views else condition_mask(latent, 1)
        with cp.disabled(net):  # its noise is drawn per global rank: each rank runs its own whole sample (no grad)
            loss, zero_loss = ckpt.guard_loss(net, latent, text, mask, camera=camera)
        ckpt.init_guard(loss, zero_loss, max_ratio=cfg.guard_max_ratio, source=cfg.init)

    # SIGTERM / SIGUSR1 (schedulers' pre-emption notice) and Ctrl-C: finish the step, save, exit 0
    stop = {"signal": None}
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: on_signal(stop, signum, say))

    peak = matmul_peak(device, torch.bfloat16) / 1e12 if device.type == "cuda" else None  # TFLOP/s
    latent_shape = (1, 16, max(views, 1) * vae_lib.latent_frames(cfg.frames), cfg.height // 8, cfg.width // 8)
    tokens = latent_shape[2] * (cfg.height // 16) * (cfg.width // 16)
    # per rank: a cp group shares each sample's FLOPs (attention too: all tokens, 1/cp of the heads)
    flops_per_step = model_flops(mcfg, latent_shape, cfg.text_len, cfg.lora)[2] * cfg.batch_size * cfg.grad_accum \
        / cfg.cp
    metrics_path = os.path.join(cfg.out, "metrics.jsonl")
    resumed_dir = os.path.join(cfg.out, f"step_{start_step:08d}") if state else None  # its row, if a kill lost it
    history = resume.load_history(metrics_path, start_step, resumed_dir) if master else []
    plots = importlib.util.find_spec("matplotlib") is not None  # optional: the one plot is not worth a dependency
    if not plots:
        say("loss.png: matplotlib is not installed (pip install matplotlib); metrics.jsonl holds every number")
    run_log = None
    if cfg.wandb and master:
        import wandb
        run_log = wandb.init(project=cfg.wandb, config=dataclasses.asdict(cfg), resume="allow",
                             id=f"{os.path.basename(os.path.abspath(cfg.out))}-{config_hash(cfg)}")
    if rl_cfg is not None and start_step == 0:  # the starting point of every RL curve (once: a restart keeps it)
        row = {"step": 0, **held_out()}
        say(f"held-out evaluation before the first update: {row}")
        if master and not any(r.get("step") == 0 for r in history):
            history.append(row)
            with open(metrics_path, "a") as f:
                f.write(json.dumps(row) + "\n")
    bar = tqdm(range(start_step, cfg.steps), initial=start_step, total=cfg.steps, disable=not master,
               desc=cfg.objective if rl_cfg is not None else "train")
    nonfinite = 0  # skipped (NaN/Inf) steps in a row
    for step in bar:
        t0 = time.perf_counter()
        lr = step_lr(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if rl_cfg is None:
            loss, grad_norm, cause = sft_step(net, optimizer, trainable, cfg, lambda: to_latent(next(loader)), step,
                                              dp_rank, dp_world)
            row = {"loss": all_mean(loss, device), "lr": lr, "grad_norm": grad_norm, **nonfinite_fields(cause)}
        else:
            row = {"lr": lr, **rl.step(net, vae, optimizer, trainable, cfg, to_latent(next(loader)), neg_text, terms,
                                       step, dp_rank, lambda *key: sample_seed(cfg.seed, *key), old)}
        if ema is not None and "skipped" not in row:  # a skipped update left the weights as they were
            with torch.no_grad():
                torch._foreach_lerp_(ema, [p.detach() for p in trainable], 1 - ema_beta(step, cfg.ema))
        if step == start_step and set(sac_modes) != {"none"}:
            sac.check_first_step(sac_modes)  # the save lists matched the kernels that really ran
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        row = {"step": step + 1, **row, "s_per_step": dt,
               "tokens_per_s": tokens * cfg.batch_size * cfg.grad_accum * dp_world / dt,
               "mfu": flops_per_step / dt / 1e12 / peak if peak and cfg.objective == "sft" else None,  # RL: smoke.py
               "peak_mem_gib": torch.cuda.max_memory_allocated() / 2 ** 30 if device.type == "cuda" else None}
        done = step + 1
        stopping = any_rank(stop["signal"] is not None, device)
        if (cfg.save_every and done % cfg.save_every == 0) or done == cfg.steps or stopping:
            t_save = time.perf_counter()
            extra = {"sampler": sampler.state_dict(consumed=done * cfg.batch_size * cfg.grad_accum),
                     "config_hash": config_hash(cfg), "config": dataclasses.asdict(cfg),
                     "metrics_row": row}  # logged again by a resumed run if a kill loses it (resume.load_history)
            path = resume.save(cfg.out, done, net, optimizer, extra, keep=cfg.keep, lora_only=bool(cfg.lora),
                               extra_state=ema_state)
            row["s_checkpoint"] = time.perf_counter() - t_save
            result = held_out()
            row.update(result)
            if master:
                resume.write_eval_marker(path, dict(result, step=done))
                say(f"step {done}: loss {row['loss']:.4f}, " + ", ".join(f"{k} {v:.4g}" for k, v in result.items()
                                                                        if k in ("eval_loss", "eval_reward"))
                    + f" -> {path}" + nonfinite_eval(result, path))
        elif cfg.eval_every and done % cfg.eval_every == 0:
            row.update(held_out())
        history.append(row)
        if master:  # after the save: a row is logged once its step is safe or the run went on past it
            with open(metrics_path, "a") as f:
                f.write(json.dumps(row) + "\n")
            if run_log is not None:
                run_log.log(row, step=row["step"])
            bar.set_postfix(**({"loss": f"{row['loss']:.4f}"} if cfg.objective == "sft" else
                               {"reward": f"{row['reward_mean']:.4g}", "std": f"{row['reward_std']:.2g}"}),
                            s_it=f"{dt:.2f}")
            if plots and "s_checkpoint" in row:
                resume.plot_metrics(os.path.join(cfg.out, "loss.png"), history, held_out=bool(holdout))
        nonfinite = count_nonfinite(row, nonfinite, cfg)
        if cfg.sample_every and done % cfg.sample_every == 0:
            write_sample(net, vae, getattr(dataset, "clips", dataset), eval_ids[0], cfg, neg_text,  # pixels
                         os.path.join(cfg.out, f"sample_{done:08d}.mp4"), master)
        if stopping:
            say(f"stopping after step {done} on {signal.Signals(stop['signal']).name}: checkpoint saved, exit 0")
            break
    if distributed:
        dist.barrier()  # rank 0 may still be writing markers and plots: tear the group down together
        dist.destroy_process_group()
    if lock is not None:
        lock.close()
    return history


@torch.no_grad()
def write_sample(net, vae, dataset, index, cfg, neg_text, path, master):
    """Generate a clip from the first frame of a fixed (held-out, if any) video; save it beside the truth."""
    item = dataset[(index, 0)]
    device = next(net.parameters()).device
    video = item["video"].to(device, next(vae.parameters()).dtype)  # [3,T,H,W], or [V,3,T,H,W] for a camera net
    text = item["text_emb"][None].to(device)
    p25 = dict(grid=inits.checkpoint_defaults(cfg.init, cfg.config)[0],
               conditional_frame_timestep=cfg.conditional_frame_timestep) if is_p25(get_config(cfg.config)) else {}
    camera = None if "w2c" not in item else views_map(item["w2c"].to(device), item["intrinsics"].to(device),
                                                      cfg.height, cfg.width)[None].to(video.dtype)
    video = video if camera is not None else video[None]
    guidance = cfg.guidance if cfg.objective == "sft" else rl.config_of(cfg).guidance  # RL: the policy's own CFG
    generated = sampling.generate(net, vae, video, text, neg_text.to(device), cfg.sample_steps, guidance, cfg.seed,
                                  camera=camera, **p25).to(video.dtype)
    if master:  # left: data, right: generated; views one above the other
        sampling.write_mp4(path, torch.cat(list(torch.cat([video, generated], dim=-1)), dim=-2))
        print(f"sample: {path} (left: data, right: generated from its first frame)", flush=True)


if __name__ == "__main__":
    cli.main(main, user_errors=USER_ERRORS)
