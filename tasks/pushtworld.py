"""PushT (gym-pusht: pymunk contact physics, pygame drawing) as a world to learn from: its frames, a scripted expert
that plans pushes in a second env, the behaviour families the world model's data is recorded from, and the episode
generator that writes them as a LeRobot v2.1 dataset and stitches it for the tiny action net.

    python -m tasks.pushtworld data/pusht   # data/pusht_lerobot (LeRobot v2.1) -> data/pusht_grid, data/pusht_one

The env is gym-pusht's own (`gym_pusht/PushT-v0`, optional: imported where used): the agent (a blue disc) is driven
by a PD controller towards each action, its target (x, y) in [0, 512]; 10 physics substeps an action, 10 actions a
second. A frame is the env's 512x512 screen area-scaled to SOURCE (96x96, the size of lerobot's pusht port).

Behaviour families (BEHAVIOURS; each episode's is recorded in meta/episodes.jsonl as "behaviour"), one target held
for SEGMENT actions at a time:
  expert         plan(): the target among candidate pushes whose simulated outcome (in a second env set to the
                 same body states) brings the T closest to the goal pose and coverage highest
  expert_random  the expert, with a random target (within 100 of the agent) in RANDOM_SHARE of the segments
  random         a random target within 100 of the agent every segment (random play)
The recorded action is exactly what the env stepped with; observation.state is the agent's position before it.

Contents, top to bottom: the env (make_env, screen, body states, near-goal resets) -> the expert (plan) -> behaviour
families -> episodes -> the dataset (generate, main).
"""
import os
import sys

import numpy as np

import stitch
from base.lerobot_write import write_v21

ENV_ID = "gym_pusht/PushT-v0"
SOURCE = 96  # the dataset's frames: SOURCE x SOURCE, area-scaled from the env's 512x512 screen
FPS = 10  # the env's control rate (metadata["render_fps"])
GOAL = np.array([256.0, 256.0, np.pi / 4])  # gym-pusht's goal pose (x, y, angle) of the T's body
SEGMENT = 8  # actions a behaviour holds one target for (two transitions of the tiny net at stride 4)
RANDOM_SHARE = 0.3  # expert_random's share of random segments
NEAR = (80.0, np.pi / 3, 60.0)  # a near-goal start: T within 80 of the goal and pi/3 of its angle, agent 60+ away
TASK = "Push the T-shaped block onto the green T."
BEHAVIOURS = ("expert", "expert_random", "random")
DATA_SEED = 0  # the data's resets come from env seeds 0, 1, ...; tasks/pusht.py's from 10**6 (seed + 1) on
SUCCESS_COVERAGE = 0.6  # next.success: coverage above it (gym-pusht's own 0.95 is almost never reached from these
# starts within an episode: no successes to learn a value from); next.reward is gym-pusht's (coverage / 0.95, <= 1)
ENV_SUCCESS = 0.95  # gym-pusht's success_threshold: its reward is min(coverage / 0.95, 1)


# -------------------------------------------------------------------------------------------------------- the env

def make_env(pixels: bool = True):
    """gym-pusht's env, unwrapped (its TimeLimit of 300 steps and checkers are not ours to keep): pixels renders the
    512x512 screen at every step (obs["pixels"]), else the state alone (cheap: the planner's)."""
    try:
        import gym_pusht  # noqa: F401  (registers the env)
        import gymnasium
    except ImportError as e:
        raise ImportError(f"PushT needs gym-pusht ({e}): pip install gym-pusht (requirements-dev.txt)") from None
    kwargs = dict(obs_type="pixels_agent_pos", observation_width=512, observation_height=512) if pixels else \
        dict(obs_type="state")
    return gymnasium.make(ENV_ID, render_mode="rgb_array", **kwargs).unwrapped


def screen(obs) -> np.ndarray:
    """[SOURCE, SOURCE, 3] uint8: the 512x512 screen of a pixel observation, area-scaled (each pixel the mean of what
    it covers, so a judge can read areas back from colours)."""
    import cv2  # gym-pusht's own dependency
    return cv2.resize(obs["pixels"], (SOURCE, SOURCE), interpolation=cv2.INTER_AREA)


def body_state(env) -> tuple:
    """The agent's and the T's positions, velocities and the T's angle: what plan() copies into its second env."""
    a, b = env.agent, env.block
    return tuple(a.position), tuple(a.velocity), tuple(b.position), b.angle, tuple(b.velocity), b.angular_velocity


def set_body_state(env, state: tuple) -> None:
    a, b = env.agent, env.block
    a.position, a.velocity, b.position, b.angle, b.velocity, b.angular_velocity = state


def pose_error(env) -> float:
    """Distance of the T's pose from the goal's: pixels plus 60 per radian of angle."""
    angle = (env.block.angle - GOAL[2] + np.pi) % (2 * np.pi) - np.pi
    return float(np.linalg.norm(np.asarray(env.block.position) - GOAL[:2]) + 60 * abs(angle))


def near_goal_seeds(n: int, first: int) -> list:
    """The first n env seeds from `first` on whose reset (gym-pusht's own: agent, T position and angle uniform) puts
    the T near the goal (NEAR) and the agent off it."""
    env, seeds, seed = make_env(pixels=False), [], first
    while len(seeds) < n:
        env.reset(seed=seed)
        block, angle = np.asarray(env.block.position), (env.block.angle - GOAL[2] + np.pi) % (2 * np.pi) - np.pi
        if np.linalg.norm(block - GOAL[:2]) < NEAR[0] and abs(angle) < NEAR[1] and \
                np.linalg.norm(np.asarray(env.agent.position) - block) > NEAR[2]:
            seeds.append(seed)
        seed += 1
    return seeds


# ----------------------------------------------------------------------------------------------------- the expert

def plan(env, planner, sign: int = 1, angles: int = 8) -> np.ndarray:
    """The next target of the expert (sign 1) or of its opposite (-1: pushes the T away): each candidate simulated in
    `planner` (a second env set to env's body states, at half the physics substeps: cheap, approximate) for one or two
    segments, scored by pose_error - 300 x coverage at its end. Candidates: stay; a target through the T's body
    (0 or 50 from it, `angles` directions); a run-up point 80 or 130 from the T, then a push towards it."""
    state, block = body_state(env), np.asarray(env.block.position)
    dirs = [np.array([np.cos(f), np.sin(f)]) for f in np.arange(angles) * 2 * np.pi / angles]
    candidates = [[np.asarray(env.agent.position)]] + [[block + r * d] for r in (0, 50) for d in dirs]
    candidates += [[block + r * d, block + 40 * d] for r in (80, 130) for d in dirs]
    best, target = None, None
    for targets in candidates:
        set_body_state(planner, state)
        for t in targets:
            for _ in range(SEGMENT):
                planner.step(t)
        score = sign * (pose_error(planner) - 300 * planner._get_coverage())
        if best is None or score < best:
            best, target = score, targets[0]
    return np.asarray(target, np.float64)


def new_planner(dt: float = 0.02):
    """plan()'s second env: state only, dt doubled (5 substeps an action instead of 10)."""
    planner = make_env(pixels=False)
    planner.reset(seed=0)
    planner.dt = dt
    return planner


# ---------------------------------------------------------------------------------------------- behaviour families

def random_target(env, rng) -> np.ndarray:
    """A target within 100 of the agent (each coordinate), inside the walls."""
    return np.clip(np.asarray(env.agent.position) + rng.uniform(-100, 100, 2), 20, 492)


def next_target(family: str, env, planner, rng, share: float = RANDOM_SHARE) -> np.ndarray:
    """One segment's target of a behaviour family (BEHAVIOURS, or tasks/pusht.py's: expert_<share>, push_away,
    stand_still, go_to_goal). The coin is drawn whatever the family, so families share their random draws."""
    coin, random = rng.random(), random_target(env, rng)
    if family == "expert" or (family == "expert_random" and coin >= share):
        return plan(env, planner)
    if family in ("expert_random", "random"):
        return random
    if family == "push_away":
        return plan(env, planner, sign=-1)
    if family == "stand_still":
        return np.asarray(env.agent.position, np.float64)
    if family == "go_to_goal":
        return GOAL[:2].copy()
    raise ValueError(f"behaviour {family!r}: one of {BEHAVIOURS + ('push_away', 'stand_still', 'go_to_goal')}")


def play(env, family: str, steps: int, rng, planner=None, share: float = RANDOM_SHARE, pixels: bool = True) -> dict:
    """One episode of a behaviour family from env's current state: {"action": [steps, 2] the targets stepped with,
    "state": [steps, 2] the agent's position before each, "coverage": [steps + 1] info["coverage"] before and after
    each action (the first: computed as the env computes it), "frames": [steps, S, S, 3] the screen before each
    action (pixels only)}."""
    planner = planner or new_planner()
    actions, states, coverage, frames = [], [], [env._get_coverage()], []
    obs = env.get_obs() if pixels else None
    for i in range(steps):
        if i % SEGMENT == 0:
            target = next_target(family, env, planner, rng, share).astype(np.float32)  # as recorded: stepped so
        states.append(np.asarray(env.agent.position, np.float32))
        frames += [screen(obs)] if pixels else []
        obs, _, _, _, info = env.step(target.astype(np.float64))
        actions.append(target)
        coverage.append(info["coverage"])
    out = {"action": np.stack(actions), "state": np.stack(states), "coverage": np.asarray(coverage)}
    return dict(out, frames=np.stack(frames)) if pixels else out


# ------------------------------------------------------------------------------------------------- the dataset

def episodes_plan(n: int, seed: int = DATA_SEED, families=BEHAVIOURS) -> list:
    """[(env seed, family, length)] of n episodes: families in turn, near-goal starts, 104-136 actions (a 3-chunk
    rollout of 9 frames at stride 4 needs 97)."""
    rng = np.random.default_rng([51, seed])
    seeds = near_goal_seeds(n, first=seed * 10 ** 5)
    return [(s, families[i % len(families)], int(rng.integers(13, 18)) * SEGMENT) for i, s in enumerate(seeds)]


def record(plan_row: tuple) -> dict:
    """One planned episode (episodes_plan's row) played from its reset, as write_v21 takes it."""
    env_seed, family, length = plan_row
    env = make_env()
    env.reset(seed=env_seed)
    run = play(env, family, length, np.random.default_rng([52, env_seed]))
    after = run["coverage"][1:, None]  # the coverage after each action: LeRobot's next.* columns
    return {"frames": {"observation.image": run["frames"]}, "task": TASK,
            "columns": {"observation.state": run["state"], "action": run["action"],
                        "next.reward": np.minimum(after / ENV_SUCCESS, 1.0),
                        "next.success": (after > SUCCESS_COVERAGE).astype(np.float32)},
            "extra": {"behaviour": family, "env_seed": env_seed, "max_coverage": float(run["coverage"].max())}}


def generate(out: str, n: int = 60, seed: int = DATA_SEED, families=BEHAVIOURS, workers: int = 1,
             progress=print) -> str:
    """data: out + "_lerobot" (LeRobot v2.1: observation.image, observation.state, action, next.reward, next.success
    (coverage > SUCCESS_COVERAGE after the action; stitch.py keeps each episode's any() as its success flag), each
    episode's behaviour)
    stitched into out + "_grid" (the tiny action net's 9x64x112 clips at stride 4: the one camera in each of the
    grid's three cells, stretched to 32x56) and out + "_one" (the same clips with the camera stretched over the whole
    64x112 frame, `stitch.py --layout one`: a policy's data at 4x the pixels of a cell). workers: processes playing
    episodes (the same episodes, any number). Returns the grid folder."""
    raw, grid = out + "_lerobot", out + "_grid"
    if not os.path.exists(raw):
        rows = episodes_plan(n, seed, families)
        if workers > 1:
            import multiprocessing
            with multiprocessing.get_context("spawn").Pool(workers) as pool:
                episodes = pool.map(record, rows, chunksize=1)
        else:
            episodes = [record(row) for row in rows]
        for i, (row, ep) in enumerate(zip(rows, episodes)):
            progress(f"pushtworld: episode {i + 1}/{n} {row[1]} (env seed {row[0]}): max coverage "
                     f"{ep['extra']['max_coverage']:.2f}")
        write_v21(raw, episodes, FPS, robot_type="pusht",
                  names={"observation.state": ["agent_x", "agent_y"], "action": ["target_x", "target_y"]})
    key = "observation.image"
    for layout in ("grid", "one"):
        stitch.stitch(raw, f"{out}_{layout}", stride=4, frames=9, size="64x112", workers=max(1, workers),
                      fit="stretch", prompt="{task}", cameras=f"ext_1={key},ext_2={key},wrist={key}", layout=layout)
    return grid


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not 1 <= len(args) <= 3 or not all(a.isdigit() for a in args[1:]):
        print("usage: python -m tasks.pushtworld OUT [EPISODES [WORKERS]]  (writes OUT_lerobot, OUT_grid and OUT_one)",
              file=sys.stderr)
        return 2
    print(generate(args[0], *(int(a) for a in args[1:2]), workers=int(args[2]) if len(args) > 2 else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
