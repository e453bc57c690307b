"""Training clips with their actions (issue 36): data.GridClips / ViewClips whose samples also hold the clip's
action chunk and states, read by actions.FolderActions from a folder that stitch.py wrote from a LeRobot dataset
with an `action` feature (the layout, the alignment and how a stride > 1 packs the commands: actions.py).

    ds = ActionClips("data/droid_grid", frames=93, height=432, width=768)   # + action [92, 4*A], state [93, S]
    ds.actions.check_action_dim(net.cfg.action_dim, "v2w-2b-action")        # one line when the widths disagree
"""
import torch

from actions import FolderActions
from data import GridClips, ViewClips


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
        parts = super()._clip(video, rng)  # (clip or clips, start, ...); the extra fields go last (data.py merges them)
        action, state = self.actions.chunk(video.stem, video.frames, parts[1])
        return (*parts, {"action": torch.from_numpy(action), "state": torch.from_numpy(state)})


class ActionClips(_WithActions, GridClips):
    """GridClips whose samples also hold action [frames-1, stride*A] and state [frames, S] (actions.py)."""

    def __init__(self, root: str, frames: int, height: int, width: int, normalize: bool = True, **kwargs):
        super().__init__(root, frames, height, width, **kwargs)
        self._init_actions(normalize)


class ViewActionClips(_WithActions, ViewClips):
    """ViewClips whose samples also hold action and state, as ActionClips."""

    def __init__(self, root: str, frames: int, height: int, width: int, normalize: bool = True, **kwargs):
        super().__init__(root, frames, height, width, **kwargs)
        self._init_actions(normalize)
