"""Training clips with their actions (issue 36): data.GridClips / ViewClips whose samples also hold the clip's
action chunk and states, read by actions.FolderActions from a folder that stitch.py wrote from a LeRobot dataset
with an `action` feature (the layout, the alignment and how a stride > 1 packs the commands: base/actions.py).

    ds = ActionClips("data/droid_grid", frames=93, height=432, width=768)   # + action [92, 4*A], state [93, S]
    ds.actions.check_action_dim(net.cfg.action_dim, "v2w-2b-action")        # one line when the widths disagree
    ds = open_clips("tiny-action", "data/tiny_action_grid", 9, 64, 112, **text)   # what train/evaluate.py build

A run's network decides whether its clips carry actions (open_clips): an action config (action_dim > 0) on a folder
without actions is refused in one line; a config without actions on a folder with them trains on the videos alone
and says so once (the actions are not silently dropped: the start-up line names them and the action configs).
Contents: the datasets -> open_clips -> the actions of a sample or an evaluation (another episode's, a file's, a
stand-in's).
"""
import os

import numpy as np
import torch

from base.actions import STATS_FILE, FolderActions
from base.inits import get_config
from clips.data import GridClips, ViewClips


class _WithActions:
    """The part both datasets share: the folder's actions checked at construction, each clip's chunk at first use (a
    bad file is a counted skip, as a bad video: data.first_loadable takes the next video)."""

    def _init_actions(self, normalize: bool):
        self.actions = FolderActions(self.root, [v.stem for v in self.videos], self.frames, normalize)
        for v in [v for v in self.videos if v.stem in self.actions.problems]:
            self.skipped[v.stem] = self.actions.problems[v.stem]
            self.videos.remove(v)
        if not self.videos:
            problem = next(iter(self.actions.problems.items()))
            raise ValueError(f"{self.root}: no video with usable actions, e.g. {problem[0]}: {problem[1]}")
        skipped = f", {len(self.actions.problems)} skipped for their actions" if self.actions.problems else ""
        print(f"{type(self).__name__}: {self.root}: {self.actions.summary()}{skipped}")

    def _clip(self, video, rng) -> tuple:
        parts = super()._clip(video, rng)  # (clip or clips, start, ...); the extra fields go last (clips/data.py merges them)
        action, state = self.actions.chunk(video.stem, video.frames, parts[1])
        return (*parts, {"action": torch.from_numpy(action), "state": torch.from_numpy(state)})


class ActionClips(_WithActions, GridClips):
    """GridClips whose samples also hold action [frames-1, stride*A] and state [frames, S] (base/actions.py)."""

    def __init__(self, root: str, frames: int, height: int, width: int, normalize: bool = True, **kwargs):
        super().__init__(root, frames, height, width, **kwargs)
        self._init_actions(normalize)


class ViewActionClips(_WithActions, ViewClips):
    """ViewClips whose samples also hold action and state, as ActionClips."""

    def __init__(self, root: str, frames: int, height: int, width: int, normalize: bool = True, **kwargs):
        super().__init__(root, frames, height, width, **kwargs)
        self._init_actions(normalize)


def refuse_latents(config: str, latents: str):
    """The latent cache (cache.py) holds no actions yet: an action config with --latents is a ValueError."""
    if latents and get_config(config).action_dim:
        raise ValueError(f"--latents {latents} with --config {config}: the latent cache holds no actions yet; drop "
                         "--latents (the clips are encoded online, with their actions)")


def open_clips(config: str, root: str, frames: int, height: int, width: int, say=print, **text):
    """The clips a run of --config trains and is evaluated on: ActionClips / ViewActionClips for an action config
    (its action_dim checked against the folder's chunk, before any model is built), else GridClips / ViewClips. A
    folder without actions for an action config is a ValueError naming the folder and the fix."""
    mcfg = get_config(config)
    views, has_actions = bool(mcfg.camera_channels), os.path.isfile(os.path.join(root, STATS_FILE))
    if mcfg.action_dim and not has_actions:
        raise ValueError(f"--config {config} is action-conditioned (action_dim {mcfg.action_dim}), but {root} has no "
                         f"actions ({STATS_FILE}): stitch a LeRobot dataset with an `action` feature into a new folder "
                         "(`python stitch.py SRC NEW_OUT`), or train a config without actions (tiny, v2w-2b, ...)")
    if not mcfg.action_dim:
        if has_actions:
            say(f"actions: {root} holds actions, but --config {config} takes none (action_dim 0): trained and "
                "sampled on the videos alone; an action-conditioned run: --config tiny-action or v2w-2b-action")
        return (ViewClips if views else GridClips)(root, frames, height, width, **text)
    clips = (ViewActionClips if views else ActionClips)(root, frames, height, width, **text)
    clips.actions.check_action_dim(mcfg.action_dim, config)
    return clips


def other_actions(actions: list) -> list:
    """For action_gap_db (evaluate.py): each held-out clip's chunk [1, T-1, D] replaced by the next clip's (cycling),
    or, with one clip, by its own reversed in time, so the generation starts from the same frame and noise under
    commands that did not happen."""
    if len(actions) == 1:
        return [actions[0].flip(1)]
    return actions[1:] + actions[:1]


def standin_action(mcfg, batch: int, device=None, generator=None):
    """A random action chunk [batch, 1, action_dim] for an action network fed stand-in inputs (smoke.py, bench.py's
    step and RL plan, sac.auto_plan on "meta": their cost depends on its shape alone); None for a net without
    actions."""
    return torch.randn(batch, 1, mcfg.action_dim, device=device, generator=generator) if mcfg.action_dim else None


def episode_chunks(clips, index: int, chunks: int) -> list:
    """The action chunks [1, T-1, stride*A] of `chunks` consecutive windows of clips.videos[index] (frames 0, T-1,
    2(T-1), ...: each window starts at the previous one's last frame, as generate.rollout chains them); a ValueError
    when the episode is too short."""
    video, T = clips.videos[index], clips.frames
    if video.frames < 1 + chunks * (T - 1):
        raise ValueError(f"{video.path}: {video.frames} frames; {chunks} chained chunks of {T} frames need "
                         f"{1 + chunks * (T - 1)}: pass fewer --chunks, or --actions FILE")
    return [torch.from_numpy(clips.actions.chunk(video.stem, video.frames, k * (T - 1))[0])[None]
            for k in range(chunks)]


def read_actions_file(path: str, shape: tuple) -> torch.Tensor:
    """sample.py --actions FILE.npz: its `action` array as one clip's chunk [1, *shape] (already normalised, as the
    clips give it: actionclips.ActionClips' `action`); a ValueError naming the file for another shape or NaN/Inf."""
    try:
        with np.load(path) as f:
            action = f["action"] if "action" in f.files else None
    except (OSError, ValueError) as e:
        raise ValueError(f"--actions {path}: not a readable .npz ({e}); write one with np.savez(path, action=...)") \
            from None
    if action is None or action.size != int(np.prod(shape)) or not np.isfinite(action).all():
        raise ValueError(f"--actions {path}: needs an `action` array of {shape} (transitions x stride*dims, "
                         f"normalised as training saw it) without NaN/Inf; it holds "
                         f"{None if action is None else action.shape}")
    return torch.from_numpy(action.astype(np.float32).reshape(1, *shape))
