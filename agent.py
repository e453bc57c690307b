"""A trained policy run (train.py --objective policy) acting as a policyeval.py policy plug-in: frames, info -> the next
raw action chunk, sampled by policy.py's sampler from the current state, with best-of-N planning by its own value.

    POLICY_RUN=runs/pusht-policy-frames python policyeval.py runs/pusht --task tasks.pusht --policies agent:act
    POLICY_RUN=runs/pusht-policy-frames POLICY_BEST_OF=4 python policyeval.py ...   # 4 candidates, the highest value runs

(a run of a layout without proprio slots: policyeval's world model gives frames only; docs/policy.md trains one).
POLICY_RUN names the run (its newest checkpoint, or one of its step directories), POLICY_BEST_OF the candidates per
chunk (default 1), POLICY_SCORE what ranks them (world_model, the default, or policy), POLICY_EXPLORE the sd of an
offset shifting candidates 1..N-1's actions (default 0: the samples as drawn); all are checked, and the run
loaded strictly, before policyeval builds any model (act.prepare). Agent(run, best_of, score=...) is the same policy
as an object (tests/policy_pusht_numbers.py runs it in gym-pusht directly).

What one call does (docs/policy.md "The plug-in"):
  the current state: the last frame the policy has seen (its grid camera: frames[:, :, -1], at the run's size) and,
  where the layout has proprio slots, info["proprio"] [B, S] in the dataset's units (the task gives it: tasks/pusht.py's
  simulator does, a world model does not), normalised with the run's policy_stats.json;
  N candidates per episode sampled as policy samples (policy.sample: the action, future image, future proprio and
  value generated; the state clean), each episode's noise from (info["seed"], its episode, chunk, candidate) alone;
  N > 1: each candidate scored by its value: score world_model (cosmos-policy's planning) samples it again as a
  world-model sample, its action given, so the future and the value are predicted for that action (a value trained
  on every episode, failures too); score policy reads the value the policy sample generated beside the action;
  the highest-value candidate is kept, its action slot read back (policy.extract) and un-normalised;
  a chunk of info["steps"] actions longer than the run's: the next sub-chunk starts from the kept candidate's own
  predicted future image and proprio (the policy's imagination; no new frame comes until the chunk is played).
"""
import json
import math
import os

import numpy as np
import torch

import policy
from base.actions import ACTION, STATE
from clips import text as text_lib
from engine import build, runs
from engine.objective import sample_seed

RUN_ENV, BEST_OF_ENV, SCORE_ENV, EXPLORE_ENV = "POLICY_RUN", "POLICY_BEST_OF", "POLICY_SCORE", "POLICY_EXPLORE"
SCORES = ("world_model", "policy")  # what ranks best-of-N's candidates (Agent)
STATS = "policy_stats.json"


def run_of(path):
    """The run opened (engine.runs.open_run: its config, newest complete checkpoint, VAE and data checked) and its
    policy_stats.json; one line naming the path when it is not a policy run."""
    if not path:
        raise ValueError(f"{RUN_ENV} is not set: name the train.py --objective policy run to act with "
                         f"({RUN_ENV}=runs/pusht-policy-frames python policyeval.py ... --policies agent:act)")
    run = runs.open_run(path, guidance=0.0)  # the policy sampler uses none
    if run.cfg["objective"] != policy.Policy.NAME:
        raise ValueError(f"{RUN_ENV}={path}: a run of --objective {run.cfg['objective']}, not a policy run (train.py "
                         "--objective policy); a world model is policyeval.py's RUN argument, not a policy")
    stats = os.path.join(run.directory, STATS)
    if not os.path.isfile(stats):
        raise ValueError(f"{RUN_ENV}={path}: no {STATS} (the policy's normalisation, written when it started "
                         "training): not a complete policy run")
    with open(stats, encoding="utf-8") as f:
        return run, json.load(f)


def frame_layout(data):
    """What the run's frames show (stitch.py --layout, from the data folder's RECIPE.json): "grid", or "one" (the
    first camera alone filling the frame); a simulator must render the policy's frames the same way
    (tasks/pusht.run_in_simulator's layout)."""
    recipe = os.path.join(data, "RECIPE.json")
    if not os.path.isfile(recipe):
        return "grid"
    with open(recipe, encoding="utf-8") as f:
        return json.load(f).get("layout", "grid")


def explore_setting(text, score):
    """POLICY_EXPLORE as a float >= 0 (candidates 1..N-1 each shifted by a constant offset of this sd, in the action's
    [-1, 1] units), or one line; only a world-model score judges a shifted chunk (a policy sample's value was made
    beside the unshifted one)."""
    try:
        explore = float(text)
    except ValueError:
        explore = -1.0
    if not explore >= 0:
        raise ValueError(f"{EXPLORE_ENV}={text!r}: the sd of each candidate's action offset, a number >= 0 (0: none)")
    if explore and score != "world_model":
        raise ValueError(f"{EXPLORE_ENV}={text}: shifted candidates need {SCORE_ENV}=world_model (a policy sample's "
                         "value was generated beside the unshifted action)")
    return explore


def best_of_setting(text):
    """POLICY_BEST_OF as an int >= 1, or one line."""
    if not str(text).isdigit() or int(text) < 1:
        raise ValueError(f"{BEST_OF_ENV}={text!r}: the candidate chunks per step, a whole number >= 1 (1: no planning)")
    return int(text)


class Agent:
    """The policy of a train.py policy run: agent(frames [B, 3, T, H, W] in [-1, 1], info) -> raw actions
    [B, info["steps"], A]; its .last_values [B] the kept candidates' values, .last_spread [B] max - min of
    each episode's candidate values (how much best-of-N had to choose from)."""

    family = "cosmos-policy"

    def __init__(self, path, best_of=1, device=None, score="world_model", explore=0.0):
        self.best_of = best_of_setting(best_of)
        if score not in SCORES:
            raise ValueError(f"{SCORE_ENV}={score!r}: {' or '.join(SCORES)} (what ranks the candidates)")
        self.score, self.explore = score, explore_setting(explore, score)
        self.run, self.stats = run_of(path)
        cfg = self.run.cfg
        self.layout = ",".join(kind + (f":{camera}" if camera else "") for kind, camera in self.stats["layout"])
        cameras = {camera for _, camera in self.stats["layout"] if camera}
        if cameras != {"grid"}:
            raise ValueError(f"{RUN_ENV}={path}: layout cameras {sorted(cameras)}; policyeval gives the grid frame "
                             "alone, so the plug-in acts with a grid layout (image:grid) only")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.net = runs.build_from_step(self.run.checkpoint, self.device).to(self.dtype).eval()
        self.vae = build.build_vae(cfg["vae"], cfg["vae_ckpt"], self.device, self.dtype)
        held = self.run.held_out[sorted(self.run.held_out)[0]]  # the prompt: the task's, as train.py embedded it
        self.text = text_lib.clip_text(self.run.dataset, self.run.dataset.videos[held])[0]
        self.kinds = [kind for kind, _ in self.stats["layout"]]
        self.chunk, self.action_dim, self.state_dim = self.stats["chunk"], self.stats["action_dim"], \
            self.stats["state_dim"]
        self.size = (cfg["height"], cfg["width"])
        self.frame_layout = frame_layout(cfg["data"])
        self.last_values = self.last_spread = None

    def limits(self, key):
        return np.asarray(self.stats[key]["min"], np.float32), np.asarray(self.stats[key]["max"], np.float32)

    def proprio(self, info, batch):
        """[B, S] the current proprio, normalised (zeros [B, 0] for a layout without proprio slots)."""
        if "proprio" not in self.kinds:
            return torch.zeros(batch, 0)
        if info.get("proprio") is None:
            raise ValueError(f"the policy's layout has proprio slots ({STATE}), but info has no 'proprio' [B, "
                             f"{self.state_dim}]: this task does not give it (a world model cannot); train a layout "
                             "without proprio for it")
        state = np.asarray(info["proprio"], np.float32)
        if state.shape != (batch, self.state_dim):
            raise ValueError(f"info['proprio'] of shape {state.shape}; the run's {STATE} is [B, {self.state_dim}]")
        return torch.from_numpy(policy.to_unit(state, *self.limits(STATE)))

    def __call__(self, frames, info):
        frames = torch.as_tensor(frames).float()
        B, steps = frames.shape[0], int(info["steps"])
        if tuple(frames.shape[-2:]) != self.size or int(info["action_dim"]) != self.action_dim:
            raise ValueError(f"frames {tuple(frames.shape[-2:])}, action_dim {info['action_dim']}; the policy run was "
                             f"trained at {self.size} with {self.action_dim}-dim actions: another task's run")
        image, proprio = frames[:, :, -1], self.proprio(info, B)
        episodes = np.asarray(info["task"].get("episode", np.arange(B)))
        parts, values, spreads = [], [], []
        for part in range(math.ceil(steps / self.chunk)):
            keys = [(info["seed"], "agent", int(e), int(info["chunk"]), part) for e in episodes]
            action, value, spread, image, proprio = self.plan(image, proprio, keys)
            parts.append(action)
            values.append(value)
            spreads.append(spread)
        self.last_values, self.last_spread = values[0], spreads[0]
        raw = policy.from_unit(torch.cat(parts, 1)[:, :steps].numpy(), *self.limits(ACTION))
        return torch.from_numpy(raw)

    @torch.no_grad()
    def plan(self, image, proprio, keys):
        """One sub-chunk for every episode: (actions [B, chunk, A] normalised, the kept values [B], the candidates'
        value spread [B], the kept candidates' future image [B, 3, H, W] and future proprio [B, S])."""
        B, N, kinds = image.shape[0], self.best_of, self.kinds
        blank = torch.zeros(self.chunk * self.action_dim)
        items = [{"image:grid": image[b], "future_image:grid": torch.zeros_like(image[b]), "action": blank,
                  "proprio": proprio[b], "future_proprio": torch.zeros_like(proprio[b]), "value": torch.zeros(1),
                  "text_emb": self.text} for b in range(B) for _ in range(N)]
        x0 = policy.encode_batch(self.vae, items, self.layout, self.device, self.dtype)
        cond = policy.condition_of(items, x0, self.layout, ["policy"] * len(items), self.device, self.dtype)
        pred = policy.sample(self.net, cond, self.noise(keys, N, x0))
        if N > 1 and self.explore:  # candidates 1..N-1 shifted: the policy's samples of one state barely differ
            slot, width = kinds.index("action"), self.chunk * self.action_dim
            shifted = policy.extract(pred[:, :, slot].float(), width).view(B * N, self.chunk, self.action_dim)
            shifted = (shifted + self.offsets(keys, N)[:, None].to(shifted.device)).clamp(-1, 1)
            pred[:, :, slot] = policy.inject(shifted.flatten(1), (pred.shape[1], *pred.shape[3:])).to(pred.dtype)
        if N > 1 and self.score == "world_model":  # cosmos-policy's planning: each candidate's action given, the
            # future and the value predicted again (a world-model sample: its value trained on every episode)
            cond = policy.condition_of(items, pred, self.layout, ["world_model"] * len(items), self.device, self.dtype)
            pred = policy.sample(self.net, cond, self.noise([(*k, "score") for k in keys], N, x0))
        pred = pred.float()
        value = policy.extract(pred[:, :, kinds.index("value")], 1).view(B, N).cpu()
        pick = (value.argmax(1) + torch.arange(B) * N).to(pred.device)  # each episode's highest-value candidate
        action = policy.extract(pred[pick][:, :, kinds.index("action")], self.chunk * self.action_dim).cpu()
        future = policy.slot_image(self.vae, pred[pick], kinds.index("future_image")).cpu().clamp(-1, 1)
        proprio = policy.extract(pred[pick][:, :, kinds.index("future_proprio")], proprio.shape[1]).cpu() \
            if proprio.shape[1] else proprio
        return (action.clamp(-1, 1).view(B, self.chunk, self.action_dim), value.max(1).values,
                value.max(1).values - value.min(1).values, future, proprio)

    def offsets(self, keys, n):
        """[len(keys) n, A] each candidate's action offset (sd self.explore; candidate 0 none), from its key alone."""
        draws = [torch.randn((n, self.action_dim), generator=torch.Generator().manual_seed(sample_seed(*k, "explore")))
                 for k in keys]
        return torch.cat([d * torch.arange(n).clamp(max=1)[:, None] for d in draws]) * self.explore

    def noise(self, keys, n, x0):
        """[len(keys) n, ...] unit noise: n draws per key, from the key alone (not from the batch it shares)."""
        return torch.cat([torch.randn((n, *x0.shape[1:]), generator=torch.Generator().manual_seed(sample_seed(*k)))
                          for k in keys]).to(self.device, x0.dtype)


_AGENTS = {}  # (run, best_of, score, explore) -> Agent: loaded once per process


def prepare():
    """The agent of POLICY_RUN / POLICY_BEST_OF, loaded now (policyeval.py calls it before any model is built)."""
    key = (os.environ.get(RUN_ENV, ""), os.environ.get(BEST_OF_ENV, "1"), os.environ.get(SCORE_ENV, SCORES[0]),
           os.environ.get(EXPLORE_ENV, "0"))
    if key not in _AGENTS:
        _AGENTS[key] = Agent(key[0], key[1], score=key[2], explore=key[3])
    return _AGENTS[key]


def prepare_for_policyeval():
    """prepare(), and a proprio layout refused in one line: policyeval runs the policy in the world model too, whose
    rollouts have frames only (no info["proprio"]); tasks/pusht.py's run_in_simulator gives it, and calls act alone."""
    agent = prepare()
    if agent.frame_layout != "grid":
        raise ValueError(f"{RUN_ENV}={agent.run.path}: trained on a stitch.py --layout {agent.frame_layout} folder "
                         f"({agent.run.cfg['data']}), and policyeval's world model gives grid frames; train the policy on "
                         "the grid folder for it (tasks/pusht.run_in_simulator(layout=...) runs this one)")
    if "proprio" in agent.kinds:
        raise ValueError(f"{RUN_ENV}={agent.run.path}: its layout ({agent.layout}) has proprio slots, and policyeval's "
                         "world model gives frames only; train the policy for it with a layout without them, e.g. "
                         "--policy-layout blank,image:grid,action,future_image:grid,value (docs/policy.md)")
    return agent


def act(frames, info):
    """policyeval.py's policy plug-in (`--policies agent:act`): the POLICY_RUN run's chunk (Agent)."""
    return prepare()(frames, info)


act.prepare, act.family = prepare_for_policyeval, Agent.family
