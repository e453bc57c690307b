"""The synthetic action world's motion (make_synthetic(motion="actions")): a square moved by each frame's action,
the actions drawn from named behaviour families (BEHAVIOURS) so that policies of many kinds act inside the data a
world model learns from (issue 51; docs/actions.md "The tiny action world's data").

Contents, top to bottom: the square and the command range -> the families -> square_commands.
"""
import numpy as np

# motion="actions": a plain frame, the square alone. Measured with the tiny codec (32x56 camera cells of the 64x112
# grid, 9 frames at stride 4; codec reconstruction of the truth against that of the same first frame moved by another
# episode's commands: the action_gap_db a perfect model would score): with the bit bands and the 24-pixel square, 0.36
# dB (the codec blurs the clock's 10 changing bits, which dominate the error); a plain frame, 2.1 dB at 24 pixels, 4.5
# dB at 48. The bit bands also name the episode and frame, so a net could recall a training clip's motion from its
# first frame alone instead of reading the actions. A 64-pixel square is what a tiny net learns to follow on a CPU
# (docs/actions.md "Measured").
ACTION_SQUARE = 64  # pixels of 320x180: about 11x11 pixels of a 32x56 camera cell, about one codec cell
SQUARE_RANGE = ((0, 320 - ACTION_SQUARE), (0, 180 - ACTION_SQUARE))  # the square's top-left corner (x, y) stays inside
COMMAND_HOLD = (8, 61)  # frames a held command holds: [low, high)
COMMAND_DX, COMMAND_DY = (-8, -4, 0, 4, 8), (-4, 0, 4)  # tasks/square.py's reference commands; their range bounds all
RATE_MAX = np.array([max(COMMAND_DX), max(COMMAND_DY)], np.float64)  # |dx|, |dy| in 320x180 pixels a frame
QUANTUM = 1 / 64  # commands are multiples of it: positions stay exact in float32, so the motion IS the action

# The behaviour families of the synthetic action world (issue 51): each episode's actions come from one, in turn
# (episode e: BEHAVIOURS[e % n] of those kept), so that a policy of any of these kinds acts inside the data.
BEHAVIOURS = {
    "held": "a command of any magnitude within the range (half the time a reference command), held 8-60 frames",
    "rate": "continuous rates: the command ramps linearly between random commands 16-60 frames apart",
    "pause": "still for 8-60 frames, then a held command for 8-40, in turn",
    "switch": "a new random command every 2-8 frames (changes inside a chunk)",
    "noisy": "a held command plus Gaussian noise of 0.5-4 pixels a frame (per episode)",
    "goal": "goal-directed: towards random goals at a gain of 0.03-0.5 a frame, or at full rate (bang-bang)",
    "walk": "a random walk of the rate: +N(0, 1) pixels a frame each frame",
}


def check_behaviours(without) -> tuple:
    """The families kept once `without` (names of BEHAVIOURS) are left out; one line for an unknown name."""
    unknown = [name for name in without if name not in BEHAVIOURS]
    if unknown or len(set(without)) >= len(BEHAVIOURS):
        raise ValueError(f"behaviours without {list(without)}: " + (f"unknown {unknown}" if unknown else "none left")
                         + f"; the families are {', '.join(BEHAVIOURS)}")
    return tuple(name for name in BEHAVIOURS if name not in without)


def episode_behaviour(episode: int, without=()) -> str:
    """The behaviour family of episode `episode`: the kept families in turn."""
    kept = check_behaviours(without)
    return kept[episode % len(kept)]


def random_command(rng) -> np.ndarray:
    """(dx, dy): half the time one of the reference commands (COMMAND_DX x COMMAND_DY, the range's ends and zero
    among them: a policy at full rate is common), else any value within the range."""
    if rng.random() < 0.5:
        return np.array([rng.choice(COMMAND_DX), rng.choice(COMMAND_DY)], np.float64)
    return rng.uniform(-RATE_MAX, RATE_MAX)


def held_segments(rng, length: int, hold=None, pause=None) -> np.ndarray:
    """[length, 2] commands held for `hold` frames each (default COMMAND_HOLD); with pause=(lo, hi), a still stretch
    before each."""
    out, i, hold = np.zeros((length, 2)), 0, hold or COMMAND_HOLD
    while i < length:
        if pause is not None:
            i += int(rng.integers(*pause))
        n = int(rng.integers(*hold))
        out[i: i + n] = random_command(rng)
        i += n
    return out


def planned_commands(behaviour: str, rng, length: int) -> np.ndarray | None:
    """[length, 2] the commands of an open-loop family (before the borders cut them); None for "goal"."""
    if behaviour == "held":
        return held_segments(rng, length)
    if behaviour == "pause":
        return held_segments(rng, length, hold=(8, 41), pause=(8, 61))
    if behaviour == "switch":
        return held_segments(rng, length, hold=(2, 9))
    if behaviour == "noisy":
        return held_segments(rng, length) + rng.normal(0, rng.uniform(0.5, 4), (length, 2))
    if behaviour == "rate":
        knots = np.cumsum(rng.integers(16, 61, length // 16 + 2))
        values = np.stack([random_command(rng) for _ in range(len(knots) + 1)])
        at = np.concatenate([[0], knots])
        return np.stack([np.interp(np.arange(length), at, values[:, k]) for k in range(2)], 1)
    if behaviour == "walk":
        return np.cumsum(rng.normal(0, 1, (length, 2)), 0) + random_command(rng)
    return None


def orbit_command(pos) -> np.ndarray:
    """motion="orbit": the command at a position, an expert's: a clockwise turn around the centre of SQUARE_RANGE
    (dx from the height above or below it, dy from the distance left or right), rounded to COMMAND_DX x COMMAND_DY.
    A function of the position alone, so a policy can read it off one frame (the tiny policy's data, policy.py)."""
    (x_lo, x_hi), (y_lo, y_hi) = SQUARE_RANGE
    dx = -(pos[1] - (y_lo + y_hi) / 2) / ((y_hi - y_lo) / 2) * max(COMMAND_DX)
    dy = (pos[0] - (x_lo + x_hi) / 2) / ((x_hi - x_lo) / 2) * max(COMMAND_DY)
    return np.array([min(COMMAND_DX, key=lambda c: abs(c - dx)), min(COMMAND_DY, key=lambda c: abs(c - dy))], float)


def square_commands(episode: int, length: int, without=(), orbit: bool = False) -> tuple:
    """motion="actions": (position [length, 2], action [length, 2]) float32 in 320x180 pixels of episode `episode`,
    its family episode_behaviour(episode, without); orbit (motion="orbit"): the same start, every command
    orbit_command's. Every command is clipped to +-RATE_MAX and rounded to QUANTUM,
    then cut where the square would leave SQUARE_RANGE, so that position[i+1] = position[i] + action[i] holds exactly:
    the motion IS the action (the last one leads nowhere). Seeded by the episode alone."""
    behaviour = episode_behaviour(episode, without)
    rng = np.random.default_rng([51, episode])
    (x_lo, x_hi), (y_lo, y_hi) = SQUARE_RANGE
    low, high = np.array((x_lo, y_lo), np.float64), np.array((x_hi, y_hi), np.float64)
    pos, act = np.zeros((length, 2)), np.zeros((length, 2))
    pos[0] = rng.integers(x_lo, x_hi + 1), rng.integers(y_lo, y_hi + 1)
    planned = planned_commands(behaviour, rng, length)
    goal, gain, until = pos[0], 0.0, 0  # "goal": the current goal, its gain (1e9: bang-bang), when it is redrawn
    for i in range(length):
        if planned is None and (i >= until or np.abs(goal - pos[i]).max() < 2):
            goal, until = rng.uniform(low, high), i + int(rng.integers(30, 91))
            gain = 1e9 if rng.random() < 0.5 else rng.uniform(0.03, 0.5)
        command = orbit_command(pos[i]) if orbit else planned[i] if planned is not None else gain * (goal - pos[i])
        command = np.round(np.clip(command, -RATE_MAX, RATE_MAX) / QUANTUM) * QUANTUM
        target = np.clip(pos[i] + command, low, high)
        act[i] = target - pos[i]
        if i + 1 < length:
            pos[i + 1] = target
    return pos.astype(np.float32), act.astype(np.float32)
