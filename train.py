"""Fine-tune Cosmos-Predict2 video2world on stitched 2x2 robot-grid videos.

    python train.py                                            # tiny built-in default, CPU, a few minutes
    torchrun --nproc_per_node=8 train.py --config v2w-14b --init droid --data DIR
    torchrun --nproc_per_node=8 train.py --config v2w-2b --init 2b-480p-16fps --data DIR --sac block

One script, top to bottom: config -> setup -> data -> model -> optimizer -> loop -> checkpoint.
"""
import argparse
import dataclasses
import hashlib
import importlib.util
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

import bench
import ckpt
import data
import grpo
import resume
import reward
import sac
import stitch
import vae as vae_lib
from model import DiT, add_lora, condition_mask, denoise, get_config, num_params

# -----------------------------------------------------------------------------
# Config: every field is a --flag; unknown flags are an error. None means "resolved from --config" below.


@dataclass
class TrainConfig:
    config: str = "tiny"  # DiT config (model.CONFIGS)
    init: str = ""  # droid | 2b-480p-16fps | 14b-720p-10fps | PATH | hf://org/repo/file@rev | random
    ema_weights: str = ""  # net | net_ema: which copy of a release file that holds both ("" = the only one)
    guard_max_ratio: float = 0.75  # init guard: iteration-0 loss / zero-velocity loss must stay below (random ~1.6)
    data: str = ""  # stitched folder (stitch.py); the tiny default builds one from a synthetic LeRobot dataset
    out: str = "out"
    vae: str = ""  # tiny | real
    vae_ckpt: str = ""  # tokenizer.pth (Wan2.1 VAE) for --vae real
    frames: int = 0  # pixel frames per clip (4k+1)
    height: int = 0
    width: int = 0
    text_len: int = 512
    batch_size: int = 1  # per rank
    grad_accum: int = 1
    steps: int = 0
    lr: float = 0.0
    warmup: int = -1
    lr_min_ratio: float = 0.1  # cosine decay to lr * this
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0
    loss_scale: float = 10.0  # upstream's loss_scale; only matters against grad_clip
    high_sigma_ratio: float = 0.05  # upstream's predict2_video2world_fsdp_* value
    text_dropout: float = 0.2
    sac: str = "none"  # none | block | mm | attn | selective
    sac_every: int = 1
    compile: bool = False  # torch.compile each block in place (keys unchanged)
    lora: int = 0  # LoRA rank; 0 = full fine-tune
    lora_alpha: float = 0.0  # 0 = rank (scale 1)
    ema: float = 0.0  # power-EMA rate s (upstream 0.1); 0 = off
    save_every: int = 0
    keep: int = 3
    sample_every: int = 0  # write a sample mp4 every N steps (0 = at the end only for the tiny default)
    sample_steps: int = 35
    seed: int = 0
    device: str = ""  # cuda | cpu (default: cuda when available)
    workers: int = 2
    holdout: int = -1  # videos (the last in name order) kept out of training for evaluation; -1: 2%, at least 1
    cache_latents: bool = False  # keep encoded clips in memory by (video, start frame): small datasets only
    objective: str = "sft"  # sft | grpo (GRPO trains LoRA adapters: needs --lora)
    grpo_k: int = 2  # samples per group (one conditioning clip + prompt)
    grpo_steps: int = 8  # stochastic sampler steps per rollout
    grpo_eta: float = 0.5
    guidance: float = 7.0  # upstream CFG convention (x0_c + g (x0_c - x0_u)); for rollouts and samples
    wandb: str = ""  # project name; used only if wandb happens to be installed


TINY = dict(data="data/tiny_grid", vae="tiny", frames=9, height=64, width=112, steps=200, lr=2e-3, warmup=20,
            save_every=100, sample_every=100, text_len=16, workers=0, cache_latents=True, holdout=0)
REAL = dict(vae="real", frames=93, height=432, width=768, steps=20000, lr=2 ** -14.5, warmup=1000, save_every=200,
            sample_every=1000)


def parse_config(argv):
    """Dataclass defaults, then the TINY or REAL preset, then the flags given on the command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     argument_default=argparse.SUPPRESS)  # only flags really given appear
    for f in dataclasses.fields(TrainConfig):
        flag = f"--{f.name.replace('_', '-')}"
        if f.type is bool or f.type == "bool":
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction)
        else:
            parser.add_argument(flag, dest=f.name, type=type(f.default))
    given = vars(parser.parse_args(argv))  # argparse rejects unknown flags
    preset = TINY if given.get("config", TrainConfig.config) == "tiny" else REAL
    return validate(TrainConfig(**{**preset, **given}))


def validate(cfg):
    """Fail fast, before anything is built."""
    get_config(cfg.config)  # raises with the valid names
    if cfg.objective not in ("sft", "grpo"):
        raise ValueError(f"--objective {cfg.objective!r}: valid are sft, grpo")
    if cfg.objective == "grpo" and not cfg.lora:
        raise ValueError("--objective grpo trains LoRA adapters only: pass --lora RANK (e.g. 32)")
    if cfg.objective == "grpo" and cfg.grad_accum != 1:
        raise ValueError("--objective grpo accumulates over (sample, step) itself: --grad-accum must be 1")
    if cfg.ema_weights not in ("", "net", "net_ema"):
        raise ValueError(f"--ema-weights {cfg.ema_weights!r}: net or net_ema")
    if cfg.save_every < 0:
        raise ValueError(f"--save-every {cfg.save_every}: >= 0 (0 = only at the end and on a signal)")
    if not cfg.init:
        if cfg.config != "tiny":
            raise ValueError(f"--config {cfg.config} needs an explicit --init (droid, 2b-480p-16fps, a path, ... "
                             "or 'random' to really train from scratch)")
        cfg.init = "random"
    sac.make_checkpoint_fn(cfg.sac)  # raises with the valid modes
    if cfg.sac_every < 1 or cfg.grad_accum < 1 or cfg.batch_size < 1 or cfg.steps < 1:
        raise ValueError("--sac-every, --grad-accum, --batch-size and --steps must be >= 1")
    if cfg.keep < 2:
        raise ValueError(f"--keep {cfg.keep}: at least 2, so a save in progress never leaves nothing to resume from")
    if (cfg.frames - 1) % 4 or cfg.height % 16 or cfg.width % 16:
        raise ValueError(f"clip {cfg.frames}x{cfg.height}x{cfg.width}: frames must be 4k+1, height/width multiples of 16")
    if cfg.vae == "real" and not cfg.vae_ckpt:
        raise ValueError("--vae real needs --vae-ckpt PATH (tokenizer/tokenizer.pth of a Cosmos-Predict2 repo)")
    if cfg.wandb and importlib.util.find_spec("wandb") is None:
        raise ValueError(f"--wandb {cfg.wandb}: wandb is not installed (pip install wandb); it is optional")
    if not 0 <= cfg.ema < 1 or cfg.lora < 0:
        raise ValueError(f"--ema {cfg.ema} must be in [0,1), --lora {cfg.lora} >= 0")
    return cfg


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


def training_loss(net, cfg, latent, text_emb, seeds):
    """Rectified-flow loss: (1+s)^2/s^2 |x0_hat - x0|^2 equals |v_hat - (eps - x0)|^2 exactly; we use the velocity
    form (no 1e8 weights at small sigma). Conditioning frames are replaced by the clean latent, so they add 0."""
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


# -----------------------------------------------------------------------------
# Distributed model: FSDP2 per block, then the final layer, then the root (torchtitan's order)


def shard_model(net, device):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("dp",))
    # fp32 master weights, bf16 compute on GPUs, fp32 gradient reduction. cast_forward_inputs=False: the fp32 diffusion
    # time must not be rounded to bf16 on its way into a block (t = 0.9995 would arrive as 1.0).
    compute = torch.bfloat16 if device.type == "cuda" else torch.float32
    mp = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32, cast_forward_inputs=False)
    last = len(net.blocks) - 1
    for i, block in enumerate(net.blocks):
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=i < last)  # backward starts at the last
    fully_shard(net.final_layer, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    fully_shard(net, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    return net


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
# Small helpers for the loop: the tiny dataset, VAE, batches, metrics, plots, evaluation markers


def make_tiny_dataset(root):
    """Synthetic LeRobot episodes (stitch.make_synthetic) stitched into a small grid folder."""
    raw = root + "_lerobot"
    if not os.path.exists(raw):  # 4 usable episodes (shards evenly over 1, 2 or 4 ranks) and 1 too short to use
        stitch.make_synthetic(raw, lengths=(48, 40, 8, 56, 44))
    stitch.stitch(raw, root, stride=4, frames=TINY["frames"], size=f"{TINY['height']}x{TINY['width']}", workers=1)


def all_mean(value, device):
    t = torch.tensor([float(value)], dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t)
        t /= dist.get_world_size()
    return t.item()


def any_rank(flag, device):
    t = torch.tensor([int(flag)], device=device)
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def plot_loss(path, steps, losses):
    """A PNG loss curve without matplotlib: log-scale loss in black on white, with the running mean in red."""
    import imageio.v2 as imageio
    H, W, pad = 240, 480, 12
    img = np.full((H, W, 3), 255, np.uint8)
    y = np.log10(np.maximum(np.asarray(losses, np.float64), 1e-12))
    smooth = np.convolve(y, np.ones(min(20, len(y))) / min(20, len(y)), mode="valid")
    lo, hi = y.min(), max(y.max(), y.min() + 1e-6)
    def draw(values, offset, colour):
        xs = pad + (np.arange(len(values)) + offset) * (W - 2 * pad) / max(1, len(y) - 1)
        ys = H - pad - (values - lo) / (hi - lo) * (H - 2 * pad)
        for x0, y0, x1, y1 in zip(xs[:-1], ys[:-1], xs[1:], ys[1:]):
            n = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
            img[np.linspace(y0, y1, n).astype(int), np.linspace(x0, x1, n).astype(int)] = colour
    img[pad:H - pad, pad] = img[H - pad, pad:W - pad] = 128  # axes
    draw(y, 0, (0, 0, 0))
    draw(smooth, len(y) - len(smooth), (220, 30, 30))
    imageio.imwrite(path, img)


EVAL_MARKER = "eval.json"


def eval_marker_valid(step_dir):
    """A checkpoint counts as evaluated only if its marker exists, parses, and its checksum matches its contents."""
    path = os.path.join(step_dir, EVAL_MARKER)
    if not os.path.isfile(path):
        return False
    with open(path) as f:
        marker = json.load(f)
    body = json.dumps(marker.get("result"), sort_keys=True)
    return marker.get("status") == "completed" and marker.get("sha256") == hashlib.sha256(body.encode()).hexdigest()


def write_eval_marker(step_dir, result):
    """Written last, atomically, and only once the evaluation finished: "completed" means completed."""
    body = json.dumps(result, sort_keys=True)
    resume.write_atomic(os.path.join(step_dir, EVAL_MARKER), json.dumps(
        {"status": "completed", "result": result, "sha256": hashlib.sha256(body.encode()).hexdigest()}, indent=1))


@torch.no_grad()
def evaluate(net, cfg, batches):
    """Held-out loss on fixed clips with fixed noise: comparable across checkpoints and runs."""
    losses = [training_loss(net, cfg, latent, text, [sample_seed(cfg.seed, "eval", i, b) for b in range(len(latent))])
              for i, (latent, text) in enumerate(batches)]
    return {"eval_loss": all_mean(torch.stack(losses).mean().item(), batches[0][0].device)}


def grpo_step(net, vae, optimizer, params, cfg, gcfg, batch, seed, distributed, device):
    """One GRPO update: per clip of this rank's batch, K rollouts from its first latent frame and prompt, decoded and
    scored; advantages over all ranks' groups; then the clipped-surrogate update of the LoRA adapters."""
    latent, text = batch
    generator = torch.Generator(device=device).manual_seed(seed)
    rollouts, rewards, keys = [], [], []
    for b in range(latent.shape[0]):
        gt = latent[b: b + 1]
        cond = grpo.Condition(crossattn_emb=text[b: b + 1], neg_crossattn_emb=torch.zeros_like(text[b: b + 1]),
                              gt_frames=gt, condition_mask=condition_mask(gt, 1), key=(seed, b))
        rollout = grpo.rollout_group(net, cond, tuple(gt.shape[1:]), gcfg, generator)
        with torch.no_grad():  # one decode at a time: memory does not grow with K
            video = torch.cat([vae.decode(rollout.x0_final[k: k + 1].to(next(vae.parameters()).dtype))
                               for k in range(gcfg.group_size)]).float()
        rollouts.append(rollout)
        rewards.append(reward.grid_rewards(video)["reward"].cpu())
        keys += [cond.key] * gcfg.group_size
    local = torch.cat(rewards)
    everyone = [local]
    if distributed:  # advantages are normalised over every group of the update, on every rank alike
        everyone = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(everyone, local.to(device) if device.type == "cuda" else local)
        everyone = [r.cpu() for r in everyone]
        keys = [(r, *k) for r in range(len(everyone)) for k in keys]
    advantages = grpo.group_advantages(torch.cat(everyone), keys, eps=gcfg.adv_eps, clip=gcfg.adv_clip,
                                       global_std=gcfg.global_std, ddof=gcfg.std_ddof)
    mine = advantages.view(len(everyone), -1)[dist.get_rank() if distributed else 0].view(len(rollouts), -1)
    stats = grpo.grpo_update(net, optimizer, params, rollouts, [a.to(device) for a in mine], gcfg,
                             set_grad_sync=net.set_requires_gradient_sync if distributed else None)
    if stats["nonfinite_steps"]:
        raise FloatingPointError(f"GRPO update produced a non-finite gradient norm: {stats['grad_norm']}")
    return stats["loss"], stats["grad_norm"][-1] if stats["grad_norm"] else 0.0, {
        "reward_mean": all_mean(local.mean().item(), device), "first_ratio": stats["first_ratio"],
        "clipfrac": stats["clipfrac"], "approx_kl": stats["approx_kl"]}


# -----------------------------------------------------------------------------
# Main: setup -> data -> model -> optimizer -> loop -> checkpoint


def main(argv=None):
    cfg = parse_config(sys.argv[1:] if argv is None else argv)
    distributed, rank, world, device = setup_distributed(cfg)
    master = rank == 0
    say = (lambda *a: print(*a, flush=True)) if master else (lambda *a: None)
    compute_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    mcfg = get_config(cfg.config)
    os.makedirs(cfg.out, exist_ok=True)
    if master:
        resume.write_atomic(os.path.join(cfg.out, "config.json"), json.dumps(dataclasses.asdict(cfg), indent=1))

    # data: clips of cfg.frames frames, encoded online by the frozen VAE
    if cfg.config == "tiny":  # (re)stitching a finished folder only re-reads its manifest; a killed one resumes
        if master:
            make_tiny_dataset(cfg.data)
        if distributed:
            dist.barrier()
    dataset = data.GridClips(cfg.data, cfg.frames, cfg.height, cfg.width, text_len=cfg.text_len,
                             text_dim=mcfg.crossattn_emb_channels, text="standin" if cfg.config == "tiny" else "t5",
                             seed=cfg.seed)
    holdout = cfg.holdout if cfg.holdout >= 0 else max(1, len(dataset) // 50)
    n_train = len(dataset) - holdout
    if n_train < 1:
        raise ValueError(f"--holdout {holdout} leaves no video of {len(dataset)} in {cfg.data} to train on")
    sampler = data.ClipSampler(n_train, rank=rank, world_size=world, seed=cfg.seed)
    vae = vae_lib.build_vae(cfg.vae, cfg.vae_ckpt, device, compute_dtype)

    latent_cache = {}

    def to_latent(batch):
        keys = list(zip(batch["stem"], batch["start"].tolist()))
        if not (cfg.cache_latents and all(k in latent_cache for k in keys)):
            with torch.no_grad():
                latent = vae.encode(batch["video"].to(device, compute_dtype)).float()
            if not cfg.cache_latents:
                return latent, batch["text_emb"].to(device)
            latent_cache.update(zip(keys, latent))
        return torch.stack([latent_cache[k] for k in keys]), batch["text_emb"].to(device)

    # model: meta build -> LoRA/freeze -> activation checkpointing -> compile -> FSDP -> materialise -> load
    with torch.device("meta"):
        net = DiT(mcfg)
    if cfg.lora:
        add_lora(net, cfg.lora, cfg.lora_alpha or None)
    sac.apply(net, cfg.sac, cfg.sac_every)
    if cfg.compile:
        for block in net.blocks:
            block.compile()  # in place: no _orig_mod. in any key
    if distributed:
        shard_model(net, device)
    net.to_empty(device=device)
    torch.manual_seed(cfg.seed)  # same on every rank, so the DTensor init is one consistent model
    net.init_weights()
    if cfg.init == "random":
        say(f"init: RANDOM weights (--init random): {cfg.config} trains from scratch")
    else:
        ckpt.load(net, cfg.init, ema={"": None, "net": False, "net_ema": True}[cfg.ema_weights],
                  allow_missing=(ckpt.LORA_KEYS,) if cfg.lora else ())
    trainable = [p for p in net.parameters() if p.requires_grad]
    say(f"model: {cfg.config}, {num_params(net):,} parameters, {sum(p.numel() for p in trainable):,} trainable"
        f"{f' (LoRA r={cfg.lora})' if cfg.lora else ''}, sac={cfg.sac}/{cfg.sac_every}, {world} rank(s) on {device.type}")

    optimizer = torch.optim.AdamW(trainable, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay,
                                  fused=device.type == "cuda")
    ema = [p.detach().clone() for p in trainable] if cfg.ema else None
    trainable_names = [n for n, p in net.named_parameters() if p.requires_grad]  # the order of `trainable`
    ema_state = {"ema": dict(zip(trainable_names, ema))} if cfg.ema else None  # saved at every save, resumed
    gcfg = grpo.GRPOConfig(group_size=cfg.grpo_k, num_steps=cfg.grpo_steps, eta=cfg.grpo_eta, guidance=cfg.guidance,
                           max_grad_norm=cfg.grad_clip, drop_zero_advantage=False,
                           # a compiled training forward rounds differently from the rollout's: recompute old log-probs
                           recompute_old_logp=cfg.compile) if cfg.objective == "grpo" else None

    # resume from OUT/latest if there is one: model, optimizer, EMA, step and data position
    state = resume.resume(cfg.out, net, optimizer, extra_state=ema_state)
    start_step = state["step"] if state else 0
    if state:
        sampler.load_state_dict(state["sampler"])
        changed = {k: (state["config"].get(k), getattr(cfg, k)) for k in RESUME_KEYS
                   if state["config"].get(k) != getattr(cfg, k)}
        if changed:
            raise ValueError(f"{cfg.out} was written with other settings, (saved, now): {changed}; a resumed run "
                             "must keep them (LoRA checkpoints hold only adapters: the base comes from --init). "
                             "Use a new --out")
    loader = iter(torch.utils.data.DataLoader(dataset, batch_size=cfg.batch_size, sampler=sampler,
                                              num_workers=cfg.workers, persistent_workers=cfg.workers > 0))

    # evaluation clips (and the init guard's batch): the held-out videos, never trained on, or with --holdout 0 fixed
    # clips of training videos; fixed windows and noise, and the same number of batches on every rank (collectives)
    eval_ids = list(range(n_train, len(dataset))) or list(range(n_train))
    held_batches = [to_latent(torch.utils.data.default_collate(
        [dataset[(eval_ids[(i * world + rank) % len(eval_ids)], data.seed_of(cfg.seed, 1, i * world + rank))]]))
        for i in range(2)]
    say(f"evaluation: {'held-out videos ' + str(eval_ids) if holdout else 'fixed clips of training videos'}")
    if state and not eval_marker_valid(os.path.join(cfg.out, f"step_{start_step:08d}")):
        # killed between the save and its evaluation: a missing or partial result is re-run, never assumed done
        result = evaluate(net, cfg, held_batches)
        if master:
            write_eval_marker(os.path.join(cfg.out, f"step_{start_step:08d}"), dict(result, step=start_step))
        say(f"evaluated the resumed checkpoint step {start_step}: {result}")

    if start_step == 0 and cfg.init != "random":  # prove that the pretrained weights went in before training
        latent, text = held_batches[0]
        loss, zero_loss = ckpt.guard_loss(net, latent, text, condition_mask(latent, 1))
        ckpt.init_guard(loss, zero_loss, max_ratio=cfg.guard_max_ratio, source=cfg.init)

    stop = {"signal": None}  # SIGTERM / SIGUSR1 (schedulers' pre-emption notice): finish the step, save, exit 0
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, lambda signum, frame: stop.__setitem__("signal", signum))

    peak = bench.matmul_peak(device, torch.bfloat16) / 1e12 if device.type == "cuda" else None  # TFLOP/s
    latent_shape = (1, 16, 1 + (cfg.frames - 1) // 4, cfg.height // 8, cfg.width // 8)
    tokens = latent_shape[2] * (cfg.height // 16) * (cfg.width // 16)
    flops_per_step = bench.model_flops(mcfg, latent_shape, cfg.text_len, cfg.lora)[2] * cfg.batch_size * cfg.grad_accum
    metrics_path = os.path.join(cfg.out, "metrics.jsonl")
    run_log = None
    if cfg.wandb and master:
        import wandb
        run_log = wandb.init(project=cfg.wandb, config=dataclasses.asdict(cfg), resume="allow",
                             id=f"{os.path.basename(os.path.abspath(cfg.out))}-{config_hash(cfg)}")
    history = []
    if master and os.path.exists(metrics_path):  # keep the curve of the steps before the resume point
        with open(metrics_path) as f:
            history = [r for r in map(json.loads, f) if r["step"] <= start_step]
    bar = tqdm(range(start_step, cfg.steps), initial=start_step, total=cfg.steps, disable=not master, desc="train")
    for step in bar:
        t0 = time.perf_counter()
        lr = lr_at(cfg, step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if cfg.objective == "sft":
            loss_sum = 0.0
            for micro in range(cfg.grad_accum):
                latent, text = to_latent(next(loader))
                seeds = [sample_seed(cfg.seed, step, (micro * world + rank) * cfg.batch_size + b)
                         for b in range(latent.shape[0])]
                loss = training_loss(net, cfg, latent, text, seeds) / cfg.grad_accum
                loss.backward()
                loss_sum += loss.item()
            grad_norm = torch.nn.utils.clip_grad_norm_(trainable, cfg.grad_clip)
            grad_norm = (grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm).item()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            extra_metrics = {}
        else:
            loss_sum, grad_norm, extra_metrics = grpo_step(net, vae, optimizer, trainable, cfg, gcfg, to_latent(
                next(loader)), sample_seed(cfg.seed, step, rank), distributed, device)
        if ema is not None:
            with torch.no_grad():
                torch._foreach_lerp_(ema, [p.detach() for p in trainable], 1 - ema_beta(step, cfg.ema))
        if step == start_step and cfg.sac != "none":
            sac.check_first_step(cfg.sac)  # the save lists matched the kernels that really ran
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        row = {"step": step + 1, "loss": all_mean(loss_sum, device), "lr": lr, "grad_norm": grad_norm, **extra_metrics,
               "s_per_step": dt, "tokens_per_s": tokens * cfg.batch_size * cfg.grad_accum * world / dt,
               "mfu": flops_per_step / dt / 1e12 / peak if peak and cfg.objective == "sft" else None,  # smoke.py: GRPO
               "peak_mem_gib": torch.cuda.max_memory_allocated() / 2 ** 30 if device.type == "cuda" else None}
        history.append(row)
        if master:
            with open(metrics_path, "a") as f:
                f.write(json.dumps(row) + "\n")
            if run_log is not None:
                run_log.log(row, step=row["step"])
            bar.set_postfix(loss=f"{row['loss']:.4f}", s_it=f"{dt:.2f}")
        done = step + 1
        stopping = any_rank(stop["signal"] is not None, device)
        if (cfg.save_every and done % cfg.save_every == 0) or done == cfg.steps or stopping:
            extra = {"sampler": sampler.state_dict(consumed=done * cfg.batch_size * cfg.grad_accum),
                     "config_hash": config_hash(cfg), "config": dataclasses.asdict(cfg)}
            path = resume.save(cfg.out, done, net, optimizer, extra, keep=cfg.keep, lora_only=bool(cfg.lora),
                               extra_state=ema_state)
            result = evaluate(net, cfg, held_batches)
            if master:
                write_eval_marker(path, dict(result, step=done))
                plot_loss(os.path.join(cfg.out, "loss.png"), [r["step"] for r in history],
                          [r["loss"] for r in history])
                say(f"step {done}: loss {row['loss']:.4f}, eval {result['eval_loss']:.4f} -> {path}")
        if cfg.sample_every and done % cfg.sample_every == 0:
            write_sample(net, vae, dataset, eval_ids[0], cfg, os.path.join(cfg.out, f"sample_{done:08d}.mp4"), master)
        if stopping:
            say(f"stopping after step {done} on signal {stop['signal']}: checkpoint saved, exit 0")
            break
    if distributed:
        dist.barrier()  # rank 0 may still be writing markers and plots: tear the group down together
        dist.destroy_process_group()
    return history


RESUME_KEYS = ("config", "init", "ema_weights", "lora", "lora_alpha", "objective", "vae", "vae_ckpt", "frames",
               "height", "width", "text_len", "batch_size", "grad_accum", "seed", "data", "holdout", "ema")


def config_hash(cfg):
    """The settings a resumed run must share with the saved one (shapes, init, data, objective), hashed."""
    return hashlib.sha256(json.dumps({k: getattr(cfg, k) for k in RESUME_KEYS}, sort_keys=True).encode()).hexdigest()[:16]


@torch.no_grad()
def write_sample(net, vae, dataset, index, cfg, path, master):
    """Generate a clip from the first frame of a fixed (held-out, if any) video; save it beside the truth."""
    import sample as sampling
    item = dataset[(index, 0)]
    device = next(net.parameters()).device
    video = item["video"][None].to(device, next(vae.parameters()).dtype)
    text = item["text_emb"][None].to(device)
    generated = sampling.generate(net, vae, video, text, torch.zeros_like(text), cfg.sample_steps, cfg.guidance,
                                  cfg.seed)
    if master:
        sampling.write_mp4(path, torch.cat([video, generated.to(video.dtype)], dim=-1)[0])
        print(f"sample: {path} (left: data, right: generated from its first frame)", flush=True)


if __name__ == "__main__":
    main()
