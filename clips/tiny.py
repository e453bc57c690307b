"""The tiny defaults' data: which configs are tiny, the folder each trains on, and the synthetic LeRobot episodes
stitched into it (train.py builds it on first use; the tests and tasks/ build theirs the same way)."""
import os

import stitch
from base import lerobot
from base.files import claim
from base.cli import recipe

# tiny-action's synthetic episodes (make_tiny_dataset): 40 long enough for a 3-chunk rollout of 9-frame clips at
# stride 4 (25 frames: 97 rows) and a short one. 40 rather than 10: with 10 (8 trained on) a tiny net never read the
# commands; with 40 (36 trained on, 4 held out) it does (docs/actions.md "Measured")
TINY_ACTION_LENGTHS = (112, 100, 120, 104, 116, 100, 108, 124, 104, 100) * 4 + (8,)


def make_tiny_dataset(root, views=False, actions=False, without=(), orbit=False, repeat=1):
    """Synthetic LeRobot episodes (stitch.make_synthetic, with camera poses) stitched into a small grid or views
    folder. The grid and the views folder beside it come from one LeRobot folder (`tiny_lerobot`, or with actions
    `tiny_action_lerobot`: squares moved by them, next to root), so their videos share stems: the same episodes, as
    Path A and B runs compare them (evaluate.py). without: behaviour families (lerobot.BEHAVIOURS) left out of the
    action episodes (leave-one-family-out runs). orbit (the tiny policy's data, recipes/tiny_policy.py): 24 of the
    action episodes, their squares steered by base.squareworld.orbit_command (`tiny_policy_lerobot`). repeat: the
    action episodes' 40 lengths that many times over, each episode its own commands (a data-size screen of the action
    world: tests/family_sweep.py --data-repeat). Under a lock: a second tiny default waits, then only re-reads."""
    if repeat != 1 and (repeat < 1 or not actions or orbit):
        raise ValueError(f"make_tiny_dataset: repeat={repeat}: a positive count, for the action episodes only")
    raw = os.path.join(os.path.dirname(root) or ".", "tiny_policy_lerobot" if orbit else "tiny_action_lerobot" if
                       actions else "tiny_lerobot")
    os.makedirs(os.path.dirname(os.path.abspath(raw)), exist_ok=True)
    # tiny: 6 usable episodes (it holds out 2: 4 train, over 1, 2 or 4 ranks), 1 too short
    lengths, motion = ((TINY_ACTION_LENGTHS[:24], "orbit") if orbit else
                       (TINY_ACTION_LENGTHS[:-1] * repeat + TINY_ACTION_LENGTHS[-1:], "actions") if actions
                       else ((48, 40, 8, 56, 44, 52, 60), "fixed"))
    with claim(raw + ".lock", "", wait=True):
        if not os.path.exists(raw):
            if os.path.exists(root):  # stitched from a source that is gone: its videos would be kept as "done"
                raise ValueError(f"{root} exists but {raw}, its source, does not: delete {root}, then rerun (both are "
                                 "rebuilt)")
            stitch.make_synthetic(raw, lengths=lengths, cameras=True, motion=motion, without=without)
        lerobot.check_synthetic(raw, lengths, motion, stitched=root, without=without)
        clip = recipe("tiny")  # the tiny preset's clips: recipes/tiny.py
        stitch.stitch(raw, root, stride=4, frames=clip["frames"], size=f"{clip['height']}x{clip['width']}",
                      workers=1, layout="views" if views else "grid")
