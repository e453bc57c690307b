"""Camera conditioning of Cosmos-Predict2.5 robot/multiview-agibot: Pluecker-ray maps, and a fixed fallback rig.

The agibot network adds, in every block, `cam_encoder(camera)` to the self-attention input of each token; `camera`
holds the Pluecker rays of the 16x16 pixels under the token (a latent token is 2x2 latent pixels = 16x16 video
pixels), flattened to 6*16*16 = 1536 channels. Layout names: B batch, T frames, H/W pixels, Hp/Wp tokens.
Also the multi-view latent layout (split_views / stack_views) of cache.py, sample.py, train.py and the RL code.
"""
import math

import numpy as np
import torch

VIEW_ORDER = ("wrist", "ext_1", "ext_2")  # stitch.py's slots in agibot's internal order [hand_0, head, hand_1]


def plucker_map(w2c_B_T_3_4, intrinsics_B_T_4, height, width, patch=16):
    """Pluecker rays per pixel, grouped per patch: [..., height/patch, width/patch, 6*patch*patch] in fp32.

    w2c: world->camera [R|t] per frame, [..., 3, 4] (any leading dims, e.g. [B, T] or [V, T]).
    intrinsics: (fx, fy, cx, cy) in pixels of a height x width image, [..., 4], the same leading dims.
    For the pixel centre (x+0.5, y+0.5): direction d = normalize(R^T K^-1 [x+0.5, y+0.5, 1]) in world coordinates,
    camera centre o = -R^T t, moment m = o x d; each pixel gives [m | d]. Token (h, w) holds pixel (patch*h + p1,
    patch*w + p2) at channels (p1*patch + p2)*6 + c, as upstream's convert_camera_to_plucker_rays(patch_spatial=16,
    camera_patch_average=False). Upstream then rounds the map to bf16; we keep fp32 (the model casts it anyway).
    """
    w2c, intrinsics = w2c_B_T_3_4.float(), intrinsics_B_T_4.float()
    if w2c.shape[-2:] != (3, 4) or intrinsics.shape[-1:] != (4,) or w2c.shape[:-2] != intrinsics.shape[:-1]:
        raise ValueError(f"plucker_map: w2c {tuple(w2c.shape)} must be [..., 3, 4] and intrinsics"
                         f" {tuple(intrinsics.shape)} [..., 4] (fx, fy, cx, cy) with the same leading dims")
    if height % patch or width % patch:
        raise ValueError(f"plucker_map: image {height}x{width} is not a multiple of the patch {patch}")
    if not torch.all(intrinsics[..., :2] > 0):
        raise ValueError("plucker_map: focal lengths fx, fy must be positive (intrinsics are fx, fy, cx, cy)")
    R, t = w2c[..., :3], w2c[..., 3]
    fx, fy, cx, cy = (v[..., None, None] for v in intrinsics.unbind(-1))
    y = torch.arange(height, dtype=torch.float32, device=w2c.device)[:, None] + 0.5
    x = torch.arange(width, dtype=torch.float32, device=w2c.device)[None, :] + 0.5
    lead = w2c.shape[:-2]
    dir_cam = torch.stack(torch.broadcast_tensors((x - cx) / fx, (y - cy) / fy, torch.ones_like(fx)), dim=-1)
    direction = torch.einsum("...ji,...hwj->...hwi", R, dir_cam)  # R^T d: camera -> world
    direction = direction / torch.linalg.vector_norm(direction, dim=-1, keepdim=True)
    centre = -torch.einsum("...ji,...j->...i", R, t)[..., None, None, :].expand_as(direction)
    rays = torch.cat([torch.linalg.cross(centre, direction, dim=-1), direction], dim=-1)  # [..., H, W, 6]
    rays = rays.reshape(*lead, height // patch, patch, width // patch, patch, 6)
    n = len(lead)
    rays = rays.permute(*range(n), n, n + 2, n + 1, n + 3, n + 4)  # [..., Hp, Wp, p1, p2, 6]
    return rays.reshape(*lead, height // patch, width // patch, 6 * patch * patch)


FALLBACK_SPACING = 0.5  # metres between neighbouring fallback cameras
FALLBACK_HFOV_DEG = 90.0  # horizontal field of view of the fallback pinhole


def views_map(w2c_V_T_3_4, intrinsics_V_T_4, height, width):
    """The Pluecker map of views stacked on latent time, in the latents' layout: w2c [..., V, T, 3, 4] and intrinsics
    [..., V, T, 4] -> [..., V*T, height/16, width/16, 1536], view-major like the stacked latent."""
    return plucker_map(w2c_V_T_3_4.flatten(-4, -3), intrinsics_V_T_4.flatten(-3, -2), height, width)


def fallback_cameras(num_views, num_frames, height, width):
    """A fixed rig for datasets without camera parameters: (w2c [V, T, 3, 4], intrinsics [V, T, 4]) in fp32.

    Assumes nothing about the scene and encodes only which view is which: every camera is static (the same pose in
    every frame), looks along world +z with the identity rotation (x right, y down, as OpenCV), and view v sits at
    world x = (v - (V-1)/2) * FALLBACK_SPACING (0.5 m), y = z = 0; so with agibot's internal view order [hand_0,
    head, hand_1] the head camera is in the middle. Intrinsics: one centred pinhole for a height x width image with a
    90 degree horizontal field of view and square pixels (fx = fy = width / 2, cx = width / 2, cy = height / 2).
    This is not agibot's real rig (its cameras look down and move with the arms): a model fine-tuned with this
    fallback learns the view identity from it, and must be sampled with the same fallback.
    """
    if num_views < 1 or num_frames < 1 or height < 1 or width < 1:
        raise ValueError(f"fallback_cameras: views {num_views}, frames {num_frames}, size {height}x{width}: all >= 1")
    focal = 0.5 * width / math.tan(math.radians(FALLBACK_HFOV_DEG) / 2)
    w2c = torch.zeros(num_views, num_frames, 3, 4)
    w2c[..., :3] = torch.eye(3)
    offsets = (torch.arange(num_views, dtype=torch.float32) - (num_views - 1) / 2) * FALLBACK_SPACING
    w2c[..., 0, 3] = -offsets[:, None]  # t = -R c with R = I
    intrinsics = torch.tensor([focal, focal, width / 2, height / 2]).expand(num_views, num_frames, 4).clone()
    return w2c, intrinsics


# -----------------------------------------------------------------------------
# Multi-view latents: views stacked on latent time (nets/flow.py's layout) <-> one latent per view (the VAE's)


def split_views(latent_B_C_VT_H_W, num_views):
    """A multi-view latent (views stacked on latent time, nets/flow.py's layout) -> [B*V, C, T, H, W], view-major per sample,
    so the VAE decodes every view on its own (it is causal in time)."""
    B, C, VT, H, W = latent_B_C_VT_H_W.shape
    if VT % num_views:
        raise ValueError(f"{VT} latent frames are not {num_views} views stacked on time")
    return latent_B_C_VT_H_W.reshape(B, C, num_views, VT // num_views, H, W).transpose(1, 2).reshape(
        B * num_views, C, VT // num_views, H, W)


def stack_views(latent_BV_C_T_H_W, num_views):
    """The inverse of split_views: per-view latents [B*V, C, T, H, W] (view-major per sample) -> [B, C, V*T, H, W]."""
    BV, C, T, H, W = latent_BV_C_T_H_W.shape
    if BV % num_views:
        raise ValueError(f"{BV} latents are not whole samples of {num_views} views")
    return latent_BV_C_T_H_W.reshape(BV // num_views, num_views, C, T, H, W).transpose(1, 2).reshape(
        BV // num_views, C, num_views * T, H, W)


def grid_from_views(video_V_3_F_H_W, order):
    """Separate views (a multi-view net's decoded sample, named by `order`: ext_1, ext_2, wrist) -> [1, 3, F, 2H, 2W],
    Path B's 2x2 grid with a black bottom-right, so Path A's rollouts are scored by the same rewards as Path B's."""
    if video_V_3_F_H_W.ndim != 5 or len(video_V_3_F_H_W) != len(order) or sorted(order) != ["ext_1", "ext_2", "wrist"]:
        raise ValueError(f"views {tuple(video_V_3_F_H_W.shape)} named {order}: need [3, 3, F, H, W] for ext_1, ext_2, "
                         "wrist")
    view = dict(zip(order, video_V_3_F_H_W))
    black = torch.full_like(view["wrist"], -1.0)
    top, bottom = torch.cat([view["ext_1"], view["ext_2"]], dim=-1), torch.cat([view["wrist"], black], dim=-1)
    return torch.cat([top, bottom], dim=-2)[None]


def fitted_intrinsics(k: np.ndarray, src_hw: tuple, cell: tuple, fit: str) -> np.ndarray:
    """(fx, fy, cx, cy) [..., 4] in source pixels -> in pixels of the cell, as cell_filter resizes (and pads) the
    frame: ffmpeg's decrease-to-fit rounds the scaled size to the nearest pixel, then down to even, and the pad's
    offset down to even (yuv420p)."""
    (sh, sw), (ch, cw) = src_hw, cell
    w, h, x, y = cw, ch, 0, 0
    if fit == "pad":
        w, h = min(cw, round(ch * sw / sh)), min(ch, round(cw * sh / sw))
        w, h = max(w // 2, 1) * 2, max(h // 2, 1) * 2
        x, y = (cw - w) // 2 // 2 * 2, (ch - h) // 2 // 2 * 2
    return k * np.array([w / sw, h / sh, w / sw, h / sh]) + np.array([0, 0, x, y])
