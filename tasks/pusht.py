"""PushT as a task for policyeval.py (`--task tasks.pusht`): gym-pusht's env is the true simulator (a world nobody
here wrote: pymunk contact physics, pygame drawing), a judge reads the T's coverage of the goal from the frames, and
reference policies of graded skill, some of families absent from the world model's data (tasks/pushtworld.py).

The world model is the tiny action net trained on tasks/pushtworld.py's data: PushT's one camera (96x96) stretched
into each of the grid's three camera cells (32x56 of the 64x112 grid; bottom-right black, as stitch.py writes every
grid), 9 frames at stride 4: a chunk is STEPS = 32 actions (3.2 s), each the agent's target (x, y) in [0, 512].

Why short pushes from near the goal: from gym-pusht's own resets (T anywhere, any angle) the greedy expert here often
never touches the goal, and a 300-step rollout is 10 chunks of a world model that drifts every chunk. So tasks are the env's seeded resets whose T starts
near the goal (pushtworld.NEAR: within 80 px and 60 degrees), 3 chunks (96 actions, 9.6 s): long enough for the
expert to push the T onto the goal, short enough for the world model, and graded policies differ within it.

Score: the judge's max coverage over the episode's frames after the start (success > 0.95 is too strict to rank on).

A frame is the grid (LAYOUTS: the world model's) or, for a policy trained on the camera alone at the frame's whole
resolution (`stitch.py --layout one`: pushtworld.generate's `_one` folder), that camera stretched over all 64x112:
run_in_simulator(layout="one") renders and judges those.

Policies plan from the true start state (info["task"]["reset_seed"]: the env's reset seed) in a state-only copy of the
env and do not read the frames: their actions are the same in the world model and the simulator, so the ranking tests
the world model's prediction of what the actions do, not a frame-reading policy's reaction to its errors. A policy of
yours may read the frames ([B, 3, T, H, W] in [-1, 1], as the net sees them) instead.

Contents, top to bottom: tasks -> frames (render, first_frames, simulator) -> judge (coverage) -> policies ->
run_in_simulator.
"""
import subprocess

import numpy as np
import torch

import stitch
from base.video import ffmpeg_exe
from engine.world import closed_loop
from tasks import pushtworld
from tasks.pushtworld import SOURCE, make_env, near_goal_seeds, screen

STRIDE, FRAMES, HEIGHT, WIDTH = 4, 9, 64, 112  # pushtworld.generate's stitch: the tiny action net's clips
STEPS = (FRAMES - 1) * STRIDE  # actions in a chunk: tiny-action's action_dim 64 = STEPS x 2
CHUNKS = 3  # policyeval.py --chunks 3 (its default)
AGENT_RADIUS = 15.0  # gym-pusht's agent disc, in 512-pixel units
# gym-pusht draws the T with a 4-pixel outline centred on its edges: the drawn T is 2 px wider than the T whose
# coverage the env computes, so green reads hide more goal than the T covers, most where much of the T's edge lies on
# the goal (coverage neither 0 nor 1). coverage() subtracts OUTLINE x c (1 - c), c the uncorrected reading: fitted
# once by least squares on every frame of expert, random_play and go_to_goal from sample_tasks(8, 1) against the env's
# info["coverage"]; held to other tasks by tests/test_pusht.py and tests/pusht_numbers.py (docs/policyeval.md)
OUTLINE = 0.27
LAYOUTS = ("grid", "one")  # the frames rendered: stitch.py's 2x2 grid, or --layout one (the camera fills the frame)


# ------------------------------------------------------------------------------------------------------------ tasks

def sample_tasks(n: int, seed: int) -> dict:
    """n near-goal starts (pushtworld.near_goal_seeds from env seed 10**6 (seed + 1) on: never the data's seeds):
    {"reset_seed": [n] the env seeds, "episode": [n], "start_coverage": [n] info["coverage"] at the start}."""
    seeds = near_goal_seeds(n, first=10 ** 6 * (seed + 1))
    env, start = make_env(pixels=False), []
    for s in seeds:
        env.reset(seed=s)
        start.append(env._get_coverage())
    return {"reset_seed": np.array(seeds), "episode": np.arange(n), "start_coverage": np.array(start)}


# ----------------------------------------------------------------------------------------------------------- frames

def cells(layout: str = "grid") -> list:
    """[(top, left, height, width)] of the camera's copies in a frame of `layout` (LAYOUTS): the grid's three cells
    (bottom-right black), or the whole frame."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: one of {LAYOUTS} (stitch.py --layout)")
    h, w = HEIGHT // 2, WIDTH // 2
    return [(0, 0, h, w), (0, w, h, w), (h, 0, h, w)] if layout == "grid" else [(0, 0, HEIGHT, WIDTH)]


def grid_graph(layout: str = "grid") -> str:
    """stitch.episode_command's filters for one 96x96 camera in the grid's three cells: converted to yuv420p (the
    dataset's H.264 did that), stretched into a 32x56 cell by stitch.cell_filter, stacked as the grid; layout "one":
    stretched over the whole frame."""
    _, _, h, w = cells(layout)[0]
    cell = stitch.cell_filter((SOURCE, SOURCE), (h, w), "stretch")
    if layout == "one":
        return f"[0:v]format=yuv420p,{cell}[grid]"
    return (f"[0:v]format=yuv420p,{cell},split=3[a][b][c];[a][b]hstack[top];[c]pad={w * 2}:{h}:0:0:black[bottom];"
            "[top][bottom]vstack[grid]")


def render(screens_N_S_S_3, layout: str = "grid") -> torch.Tensor:
    """[N, 3, HEIGHT, WIDTH] float32 in [-1, 1]: these 96x96 screens as the stitched grid (or layout) shows them
    decoded, less the two H.264 passes, through stitch.py's own filters in the bundled ffmpeg (tasks/square.py's
    render says why)."""
    screens = np.ascontiguousarray(screens_N_S_S_3, np.uint8)
    args = [ffmpeg_exe(), "-hide_banner", "-nostdin", "-nostats", "-loglevel", "error", "-f", "rawvideo", "-pix_fmt",
            "rgb24", "-s", f"{SOURCE}x{SOURCE}", "-framerate", "10", "-i", "pipe:0", "-filter_complex", grid_graph(layout),
            "-map", "[grid]", "-fps_mode", "passthrough", "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1"]
    proc = subprocess.run(args, input=screens.tobytes(), capture_output=True, check=False)  # rc checked below
    want = len(screens) * HEIGHT * WIDTH * 3
    if proc.returncode != 0 or len(proc.stdout) != want:
        raise RuntimeError(f"render: ffmpeg rc {proc.returncode} gave {len(proc.stdout)} bytes, expected {want}: "
                           + " | ".join(proc.stderr.decode(errors="replace").strip().splitlines()[-3:]))
    grids = np.frombuffer(proc.stdout, np.uint8).reshape(len(screens), HEIGHT, WIDTH, 3)
    return torch.from_numpy(grids.copy()).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)


def grab(env) -> np.ndarray:
    """The env's screen now (pushtworld.screen), from a state-only env: rendered only when a frame is kept."""
    env.obs_type = "pixels_agent_pos"
    try:
        return screen(env.get_obs())
    finally:
        env.obs_type = "state"


def reset_envs(tasks: dict) -> list:
    envs = [make_env(pixels=True) for _ in tasks["reset_seed"]]
    for env, seed in zip(envs, tasks["reset_seed"]):
        env.obs_type = "state"  # made with 512x512 pixels; grab() renders them
        env.reset(seed=int(seed))
    return envs


def first_frames(tasks: dict, layout: str = "grid") -> torch.Tensor:
    """[B, 3, 1, H, W]: the tasks' start frames, where the world model and the simulator both begin."""
    return render(np.stack([grab(env) for env in reset_envs(tasks)]), layout)[:, :, None]


def simulator(tasks: dict, layout: str = "grid"):
    """gym-pusht's env as a step function for engine/world.closed_loop: step(actions [B, S, A], chunk) steps each
    episode's env with the targets actions[..., :2] and returns the chunk's frames [B, 3, S/STRIDE + 1, H, W] (frame
    j: after j*STRIDE actions). Its .coverage: info["coverage"] after every action so far, [B, n] (column 0: the
    start's); its .proprio: [B, 2] the agents' positions now (the data's observation.state), updated in place after
    each chunk (run_in_simulator hands it to the policy as info["proprio"]). layout: the frames' (LAYOUTS)."""
    envs = reset_envs(tasks)

    def agents():
        return np.array([np.asarray(env.agent.position) for env in envs], np.float32).reshape(len(envs), 2)

    def advance(raw_actions, chunk):
        actions = np.asarray(raw_actions, np.float64)[:, :, :2]
        if actions.shape[1] % STRIDE:
            raise ValueError(f"simulator: {actions.shape[1]} actions are not whole transitions of stride {STRIDE}")
        screens, coverage = [], []
        for env, targets in zip(envs, actions):
            kept, row = [grab(env)], []
            for i, target in enumerate(targets, 1):
                row.append(env.step(target)[4]["coverage"])
                kept += [grab(env)] if i % STRIDE == 0 else []
            screens.append(np.stack(kept))
            coverage.append(row)
        advance.coverage = np.concatenate([advance.coverage, np.array(coverage)], 1)
        advance.proprio[:] = agents()
        frames = render(np.concatenate(screens), layout)
        return frames.view(len(envs), -1, 3, HEIGHT, WIDTH).permute(0, 2, 1, 3, 4)
    advance.coverage, advance.proprio = np.asarray(tasks["start_coverage"], np.float64)[:, None], agents()
    return advance


# ------------------------------------------------------------------------------------------------------------ judge

_GOAL_GREEN = {}  # the greenness of the goal alone, per layout (computed once)


def greenness(frames_B_3_T_H_W) -> torch.Tensor:
    """[B, T, H, W] G - (R + B) / 2 in 0-255 units: 94 on the goal's LightGreen, 0 on white, the walls' grey and the
    T's slate grey (fill and outline), negative on the agent's blue; area-scaling mixes it linearly."""
    rgb = (torch.as_tensor(frames_B_3_T_H_W).detach().float().cpu() + 1) * 127.5
    return rgb[:, 1] - (rgb[:, 0] + rgb[:, 2]) / 2


def goal_greenness(layout: str = "grid") -> torch.Tensor:
    """[H, W] the greenness of a frame showing the goal alone (T and agent moved off the screen): each pixel's share
    of the goal, x 94."""
    if layout not in _GOAL_GREEN:
        env = make_env(pixels=True)
        env.reset(seed=0)
        env._set_state(np.array([-2000, -2000, -1000, -1000, 0.0]))  # sets the bodies and steps the space (its
        # shapes' cached vertices move with it; setting positions alone would draw them where they were)
        _GOAL_GREEN[layout] = greenness(render(screen(env.get_obs())[None], layout)[:, :, None])[0, 0]
    return _GOAL_GREEN[layout]


def coverage(frames_B_3_T_H_W, layout: str = "grid") -> torch.Tensor:
    """[B, T] the T's coverage of the goal read from the frames, per camera cell (cells(layout)) then averaged: c = 1 -
    the goal's visible green / the goal's green, both summed outside the agent (where the goal cannot be seen; the
    agent is found as the blue B - (R + G) / 2's centroid, masked with its radius + 1.5 pixels), less the outline's
    share OUTLINE x c (1 - c)."""
    frames = torch.as_tensor(frames_B_3_T_H_W).detach().float().cpu()
    if frames.ndim != 5 or (frames.shape[1], *frames.shape[3:]) != (3, HEIGHT, WIDTH):
        raise ValueError(f"coverage: frames of shape {tuple(frames.shape)}, expected [B, 3, T, {HEIGHT}, {WIDTH}]")
    goal, green = goal_greenness(layout), greenness(frames)
    rgb = (frames + 1) * 127.5
    blue = ((rgb[:, 2] - (rgb[:, 0] + rgb[:, 1]) / 2 - 30) / 60).clamp(0, 1)  # [B, T, H, W]
    readings = []
    for y, x, h, w in cells(layout):
        rows, cols = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
        radius = torch.tensor([AGENT_RADIUS * w / 512 + 1.5, AGENT_RADIUS * h / 512 + 1.5])
        weight, g = blue[..., y: y + h, x: x + w], green[..., y: y + h, x: x + w]
        mass = weight.sum((-2, -1)).clamp_min(1e-6)
        cx, cy = (weight * cols).sum((-2, -1)) / mass, (weight * rows).sum((-2, -1)) / mass
        inside = ((cols - cx[..., None, None]) / radius[0]) ** 2 + ((rows - cy[..., None, None]) / radius[1]) ** 2
        keep = ((inside > 1) | (weight.sum((-2, -1)) < 0.5)[..., None, None]).float()
        seen = (g * keep).sum((-2, -1)) / (goal[y: y + h, x: x + w] * keep).sum((-2, -1)).clamp_min(1e-6)
        readings.append(1 - seen)
    seen = torch.stack(readings).mean(0).clamp(0, 1)
    return seen - OUTLINE * seen * (1 - seen)


def judge(frames_B_3_T_H_W, info: dict) -> torch.Tensor:
    """[B] the max coverage read from the frames after the start (coverage; info["layout"] the frames', grid when
    absent): policyeval's success, in [0, 1]."""
    return coverage(frames_B_3_T_H_W[:, :, 1:], info.get("layout", "grid")).amax(1)


# --------------------------------------------------------------------------------------------------------- policies

_PLANS = {}  # (family, share, reset seed) -> the actions planned so far [n, 2]: each policy plans once per process
FAMILIES = {"expert": ("expert", 0.0), "expert_25": ("expert_random", 0.25), "expert_60": ("expert_random", 0.6),
            "random_play": ("random", 0.0), "go_to_goal": ("go_to_goal", 0.0), "stand_still": ("stand_still", 0.0),
            "push_away": ("push_away", 0.0)}  # policy -> (pushtworld.next_target's family, its random share)
ABSENT = ("go_to_goal", "stand_still", "push_away")  # families absent from the world model's data


def plan_episode(key: tuple) -> np.ndarray:
    """[steps, 2] the targets of (family, share, reset seed, steps): the family played in a state-only env from the
    reset, its random draws seeded by the reset seed alone (expert_25 randomises a subset of expert_60's segments)."""
    family, share, seed, steps = key
    env = make_env(pixels=False)
    env.reset(seed=int(seed))
    return pushtworld.play(env, family, steps, np.random.default_rng([53, int(seed)]), share=share,
                           pixels=False)["action"]


def prefetch(tasks: dict, steps: int, workers: int, names=tuple(FAMILIES)) -> None:
    """Plan these policies' episodes in `workers` processes now (the same plans as planned() makes one by one)."""
    import multiprocessing
    keys = [(*FAMILIES[n], int(s), steps) for n in names for s in tasks["reset_seed"]]
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        for key, actions in zip(keys, pool.map(plan_episode, keys, chunksize=1)):
            _PLANS[key[:3]] = actions


def planned(name: str, info: dict) -> torch.Tensor:
    """[B, steps, action_dim] chunk info["chunk"] of policy `name`'s plan (FAMILIES: pushtworld.next_target, one
    target every SEGMENT actions) from each episode's true start state (plan_episode)."""
    steps, action_dim, chunk = info["steps"], info["action_dim"], info["chunk"]
    if action_dim < 2 or steps % pushtworld.SEGMENT:
        raise ValueError(f"info: steps {steps}, action_dim {action_dim}; PushT's targets need action_dim >= 2 and "
                         f"steps in whole segments of {pushtworld.SEGMENT}")
    need, out = (chunk + 1) * steps, np.zeros((len(info["task"]["reset_seed"]), steps, action_dim), np.float32)
    for b, seed in enumerate(info["task"]["reset_seed"]):
        key = (*FAMILIES[name], int(seed))
        if len(_PLANS.get(key, ())) < need:
            _PLANS[key] = plan_episode((*key, max(need, CHUNKS * steps)))
        out[b, :, :2] = _PLANS[key][chunk * steps: need]
    return torch.from_numpy(out)


def expert(frames, info: dict) -> torch.Tensor:
    """The planner every segment (a family in the data)."""
    return planned("expert", info)


def expert_25(frames, info: dict) -> torch.Tensor:
    """The planner, a random target in a quarter of the segments (the data's expert_random holds 0.3)."""
    return planned("expert_25", info)


def expert_60(frames, info: dict) -> torch.Tensor:
    """The planner, a random target in 60% of the segments."""
    return planned("expert_60", info)


def random_play(frames, info: dict) -> torch.Tensor:
    """A random target within 100 of the agent every segment (a family in the data)."""
    return planned("random_play", info)


def go_to_goal(frames, info: dict) -> torch.Tensor:
    """Drives the agent straight to the goal's centre and stays there (a family absent from the data)."""
    return planned("go_to_goal", info)


def stand_still(frames, info: dict) -> torch.Tensor:
    """Holds the agent where it starts (absent from the data): the T stays at its start coverage."""
    return planned("stand_still", info)


def push_away(frames, info: dict) -> torch.Tensor:
    """The planner turned round: the push that takes the T farthest from the goal (absent from the data)."""
    return planned("push_away", info)


POLICIES = {f.__name__: f for f in (expert, expert_25, expert_60, random_play, go_to_goal, stand_still, push_away)}


# ----------------------------------------------------------------------------------------------- run_in_simulator

def run_in_simulator(policy, tasks: dict, chunks: int = CHUNKS, seed: int = 0, steps: int = STEPS,
                     layout: str = "grid") -> dict:
    """The policy in the simulator for `chunks` chunks of `steps` actions from the tasks' starts
    (engine/world.closed_loop, as policyeval.py runs it; info["proprio"]: the agents' positions now):
    {"frames": [B, 3, 1 + chunks steps / STRIDE, H, W], "actions": [B, chunks*steps, 2], "coverage": [B,
    chunks*steps + 1] the env's info["coverage"], "success": [B] the judge's max coverage}. layout: the frames the
    policy sees and the judge reads (LAYOUTS; "one" for a policy trained on a `stitch.py --layout one` folder)."""
    world = simulator(tasks, layout)
    info = {"task": tasks, "steps": steps, "action_dim": 2, "seed": seed, "proprio": world.proprio, "layout": layout}
    run = closed_loop(world, policy, getattr(policy, "__name__", str(policy)), first_frames(tasks, layout), info, chunks,
                      (len(tasks["reset_seed"]), steps, 2))
    return dict(run, coverage=world.coverage, success=judge(run["frames"], info))
