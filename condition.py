"""The conditioning record and its one home: every Condition the network sees is built by a function of this file.

What a generation is conditioned on, besides the noisy latent and its time, travels as one `Condition` from the
batch to `DiT.forward`; every layer between them (denoisers, samplers, losses, GRPO, NFT, generation) passes it on
without opening it, deriving what it needs with dataclasses.replace or map_tensors, never by listing fields. So a new
per-clip input costs three files (docs/conditioning.md):
    1. the data: the dataset item's field (clips/), e.g. item["state"];
    2. here: the record's field, and the line of `from_batch` that reads the batch's field into it;
    3. the network that consumes it (model.py, with its DiTConfig field in base/inits.py).

Contents, top to bottom: the record and its helpers -> the conditioning-frame masks -> from a batch of clips (SFT,
held-out evaluation, RL, samples, evaluate.py, sample.py) -> derived records (generation, one per RL clip) ->
stand-ins (smoke.py, benchmarks, sac.auto_plan).
"""
from dataclasses import dataclass, fields, replace

import torch

from base.camera import fallback_cameras, views_map


@dataclass
class Condition:
    """What a generation is conditioned on, besides the noisy latent and its time (docs/conditioning.md).

    DiT.forward reads crossattn_emb, condition_mask, padding_mask, fps, camera and action; the denoisers (edm.denoise,
    flow.velocity) read gt_frames, flow's also conditional_frame_timestep, CFG reads neg_crossattn_emb, RL reads key.
    Not frozen: FSDP2's root hook rebuilds dataclass inputs field by field
    (torch.distributed.utils._apply_to_tensors, the mixed-precision input cast).
    """
    crossattn_emb: torch.Tensor  # [B, S, D_text] prompt embedding (T5 1024, or Reason1 28 x 3584 for Predict2.5)
    neg_crossattn_emb: torch.Tensor = None  # [B or 1, S, D_text] negative prompt: CFG's uncond branch
    gt_frames: torch.Tensor = None  # [B, 16, T, H, W] clean latent; only its conditioning frames are read
    condition_mask: torch.Tensor = None  # [B, 1, T, H, W] 1 on conditioning latent frames (frame_mask); None = no
    # conditioning frames
    padding_mask: torch.Tensor = None  # [B, 1, H', W'] any size (resized to the latent's); None = zeros
    fps: float = None  # frames per second (a float or [B]); read only by fps-modulated RoPE (no release uses it)
    key: tuple = ()  # RL group key of the advantages: (episode, instruction) or (rank, clip), never the text
    conditional_frame_timestep: float = None  # read by Predict2.5 (nets/flow.py) only: -1 or None (one time for all
    # frames) or 0.1 (t = 1e-4 on the conditional frames); Predict2 (nets/edm.py) always shows them at sigma 1e-4
    camera: torch.Tensor = None  # camera nets (agibot): [B, T, H/2, W/2, 1536] Pluecker map (camera.plucker_map)
    action: torch.Tensor = None  # action nets: [B, transitions, dims] the clip's action chunk (clips/actionclips.py)
    # action guidance (policyeval.py --action-guidance): [B, transitions, dims] the uncond branch's action, the still
    # command; None: the uncond branch keeps the action and swaps the prompt (upstream's CFG)
    neg_action: torch.Tensor = None


def uncond(cond: Condition):
    """The unconditional branch of classifier-free guidance: the negative prompt in place of the prompt, the same
    conditioning frames and camera; with neg_action (action guidance), neg_action in place of the action and the same
    prompt, so that guidance pushes along what the action changes alone."""
    if cond.neg_action is not None:
        return replace(cond, action=cond.neg_action)
    return replace(cond, crossattn_emb=cond.neg_crossattn_emb)


def has_uncond(cond: Condition):
    """Whether CFG has an uncond branch to call: a negative prompt, or action guidance's neg_action."""
    return cond.neg_crossattn_emb is not None or cond.neg_action is not None


def map_tensors(cond: Condition, fn):
    """cond with fn applied to each of its tensor fields (None fields, fps floats and the key stay): one sample of a
    batch's record (per_clip), a one-sample record as a batch (nft.sample_group)."""
    tensors = {f.name: v for f in fields(cond) if isinstance(v := getattr(cond, f.name), torch.Tensor)}
    return replace(cond, **{name: fn(v) for name, v in tensors.items()})


# -----------------------------------------------------------------------------
# The conditioning frames: a video's first latent frames, a camera net's views' frame-init mask


def condition_mask(latent_B_C_T_H_W, num_conditional_frames):
    """[B,1,T,H,W] mask, 1 on the first n latent frames; n is an int or a per-sample LongTensor [B]."""
    B, _, T, H, W = latent_B_C_T_H_W.shape
    n = torch.as_tensor(num_conditional_frames, device=latent_B_C_T_H_W.device).reshape(-1, 1)
    frames = torch.arange(T, device=latent_B_C_T_H_W.device)[None, :]
    mask_B_T = (frames < n).to(latent_B_C_T_H_W.dtype).expand(B, T)
    return mask_B_T[:, None, :, None, None].expand(B, 1, T, H, W).contiguous()


def multiview_condition_mask(latent_B_C_VT_H_W, num_views, num_conditional_frames):
    """robot/multiview-agibot's frame-init mask [B,1,V*T,H,W]: latent 0 of view 0, plus the first n latents of every
    other view (spec §1.1); n is an int or a per-sample tensor [B]. A latent whose V*T is not a multiple of V fails."""
    B, _, VT, H, W = latent_B_C_VT_H_W.shape
    if num_views < 1 or VT % num_views:
        raise ValueError(f"{VT} latent frames are not {num_views} views stacked on time (need a multiple)")
    T = VT // num_views
    device = latent_B_C_VT_H_W.device
    n = torch.as_tensor(num_conditional_frames, device=device).reshape(-1, 1).expand(B, 1)
    frame = torch.arange(T, device=device)[None, :]  # [1, T] within a view
    views = [(frame < 1).expand(B, T)] + [frame < n for _ in range(num_views - 1)]
    mask_B_VT = torch.cat(views, dim=1).to(latent_B_C_VT_H_W.dtype)
    return mask_B_VT[:, None, :, None, None].expand(B, 1, VT, H, W).contiguous()


def frame_mask(latent, views, num_conditional_frames):
    """The conditioning-frame mask of a record, chosen here for training, generation, smoke and bench alike: a camera
    net's views (> 1) stacked on time take multiview_condition_mask's, one video condition_mask's (its first n
    latent frames)."""
    if views > 1:
        return multiview_condition_mask(latent, views, num_conditional_frames)
    return condition_mask(latent, num_conditional_frames)


# -----------------------------------------------------------------------------
# From a batch of clips: the one producer of every record made from data


def from_batch(batch, device, height, width, camera_dtype, conditional_frame_timestep, latent=None,
               neg_crossattn_emb=None):
    """The record of a batch of clips (a dataset's collated items, or one item as a batch of one: as_batch): its
    prompt (text_emb), a camera net's Pluecker map of its views' cameras (w2c, intrinsics: built here on the device,
    ~570 MB fp32 per 93x432x768 sample, too big for a DataLoader), an action net's chunks (action), the run's
    conditional_frame_timestep (Predict2.5 only). With `latent` (training, the held-out loss, RL): the clean latent and
    its conditioning frame, the first latent frame (SFT redraws it per sample); without (generation): generate sets
    both from the frames it is given. neg_crossattn_emb: CFG's negative prompt, for records that sample."""
    camera = None
    if "w2c" in batch:
        camera = views_map(batch["w2c"].to(device), batch["intrinsics"].to(device), height, width).to(camera_dtype)
    frames = {}
    if latent is not None:
        views = batch["w2c"].shape[-4] if camera is not None else 0  # [B, V, T, 3, 4]: stacked on latent time
        frames = dict(gt_frames=latent, condition_mask=frame_mask(latent, views, 1))
    return Condition(crossattn_emb=batch["text_emb"].to(device), neg_crossattn_emb=neg_crossattn_emb,
                     camera=camera, action=batch["action"].to(device) if "action" in batch else None,
                     conditional_frame_timestep=conditional_frame_timestep, **frames)


def as_batch(item):
    """One dataset item as a batch of one, for from_batch: every tensor gains a leading dimension."""
    return {k: v[None] if isinstance(v, torch.Tensor) else v for k, v in item.items()}


# -----------------------------------------------------------------------------
# Derived records: what generation and RL make of a batch's record


def for_generation(cond: Condition, neg_crossattn_emb):
    """A batch record made to generate from: the negative prompt added, its latent and mask dropped (generate sets
    them from the frames it is given, so nothing of the true clip but its first frame can leak in)."""
    return replace(cond, neg_crossattn_emb=neg_crossattn_emb, gt_frames=None, condition_mask=None)


def per_clip(cond: Condition, neg_crossattn_emb, rank):
    """One record per clip of a batch record (an RL group each): its prompt, first latent frame (the multi-view mask
    and cameras for a camera net), the clip's whole latent (NFT's and GRPO's data term read it), actions, the
    negative prompt and its group key (rank, clip)."""
    neg = neg_crossattn_emb.to(cond.crossattn_emb.device)
    return [replace(map_tensors(cond, lambda v: v[b: b + 1]), neg_crossattn_emb=neg, key=(rank, b))
            for b in range(cond.crossattn_emb.shape[0])]


# -----------------------------------------------------------------------------
# The action chunk's one layout (DiT._action, the stand-ins, every entry point's check)


ACTIONS_PER_LATENT_FRAME = 4  # the VAE's temporal compression: 4 frames (transitions) per latent frame after the first


def action_layout(cfg, B: int, latent_frames: int):
    """The one action layout an action net takes for a clip of `latent_frames` latent frames: [B, transitions, dims],
    transitions = 4 (latent_frames - 1) (a pixel frame's transition each), dims = the values of one transition
    (per clip: action_dim / transitions; per latent frame: action_dim / 4)."""
    transitions = ACTIONS_PER_LATENT_FRAME * (latent_frames - 1)
    per = ACTIONS_PER_LATENT_FRAME if cfg.action_per_frame else transitions
    if transitions < 1 or cfg.action_dim % per:
        raise ValueError(f"action_dim {cfg.action_dim} does not split into {transitions} transitions of a clip of "
                         f"{latent_frames} latent frames ({1 + transitions} frames): sample the frames the net was "
                         "trained on")
    return (B, transitions, cfg.action_dim // per)


def check_action(action, layout, what, note=""):
    """`action` of exactly `layout` [B, transitions, dims], or one line naming it, the layout and a likely cause."""
    if tuple(action.shape) == tuple(layout):
        return
    B, T, D = layout
    hint = (" (transposed? it is [B, dims, transitions])" if tuple(action.shape) == (B, D, T) else
            " (flattened? keep one row per transition)" if action.ndim < 3 else "")
    raise ValueError(f"{what} {tuple(action.shape)} ({action[0].numel() if action.ndim else 0} values a sample): expected"
                     f" [B, transitions, dims] = {list(layout)}{hint}{note}")


# -----------------------------------------------------------------------------
# Stand-ins: a network fed no data, whose cost depends on the shapes alone


def standin_action(mcfg, batch: int, latent_frames: int, device=None, generator=None):
    """A random action chunk [batch, transitions, dims] (action_layout) for an action network fed stand-in
    inputs of `latent_frames` latent frames; None for a net without actions."""
    if not mcfg.action_dim:
        return None
    return torch.randn(action_layout(mcfg, batch, latent_frames), device=device, generator=generator)


def standin(mcfg, gt_frames, crossattn_emb, *, neg_crossattn_emb=None, views=0, cond_frames=1, pixels=None,
            camera_dtype=None, generator=None, key=(), conditional_frame_timestep=None):
    """The record of stand-in inputs (smoke.py, benchmarks/ step and RL plan, sac.auto_plan on the meta device):
    gt_frames [B, C, T, H, W] (a camera net's `views` stacked on time) with its first cond_frames latent frames as
    the conditioning frames, the given prompts; a camera net, when `pixels` (height, width) is given, the fallback
    rig's Pluecker map (camera.fallback_cameras; on the meta device an empty one of its shape), an action net a
    random chunk drawn from `generator` after whatever the caller drew."""
    camera = None
    if mcfg.camera_channels and pixels is not None:
        B, _, T, H, W = gt_frames.shape
        if gt_frames.device.type == "meta":
            camera = torch.empty(B, T // mcfg.patch_temporal, H // mcfg.patch_spatial, W // mcfg.patch_spatial,
                                 mcfg.camera_channels, device="meta")
        else:
            w2c, intrinsics = fallback_cameras(max(views, 1), T // max(views, 1), *pixels)
            camera = views_map(w2c, intrinsics, *pixels)[None].to(gt_frames.device, camera_dtype)
    action = standin_action(mcfg, gt_frames.shape[0], gt_frames.shape[2] // max(views, 1), gt_frames.device, generator)
    return Condition(crossattn_emb=crossattn_emb, neg_crossattn_emb=neg_crossattn_emb, gt_frames=gt_frames,
                     condition_mask=frame_mask(gt_frames, views, cond_frames), camera=camera, action=action, key=key,
                     conditional_frame_timestep=conditional_frame_timestep)
