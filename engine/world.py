"""A world model as an environment for a policy in closed loop, and the loop itself (policyeval.py).

A world is a step function, step(raw_actions [B, steps, A], chunk) -> the chunk's frames [B, 3, T, H, W] in [-1, 1],
that keeps its own state: a world model (model_world) the last frame it generated, a true simulator (tasks/) its
true state. closed_loop runs a policy plug-in in any world the same way: the policy sees every frame so far and
returns the next chunk's raw actions; each chunk starts from the last frame of the one before (a world model's:
engine/generate.next_chunk, the link of generate.rollout's chain).

Plug-ins (`module:function`, like the reward plug-ins) see the grid as the net does:
  policy(frames [B, 3, 1 + k (T-1), H, W], info) -> raw actions [B, (T-1) x stride, A] in the dataset's units
  judge(frames, info)                              -> [B] success in [0, 1]
info: {"chunk": k, "task": the task's per-episode arrays, "steps": (T-1) x stride, "action_dim": A, "seed"}.
"""
from dataclasses import replace

import numpy as np
import torch

from base.cli import load_function
from engine.generate import next_chunk


def load_plugin(spec: str, flag: str):
    """The callable of `module:function` (base/cli.load_function, as --reward's plug-ins), imported now: a typo is
    one line before any model is built."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"{flag} {spec!r}: give module:function (e.g. tasks.square:go_to_target)")
    if module.endswith(".py"):  # a file name: import would look for a package "mypolicy" holding "py.py"
        dotted = module[:-3].replace("/", ".").replace("\\", ".").lstrip(".")
        raise ValueError(f"{flag} {spec!r}: give the module, not its file: {dotted}:{name} (importable from the "
                         "working folder)")
    return load_function(f"{flag} {spec!r}", module, name)


def checked(value, name: str, shape: tuple, what: str):
    """value as a float32 CPU tensor of exactly `shape`, finite, or one line naming the plug-in, what it returned and
    what was expected."""
    got = torch.as_tensor(np.asarray(value) if not isinstance(value, torch.Tensor) else value).detach().cpu().float()
    if tuple(got.shape) != tuple(shape) or not bool(torch.isfinite(got).all()):
        finite = bool(torch.isfinite(got).all()) if got.numel() else True
        raise ValueError(f"{name} returned {what} of shape {tuple(got.shape)}{'' if finite else ' with NaN/Inf'}; "
                         f"expected finite {list(shape)}" + (" = [B, steps, action_dim], a row per raw action (not "
                                                              "transposed, not flat)" if what == "actions" else ""))
    return got


def model_world(net, vae, cond, normalise, frames, num_steps, guidance, seeds, grid, dtype, first, neg_action=None):
    """The step function of a world model: chunk k generated from the last frame the world made (first
    [B, 3, 1, H, W] for chunk 0) under cond with the policy's actions (normalise: raw [B, steps, A] -> the net's
    chunk, FolderActions.normalise), episode b's noise seed seeds[b] + k: an episode's chunks do not depend on the
    batch it shares. neg_action ([1, transitions, dims], the net's units): action guidance's uncond branch (the
    still command: policyeval --action-guidance), guidance then pushing along the policy's action alone."""
    device, state = next(net.parameters()).device, {"frame": first.to(dtype)}

    def step(raw_actions, chunk):
        action = torch.from_numpy(normalise(raw_actions.numpy())).to(device)
        neg = None if neg_action is None else neg_action.to(device, action.dtype).expand_as(action)
        generated = next_chunk(net, vae, state["frame"], replace(cond, action=action, neg_action=neg), frames,
                               num_steps, guidance, [s + chunk for s in seeds], grid, dtype)
        state["frame"] = generated[:, :, -1:].to(dtype)  # what the model made, not the truth
        return generated
    return step


def closed_loop(step, policy, name, first, info: dict, chunks: int, action_shape: tuple, progress=None):
    """`policy` (called `name` in errors) in the world `step` for `chunks` chunks from `first` [B, 3, 1, H, W]:
    {"frames": [B, 3, 1 + chunks (T-1), H, W] every frame, each chunk's first frame once, "actions": [B, chunks x
    steps, A]}. progress: called after each chunk."""
    seen, actions = first.float().cpu(), []
    for k in range(chunks):
        raw = checked(policy(seen, dict(info, chunk=k)), name, action_shape, "actions")
        frames = step(raw, k).float().cpu()
        seen = torch.cat([seen, frames[:, :, 1:]], dim=2)
        actions.append(raw)
        if progress is not None:
            progress()
    return {"frames": seen, "actions": torch.cat(actions, dim=1)}
