"""A chunk of a chained rollout whose first frame is the model's own (issue 52): what own-context SFT (ownctx.py) and
chained NFT (nft.py --nft-chain-chunks) train on. A chained rollout (generate.rollout, evaluate.py --chunks) starts
chunk k from the last frame the model generated, a frame one-chunk training never shows it. sample_item rolls out
k - 1 chunks from an episode's true frame under its true actions, without gradient, and returns chunk k's TRUE window
with its frame 0 replaced by the last generated one; encode turns such items into a (latent, Condition) batch.

Contents: the data checks -> one window -> the context frame -> a sample item -> its batch.
"""
import os

import torch

import condition
from base.inits import get_config, tiny_data
from clips import data, text as text_lib
from clips.tiny import make_tiny_dataset
from engine.generate import rollout
from nets.family import family_of


def check_lengths(cfg, chunks, flag):
    """Every video of --data with a clip holds `chunks` chained chunks (1 + chunks (T-1) frames), read from its
    manifest, or one line naming the shortest and the chunks it allows (flag: the setting that asked for them)."""
    need = 1 + chunks * (cfg.frames - 1)
    videos = [v for v in data.list_folder(cfg.data, cfg.height, cfg.width, views=False)
              if v.frames is None or v.frames >= cfg.frames]
    unknown = [v.stem for v in videos if v.frames is None]
    if unknown:
        raise ValueError(f"{flag} {chunks}: {cfg.data} has no manifest frame count for {unknown[:3]}: re-stitch "
                         "it with stitch.py (chained chunks need each episode's length before training)")
    short = min(videos, key=lambda v: v.frames) if videos else None
    if short is not None and short.frames < need:
        most = (short.frames - 1) // (cfg.frames - 1)
        raise ValueError(f"{flag} {chunks}: {short.path} has {short.frames} frames, "
                         f"{chunks} chained chunks of {cfg.frames} need {need}; pass {flag} "
                         f"{most} or fewer (>= 2), or leave the short episodes out of --data")


def check_chain(cfg, chunks, flag, what):
    """The checks of an objective that chains `chunks` chunks from the model's own frames (ownctx, nft's
    --nft-chain-chunks; what: its name in the line): a grid net, no --latents, episodes long enough (the tiny
    default's folder built first, as train.py builds it)."""
    mcfg = get_config(cfg.config)
    if mcfg.camera_channels:
        raise ValueError(f"{what} with --config {cfg.config}: chained rollouts take a grid net; a camera net's views "
                         "are not chained yet")
    if cfg.latents:
        raise ValueError(f"{what} with --latents: a sample's frame 0 is generated each step, its window is encoded "
                         "then; drop --latents")
    if os.path.normpath(cfg.data) == os.path.normpath(tiny_data(cfg.config)) and not os.path.isdir(cfg.data):
        make_tiny_dataset(cfg.data, actions=mcfg.action_dim > 0)  # the tiny default's folder, as train.py builds it
    check_lengths(cfg, chunks, flag)


# -----------------------------------------------------------------------------
# A chained sample: its window, the model's context frame, the item and its batch


def window(clips, index, start):
    """The window of clips.videos[index] at frame `start` as a dataset item (data.Windows: GridClips' own reader)
    with its prompt embedding."""
    item = data.Windows(clips, [(index, start)])[0]
    if "error" in item:
        raise ValueError(f"{clips.videos[index].path} at frame {start}: {item['error']}")
    return dict(item, text_emb=text_lib.clip_text(clips, clips.videos[index])[0])


@torch.no_grad()
def context_frame(net, vae, items, run, steps, seed):
    """The last frame [1, 3, 1, H, W] of a len(items)-chunk rollout (generate.rollout, guidance 0, the family's
    default grid, noise seed + j for chunk j) from items[0]'s true frame 0 under each item's own record (an action
    net: the episode's true actions of that window)."""
    cfg, device, dtype = run.cfg, run.device, run.compute_dtype
    records = [condition.from_batch(condition.as_batch(item), device, cfg.height, cfg.width, dtype,
                                    cfg.conditional_frame_timestep) for item in items]
    grid = family_of(net.cfg).sampler_defaults(cfg.init, cfg.config)[0]
    first = items[0]["video"][None, :, :1].to(device)
    chunks = rollout(net, vae, first, records, cfg.frames, steps, 0.0, seed, grid, dtype)
    return chunks[-1][:, :, -1:].float().cpu()


def sample_item(net, vae, run, clips, index, k, start, seed, steps):
    """The training item of one draw: the true window of chunk k (frame start + (k-1)(T-1)) whose frame 0 is, for
    k > 1, the model's own (context_frame over chunks 1..k-1 at `steps` sampler steps), and its record's fields
    (prompt, true actions). nft.py's --nft-chain-chunks draws its groups' first frames with it too."""
    T = run.cfg.frames
    items = [window(clips, index, start + j * (T - 1)) for j in range(k)]
    target = items[-1]
    if k > 1:
        own = context_frame(net, vae, items[:-1], run, steps, seed)[0]
        target = dict(target, video=torch.cat([own, target["video"][:, 1:]], dim=1))
    return target


def encode(vae, run, items):
    """(latent, Condition) of a micro-batch of items, encoded now (never from --cache-latents: frame 0 may be the
    model's, a fresh draw each step)."""
    batch = torch.utils.data.default_collate(items)
    with torch.no_grad():
        latent = vae.encode(batch["video"].to(run.device, run.compute_dtype)).float()
    return latent, condition.from_batch(batch, run.device, run.cfg.height, run.cfg.width, run.compute_dtype,
                                        run.cfg.conditional_frame_timestep, latent=latent)
