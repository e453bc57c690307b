"""Training clips with their actions (issue 36): data.GridClips / ViewClips whose samples also hold the clip's
action chunk and states, read by actions.FolderActions from a folder that stitch.py wrote from a LeRobot dataset
with an `action` feature (the layout, the alignment and how a stride > 1 packs the commands: base/actions.py).

    ds = ActionClips("data/droid_grid", frames=93, height=432, width=768)   # + action [92, 4*A], state [93, S]
    ds.actions.check_action_dim(net.cfg.action_dim, "v2w-2b-action")        # one line when the widths disagree
    ds = open_clips("tiny-action", "data/tiny_action_grid", 9, 64, 112, **text)   # what train.py and evaluate.py build

A run's network decides whether its clips carry actions (open_clips): an action config (action_dim > 0) on a folder
without actions is refused in one line; a config without actions on a folder with them trains on the videos alone
and says so once (the actions are not silently dropped: the start-up line names them and the action configs).
Contents: the datasets -> open_clips -> the actions of a sample or an evaluation (another episode's, a file's, a
stand-in's).
"""
import os

import numpy as np
import torch

from base.actions import STATS_FILE, FolderActions, read_arrays
from base.inits import get_config
from base.video import ClipError
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


def open_clips(config: str, root: str, frames: int, height: int, width: int, say=print, action_dim: int = 0, **text):
    """The clips a run of --config trains and is evaluated on: ActionClips / ViewActionClips for an action config
    (action_dim: the network's, 0 = the config's; -1: none yet, a net trained from scratch takes the data's: see
    network_action_dim), else GridClips / ViewClips. A folder without actions for an action config, or a network
    whose action_dim is not the folder's chunk, is a ValueError naming the folder and the fixes, before any model."""
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
    if action_dim >= 0:
        clips.actions.check_action_dim(action_dim or mcfg.action_dim, config, per_frame=mcfg.action_per_frame)
    return clips


def network_action_dim(config: str, init: str, recorded: int, clips, say=print) -> int:
    """The action_dim of the network a train.py run of --config builds for `clips` (0 for a config without
    actions): from scratch (--init random) its data's (said when it is not the config's: a net of one's own robot's
    commands needs no config of its own); loaded from --init, its own (`recorded`: what a train.py step recorded,
    0 = the config's), checked against the data (FolderActions.check_action_dim: one line, the fixes that work)."""
    mcfg = get_config(config)
    if not mcfg.action_dim:
        return 0
    per_frame = mcfg.action_per_frame
    if init == "random":
        width = clips.actions.width(per_frame)
        if width != mcfg.action_dim:
            say(f"actions: --config {config} trained from scratch takes its action_dim from {clips.root}: {width} "
                f"(its clips' {clips.actions.action_width}-value commands at stride {clips.actions.stride}) instead of "
                f"the config's {mcfg.action_dim}; recorded with every step, sample.py and evaluate.py rebuild it so")
        return width
    own = recorded or mcfg.action_dim
    clips.actions.check_action_dim(own, config, init, per_frame=per_frame)
    return own


def other_actions(actions: list, stems: list) -> tuple:
    """For action_gap_db (evaluate.py): (each held-out clip's chunk [1, T-1, D] replaced by commands that did not
    happen, what each replacement is). The next clip's (cycling) that differs from its own; with one clip, or where
    every other clip's equals it, its own reversed in time, negated (mirrored about the data's mean command: a
    command held for the whole chunk reverses into itself), or shifted by one sd (the mean command itself): the
    first that differs, so a net that follows its actions never scores the 0 of one that ignores them."""
    replaced, what = [], []
    for i, own in enumerate(actions):
        candidates = [(actions[(i + k) % len(actions)], f"{stems[(i + k) % len(actions)]}'s actions")
                      for k in range(1, len(actions))]
        candidates += [(own.flip(1), "its own reversed in time"), (-own, "its own negated (mirrored about the mean)"),
                       (own + 1, "its own shifted by one sd")]
        chunk, label = next((c, label) for c, label in candidates if not torch.equal(c, own))
        replaced.append(chunk)
        what.append(label)
    return replaced, what


def episode_chunks(clips, index: int, chunks: int) -> list:
    """The action chunks [1, T-1, stride*A] of `chunks` consecutive windows of clips.videos[index] (frames 0, T-1,
    2(T-1), ...: each window starts at the previous one's last frame, as generate.rollout chains them); a ValueError
    when the episode (its video or its actions file) is too short or its actions file is damaged."""
    video, T = clips.videos[index], clips.frames
    if video.frames < 1 + chunks * (T - 1):
        raise ValueError(f"{video.path}: {video.frames} frames; {chunks} chained chunks of {T} frames need "
                         f"{1 + chunks * (T - 1)}: pass fewer --chunks, or --actions FILE")
    try:
        return [torch.from_numpy(clips.actions.chunk(video.stem, video.frames, k * (T - 1))[0])[None]
                for k in range(chunks)]
    except ClipError as e:  # the actions file does not match its video (cut, edited, damaged)
        raise ValueError(f"the actions of {video.path}: {e}") from None


def read_actions_file(path: str, transitions: int, width: int, folder) -> tuple:
    """sample.py --actions FILE (.npz with `action`, or an .npy): (one clip's chunks [1, transitions, width], what was
    read) for a net that takes `width` values a transition. Two layouts, told apart by their shape, anything else a
    ValueError naming the file: [transitions, width], normalised as training saw it (ActionClips' `action`), or
    stitch.py's actions/<stem>.npz as written, [N, stride, A] raw commands: its first `transitions` are normalised
    here by folder() (a FolderActions: the run's data folder's action_stats.json)."""
    try:
        action = read_arrays(path, ("action",)).get("action")
    except ValueError as e:  # damaged, an object or a text array: the file named, no numpy traceback
        raise ValueError(f"--actions {e}") from None
    if action is None:
        raise ValueError(f"--actions {path}: no `action` array; write one with np.savez(path, action=...)")
    if not np.isfinite(action).all():
        raise ValueError(f"--actions {path}: `action` holds NaN/Inf values")
    if action.shape == (transitions, width):
        return torch.from_numpy(action.astype(np.float32))[None], f"{path} ({transitions} x {width}, normalised)"
    actions = folder() if action.ndim == 3 else None
    if actions is not None and action.shape[1:] == (actions.stride, actions.action_width) and \
            actions.stride * actions.action_width == width:
        if len(action) < transitions:
            raise ValueError(f"--actions {path}: {len(action)} transitions of raw commands (stitch.py's layout), "
                             f"these --chunks need {transitions}: pass fewer --chunks")
        chunk = actions.normalise(action[:transitions].reshape(transitions * actions.stride, actions.action_width))
        unused = f", {len(action) - transitions} later ones unused" if len(action) > transitions else ""
        return torch.from_numpy(chunk)[None], (f"{path} (stitch.py's raw [N, {actions.stride}, {actions.action_width}]"
                                               f": its first {transitions} of {len(action)} transitions{unused}, "
                                               "normalised by "
                                               f"{actions.root}/{STATS_FILE})")
    hint = (" (transposed? it is [dims, transitions])" if action.shape == (width, transitions) else
            " (flattened? keep one row per transition)" if action.ndim < 2 else "")
    raise ValueError(f"--actions {path}: needs an `action` array of {(transitions, width)} (transitions x stride*dims, "
                     "normalised as training saw it) or stitch.py's actions/<stem>.npz ([N, stride, dims] raw); it "
                     f"holds {action.shape}{hint}: its values are never reshaped into another layout")
