"""Fine-tune Cosmos-Predict2 (and Predict2.5: its rectified-flow loss, nets/flow.py) video2world on robot-grid videos.

    python train.py                                            # tiny built-in default, CPU, a few minutes
    torchrun --nproc_per_node=8 train.py --config v2w-14b --init droid --data DIR
    torchrun --nproc_per_node=8 train.py --config v2w-2b --init 2b-480p-16fps --data DIR --sac block
    python train.py --objective nft --init out/step_00001000 --lora 4 --out runs/tiny-nft     # DiffusionNFT (--nft-*)
    python train.py --objective grpo --init out/step_00001000 --lora 4 --out runs/tiny-grpo   # GRPO (--grpo-*)
    python train.py --config p25-tiny --out runs/p25-tiny      # the Predict2.5 tiny default

Flags not given take the preset of --config, files in recipes/: tiny.py for a tiny config (data/tiny_grid, 9x64x112,
1000 steps at lr 2e-3, warm-up 20, the tiny codec, 2 held-out videos; tiny_action.py on top for an action config,
tiny_rl.py and tiny_<objective>.py for an RL objective), real.py for every other config (93x432x768, 20k steps at lr
2^-14.5, warm-up 1000, the real VAE); action.py (guidance 0) for an action config. An experiment is a file: copy a
recipe, edit it, pass --recipe FILE (its settings count as flags given; flags on the command line still win).
The RL objectives have their own optimizer flags (--grpo-lr, ...; --nft-lr, ...): the SFT ones are refused with them.
One script, top to bottom: config -> setup -> data -> run directory -> model -> optimizer -> resume -> loop.
"""
import dataclasses
import importlib.util
import os
import signal
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from tqdm import tqdm

import cache
import ckpt
import grpo
import nft
import ownctx
import sac
import sft
from base import cli, collectives, cp, lerobot
from base.inits import CONFIGS, TINY_CONFIGS, get_config, tiny_data
from clips import actionclips, data, text as text_lib
from clips.tiny import make_tiny_dataset
from engine import build, resume, rl, rundir, runs
from engine.build import build_vae, compile_seconds, make_encoder, trainable
from engine.generate import write_sample
from engine.objective import held_out_slots
from grpo import GRPOConfig
from nets import vae as vae_lib
from nets.family import FAMILIES, family_of
from nets.flops import matmul_peak
from nft import NFTConfig
from ownctx import OwnContextConfig
from policy import Policy, PolicyConfig

# -----------------------------------------------------------------------------
# Config: every field is a --flag (base/cli.py: the comment is its --help); unknown flags are an error. 0 / "" / -1 mean
# "from the preset" (recipes/: tiny.py for --config tiny, real.py otherwise), filled only where the flag was not given.


@dataclass
class TrainConfig:
    config: str = "tiny"  # DiT config (inits.CONFIGS): tiny, v2w-2b, v2w-14b, p25-tiny, p25-2b, p25-14b, ...
    recipe: str = ""  # an experiment's file (a copy of recipes/*.py): its settings replace the preset's, flags win
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
    cond_frames: int = 0  # Predict2 SFT: conditioning latent frames a clip trains with (0: upstream's 1 or 2 drawn; 1: as policyeval chains)
    conditional_frame_timestep: float = -1.0  # Predict2.5: -1 = conditional frames share the noisy frames' time (pre-
    # training); 0.1 = they get timestep 0.1, t = 1e-4; default: upstream's for --init (0.1 for p25-2b-post, agibot)
    text_dropout: float = 0.2  # SFT: probability of training a sample without its prompt (for CFG)
    sac: str = "none"  # activation checkpointing: none | block | mm | attn | selective | auto (docs/memory.md)
    mem_budget: float = 0.0  # --sac auto: per-rank memory budget in GiB; the fastest per-block mix that fits
    sac_every: int = 1  # checkpoint every N-th block only
    compile: bool = False  # torch.compile each block in place (keys unchanged)
    cp: int = 1  # context parallelism: ranks that split each sample's latent frames (Ulysses, base/cp.py, docs/memory.md)
    lora: int = 0  # LoRA rank; 0 = full fine-tune
    lora_alpha: float = 0.0  # LoRA alpha; 0 = rank (scale 1)
    fp8: bool = False  # fp8 GEMMs in the block Linears (base/fp8.py): LoRA holds its frozen base in fp8 (half the memory);
    # a full fine-tune keeps its weights and runs forward and input-gradient GEMMs in fp8, weight gradients in bf16
    ema: float = 0.0  # power-EMA rate s (upstream 0.1); 0 = off
    save_every: int = 0  # checkpoint every N steps; 0 = only at the end and on SIGTERM/SIGUSR1
    keep: int = 3  # complete checkpoints kept (>= 2)
    sample_every: int = 0  # write a sample mp4 every N steps (0 = never; the tiny default: every 500)
    sample_steps: int = 35  # sampler steps of those samples
    guidance: float = 7.0  # CFG of the sample videos, upstream convention x0_c + g (x0_c - x0_u) (rollouts:
    # --grpo-guidance); an action net's preset: 0, as upstream samples it
    seed: int = 0  # every random draw depends on (seed, step, sample, purpose) only
    device: str = ""  # cuda | cpu (default: cuda when available)
    workers: int = 2  # DataLoader worker processes per rank
    holdout: int = -1  # videos (the last in name order) kept out of training for evaluation; -1: 2%, at least 1
    cache_latents: bool = False  # keep encoded clips in memory by (video, start frame): small datasets only
    latents: str = ""  # a cache.py folder of --data's encoded windows: train on them, no VAE encoding per step
    objective: str = "sft"  # sft | ownctx | grpo | nft | policy (the RL objectives train LoRA adapters: need --lora)
    reward: str = "default"  # GRPO reward: default (reward.py) and/or module:function plug-ins, comma-separated, each =WEIGHT optional
    wandb: str = ""  # project name; needs `pip install wandb`
    eval_every: int = 0  # held-out evaluation every N steps besides each save (RL: also before the first update)
    eval_steps: int = 35  # RL: deterministic sampler steps of the held-out evaluation (eval_reward_*, eval_psnr)
    max_psnr_drop: float = 0.5  # RL: warn once when held-out PSNR falls this many dB below step 0's (0: never)
    stop_on_psnr_drop: bool = False  # RL: and stop the run there (docs/rl.md: which checkpoint to keep)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)  # GRPO knobs (--objective grpo; docs/grpo.md)
    nft: NFTConfig = field(default_factory=NFTConfig)  # DiffusionNFT knobs (--objective nft; docs/nft.md)
    policy: PolicyConfig = field(default_factory=PolicyConfig)  # Cosmos-Policy knobs (--objective policy; docs/policy.md)
    ownctx: OwnContextConfig = field(default_factory=OwnContextConfig)  # own-context SFT (--objective ownctx; docs/actions.md)
    action_dim: int = field(default=0, init=False)  # no flag: an action net's, decided at start-up (load_data)


FAMILY_ONLY = {k: f.NAME for f in FAMILIES for k in f.TRAIN_FLAGS}  # loss knobs of one model family: its owner


def recipes_of(name, objective):
    """The recipes/ files of --config `name` and --objective `objective`, in the order they apply (later wins)."""
    tiny, action = name in TINY_CONFIGS, name in CONFIGS and CONFIGS[name].action_dim > 0
    files = ["tiny", *(["tiny_action"] if action else [])] if tiny else ["real"]
    return files + (["action"] if action else []) + (list(objective_of(objective).TINY_RECIPES) if tiny else [])


def preset(name, objective):
    """The settings of --config `name` and --objective `objective` that are not TrainConfig's defaults."""
    settings = dict(data=tiny_data(name)) if name in TINY_CONFIGS else {}  # the tiny default's own folder
    for file in recipes_of(name, objective):
        settings.update(cli.recipe(file))
    return settings


def parse_config(argv):
    """Dataclass defaults, then the preset of --config (recipes/), then --recipe FILE's, then the flags given."""
    given = cli.parse_flags(TrainConfig, argv, description=__doc__)  # argparse rejects unknown flags
    if given.get("recipe"):  # its settings count as given: checked as flags are (nothing silently ignored)
        given = cli.merged(cli.read_recipe(given["recipe"]), given)
    name = given.get("config", TrainConfig.config)
    return validate(cli.build(TrainConfig, preset(name, given.get("objective", TrainConfig.objective)), given), given)


def validate(cfg, given=None):
    """Fail fast, before anything is built or written: every setting is used, validated or refused."""
    given = cli.flatten(given or {})
    mcfg = get_config(cfg.config)  # raises with the valid names
    objective = objective_of(cfg.objective)  # raises with the valid names
    unused = {}
    views = len(data.VIEW_ORDER) if mcfg.camera_channels else 1  # stacked on latent time, split with it
    cp.check_split(cfg.cp, cfg.config, mcfg.num_heads, vae_lib.latent_frames(cfg.frames) * views, cfg.frames)
    if cfg.cp > 1 and cfg.sac == "auto":
        raise ValueError(f"--cp {cfg.cp} with --sac auto: the auto plan measures a block without CP; pick a --sac mode"
                         f" with `bench.py --world N --cp {cfg.cp}` (docs/memory.md)")
    unused.update({k: f"with --objective {objective.NAME}" for k in given if k.split(".")[0] in set(OBJECTIVES) - {objective.NAME}})
    unused.update(objective.validate(cfg, given))  # RL: imports the reward plug-ins (a typo fails before a model)
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
    unused.update({k: f"with --config {cfg.config} (a {owner} loss setting)" for k, owner in FAMILY_ONLY.items()
                   if k in given and k not in family_of(mcfg).TRAIN_FLAGS})
    if unused:
        raise ValueError("; ".join(f"{cli.flag(k)} does nothing {why}" for k, why in unused.items()) + ": drop it (nothing is silently ignored)")
    if cfg.ema_weights not in ("", "net", "net_ema"):
        raise ValueError(f"--ema-weights {cfg.ema_weights!r}: net or net_ema")
    if cfg.save_every < 0:
        raise ValueError(f"--save-every {cfg.save_every}: >= 0 (0 = only at the end and on a signal)")
    if "conditional_frame_timestep" not in given:  # upstream's value for the checkpoint (Predict2: never read)
        cfg.conditional_frame_timestep = family_of(mcfg).sampler_defaults(cfg.init, cfg.config)[1]
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
        missing = rundir.missing_step(cfg.init, "--init")  # RUN/step_N that is not there: the steps that are
        if missing:
            raise ValueError(missing)
        ckpt.resolve_source(cfg.init)  # a local path: it exists and has a checkpoint format (hub names: in main)
        if "holdout" not in given:  # RL from an SFT step: the base's held-out episodes, never trained on
            cfg.holdout = runs.init_holdout(cfg.init, cfg.data, cfg.holdout)
    sac.make_checkpoint_fn("block" if cfg.sac == "auto" else cfg.sac)  # raises with the valid modes
    if min(cfg.sac_every, cfg.grad_accum, cfg.batch_size, cfg.steps, cfg.max_nonfinite) < 1 or cfg.eval_every < 0:
        raise ValueError("--sac-every, --grad-accum, --batch-size, --steps and --max-nonfinite must be >= 1, "
                         "--eval-every >= 0")
    if cfg.keep < 2:
        raise ValueError(f"--keep {cfg.keep}: at least 2, so a save in progress never leaves nothing to resume from")
    if (cfg.frames - 1) % 4 or cfg.height % 16 or cfg.width % 16:
        raise ValueError(f"clip {cfg.frames}x{cfg.height}x{cfg.width}: frames must be 4k+1, height/width multiples of 16")
    check_inputs(cfg, given)
    return cfg


def check_inputs(cfg, given):
    """The files and devices a run reads: the latent cache, the VAE checkpoint, wandb, the device, --out, --data."""
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


def check_data(cfg, given):
    """--data is a folder stitch.py wrote (the tiny default's own is built by train.py), and what text it gives."""
    if not synthetic_data(cfg) and not os.path.isdir(cfg.data):
        raise ValueError(f"--data {cfg.data!r}: no such folder (build one with `python stitch.py SRC DIR`)"
                         if cfg.data else "--data DIR is needed: a folder written by stitch.py")
    hint = lerobot.unstitched(cfg.data, "--data", cfg.frames, cfg.height, cfg.width,
                              views=bool(get_config(cfg.config).camera_channels))
    if not synthetic_data(cfg) and hint:
        raise ValueError(hint)
    if not text_lib.standin_text(cfg.config, cfg.data) and cfg.config in TINY_CONFIGS and "text_len" not in given:
        cfg.text_len = TrainConfig.text_len  # tiny on a folder with t5_xxl/: T5's 512 tokens, not the stand-in's 16


def synthetic_data(cfg):
    """Only the tiny default's own folder is ever written by train.py; any other --data is read, never written."""
    return cfg.config in TINY_CONFIGS and os.path.normpath(cfg.data) == os.path.normpath(tiny_data(cfg.config))


# -----------------------------------------------------------------------------
# The tiny default's data and the settings a resumed run keeps (the rest of the run directory: engine/rundir.py)


def resume_keys(cfg):
    """The settings a resumed run must share with the saved one (shapes, init, data, objective, GRPO's sampler and
    objective); all others (steps, optimizer, memory and logging settings) may change and are reported."""
    keys = ["config", "init", "ema_weights", "lora", "lora_alpha", "objective", "vae", "vae_ckpt", "frames", "height",
            "width", "text_len", "batch_size", "grad_accum", "seed", "data", "holdout", "ema", "latents"]
    return keys + objective_of(cfg.objective).resume_keys(cfg)


# The objectives: each class has the same names (NAME, CONFIG, MAY_CHANGE, TINY_RECIPES, validate, resume_keys, rewards;
# built: lr_at, step, evaluate, evaluated, watch, bar, state), and this is the one place --objective is read: the
# rest of train.py asks the class, never which one it is. A new objective: its file, and one entry here.
OBJECTIVES = {objective.NAME: objective for objective in (sft.SFT, grpo.GRPO, nft.NFT, Policy, ownctx.OwnContext)}


def objective_of(name):
    """The objective class of --objective `name` (sft.SFT, grpo.GRPO or nft.NFT); a ValueError names the valid ones."""
    if name not in OBJECTIVES:
        raise ValueError(f"--objective {name!r}: valid are {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name]


# -----------------------------------------------------------------------------
# Main: setup -> data -> run directory -> model -> objective and optimizer -> resume -> loop -> checkpoint


@dataclass(kw_only=True)
class Run:
    """This process's place in the job and what every phase shares: filled phase by phase by main."""
    cfg: TrainConfig
    rank: int
    world: int
    device: torch.device
    dp_rank: int  # --cp C: the C ranks of a cp group train on the same clips with the same noise; data and seeds
    dp_world: int  # go by dp rank
    cp_group: object
    distributed: bool
    views: int  # a camera net trains on separate views stacked on latent time; 0 for a grid net
    say: object  # print on rank 0
    compute_dtype: torch.dtype
    optimizer: object = None
    resume_from: str = None  # the checkpoint this run resumes (claim_run), None for a fresh start
    actions: object = None  # an action run's FolderActions (its raw units: world-model rewards read them), else None
    clips: object = None  # the training clips (a --latents run's pixel dataset): objectives that draw their own read it
    n_train: int = 0  # clips.videos[:n_train] are trained on, the rest held out

    @property
    def master(self):
        return self.rank == 0


USER_ERRORS = (ValueError, OSError, ckpt.CheckpointError, FloatingPointError, rl.FidelityStop)  # one line, exit 2


def setup(cfg):
    distributed, rank, world, device = collectives.setup_distributed(cfg)
    dp_rank, dp_world, cp_group = cp.make_mesh(device.type, world, cfg.cp)
    say = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)
    views = len(data.VIEW_ORDER) if get_config(cfg.config).camera_channels else 0
    return Run(cfg=cfg, rank=rank, world=world, device=device, dp_rank=dp_rank, dp_world=dp_world, cp_group=cp_group,
               distributed=distributed, views=views, say=say,
               compute_dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)


def text_source(run):
    """The data's text settings: the tiny default's stand-in text, or embedding files (T5, Predict2.5: Reason1)."""
    cfg, mcfg = run.cfg, get_config(run.cfg.config)
    tiny = cfg.config in TINY_CONFIGS
    standin = text_lib.standin_text(cfg.config, cfg.data)
    if tiny and not synthetic_data(cfg):
        run.say(f"text: {cfg.data}/t5_xxl's T5 embeddings" if not standin else f"text: stand-in embeddings of "
                f"{cfg.data}'s prompts (" + ("no t5_xxl/" if mcfg.crossattn_proj_in_channels == text_lib.T5_WIDTH else
                                             f"{cfg.config}'s text is {mcfg.crossattn_proj_in_channels} wide: no "
                                             "released encoder writes it") + ")")
    return dict(text_len=cfg.text_len, text_dim=mcfg.crossattn_proj_in_channels, text="standin" if standin else "t5",
                seed=cfg.seed, text_encoder="t5" if tiny else family_of(mcfg).TEXT_ENCODER)


def load_data(run):
    """(dataset, number of training videos, text settings): read (and checked) before anything is written."""
    cfg = run.cfg
    if synthetic_data(cfg):  # (re)stitching a finished folder only re-reads its manifest; a killed one resumes
        if run.master:
            make_tiny_dataset(cfg.data, views=bool(run.views), actions=get_config(cfg.config).action_dim > 0)
        if run.distributed:
            dist.barrier()
    text = text_source(run)
    actionclips.refuse_latents(cfg.config, cfg.latents)
    if cfg.latents:  # the encoded windows of cache.py, checked against this run's VAE, clip settings and videos
        dataset = cache.LatentClips(cfg.latents, cfg.data, cfg.frames, cfg.height, cfg.width, vae=cfg.vae,
                                    vae_ckpt=cfg.vae_ckpt, dtype="bf16" if run.device.type == "cuda" else "fp32",
                                    **text)
    else:  # clips of cfg.frames frames, encoded online by the VAE; an action config's with their actions
        dataset = actionclips.open_clips(cfg.config, cfg.data, cfg.frames, cfg.height, cfg.width, run.say,
                                         action_dim=-1, **text)
        recorded = 0 if cfg.init == "random" else rundir.step_settings(cfg.init).get("action_dim", 0)
        cfg.action_dim = actionclips.network_action_dim(cfg.config, cfg.init, recorded, dataset, run.say)
    return dataset, data.train_count(cfg.data, dataset, cfg.holdout, cfg.frames, run.say), text


def make_optimizer(run, objective, params):
    """AdamW with the objective's own settings (SFT: warm-up + cosine; GRPO/NFT: constant after a warm-up)."""
    optimizer = torch.optim.AdamW(params, lr=objective.lr_at(0), betas=objective.betas,
                                  weight_decay=objective.weight_decay, eps=1e-8, fused=run.device.type == "cuda")
    run.say(f"optimizer: AdamW betas {objective.betas}, weight decay {objective.weight_decay}, {objective.schedule}")
    return optimizer


def restore(run, net, objective, sampler, extra_state):
    """Resume from OUT/latest if there is one (model, optimizer, EMA / NFT's old policy, step, data position);
    returns the step to start from."""
    state = resume.resume(run.cfg.out, net, run.optimizer, extra_state=extra_state)
    if not state:
        return 0
    if state["sampler"]["world_size"] != run.dp_world:
        raise ValueError(f"{run.cfg.out}: its data position is for {state['sampler']['world_size']} data-parallel "
                         f"groups, this run has {run.dp_world} (ranks / --cp); resume with ranks / --cp = "
                         f"{state['sampler']['world_size']} (--cp may change), or use a new --out")
    sampler.load_state_dict(state["sampler"])
    for group in run.optimizer.param_groups:  # the checkpoint restored its own; this run's flags win (said above)
        group.update(betas=objective.betas, weight_decay=objective.weight_decay)
    return state["step"]


def held_out_batches(run, dataset, n_train, to_latent):
    """The evaluation clips (and the init guard's batch): the window at frame 0 of the held-out videos, never trained
    on (--holdout 0: of the first training videos), as evaluate.py reads them; objective.held_out_slots' clips of
    this rank. Returns (eval_ids, batches [(latent, Condition)], truths [the clips' videos, float32 on the CPU:
    [1, 3, T, H, W], a views run's [V, 3, T, H, W]])."""
    eval_ids = list(range(n_train, len(dataset))) or list(range(n_train))
    clips, batches, truths = getattr(dataset, "clips", dataset), [], []  # --latents: its pixel dataset
    for slot in held_out_slots(run.dp_rank, run.dp_world)[0]:
        index = eval_ids[slot % len(eval_ids)]
        video, item = clips.videos[index], cache.Windows(clips, [(index, 0)])[0]
        if "error" in item:
            raise ValueError(f"held-out video {video.path}: {item['error']}; re-stitch it or remove it")
        batch = dict(item, stem=video.stem, start=0, text_emb=text_lib.clip_text(clips, video)[0])
        batches.append(to_latent(torch.utils.data.default_collate([batch])))
        truths.append(item["video"] if run.views else item["video"][None])
    stems = ", ".join(clips.videos[i].stem for i in eval_ids[:4]) + (" ..." if len(eval_ids) > 4 else "")
    held = n_train < len(dataset)  # by stem, as evaluate.py names them
    run.say(f"evaluation: held-out episodes {stems} (the last {len(eval_ids)} of {len(dataset)} in name order, "
            "--holdout)" if held else f"evaluation: fixed clips of training episodes {stems} (--holdout 0)")
    return eval_ids, batches, truths


def main(argv=None):
    cfg = parse_config(sys.argv[1:] if argv is None else argv)
    run = setup(cfg)
    dataset, n_train, text = load_data(run)
    fresh = not os.path.isdir(cfg.out) or not os.listdir(cfg.out)
    episodes = rundir.episode_record(dataset.videos, n_train, getattr(dataset, "actions", None))
    lock = rundir.claim_run(run, resume_keys(run.cfg), TrainConfig(), episodes)
    try:
        return train(run, lock, dataset, n_train, text, episodes)
    except BaseException:  # a start refused after the claim (wrong network, init guard, VAE): --out as it was found
        if fresh and run.master:
            rundir.release_fresh_out(cfg.out, lock)
        raise


def train(run, lock, dataset, n_train, text, episodes):
    """Everything after the run directory is claimed: model, objective, resume, the loop. Returns the metrics rows."""
    cfg = run.cfg
    method = objective_of(cfg.objective)  # its class
    terms = method.rewards(cfg)  # validated; None for SFT, which scores no samples
    run.clips, run.n_train = getattr(dataset, "clips", dataset), n_train
    run.actions = getattr(run.clips, "actions", None)
    neg_text = None  # the uncond branch of CFG in RL rollouts and samples
    if terms is not None or cfg.sample_every:
        neg_text, source = text_lib.negative_embedding(cfg.data, cfg.text_len, text["text_dim"],
                                                   standin=text["text"] == "standin", text_encoder=text["text_encoder"])
        neg_text = neg_text[None]
        run.say(f"negative prompt: {source}")
    vae = build_vae(cfg.vae, cfg.vae_ckpt, run.device, run.compute_dtype)
    to_latent = make_encoder(run, vae)
    net, sac_modes = build.training_net(run)
    rundir.check_lora_base(run, net)
    params = trainable(net)  # after fully_shard: the DTensor parameters
    objective = method(run, net, params, vae, neg_text, terms)
    run.optimizer = make_optimizer(run, objective, params)
    ema = [p.detach().clone() for p in params] if cfg.ema else None
    names = [n for n, p in net.named_parameters() if p.requires_grad]  # the order of `params`
    extra_state = {**({"ema": dict(zip(names, ema))} if ema else {}), **objective.state} or None
    sampler = data.ClipSampler(n_train, rank=run.dp_rank, world_size=run.dp_world, seed=cfg.seed)
    start_step = restore(run, net, objective, sampler, extra_state)
    loader = iter(torch.utils.data.DataLoader(dataset, batch_size=cfg.batch_size, sampler=sampler,
                                              num_workers=cfg.workers, persistent_workers=cfg.workers > 0,
                                              worker_init_fn=rundir.detach_worker if cfg.workers else None))
    eval_ids, batches, truths = held_out_batches(run, dataset, n_train, to_latent)
    step_dir = os.path.join(cfg.out, f"step_{start_step:08d}")
    if start_step and not resume.eval_marker_valid(step_dir):
        # killed between the save and its evaluation: a missing or partial result is re-run, never assumed done
        result = objective.evaluate(batches, truths)
        if run.master:
            resume.write_eval_marker(step_dir, dict(result, step=start_step))
        run.say(f"evaluated the resumed checkpoint step {start_step}: {result}")
    elif start_step:  # its evaluation ran after the save: what it decided (RL's data weight) is decided again
        objective.evaluated(resume.read_eval_marker(step_dir))
    if start_step == 0 and cfg.init != "random":
        with cp.disabled(net):  # the init guard (build.init_guard): its noise is drawn per global rank
            loss, zero_loss = build.guard_loss(net, *batches[0])
        build.init_guard(loss, zero_loss, max_ratio=cfg.guard_max_ratio, source=cfg.init)  # the weights went in
    loop = Loop(run=run, net=net, params=params, objective=objective, sampler=sampler, loader=loader,
                to_latent=to_latent, held_out=(batches, truths), ema=ema, extra_state=extra_state,
                sac_modes=sac_modes, has_holdout=n_train < len(dataset), episodes=episodes, vae=vae,
                sample_clip=(getattr(dataset, "clips", dataset), eval_ids[0]), neg_text=neg_text)
    history = train_loop(loop, start_step)
    if run.distributed:
        dist.barrier()  # rank 0 may still be writing markers and plots: tear the group down together
        dist.destroy_process_group()
    if lock is not None:
        lock.close()
    return history


# -----------------------------------------------------------------------------
# The loop: step -> EMA -> row -> save and evaluate -> log -> sample; a signal finishes the step, saves, exits 0


@dataclass(kw_only=True)
class Loop:
    run: Run
    net: object
    params: list
    objective: object  # sft.SFT, grpo.GRPO or nft.NFT (objective_of)
    sampler: object
    loader: object  # an iterator of the DataLoader's batches
    to_latent: object  # build.make_encoder's: batch -> (latent, Condition)
    held_out: tuple  # held_out_batches' (batches, truths)
    ema: list
    extra_state: dict
    sac_modes: list
    has_holdout: bool
    episodes: dict  # rundir.episode_record: saved with every step
    vae: object
    sample_clip: tuple  # (the clips, the index of the clip whose first frame starts the sample videos)
    neg_text: object


def held_out(loop):  # the objective's held-out evaluation (RL: and what it decides after it, its data weight)
    return loop.objective.evaluate(*loop.held_out)


def one_step(loop, step, start_step, peak):
    """Run one step of the objective; its metrics row."""
    cfg, run = loop.run.cfg, loop.run
    t0, compiled0 = time.perf_counter(), compile_seconds() if cfg.compile else None
    lr = loop.objective.lr_at(step)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    batches = [loop.to_latent(next(loop.loader)) for _ in range(cfg.grad_accum)] \
        if loop.objective.reads_clips else []  # RL: one (--grad-accum is SFT's); the policy draws its own
    row = {"lr": lr, **loop.objective.step(step, batches)}
    if loop.ema is not None and "skipped" not in row:  # a skipped update left the weights as they were
        with torch.no_grad():
            torch._foreach_lerp_(loop.ema, [p.detach() for p in loop.params], 1 - sft.ema_beta(step, cfg.ema))
    if step == start_step and set(loop.sac_modes) != {"none"}:
        sac.check_first_step(loop.sac_modes)  # the save lists matched the kernels that really ran
    if run.device.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    tokens, flops = build.step_counts(cfg, run.views)
    return {"step": step + 1, **row, "s_per_step": dt,
            **({"s_compile": compile_seconds() - compiled0} if cfg.compile else {}),  # inside s_per_step
            "tokens_per_s": tokens * run.dp_world / dt,
            "mfu": flops / dt / 1e12 / peak if peak and loop.objective.mfu else None,
            "peak_mem_gib": torch.cuda.max_memory_allocated() / 2 ** 30 if run.device.type == "cuda" else None}


def save_and_evaluate(loop, row, done):
    """Checkpoint `done` (the metrics row travels with it), then its held-out evaluation and marker."""
    cfg, run = loop.run.cfg, loop.run
    t_save = time.perf_counter()
    extra = {"sampler": loop.sampler.state_dict(consumed=done * cfg.batch_size * cfg.grad_accum),
             "config_hash": rundir.config_hash(cfg, resume_keys(cfg)), "config": dataclasses.asdict(cfg),
             "metrics_row": row, "episodes": loop.episodes,  # the row: logged again if a kill loses it
             **({"base_checksum": loop.net.init_checksum} if cfg.lora else {})}  # the adapters' base, by content
    path = resume.save(cfg.out, done, loop.net, run.optimizer, extra, keep=cfg.keep, lora_only=bool(cfg.lora),
                       extra_state=loop.extra_state)
    row["s_checkpoint"] = time.perf_counter() - t_save
    result = held_out(loop)
    row.update(result)
    if run.master:
        resume.write_eval_marker(path, dict(result, step=done))
        run.say(f"step {done}: loss {row['loss']:.4f}, " + ", ".join(f"{k} {v:.4g}" for k, v in result.items()
                                                      if k in ("eval_loss", "eval_reward"))
                + f" -> {path}" + rundir.nonfinite_eval(result, path))


def train_loop(loop, start_step):
    """Steps start_step..cfg.steps; returns the metrics history."""
    cfg, run = loop.run.cfg, loop.run
    stop = rundir.stop_on_signals(run.say)  # SIGTERM, SIGUSR1 (pre-emption notices), Ctrl-C: finish, save, exit 0
    peak = matmul_peak(run.device, torch.bfloat16) / 1e12 if run.device.type == "cuda" else None  # TFLOP/s
    log = rundir.MetricsLog(cfg, run, start_step, loop.has_holdout, rundir.config_hash(cfg, resume_keys(cfg)),
                            loop.objective.max_psnr_drop)
    if loop.objective.eval_at_start and start_step == 0:  # once: a restart keeps it
        row = {"step": 0, **held_out(loop)}
        run.say(f"held-out evaluation before the first update: {row}")
        log.write(row, first=True)
    if start_step >= cfg.steps:  # a finished run run again: nothing to do, said (not a bar at 100%)
        run.say(f"train: {cfg.out} is already at step {start_step} (--steps {cfg.steps}): nothing to train; pass a "
                "larger --steps to go on from there, or a new --out")
        return log.history
    bar = tqdm(range(start_step, cfg.steps), initial=start_step, total=cfg.steps, disable=not run.master,
               desc=loop.objective.name)
    nonfinite = 0  # skipped (NaN/Inf) steps in a row
    for step in bar:
        row, done = one_step(loop, step, start_step, peak), step + 1
        stopping = collectives.any_rank(stop["signal"] is not None, run.device)
        if (cfg.save_every and done % cfg.save_every == 0) or done == cfg.steps or stopping:
            save_and_evaluate(loop, row, done)
        elif cfg.eval_every and done % cfg.eval_every == 0:
            row.update(held_out(loop))
        log.write(row)  # after the save: a row is logged once its step is safe or the run went on past it
        if "eval_reward" in row:  # RL's fidelity guard, decided on rank 0 (its history)
            loop.objective.watch(row, log.history[:-1])
        if run.master:
            bar.set_postfix(**loop.objective.bar(row), s_it=f"{row['s_per_step']:.2f}")
        nonfinite = rundir.count_nonfinite(row, nonfinite, cfg, loop.objective,
                                           say=lambda line: run.master and tqdm.write(line))
        if cfg.sample_every and (done % cfg.sample_every == 0 or done == cfg.steps):  # the last step's too
            write_sample(loop.net, loop.vae, *loop.sample_clip, cfg, loop.neg_text, loop.objective.guidance,
                         os.path.join(cfg.out, f"sample_{done:08d}.mp4"), run.master)
        if stopping:
            run.say(f"stopping after step {done} on {signal.Signals(stop['signal']).name}: checkpoint saved, exit 0")
            break
    return log.history


if __name__ == "__main__":
    cli.main(main, user_errors=USER_ERRORS)
