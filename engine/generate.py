"""Video2world generation from a first frame, through the net's own family: what sample.py, evaluate.py and the
sample videos of train.py share.

generate encodes the given video's first frame(s) with the VAE (causal: latent frame 0 is pixel frame 0 alone),
keeps them as the conditioning frames, samples the rest with the family's sampler (nets/family.family_of: nets/edm.py's Karras
AB2 for Predict2, nets/flow.py's UniPC for Predict2.5) and decodes. A camera net (agibot) takes one sample's views as the
batch: they are stacked on latent time, sampled jointly (frame-init mask, one noise draw for every view) and
returned per view. rollout chains chunks into a long video, each from the last frame generated (issue 36).
"""
import dataclasses

import torch

import condition
from base.camera import split_views, stack_views
from base.video import write_mp4
from condition import Condition, frame_mask
from nets.family import family_of


@torch.no_grad()
def generate_latent(net, vae, video_B_3_T_H_W, cond: Condition, num_steps, guidance, seed, grid,
                    num_conditional_frames=1):
    """The final latent x0 [1, C, T', h, w] (a camera net: its views stacked on latent time) generated from the
    video's first latent frame(s), kept as the conditioning frames. cond: the prompt (crossattn_emb,
    neg_crossattn_emb), Predict2.5's conditional_frame_timestep (-1 or 0.1; the family's sampler_defaults) and, for
    a camera net, the camera; its gt_frames and condition_mask are set here from the video. grid: one of the family's
    GRIDS (Predict2: karras only; Predict2.5: shift | karras). A camera net takes video [V,3,T,H,W] and its Pluecker
    map cond.camera [1, V*T_latent, H/16, W/16, 1536]. seed: an int, or one per row of a grid net's batch."""
    latent = vae.encode(video_B_3_T_H_W).float()
    views = len(video_B_3_T_H_W) if net.cfg.camera_channels else 0
    if views:
        latent = stack_views(latent, views)
    mask = frame_mask(latent, views, num_conditional_frames)
    cond = dataclasses.replace(cond, gt_frames=latent, condition_mask=mask)
    math, shape = family_of(net.cfg), tuple(latent.shape)
    if isinstance(seed, int):  # one draw for the batch (a camera net's views are its batch)
        noise = math.initial_noise(shape, seed, max(views, 1))
    else:  # one draw per batch row: a row's sample does not depend on which rows share its batch
        noise = torch.cat([math.initial_noise((1, *shape[1:]), int(s), 1) for s in seed])
    return math.sample(net, noise.to(video_B_3_T_H_W.device), cond, guidance, grid, num_steps)


def decode(vae, x0, dtype, views):
    """x0 of generate_latent decoded in `dtype`: [1, 3, T, H, W], or a camera net's `views` [V, 3, T, H, W] (0: a
    grid net's one video)."""
    return vae.decode((split_views(x0, views) if views else x0).to(dtype))


@torch.no_grad()
def generate(net, vae, video_B_3_T_H_W, cond: Condition, num_steps, guidance, seed, grid, num_conditional_frames=1):
    """generate_latent, decoded: the generated video in the video's dtype ([V,3,T,H,W] for a camera net)."""
    x0 = generate_latent(net, vae, video_B_3_T_H_W, cond, num_steps, guidance, seed, grid, num_conditional_frames)
    return decode(vae, x0, video_B_3_T_H_W.dtype, len(video_B_3_T_H_W) if net.cfg.camera_channels else 0)


@torch.no_grad()
def from_first_frame(net, vae, truth, cond: Condition, num_steps, guidance, seed, grid, dtype):
    """(video float32, x0) generated from the first frame of truth ([1,3,T,H,W], a camera net's [V,3,T,H,W]) alone:
    every later frame is replaced by black before encoding, so none can leak into the generation. The held-out
    generation of evaluate.py and of every RL run's evaluation (rl.evaluate): one function, one number."""
    first = truth[:, :, :1].to(dtype)
    given = torch.cat([first, torch.full_like(first, -1).expand(-1, -1, truth.shape[2] - 1, -1, -1)], dim=2)
    x0 = generate_latent(net, vae, given, cond, num_steps, guidance, seed, grid)
    return decode(vae, x0, dtype, len(given) if net.cfg.camera_channels else 0).float(), x0


@torch.no_grad()
def next_chunk(net, vae, frame_B_3_1_H_W, cond: Condition, frames, num_steps, guidance, seed, grid, dtype):
    """One chunk [B, 3, frames, H, W] float32 generated from one conditioning frame per row (a grid net's), under cond
    (an action net: its actions of these frames-1 transitions): a link of rollout's chain and of a world's closed
    loop (engine/world.py), one implementation."""
    # from_first_frame reads frame 0 and the length of what it is given: the chunk's frame 0 and T
    return from_first_frame(net, vae, frame_B_3_1_H_W.expand(-1, -1, frames, -1, -1), cond, num_steps, guidance, seed,
                            grid, dtype)[0]


@torch.no_grad()
def rollout(net, vae, first, conds: list, frames, num_steps, guidance, seed, grid, dtype):
    """A long rollout of len(conds) chained chunks of `frames` frames from first [1, 3, 1, H, W] (a grid net's):
    chunk k is generated from one conditioning frame, the last frame of chunk k-1 as decoded (chunk 0: first), under
    conds[k] (an action net: the actions of frames k*(frames-1) .. (k+1)*(frames-1)), noise seed + k. Returns the
    chunks [1, 3, frames, H, W] float32; chunk k's frame 0 is chunk k-1's last (join() writes it once)."""
    if net.cfg.camera_channels:
        raise ValueError("a rollout of chained chunks takes a grid net; a camera net's views are not chained yet")
    chunks, frame = [], first.to(dtype)
    for k, cond in enumerate(conds):
        chunks.append(next_chunk(net, vae, frame, cond, frames, num_steps, guidance, seed + k, grid, dtype))
        frame = chunks[-1][:, :, -1:].to(dtype)  # what the model made, not the truth: drift compounds, as in use
    return chunks


def join(chunks):
    """One video of rollout()'s chunks: the first whole, each later one without its conditioning frame 0."""
    return torch.cat(chunks[:1] + [c[:, :, 1:] for c in chunks[1:]], dim=2)


@torch.no_grad()
def write_sample(net, vae, dataset, index, cfg, neg_text, guidance, path, master):
    """train.py's sample videos: a clip generated from the first frame of a fixed (held-out, if any) video of
    `dataset`, written beside the truth. cfg: the run's TrainConfig."""
    item = dataset[(index, 0)]
    device = next(net.parameters()).device
    video = item["video"].to(device, next(vae.parameters()).dtype)  # [3,T,H,W], or [V,3,T,H,W] for a camera net
    cond = condition.from_batch(condition.as_batch(item), device, cfg.height, cfg.width, video.dtype,
                                cfg.conditional_frame_timestep, neg_crossattn_emb=neg_text.to(device))
    video = video if cond.camera is not None else video[None]
    grid = family_of(net.cfg).sampler_defaults(cfg.init, cfg.config)[0]
    generated = generate(net, vae, video, cond, cfg.sample_steps, guidance, cfg.seed, grid=grid).to(video.dtype)
    if master:  # left: data, right: generated; views one above the other
        write_mp4(path, torch.cat(list(torch.cat([video, generated], dim=-1)), dim=-2))
        print(f"sample: {path} (left: data, right: generated from its first frame)", flush=True)
