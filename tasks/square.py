"""The tiny-action world as a task, move the yellow square into a target box: its true simulator, a weight-free judge
and reference policies of graded skill, so that one policy runs from the same start in the world model and here and
the world model's ranking of policies can be checked against the truth. Copy this file for your own robot.

The world (lerobot.make_synthetic(motion="actions"), stitched by train.make_tiny_dataset): three cameras show their
colour and a yellow ACTION_SQUARE square whose top-left corner (x, y), in 320x180 pixels, moves by each raw action
(dx, dy), clipped to SQUARE_RANGE; the grid keeps every STRIDE-th step. A chunk is STEPS = (FRAMES - 1) x STRIDE = 32
raw actions, and a command held for a chunk moves the square 128 or 256 pixels in x and into a border in y: a target
drawn anywhere is often out of every command sequence's reach. So a target box (the square's size) sits where one
command held for one chunk takes the square from its start, never overlapping it: go_to_target gets there in chunk 0.

Plug-ins (`tasks.square:judge`, `tasks.square:go_to_target`, ...) see the grid as the net does, frames [B, 3, T, H, W]
in [-1, 1], and info {"chunk": k, "task": sample_tasks' arrays of these B episodes, "steps", "action_dim", "seed"}:
  judge(frames, info)  -> [B] success in [0, 1]
  policy(frames, info) -> [B, steps, action_dim] raw actions, cut where the square would leave SQUARE_RANGE, as the
                          data's recorded actions are (the motion IS the action there). Each policy has a .family:
                          "reference" (go_to_target to wrong_way: one command held a chunk), or goal, pause, noisy,
                          switch (OTHERS: controllers acting like that family of the data, FAMILY_DATA), each graded

A task module for policyeval.py has: sample_tasks(n, seed), first_frames(tasks), simulator(tasks) (a step function
for engine/world.closed_loop; a task without a true simulator leaves it out), judge, POLICIES, and optionally
state_success(world, tasks) (success read from the simulator's own state, to check the judge against) and
mark(frames, tasks) (the goal drawn on policyeval's mp4s).

Contents, top to bottom: tasks -> simulator (step, render, first_frames, simulator) -> judge (locate, judge) ->
mark -> reference policies -> policies of other families, state_success -> run_in_simulator -> world-model reward.
"""
import subprocess

import numpy as np
import torch

from base.lerobot import ACTION_SQUARE, COMMAND_DX, COMMAND_DY, SLOTS, SQUARE_RANGE, code_frame
from base.squareworld import RATE_MAX
from base.video import cell_filter, ffmpeg_exe, fit_of
from engine.world import closed_loop

STRIDE, FRAMES, HEIGHT, WIDTH = 4, 9, 64, 112  # clips/tiny.make_tiny_dataset's stitch (stride 4) of recipes/tiny.py's clips
STEPS = (FRAMES - 1) * STRIDE  # raw actions in a chunk: tiny-action's action_dim 64 = STEPS x 2
SOURCE_HW = (90, 160)  # make_synthetic's camera frames (its defaults, which make_tiny_dataset keeps)
COMMANDS = np.array([(dx, dy) for dx in COMMAND_DX for dy in COMMAND_DY], np.float32)  # [15, 2]
LOW, HIGH = np.array(SQUARE_RANGE, np.float32).T  # the corner's (x, y) bounds
MIN_COVER = 0.25  # found: at least this fraction of the square's area in solid yellow pixels


# ------------------------------------------------------------------------------------------------------------ tasks

def sample_tasks(n: int, seed: int) -> dict:
    """n tasks, deterministic in seed: {"start": [n, 2] the square's top-left corner, "target": [n, 2] the target
    box's top-left corner (the box is ACTION_SQUARE wide), both in 320x180 pixels, "episode": [n] each task's index
    (the policies seed their draws with it)}. Starts are on even pixels: code_frame draws at 160x90 and rounds half
    to even, so an odd corner is drawn a pixel off. The target: where a random command held for STEPS takes the
    square, among the commands whose box does not overlap the start's (so stand_still never succeeds)."""
    rng = np.random.default_rng([1, seed])
    start = np.stack([rng.integers(0, int(hi) // 2 + 1, n) for hi in HIGH], 1) * 2
    start = start.astype(np.float32)
    ends = chunk_ends(start, STEPS)  # [n, 15, 2]
    apart = (np.abs(ends - start[:, None]) >= ACTION_SQUARE).any(-1)
    target = np.stack([ends[i, rng.choice(np.flatnonzero(apart[i]))] for i in range(n)])
    return {"start": start, "target": target, "episode": np.arange(n)}


def chunk_ends(corners_B_2, steps: int) -> np.ndarray:
    """[B, 15, 2]: where each of COMMANDS, held for `steps` raw actions, takes the square from these corners."""
    B, C = len(corners_B_2), len(COMMANDS)
    held = np.broadcast_to(COMMANDS[None, :, None], (B, C, steps, 2)).reshape(B * C, steps, 2)
    return step(np.repeat(corners_B_2, C, 0), held)[:, -1].reshape(B, C, 2)


def inside(centres_B_2, targets_B_2) -> np.ndarray:
    """[B] whether each centre lies in its target box [corner, corner + ACTION_SQUARE) (a NaN centre: no)."""
    return ((centres_B_2 >= targets_B_2) & (centres_B_2 < targets_B_2 + ACTION_SQUARE)).all(-1)


# -------------------------------------------------------------------------------------------------------- simulator

def step(corners_B_2, actions_B_N_2) -> np.ndarray:
    """[B, N+1, 2] float32: the square's corner before and after each raw action, clipped after every action as
    square_commands does: position[i+1] = clip(position[i] + action[i], SQUARE_RANGE)."""
    corners, actions = np.asarray(corners_B_2, np.float64), np.asarray(actions_B_N_2, np.float64)
    if corners.ndim != 2 or corners.shape[1] != 2 or actions.ndim != 3 or actions.shape[::2] != (len(corners), 2):
        raise ValueError(f"step: corners {corners.shape} and actions {actions.shape}, expected [B, 2] and [B, N, 2]")
    path = [corners]
    for action_B_2 in actions.transpose(1, 0, 2):
        path.append(np.clip(path[-1] + action_B_2, LOW, HIGH))
    return np.stack(path, 1).astype(np.float32)


def grid_graph() -> str:
    """stitch.episode_command's filter graph for one input holding the three cameras side by side: each camera cut
    out and converted to yuv420p (make_synthetic's encoder did that), fitted into its cell by video.cell_filter (area
    scaling), stacked into the grid; ffmpeg's -pix_fmt rgb24 then converts as read_clip's decode does."""
    (sh, sw), (h, w) = SOURCE_HW, (HEIGHT // 2, WIDTH // 2)
    cell = cell_filter(SOURCE_HW, (h, w), fit_of("auto", SOURCE_HW, (h, w)))  # stitch.py's default --fit
    chains = ["[0:v]split=3" + "".join(f"[in_{s}]" for s in SLOTS)]
    chains += [f"[in_{s}]crop={sw}:{sh}:{i * sw}:0,format=yuv420p,{cell}[{s}]" for i, s in enumerate(SLOTS)]
    chains += ["[ext_1][ext_2]hstack=shortest=1[top]", f"[wrist]pad={w * 2}:{h}:0:0:black[bottom]",
               "[top][bottom]vstack=shortest=1[grid]"]
    return ";".join(chains)


def render(corners_B_T_2) -> torch.Tensor:
    """Frames [B, 3, T, HEIGHT, WIDTH] float32 in [-1, 1] of the squares at these corners, as the stitched grid shows
    them decoded (read_clip, then data.py's / 127.5 - 1), less the two H.264 passes (make_synthetic's crf 18, stitch's
    crf 15): code_frame's 90x160 frames through stitch.py's own filters in the bundled ffmpeg, bit-exact to
    stitch.episode_command with lossless codecs (tests/test_square.py). Calling the filters rather than imitating them
    in torch: swscale's fixed-point area scaling and colour conversions are what the data went through."""
    corners = np.asarray(corners_B_T_2, np.float32)
    if corners.ndim != 3 or corners.shape[2] != 2:
        raise ValueError(f"render: corners of shape {corners.shape}, expected [B, T, 2] (x, y in 320x180 pixels)")
    unique, which = np.unique(corners.reshape(-1, 2), axis=0, return_inverse=True)  # a still square: drawn once
    sources = np.stack([np.concatenate([code_frame(0, camera, 0, *SOURCE_HW, square=corner)
                                        for camera in (1, 2, 3)], 1) for corner in unique])  # [U, 90, 480, 3]
    args = [ffmpeg_exe(), "-hide_banner", "-nostdin", "-nostats", "-loglevel", "error", "-f", "rawvideo", "-pix_fmt",
            "rgb24", "-s", f"{sources.shape[2]}x{sources.shape[1]}", "-framerate", "15", "-i", "pipe:0",
            "-filter_complex", grid_graph(), "-map", "[grid]", "-fps_mode", "passthrough", "-f", "rawvideo",
            "-pix_fmt", "rgb24", "pipe:1"]
    proc = subprocess.run(args, input=sources.tobytes(), capture_output=True, check=False)  # rc checked below
    want = len(unique) * HEIGHT * WIDTH * 3
    if proc.returncode != 0 or len(proc.stdout) != want:
        raise RuntimeError(f"render: ffmpeg rc {proc.returncode} gave {len(proc.stdout)} bytes, expected {want}: "
                           + " | ".join(proc.stderr.decode(errors="replace").strip().splitlines()[-3:]))
    grids = np.frombuffer(proc.stdout, np.uint8).reshape(len(unique), HEIGHT, WIDTH, 3)[which.reshape(-1)]
    frames = torch.from_numpy(grids).view(*corners.shape[:2], HEIGHT, WIDTH, 3).permute(0, 4, 1, 2, 3)
    return frames.float().div(127.5).sub(1.0)


def first_frames(tasks: dict) -> torch.Tensor:
    """[B, 3, 1, H, W]: the tasks' start frames, where the world model and the simulator both begin."""
    return render(np.asarray(tasks["start"], np.float32)[:, None])


def simulator(tasks: dict):
    """The true world as a step function for engine/world.closed_loop: step(raw actions [B, S, A], chunk) -> the
    chunk's frames [B, 3, S/STRIDE + 1, H, W] (frame j shows step j*STRIDE, frame 0 the chunk's start, as a world
    model's chunk), the square moved by each action's (dx, dy). Its .path: the true corners so far [B, n, 2]."""
    def advance(raw_actions, chunk):
        actions = np.asarray(raw_actions, np.float32)[:, :, :2]
        if actions.shape[1] % STRIDE:
            raise ValueError(f"simulator: {actions.shape[1]} actions are not whole transitions of stride {STRIDE}")
        path = step(advance.path[:, -1], actions)
        advance.path = np.concatenate([advance.path, path[:, 1:]], 1)
        return render(path[:, ::STRIDE])
    advance.path = np.asarray(tasks["start"], np.float32)[:, None]
    return advance


# ------------------------------------------------------------------------------------------------------------ judge

def locate(frames_B_3_T_H_W) -> tuple:
    """(centre [B, T, 2] in 320x180 pixels, NaN where not found; found [B, T] bool) of the yellow square, by colour
    alone, in whichever camera cell shows the most of it: every camera shows the one square (code_frame), and a
    world model may draw it sharply in one view and smear it in another. Against each cell's colour (red, green,
    blue) yellow (255, 255, 0) is min(R, G) - B: a = clamp((min(R, G) - B) / 2, 0, 1) is 0 on every background, 1 on
    yellow and, in between, the share of the pixel the square covers (what area scaling left). Found: at least
    MIN_COVER of the square's area in pixels with a > 0.5. Centre: the a-weighted centroid within 3/4 of the
    square's size of those pixels' centroid, so that stray colour elsewhere in a generated frame does not pull it;
    within 0.6 pixel of the drawn centre in simulator frames. On the CPU: a generated batch's cells are a few MB."""
    frames = torch.as_tensor(frames_B_3_T_H_W)
    if frames.ndim != 5 or frames.shape[1] != 3:
        raise ValueError(f"locate: frames of shape {tuple(frames.shape)}, expected [B, 3, T, H, W] in [-1, 1]")
    h, w = frames.shape[3] // 2, frames.shape[4] // 2
    cells = torch.stack([frames[:, :, :, y: y + h, x: x + w] for y, x in ((0, 0), (0, w), (h, 0))])  # SLOTS' cells
    cells = cells.detach().float().cpu()  # [3, B, 3, T, h, w]
    a = ((torch.minimum(cells[:, :, 0], cells[:, :, 1]) - cells[:, :, 2]) / 2).clamp(0, 1)  # [3, B, T, h, w]
    rows, cols = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
    xy = torch.stack([cols, rows], -1)  # pixel centres [h, w, 2] in cell pixels
    centroid = lambda weight: (weight[..., None] * xy).sum((-3, -2)) / weight.sum((-2, -1))[..., None]  # noqa: E731
    square = ACTION_SQUARE * torch.tensor([w / 320, h / 180])  # its size in cell pixels (x, y)
    solid = (a > 0.5).float()
    near = ((xy - centroid(solid)[..., None, None, :]).abs() <= 0.75 * square).all(-1)
    mass = solid.sum((-2, -1))  # [3, B, T]
    best = mass.argmax(0)  # the cell that shows the most of the square
    pick = lambda x: x.gather(0, best[None, ..., None].expand(1, *x.shape[1:])).squeeze(0)  # noqa: E731
    centre = pick(centroid(a * near)) * torch.tensor([320 / w, 180 / h])
    found = mass.amax(0) >= MIN_COVER * square.prod()
    return torch.where(found[..., None], centre, torch.nan), found


def judge(frames_B_3_T_H_W, info: dict) -> torch.Tensor:
    """[B] 1.0 where the square's centre, located in the last frame, lies in the task's target box; 0.0 elsewhere
    and where no square is found."""
    centre, _ = locate(frames_B_3_T_H_W[:, :, -1:])
    target = np.asarray(info["task"]["target"], np.float32)
    if target.shape != (len(centre), 2):
        raise ValueError(f"judge: info['task']['target'] of shape {target.shape} for {len(centre)} videos")
    return torch.from_numpy(inside(centre[:, 0].numpy(), target).astype(np.float32))


def mark(frames_B_3_T_H_W, tasks: dict) -> torch.Tensor:
    """A copy of the frames with each task's target box outlined in white in every camera cell: policyeval's mp4s
    only (the judge and the policies see frames unmarked), so that success can be seen."""
    frames = torch.as_tensor(frames_B_3_T_H_W).clone()
    h, w = frames.shape[3] // 2, frames.shape[4] // 2
    target = np.asarray(tasks["target"], np.float32)
    for b, (x, y) in enumerate(target):
        x0, y0 = int(x * w / 320), int(y * h / 180)
        x1 = min(w - 1, int(np.ceil((x + ACTION_SQUARE) * w / 320)))
        y1 = min(h - 1, int(np.ceil((y + ACTION_SQUARE) * h / 180)))
        for top, left in ((0, 0), (0, w), (h, 0)):  # SLOTS' cells, as locate reads them
            cell = frames[b, :, :, top: top + h, left: left + w]
            cell[:, :, (y0, y1), x0: x1 + 1] = 1.0
            cell[:, :, y0: y1 + 1, (x0, x1)] = 1.0
    return frames


# --------------------------------------------------------------------------------------------------------- policies

def seen(frames_B_3_T_H_W) -> tuple:
    """(corner [B, 2], found [B]) of the square in the last frame: what a policy knows of the world."""
    centre, found = locate(frames_B_3_T_H_W[:, :, -1:])
    return centre[:, 0].numpy() - ACTION_SQUARE / 2, found[:, 0].numpy()


def held(commands_B_2, corners_B_2, found_B, info: dict) -> torch.Tensor:
    """[B, info["steps"], info["action_dim"]] raw actions: each command held for the whole chunk from the corner the
    policy sees, cut where the square would leave SQUARE_RANGE (the motion is the action, as in the data the world
    model learnt from); (0, 0) where no square was found; dims beyond (dx, dy) zero, as make_synthetic pads them."""
    steps, action_dim = info["steps"], info["action_dim"]
    if action_dim < 2 or steps < 1:
        raise ValueError(f"info: steps {steps}, action_dim {action_dim}; the square's commands need >= 1 and >= 2")
    commands = np.where(found_B[:, None], commands_B_2, 0).astype(np.float32)
    path = step(np.nan_to_num(corners_B_2), np.broadcast_to(commands[:, None], (len(commands), steps, 2)))
    actions = np.zeros((len(commands), steps, action_dim), np.float32)
    actions[:, :, :2] = np.diff(path, axis=1)
    return torch.from_numpy(actions)


def towards(frames_B_3_T_H_W, info: dict, sign: int) -> torch.Tensor:
    """The command whose chunk ends closest to (sign 1) or farthest from (-1) the target box's centre."""
    corners, found = seen(frames_B_3_T_H_W)
    target = np.asarray(info["task"]["target"], np.float32)
    distance = np.linalg.norm(chunk_ends(np.nan_to_num(corners), info["steps"]) - target[:, None], axis=-1)
    return held(COMMANDS[np.argmin(sign * distance, 1)], corners, found, info)


def go_to_target(frames_B_3_T_H_W, info: dict) -> torch.Tensor:
    """The command that brings the square's centre closest to the target box's centre by the chunk's end; stands
    still once the centre is inside the box, and where no square is found."""
    corners, _ = seen(frames_B_3_T_H_W)
    there = inside(corners + ACTION_SQUARE / 2, np.asarray(info["task"]["target"], np.float32))
    return torch.where(torch.from_numpy(there)[:, None, None], 0.0, towards(frames_B_3_T_H_W, info, 1))


def epsilon_greedy(frames_B_3_T_H_W, info: dict, epsilon: float) -> torch.Tensor:
    """go_to_target, but with probability epsilon per episode and chunk a random command (stands still where no
    square is found). The coin and the random command come from one generator per (info["seed"], chunk, episode)
    whatever epsilon is, so a larger epsilon randomises a superset of the same chunks with the same commands: the
    policies' ranking is not left to sampling noise."""
    draws = [np.random.default_rng([info["seed"], info["chunk"], int(e)]) for e in info["task"]["episode"]]
    coin = torch.tensor([rng.random() < epsilon for rng in draws])
    random = held(COMMANDS[[int(rng.integers(len(COMMANDS))) for rng in draws]], *seen(frames_B_3_T_H_W), info)
    return torch.where(coin[:, None, None], random, go_to_target(frames_B_3_T_H_W, info))


def epsilon_25(frames_B_3_T_H_W, info: dict) -> torch.Tensor:
    """go_to_target with a random command in a quarter of the chunks (epsilon_greedy)."""
    return epsilon_greedy(frames_B_3_T_H_W, info, 0.25)


def epsilon_50(frames_B_3_T_H_W, info: dict) -> torch.Tensor:
    """go_to_target with a random command in half of the chunks (epsilon_greedy)."""
    return epsilon_greedy(frames_B_3_T_H_W, info, 0.5)


def epsilon_75(frames_B_3_T_H_W, info: dict) -> torch.Tensor:
    """go_to_target with a random command in three quarters of the chunks (epsilon_greedy)."""
    return epsilon_greedy(frames_B_3_T_H_W, info, 0.75)


def random_commands(frames_B_3_T_H_W, info: dict) -> torch.Tensor:
    """A random command every chunk, the epsilon policies' draws (stands still where no square is found)."""
    return epsilon_greedy(frames_B_3_T_H_W, info, 1.0)


def stand_still(frames_B_3_T_H_W, info: dict) -> torch.Tensor:
    """(0, 0) throughout: never succeeds in the simulator, as no target overlaps its start."""
    still = np.zeros((len(frames_B_3_T_H_W), 2), np.float32)
    return held(still, still, np.ones(len(still), bool), info)


def wrong_way(frames_B_3_T_H_W, info: dict) -> torch.Tensor:
    """The command that ends the chunk farthest from the target box's centre (stands still where no square is
    found). Never succeeds in the simulator: a border 128+ pixels from the target in x is always within reach."""
    return towards(frames_B_3_T_H_W, info, -1)


REFERENCE = (go_to_target, epsilon_25, epsilon_50, epsilon_75, random_commands, stand_still, wrong_way)


# ---------------------------------------------------------------------------------- policies of other families
# Each family acts like one of the data's behaviour families (lerobot.BEHAVIOURS; FAMILY_DATA maps them), graded in
# skill, so that a world model trained without that family (the leave-one-family-out runs, docs/policyeval.md) is
# asked to rank policies whose kind of motion it never saw. Closed loop across chunks (each reads the square from
# the frames), open loop inside one: the policy knows where its own actions take the square (the motion IS the action).

FAMILY_DATA = {"reference": "held", "goal": "goal", "pause": "pause", "noisy": "noisy", "switch": "switch"}


def drive(frames_B_3_T_H_W, info: dict, command) -> torch.Tensor:
    """[B, info["steps"], info["action_dim"]] raw actions of a controller: command(t, corners [B, 2], target [B, 2],
    rngs) -> [B, 2] the next command (t: the step in the episode), clipped to the data's +-RATE_MAX, cut at the
    borders; (0, 0) where no square was found. rngs: one generator per episode, seeded by (seed, chunk, episode)."""
    steps, action_dim = info["steps"], info["action_dim"]
    if action_dim < 2 or steps < 1:
        raise ValueError(f"info: steps {steps}, action_dim {action_dim}; the square's commands need >= 1 and >= 2")
    corners, found = seen(frames_B_3_T_H_W)
    target = np.asarray(info["task"]["target"], np.float64)
    rngs = [np.random.default_rng([info["seed"], info["chunk"], int(e), 51]) for e in info["task"]["episode"]]
    position, actions = np.nan_to_num(corners).astype(np.float64), np.zeros((len(corners), steps, action_dim))
    for i in range(steps):
        wanted = np.clip(command(info["chunk"] * steps + i, position, target, rngs), -RATE_MAX, RATE_MAX)
        moved = np.clip(position + np.where(found[:, None], wanted, 0), LOW, HIGH)
        actions[:, i, :2], position = moved - position, moved
    return torch.from_numpy(actions.astype(np.float32))


def family_policy(name: str, family: str, doc: str, command):
    """A module-level policy (a `tasks.square:<name>` plug-in) of `family` driving `command`."""
    def policy(frames_B_3_T_H_W, info: dict) -> torch.Tensor:
        return drive(frames_B_3_T_H_W, info, command)
    policy.__name__ = policy.__qualname__ = name
    policy.__doc__, policy.family = doc, family
    return policy


def proportional(gain: float, offset=(0.0, 0.0)):
    """gain x (target - corner) a step (1: full rate until a last step lands on it, bang-bang), aimed `offset` pixels
    off the target."""
    return lambda t, position, target, rngs: gain * (target + offset - position)


def after(pause: int, then):
    """Still for the episode's first `pause` steps, then `then`."""
    return lambda t, position, target, rngs: then(t, position, target, rngs) * (t >= pause)


def noisy(then, sigma: float):
    """`then` plus Gaussian noise of sigma pixels a step."""
    return lambda t, position, target, rngs: then(t, position, target, rngs) + np.stack(
        [rng.normal(0, sigma, 2) for rng in rngs])


def switching(then, share: float, every: int = 4):
    """`then`, but in a `share` of each `every`-step block a random command: changes inside a chunk."""
    def command(t, position, target, rngs):
        if t % every == 0:
            command.draws = [(rng.random() < share, rng.uniform(-RATE_MAX, RATE_MAX)) for rng in rngs]
        own = then(t, position, target, rngs)
        return np.stack([r if coin else o for (coin, r), o in zip(command.draws, own)])
    return command


OTHERS = [family_policy(*spec) for spec in (
    ("bang_bang", "goal", "Full rate towards the target on each axis, a smaller step to land on it.",
     proportional(1.0)),
    ("proportional_10", "goal", "0.1 x (target - corner) a step.", proportional(0.1)),
    ("proportional_02", "goal", "0.02 x (target - corner) a step: slow, far targets are missed.", proportional(0.02)),
    ("aim_off", "goal", "0.1 x a step towards a point 48 pixels right of and 24 below the target.",
     proportional(0.1, (48.0, 24.0))),
    ("proportional_01", "goal", "0.01 x (target - corner) a step: slower.", proportional(0.01)),
    ("pause_16", "pause", "Still for 16 steps, then bang-bang.", after(16, proportional(1.0))),
    ("pause_64", "pause", "Still for 64 steps (two chunks), then bang-bang.", after(64, proportional(1.0))),
    ("pause_80", "pause", "Still for 80 steps, then bang-bang.", after(80, proportional(1.0))),
    ("pause_88", "pause", "Still for 88 steps, then bang-bang: only the nearest targets.",
     after(88, proportional(1.0))),
    ("noisy_2", "noisy", "proportional 0.1 plus noise of 2 pixels a step.", noisy(proportional(0.1), 2.0)),
    ("noisy_8", "noisy", "proportional 0.03 plus noise of 8 pixels a step.", noisy(proportional(0.03), 8.0)),
    ("noisy_16", "noisy", "proportional 0.01 plus noise of 16 pixels a step.", noisy(proportional(0.01), 16.0)),
    ("switch_25", "switch", "bang-bang, a random command in a quarter of the 4-step blocks.",
     switching(proportional(1.0), 0.25)),
    ("switch_75", "switch", "bang-bang, a random command in three quarters of the 4-step blocks.",
     switching(proportional(1.0), 0.75)),
    ("switch_100", "switch", "a random command every 4 steps.", switching(proportional(1.0), 1.0)),
)]
globals().update({policy.__name__: policy for policy in OTHERS})  # tasks.square:<name> plug-ins
for policy in REFERENCE:
    policy.family = "reference"
POLICIES = {f.__name__: f for f in REFERENCE + tuple(OTHERS)}  # the reference family from most to least skilled, then
# the others family by family (tasks/square.py's docstring; docs/policyeval.md gives their success in the simulator)


def state_success(world, tasks: dict) -> np.ndarray:
    """[B] 1.0 where the square's true centre (the simulator's own state: the `path` of the world that
    simulator(tasks) returns, not its frames) ends in the target box: what policyeval.py holds the judge against."""
    end = np.asarray(world.path, np.float32)[:, -1] + ACTION_SQUARE / 2
    return inside(end, np.asarray(tasks["target"], np.float32)).astype(np.float32)


# ----------------------------------------------------------------------------------------------- run_in_simulator

def run_in_simulator(policy, tasks: dict, chunks: int = 3, seed: int = 0) -> dict:
    """The policy in the simulator for `chunks` chained chunks from the tasks' starts (engine/world.closed_loop, as
    policyeval.py runs it): {"frames": [B, 3, 1 + chunks (FRAMES - 1), H, W] every frame, "success": [chunks, B] the
    judge after each chunk (a task's success: the last row), "positions": [B, chunks*STEPS + 1, 2] the true path,
    "actions": [B, chunks*STEPS, 2]}."""
    world = simulator(tasks)
    info = {"task": tasks, "steps": STEPS, "action_dim": 2, "seed": seed}
    run = closed_loop(world, policy, getattr(policy, "__name__", str(policy)), first_frames(tasks), info, chunks,
                      (len(tasks["start"]), STEPS, 2))
    ends = [1 + k * (FRAMES - 1) for k in range(1, chunks + 1)]
    run["success"] = torch.stack([judge(run["frames"][:, :, :end], info) for end in ends])
    return dict(run, positions=world.path)


# ---------------------------------------------------------------------------------------------- world-model reward

def follows_actions(video, truth) -> torch.Tensor:
    """[B] a world-model reward (--reward tasks.square:follows_actions): minus the mean distance, in 320x180 pixels
    / 100, between the square located in each generated frame and in the same true frame (the truth moved by the
    clip's own actions), a frame where the truth shows it and the sample does not counting 1.6 (half the width)."""
    mine, found = locate(video)
    theirs, there = locate(truth.expand_as(video))
    distance = torch.where(found, (mine - theirs).norm(dim=-1) / 100, 1.6)
    return -torch.where(there, distance, 0.0).sum(1) / there.sum(1).clamp_min(1)
