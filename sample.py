"""Sample a video2world clip from a first frame and write an mp4: a train.py run as trained, a release checkpoint,
or random weights. The sampler is the net's family's (engine/generate.py -> nets/family.family_of): Predict2's 35 Karras steps,
Euler then 2-step Adams-Bashforth (nets/edm.py), or Predict2.5's UniPC (nets/flow.py: shift-5 or Karras grid per checkpoint,
v_c + g (v_c - v_u)), with classifier-free guidance in upstream's convention.

    python sample.py                       # tiny default: the checkpoint python train.py wrote to out/, on CPU
    python sample.py --ckpt runs/droid14b --prompt-emb prompt.safetensors --image first.png   # a run, as trained
    python sample.py --config v2w-14b --ckpt droid --vae real --vae-ckpt tokenizer.pth
                     --image first_frame.png --prompt-emb prompt.safetensors --out video.mp4   # (one line)

    python sample.py --config p25-2b --ckpt p25-2b-post --vae real --vae-ckpt tokenizer.pth --image first.png
                     --prompt-emb reason1/<sha1>.safetensors   # Predict2.5: UniPC, Karras grid for 2B post-trained

The network lives in model.py, its family's math in nets/edm.py / nets/flow.py, generation in engine/generate.py; this file is the
command line.
"""
import dataclasses
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

import ckpt
import condition
from base import cli, formats, inits, lerobot
from base.inits import TINY_CONFIGS, get_config, tiny_data
from base.video import write_mp4
from clips import data
from clips import text as text_lib
from clips.actionclips import episode_chunks, open_clips, read_actions_file
from clips.text import standin_text
from engine import build, resume, rundir, runs
from engine.generate import generate, join, rollout
from nets.family import family_of


def views_side_by_side(video_V_3_T_H_W):
    """Decoded views [V,3,T,H,W] -> one [3,T,H,V*W] video, view 0 on the left (write_mp4 takes it)."""
    if video_V_3_T_H_W.ndim != 5 or video_V_3_T_H_W.shape[1] != 3:
        raise ValueError(f"views {tuple(video_V_3_T_H_W.shape)}: need [V, 3, T, H, W]")
    return torch.cat(list(video_V_3_T_H_W), dim=-1)


# -----------------------------------------------------------------------------
# CLI


@dataclasses.dataclass
class SampleConfig:
    ckpt: str = "out"  # a train.py run dir (rebuilt as trained, newest checkpoint), anything ckpt.load takes (droid, a path, hf://...), or random
    config: str = ""  # DiT config (inits.CONFIGS); default: the run's, or tiny
    ema: bool = False  # --ema: the EMA weights (a run's --ema, or a release file's net_ema. copy); --no-ema: the raw net. copy of a file holding both
    vae: str = ""  # tiny | real (default: the run's, or tiny for the tiny config, else real)
    vae_ckpt: str = ""  # tokenizer.pth for --vae real (default: the run's)
    image: str = ""  # first frame (png/jpg); default: the first frame of the first video in --data
    data: str = ""  # where the default first frame, the tiny stand-in prompt and the negative prompt come from (default: the run's, or data/tiny_grid; multi-view: data/tiny_views)
    prompt_emb: str = ""  # T5 embedding file (.safetensors "text_emb" or upstream .pickle); tiny: stand-in of --prompt
    # (Predict2.5: a Reason1 file, DATA/reason1/<sha1 of the prompt>.safetensors from t5.py --encoder reason1)
    prompt: str = ""  # the tiny stand-in's prompt text
    neg_prompt_emb: str = ""  # negative-prompt embedding (default: DATA/t5_xxl/negative_prompt.pickle from t5.py, else zeros, said)
    # (Predict2.5: DATA/reason1/negative_prompt.safetensors)
    frames: int = 0  # pixel frames, 4k+1 (default: the run's, or 9 for tiny, 93)
    height: int = 0  # pixels, a multiple of 16 (default: the run's, or 64 for tiny, 432)
    width: int = 0  # pixels, a multiple of 16 (default: the run's, or 112 for tiny, 768)
    steps: int = 35  # sampler steps (Predict2.5 Karras grid: steps + 1 network evaluations)
    compile: str = "auto"  # torch.compile the blocks: auto (on a GPU), on, off; the first chunk pays the compile
    fp8: bool = False  # block GEMMs in fp8 (H100/H200; base/fp8.py)
    guidance: float = 7.0  # CFG, upstream convention x0_c + g (x0_c - x0_u) (Predict2.5: v_c + g (v_c - v_u));
    # default for a GRPO/NFT run: its rollouts' (--grpo-guidance / --nft-guidance: NFT's policy is CFG-free); for an
    # action net 0, as upstream samples it
    grid: str = ""  # Predict2.5 only: shift | karras (default: upstream's for --ckpt: karras for p25-2b-post,
    # else shift; Predict2: karras, its only grid)
    conditional_frame_timestep: float = -1.0  # Predict2.5 only: -1 = the noisy frames' time, 0.1 -> t = 1e-4 (default:
    # upstream's for --ckpt: 0.1 for p25-2b-post and agibot)
    actions: str = ""  # an action net's commands: FILE.npz (or .npy) with `action` [chunks x (frames-1), stride*A],
    # normalised as training saw them, or a stitched DATA/actions/<stem>.npz as written ([N, stride, A] raw:
    # normalised by DATA's action_stats.json); default: those of the last video of --data (a run's held-out episode).
    # Either way, without --image, the rollout starts from that episode's frame 0
    chunks: int = 1  # a long rollout: N chained chunks, each from the last frame generated (and the next actions)
    seed: int = 0  # initial noise (numpy, as upstream)
    fps: int = 16  # frame rate written into the mp4
    device: str = ""  # cuda | cpu (default: cuda when available)
    out: str = "sample.mp4"  # the mp4 to write
    action_dim: int = dataclasses.field(default=0, init=False)  # no flag: the net's (its run's record, or --config's)


def is_run(path):
    return os.path.isfile(os.path.join(path, "config.json")) and os.path.isfile(os.path.join(path, "latest"))


def run_settings(path):
    """The train.py settings behind --ckpt: a run directory's config.json, or the config a train.py step directory
    recorded in its meta.json; None for anything else (a file, a named init, hf://, random)."""
    if is_run(path):
        return rundir.run_config(path)
    if os.path.isfile(os.path.join(path, "meta.json")) and os.path.isfile(os.path.join(path, ".metadata")):
        extra = formats.read_meta(path)["extra"]
        return extra.get("config") if isinstance(extra, dict) and isinstance(extra.get("config"), dict) else None
    return None


def check_ckpt(ckpt, given):
    """--ckpt names something sample.py can load, said in one line before any model is built."""
    if ckpt == "random" or ckpt in inits.NAMED_INITS or ckpt.startswith("hf://") or os.path.exists(ckpt):
        return
    missing = rundir.missing_step(ckpt, "--ckpt")  # RUN/step_N that is not there: the steps that are
    if missing:
        raise ValueError(missing)
    if "ckpt" not in given:
        raise ValueError(f"--ckpt {ckpt} (the default): no such run; train one with `python train.py` (it writes "
                         f"{ckpt}/), or pass --ckpt RUN_DIR, a checkpoint file, or random")
    raise ValueError(f"--ckpt {ckpt}: no such file or directory; pass a train.py run directory (--out of train.py), a "
                     f"checkpoint file, a named init ({', '.join(inits.NAMED_INITS)}), hf://ORG/REPO/FILE, or random")


def parse_config(argv):
    """Flags, then the run's own settings (config, size, VAE, data) for what was not given, then the defaults."""
    given = cli.parse_flags(SampleConfig, argv, description=__doc__)
    ckpt = given.get("ckpt", SampleConfig.ckpt)
    check_ckpt(ckpt, given)
    killed = formats.incomplete_save(ckpt)  # a step_N.tmp: never sampled (unverified, maybe half-written)
    if killed:
        raise ValueError(killed)
    saved = run_settings(ckpt)
    run, run_p25 = {}, {}
    if saved is not None:
        run = {k: saved[k] for k in ("config", "vae", "vae_ckpt", "data", "frames", "height", "width") if k in saved}
        run_p25 = {k: saved[k] for k in ("init", "conditional_frame_timestep") if k in saved}  # sampler defaults
        own = rundir.objective_settings(saved)
        if own is not None:  # an RL run: the CFG its policy was trained to sample with
            run["guidance"] = own["guidance"]
        if "config" in given and given["config"] != run["config"]:
            raise ValueError(f"--config {given['config']}: the run in {ckpt} trained {run['config']}; pass --ckpt "
                             f"with a {given['config']} run (train.py --config {given['config']} --out DIR), or "
                             "--ckpt random")
    cfg = cli.build(SampleConfig, run, given)
    cfg.config = cfg.config or "tiny"
    tiny = cfg.config in TINY_CONFIGS
    mcfg = get_config(cfg.config)
    cfg.action_dim = (saved or {}).get("action_dim") or mcfg.action_dim  # a net trained from scratch: the data's
    if mcfg.action_dim and "guidance" not in given and "guidance" not in run:
        cfg.guidance = 0.0  # an action net samples without CFG, as upstream's does (train.py's preset too)
    cfg.ema = cfg.ema if "ema" in given else None  # None: the only copy a file holds (both: an error)
    cfg.data = cfg.data or tiny_data(cfg.config)
    cfg.vae = cfg.vae or ("tiny" if tiny else "real")
    cfg.frames = cfg.frames or (9 if tiny else 93)
    cfg.height, cfg.width = cfg.height or (64 if tiny else 432), cfg.width or (112 if tiny else 768)
    if (cfg.frames - 1) % 4 or cfg.height % 16 or cfg.width % 16:
        raise ValueError(f"{cfg.frames}x{cfg.height}x{cfg.width}: frames must be 4k+1, height/width multiples of 16")
    if cfg.steps < 1 or cfg.guidance < 0:  # 0 steps would write the noise's decode; g < 0 steers away from the prompt
        raise ValueError(f"--steps {cfg.steps} must be >= 1 and --guidance {cfg.guidance} >= 0 (0: no guidance)")
    if mcfg.camera_channels and cfg.image:
        raise ValueError(f"--image does nothing with --config {cfg.config}: a multi-view net starts from the first "
                         "frame and cameras of every view of the first episode in --data (stitch.py --layout views)")
    family = family_of(mcfg)
    for name in ("grid", "conditional_frame_timestep"):
        if name in given and name not in family.SAMPLER_FLAGS:
            raise ValueError(f"{cli.flag(name)} is a Predict2.5 (UniPC) setting: --config {cfg.config} samples "
                             f"with {family.NAME}'s own sampler; drop it")
    grid, timestep = family.sampler_defaults(run_p25.get("init", cfg.ckpt), cfg.config)  # a run: as trained
    cfg.grid = cfg.grid or grid
    if "conditional_frame_timestep" not in given:
        cfg.conditional_frame_timestep = run_p25.get("conditional_frame_timestep", timestep)
    if cfg.grid not in family.GRIDS:
        raise ValueError(f"--grid {cfg.grid!r}: valid are {', '.join(family.GRIDS)}")
    if cfg.conditional_frame_timestep != -1 and not 0 <= cfg.conditional_frame_timestep < 1000:
        raise ValueError(f"--conditional-frame-timestep {cfg.conditional_frame_timestep}: -1 or in [0, 1000)")
    if not standin_text(cfg.config, cfg.data) and not cfg.prompt_emb:
        raise ValueError(f"--config {cfg.config} needs --prompt-emb (a T5-XXL embedding file, e.g. {cfg.data}/t5_xxl/"
                         "STEM.pickle; see t5.py; Predict2.5: a Reason1 embedding, docs/text.md)")
    if cfg.vae == "real" and not cfg.vae_ckpt:
        raise ValueError("--vae real needs --vae-ckpt (tokenizer/tokenizer.pth of a Cosmos-Predict2 repo)")
    for name in ("image", "prompt_emb", "neg_prompt_emb", "vae_ckpt"):
        if getattr(cfg, name) and not os.path.isfile(getattr(cfg, name)):
            raise ValueError(f"{cli.flag(name)} {getattr(cfg, name)}: no such file")
    if mcfg.camera_channels or not cfg.image:  # --data is read: a raw LeRobot folder is named as such
        unstitched = lerobot.unstitched(cfg.data, "--data", cfg.frames, cfg.height, cfg.width,
                                        views=bool(mcfg.camera_channels))
        if unstitched:
            raise ValueError(unstitched)
    if cfg.ckpt == "random" and "ema" in given:
        raise ValueError("--ema/--no-ema does nothing with --ckpt random")
    if cfg.chunks < 1 or (cfg.chunks > 1 and mcfg.camera_channels):
        raise ValueError(f"--chunks {cfg.chunks}: >= 1, and chained chunks (> 1) take a grid net, not {cfg.config}")
    if cfg.actions and not mcfg.action_dim:
        raise ValueError(f"--actions does nothing with --config {cfg.config} (action_dim 0): drop it, or sample an "
                         "action-conditioned run (tiny-action, v2w-2b-action)")
    if mcfg.action_dim and cfg.image and not cfg.actions:
        raise ValueError(f"--image with --config {cfg.config} needs --actions FILE.npz: the commands to follow from "
                         "that frame (without --image: the last episode of --data, its frame 0 and its own actions)")
    if cfg.actions and not os.path.isfile(cfg.actions):
        raise ValueError(f"--actions {cfg.actions}: no such file")
    return cfg


def load_first_frame(cfg, video=None):
    """[1, 3, 1, H, W] in [-1, 1] from --image, or the first frame of `video` (default: the first video in --data)."""
    import imageio.v2 as imageio
    if cfg.image:
        try:  # a text file, a truncated png: imageio's own errors range from struct.error to a missing-plugin hint
            pixels = np.asarray(imageio.imread(cfg.image))
        except Exception as e:
            raise ValueError(f"--image {cfg.image}: not a readable image ({type(e).__name__}: {e}); pass a png or "
                             "jpg file") from e
        if pixels.ndim == 2:  # grayscale
            pixels = np.repeat(pixels[..., None], 3, axis=-1)
        if pixels.ndim != 3 or pixels.shape[-1] < 3 or pixels.dtype != np.uint8:
            raise ValueError(f"--image {cfg.image}: {pixels.dtype} pixels of shape {pixels.shape}; pass an 8-bit RGB "
                             "(or gray) png or jpg")
        frame = torch.from_numpy(pixels[..., :3].copy())
    else:
        if not os.path.isdir(cfg.data):
            raise ValueError(f"--data {cfg.data}: no such folder to take the first frame from: pass --image FILE (the "
                             "tiny default's folder appears after one `python train.py`)")
        path = video or data.list_videos(cfg.data)[0].path
        try:
            frame = torch.from_numpy(data.read_clip(path, 0, 1, cfg.height, cfg.width)[0])
        except data.ClipError as e:  # e.g. a folder stitched at another size: never resized silently
            raise ValueError(f"--data {cfg.data}: first frame of {path}: {e}; pass --image, or --height/--width "
                             "of the data") from e
    frame = frame.permute(2, 0, 1)[None].float()  # [1, 3, h, w] in 0..255
    frame = F.interpolate(frame, size=(cfg.height, cfg.width), mode="bilinear", antialias=True, align_corners=False)
    return (frame / 127.5 - 1).clamp(-1, 1)[:, :, None]


def episode_actions(cfg):
    """(action chunks [1, T-1, D] per chunk, the video whose frame 0 starts the rollout, None with --image): an action
    net's --actions file (read_actions_file: its layout checked), or the last video of --data's own actions (train.py
    holds out the last videos: a run's held-out episode). Without --image the rollout starts from that episode's frame
    0 with a file's actions too; the line says which frame and which actions. (None, None) for a net without
    actions."""
    if not cfg.action_dim:
        return None, None
    T, mcfg, opened = cfg.frames, get_config(cfg.config), []

    def clips():  # the data folder, opened once when needed: its last episode, or the statistics a raw file needs
        if not opened:
            opened.append(open_clips(cfg.config, cfg.data, T, cfg.height, cfg.width, action_dim=cfg.action_dim,
                                     text="standin", text_len=16, text_dim=mcfg.crossattn_proj_in_channels))
        return opened[0]
    video = None if cfg.image else clips().videos[-1]
    start = f"--image {cfg.image}" if cfg.image else f"{video.path}: its frame 0"
    if not cfg.actions:
        print(f"sample: {start} and its own actions ({cfg.chunks} chunk(s))", flush=True)
        return episode_chunks(clips(), len(clips().videos) - 1, cfg.chunks), video.path
    width = cfg.action_dim // (4 if mcfg.action_per_frame else T - 1)  # values a transition: stride x A
    action, what = read_actions_file(cfg.actions, cfg.chunks * (T - 1), width, lambda: clips().actions)
    held = "" if cfg.image else f" (the last episode of {cfg.data}: a run's held-out one)"
    print(f"sample: {start}{held}, under the actions of {what} ({cfg.chunks} chunk(s))", flush=True)
    return list(action.chunk(cfg.chunks, dim=1)), video and video.path


def main(argv=None):
    cfg = parse_config(sys.argv[1:] if argv is None else argv)
    device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    runs.check_fast_flags(cfg.compile, cfg.fp8, device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    # a run's newest step or a step itself, checked (files whole, LoRA base there) before any model
    step = rundir.checked_step(cfg.ckpt, "--ckpt ") if is_run(cfg.ckpt) or run_settings(cfg.ckpt) else None
    disagree = runs.config_disagreement(rundir.run_config(cfg.ckpt), formats.read_meta(step), step) \
        if step is not None and is_run(cfg.ckpt) else ""
    if disagree:  # config.json edited after training: its settings are not what the step was trained with
        raise ValueError(f"--ckpt {cfg.ckpt}: {disagree}")
    actions, episode = episode_actions(cfg)  # an action net's chunks, and the episode they come from
    first = None if get_config(cfg.config).camera_channels else load_first_frame(cfg, episode).to(device)
    if step is not None:  # a train.py run (its newest checkpoint) or one of its steps: rebuilt as trained
        net = runs.build_from_step(step, device, bool(cfg.ema))
        source = f"{step}, step {resume.read_meta(step)['step']}{' (EMA)' if cfg.ema else ''}"
    else:
        source = cfg.ckpt
        if source == "random":
            print("sample: RANDOM weights (--ckpt random)", flush=True)
        net = build.build(build.NetSpec(config=cfg.config, init=source, ema=cfg.ema), device)
    mcfg = net.cfg
    net = runs.for_sampling(net, dtype, device, cfg.compile, cfg.fp8)  # adapters folded, --fp8, --compile
    vae = build.build_vae(cfg.vae, cfg.vae_ckpt, device, dtype)

    dim = mcfg.crossattn_proj_in_channels  # the embedding as stored (Predict2.5: before the net's crossattn_proj)
    family = family_of(mcfg)
    text_encoder = "t5" if cfg.config in TINY_CONFIGS else family.TEXT_ENCODER
    batch = {}  # what the clip gives condition.from_batch besides the prompt
    if mcfg.camera_channels:  # the first episode of a views folder: each view's first frame and its cameras
        views = data.ViewClips(cfg.data, cfg.frames, cfg.height, cfg.width, text="standin", text_len=16,
                               text_dim=dim)[(0, 0)]
        first = views["video"][:, :, :1].to(device)
        batch = condition.as_batch({"w2c": views["w2c"], "intrinsics": views["intrinsics"]})
    video = torch.cat([first, torch.full_like(first, -1).expand(-1, -1, cfg.frames - 1, -1, -1)], dim=2)
    if cfg.prompt_emb:
        load = text_lib.load_reason1_embedding if family.TEXT_ENCODER == "reason1" else text_lib.load_text_embedding
        text, _ = load(cfg.prompt_emb, 512, dim)
    else:  # tiny only (parse_config refuses otherwise): train.py's stand-in, 16 tokens
        text, _ = text_lib.standin_text_embedding(cfg.prompt or "Put the marker in the cup.", 16, dim)
    neg, neg_source = text_lib.negative_embedding(cfg.data, text.shape[0], dim, standin=standin_text(cfg.config, cfg.data),
                                              path=cfg.neg_prompt_emb, text_encoder=text_encoder)
    print(f"sample: negative prompt: {neg_source}", flush=True)
    cond = condition.from_batch(dict(batch, text_emb=text[None]), device, cfg.height, cfg.width, dtype,
                                cfg.conditional_frame_timestep, neg_crossattn_emb=neg[None].to(device))
    if cfg.chunks > 1 or actions:  # a grid net's rollout: one chunk, or N chained, each under its own actions
        conds = [dataclasses.replace(cond, action=a.to(device) if a is not None else None)
                 for a in actions or [None] * cfg.chunks]
        generated = join(rollout(net, vae, first, conds, cfg.frames, cfg.steps, cfg.guidance, cfg.seed, cfg.grid,
                                 dtype))
    else:
        generated = generate(net, vae, video.to(dtype), cond, cfg.steps, cfg.guidance, cfg.seed, grid=cfg.grid)
    write_mp4(cfg.out, views_side_by_side(generated) if cond.camera is not None else generated[0], fps=cfg.fps)
    sampler = family.describe_sampler(cfg.grid, cfg.conditional_frame_timestep)
    print(f"sample: wrote {cfg.out} ({generated.shape[-3]} frames: {cfg.chunks} chunk(s) of {cfg.frames}, "
          f"{cfg.height}x{cfg.width}, {cfg.steps} steps, {sampler}, "
          f"guidance {cfg.guidance}, seed {cfg.seed}, weights {source})", flush=True)


if __name__ == "__main__":
    cli.main(main, user_errors=(ValueError, OSError, ckpt.CheckpointError))
