"""A trained run opened to be evaluated (evaluate.py, policyeval.py, sample.py, export.py), and its network rebuilt
as trained (build_from_step): its config.json, its newest complete checkpoint
(or the step given), its VAE file and data folder checked, its held-out episodes listed as train.py held them out,
and the guidance it samples with; one line naming the run for anything not usable, before any model is built."""
import dataclasses
import os
import re

import torch

import ckpt
from base import fp8 as fp8_lib
from base.formats import STEP_RE, CheckpointError, read_meta
from base.inits import TINY_CONFIGS, get_config
from clips.actionclips import open_clips
from clips.text import standin_text
from engine import build, resume, rundir
from engine.resume import lora_base
from nets import lora
from nets.family import family_of

# what a resumed run keeps (train.resume_keys), so a step's own record must agree with config.json on them
RECORDED_KEYS = ("config", "init", "lora", "objective", "vae", "vae_ckpt", "frames", "height", "width", "text_len",
                 "seed", "data", "holdout", "ema", "action_dim")
RUN_KEYS = ("config", "init", "objective", "data", "frames", "height", "width", "text_len", "seed", "holdout", "vae",
            "vae_ckpt", "ema", "guidance", "conditional_frame_timestep")  # what is read of a run's config.json


@dataclasses.dataclass(kw_only=True)
class Run:
    path: str  # the run directory as given (or one of its step directories)
    directory: str  # the run directory
    cfg: dict  # its config.json
    checkpoint: str  # the step directory evaluated: its newest complete one, or the one given
    step: int  # its training step
    views: bool  # a camera net on a views folder (Path A's multi-view model), else 2x2 grids
    dataset: object  # data.GridClips | data.ViewClips of its data folder, built as train.py built it
    held_out: dict  # stem -> dataset index of the videos train.py kept out of training
    guidance: float  # the CFG it is sampled with

    @property
    def family(self):
        return f"{family_of(get_config(self.cfg['config'])).NAME} " \
               f"{'views' if self.views else 'grid'}"

    @property
    def view_size(self):
        H, W = self.cfg["height"], self.cfg["width"]
        return (H, W) if self.views else (H // 2, W // 2)


def held_out_stems(videos, holdout):
    """{stem: index} of the videos train.py holds out: the last `holdout` in the dataset's (name) order, -1 meaning
    max(1, n // 50) as train.main computes it."""
    n = len(videos)
    k = holdout if holdout >= 0 else max(1, n // 50)
    return {videos[i].stem: i for i in range(n - k, n)}


def init_holdout(init, data, holdout):
    """The --holdout of a run from the train.py step `init` on the same data folder: the step's run's (said when it
    differs from `holdout`, the preset's or the default), so RL from an SFT base never trains on the base's held-out
    episodes nor needs the flag again; `holdout` for anything else."""
    base = rundir.step_settings(init)
    if "holdout" not in base or os.path.normpath(base.get("data", "")) != os.path.normpath(data):
        return holdout
    if base["holdout"] != holdout:
        print(f"train: --holdout {base['holdout']}, as --init {init}'s run held out on {data} (pass --holdout to "
              "change it)", flush=True)
    return base["holdout"]


def run_guidance(path, run, given):
    """--guidance if given (>= 0), else the run's own: GRPO / NFT their rollouts' (grpo.guidance, nft.guidance), SFT
    the guidance its sample videos used (train.py --guidance, default 7.0)."""
    if given >= 0:
        return given
    own = rundir.objective_settings(run)  # an RL run's knobs, else the run's own
    source = own if own and "guidance" in own else run  # own-context SFT's knobs hold none: its --guidance (0)
    if "guidance" not in source:
        raise ValueError(f"{path}/config.json: {run.get('objective')} settings without a guidance; pass --guidance")
    return float(source["guidance"])


def run_directory(path):
    """The run directory of `path`: itself, or the run of a step directory given in its place (RUN/step_XXXXXXXX)."""
    parent, name = os.path.split(os.path.normpath(path))
    return parent or "." if STEP_RE.match(name) else path


def open_run(path, ema=False, guidance=-1.0):
    """The run in `path` checked (config, its newest complete checkpoint or the step given, VAE file, data folder) and
    its held-out videos listed, before any model is built; one line naming the run for anything not usable."""
    directory = run_directory(path)
    config = os.path.join(directory, "config.json")
    if not os.path.isfile(config):
        raise ValueError(f"{path}: not a train.py run directory (no config.json); pass the --out of a train.py run")
    run = rundir.run_config(directory)
    missing = [k for k in RUN_KEYS if k not in run]
    if missing:
        raise ValueError(f"{config}: no {missing}; not written by this train.py")
    latest = rundir.checked_step(path, "")  # a run with none yet, files cut short, a LoRA base gone: one line each
    if ema and not run["ema"]:
        raise ValueError(f"--ema: the run in {path} kept no EMA (train.py --ema); drop --ema")
    if run["vae"] == "real" and not os.path.isfile(run["vae_ckpt"]):
        raise ValueError(f"{path}: its VAE checkpoint {run['vae_ckpt']} (config.json vae_ckpt) is not a file here")
    if not os.path.isdir(run["data"]):
        raise ValueError(f"{path}: its data folder {run['data']!r} (config.json data) is not here; run evaluate.py "
                         "where train.py ran (relative paths are from there)")
    mcfg = get_config(run["config"])
    text = dict(text_len=run["text_len"], text_dim=mcfg.crossattn_proj_in_channels, seed=run["seed"],
                **text_settings(run))
    views = bool(mcfg.camera_channels)
    dataset = open_clips(run["config"], run["data"], run["frames"], run["height"], run["width"],
                         action_dim=run.get("action_dim", 0), **text)  # a net from scratch: its data's, recorded
    held_out = held_out_stems(dataset.videos, run["holdout"])
    meta = resume.read_meta(latest)
    disagree = config_disagreement(run, meta, latest)
    if disagree:
        raise ValueError(f"{path}: {disagree}")
    recorded = meta["extra"].get("episodes")  # what it held out when it trained (steps since)
    if recorded and recorded["held_out"] and sorted(held_out) != sorted(recorded["held_out"]):
        by_stem = {v.stem: i for i, v in enumerate(dataset.videos)}
        gone = [s for s in recorded["held_out"] if s not in by_stem]
        if gone:
            raise ValueError(f"{path}: its held-out episode(s) {', '.join(gone)} are no longer usable in {run['data']} "
                             "(deleted or skipped): evaluate.py never reports a trained-on episode as held out; "
                             "restore them")
        held_out = {s: by_stem[s] for s in recorded["held_out"]}
    now = rundir.episode_record(dataset.videos, len(dataset.videos) - len(held_out),
                                getattr(dataset, "actions", None)) if recorded else None
    change = rundir.episode_change(recorded, now, run["data"]) if now and now["train"] == recorded["train"] else ""
    if change:  # the videos, or (an action run) the actions or their statistics
        raise ValueError(f"{path}: {change}: its held-out truth is not what the run held out; restore the data "
                         "folder")
    if not held_out:
        raise ValueError(f"{path}: trained with --holdout 0, so every video of {run['data']} was trained on, and "
                         "evaluate.py and policyeval.py need a held-out episode to start from: retrain into a new --out "
                         "with --holdout 1 (RL from it then holds out the same episode)")
    return Run(path=path, directory=directory, cfg=run, checkpoint=latest, step=meta["step"],
               views=views, dataset=dataset, held_out=held_out, guidance=run_guidance(path, run, guidance))


def config_disagreement(run, meta, step_dir):
    """"" when config.json agrees with the step's own record of its run (meta.json extra.config) on RECORDED_KEYS,
    else one line naming each key, both values and the fix (config.json edited after training: the step is what
    trained)."""
    saved = meta["extra"].get("config") if isinstance(meta["extra"], dict) else None
    if not isinstance(saved, dict):
        return ""
    differ = [k for k in RECORDED_KEYS if k in saved and k in run and saved[k] != run[k]]
    if not differ:
        return ""
    both = ", ".join(f"{k} {run[k]!r} in config.json, {saved[k]!r} in the step" for k in differ)
    return (f"config.json disagrees with {step_dir}/meta.json, the step's own record of how it was trained: {both}; "
            "config.json was edited after training: restore it (e.g. from the step's meta.json extra.config), or "
            "train a new run with the settings you want")


def text_settings(run):
    """The text GridClips / ViewClips read for a run, as train.main chooses it: the stand-in, T5 or Reason1."""
    tiny = run["config"] in TINY_CONFIGS
    return dict(text="standin" if standin_text(run["config"], run["data"]) else "t5",
                text_encoder="t5" if tiny else family_of(get_config(run["config"])).TEXT_ENCODER)


def build_from_step(step_dir, device, use_ema=False):
    """The network of a train.py step directory rebuilt as train.py built it (its recorded config, LoRA, seeded init,
    and for a LoRA-only step the --init base), then the step loaded strictly by ckpt.load (every key, its checksums);
    use_ema: the EMA the run kept (train.py --ema) in place of the weights it averages."""
    meta = read_meta(step_dir)
    run = meta["extra"].get("config") if isinstance(meta["extra"], dict) else None
    if not isinstance(run, dict) or "config" not in run:
        raise CheckpointError(f"{step_dir}: not a train.py step (its meta.json records no run config)")
    lora_base(step_dir, meta)  # before a network is built
    if use_ema and not run.get("ema"):
        raise CheckpointError(f"--ema: the run of {step_dir} kept no EMA (train.py --ema RATE): drop --ema")
    init = run.get("init", "random") if meta["lora_only"] else "random"  # a LoRA-only step: its adapters' base
    spec = build.NetSpec(config=run["config"], action_dim=run.get("action_dim", 0), init=init, ema={"": None, "net": False, "net_ema": True}[
        run.get("ema_weights", "")], lora=run.get("lora", 0), lora_alpha=run.get("lora_alpha") or None,
        seed=run.get("seed", 0))
    net = build.build(spec, device)  # as train.py built it: a random base is this seed's init_weights
    recorded = meta["extra"].get("base_checksum", net.init_checksum)  # (steps saved before it was recorded: none)
    if meta["lora_only"] and recorded != net.init_checksum:  # the same content under any path is the same base
        raise CheckpointError(f"{step_dir} holds LoRA adapters trained on a base of content checksum {recorded}, but "
                              f"its run's recorded base {init} now holds {net.init_checksum}: another network; restore "
                              "the original base at that path")
    frozen = [k for k, p in net.named_parameters() if not p.requires_grad]  # the base build() loaded, strictly
    base = ("^(" + "|".join(map(re.escape, frozen)) + ")$",) if meta["lora_only"] and frozen else ()
    ckpt.load(net, step_dir, ema=True if use_ema else None, allow_missing=base)  # LoRA-only: the base is not in it
    return net


COMPILE_MODES = ("auto", "on", "off")  # --compile of the sampling commands: auto = on a GPU


def check_fast_flags(compile_mode, fp8, device):
    """--compile and --fp8 of sample.py, evaluate.py and policyeval.py, checked before any model is built."""
    if compile_mode not in COMPILE_MODES:
        raise ValueError(f"--compile {compile_mode!r}: one of {', '.join(COMPILE_MODES)} (auto: on a GPU)")
    if fp8 and device.type != "cuda":
        raise ValueError("--fp8: fp8 GEMMs are for a GPU with fp8 tensor cores (H100/H200); on the CPU they only emulate "
                         "it, slower: drop --fp8")


@torch.no_grad()
def for_sampling(net, dtype, device, compile_mode="auto", fp8=False, say=print, fold=True):
    """The net made ready to only sample: a LoRA run's adapters folded into its weights (one GEMM a Linear instead of
    three), cast to dtype, eval; fp8: the blocks' Linears as fp8 GEMMs (a folded LoRA base quantised once, a full net's
    weights per forward: base/fp8.py); compile (auto: on a GPU): each block compiled in place, as train.py --compile
    (the first chunk pays the compile, said; every later one runs the compiled kernels). fold False: the adapters
    kept apart (evaluate.py: its numbers are the run's own held-out evaluation's, bit for bit; --fp8 folds anyway)."""
    net = (lora.fold_lora_(net) if fold or fp8 else net).to(dtype).eval()
    if fp8:
        adapted = lora.quantize_base(net)  # a folded LoRA net: its base, once
        plain = lora.target_linears(net)
        converted = fp8_lib.convert_trainable(plain) if plain else 0
        say(f"sampling: fp8 GEMMs in {adapted + converted} block Linears (--fp8; e4m3, per-channel weight scales)")
    if compile_mode == "on" or (compile_mode == "auto" and device.type == "cuda"):
        for block in net.blocks:
            block.compile()
        say("sampling: blocks compiled (--compile " + compile_mode + "): the first chunk also compiles them (tens of "
            "seconds on a 2B net; later chunks run compiled); --compile off to skip")
    return net
