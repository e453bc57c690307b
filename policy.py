"""Cosmos-Policy (NVlabs/cosmos-policy): the unchanged Predict2 video DiT as a visuomotor policy, trained by latent
frame injection. train.py runs it as the `policy` objective (--policy-* flags); docs/policy.md has the whole story.

One sample is one latent video whose latent frames are slots (a layout: LAYOUTS, or your own comma list):
  image slots (image:CAM, future_image:CAM) are 4 copies of the camera's image in pixel space, one latent frame of
  the VAE (slot 0 is always the blank first frame: the VAE codes frame 0 alone); proprio, action and value slots are
  blank frames whose latent frame is overwritten by the min-max normalised vector ([-1, 1] per dimension, the
  dataset's statistics) tiled to fill C x H x W, cut at the end (inject); reading one back averages the full copies
  (extract). The value is the Monte-Carlo return at the future step (success at the episode's end, gamma), in [-1, 1].
Which slots are clean decides what a sample trains (GENERATED): a policy sample generates the action, the future state
and the value; a world-model sample also conditions on the action; a value sample generates the value alone. The
loss is Predict2's velocity loss (nets/edm.py's denoiser) on the generated slots only, at the hybrid noise draw
(draw_sigma); the sampler runs sigma 80 -> 4 in 4 Adams-Bashforth steps plus a clean pass, no guidance (sample).

Contents, top to bottom: config and layouts -> inject / extract -> data (a stitched folder with actions) -> the
batch -> loss and sampler -> held-out evaluation -> Policy, the objective train.py calls.
"""
import json
import math
import os
from dataclasses import dataclass, fields, replace

import numpy as np
import torch

from base import collectives
from base.collectives import ranks_any
from base.inits import get_config
from base.actions import ACTION, STATE, STATS_FILE, action_file, checked_stats, read_arrays
from base.files import write_atomic
from base.video import read_clip
from clips import text as text_lib
from clips.data import VIEW_ORDER, GridClips, ViewClips
from clips.tiny import make_tiny_dataset
from condition import from_batch
from engine.objective import clip_and_step, sample_seed
from engine.rl import unused_rl_flags
from nets import edm
from nets.family import family_of
from sft import lr_at, nonfinite_fields

# -----------------------------------------------------------------------------
# Config and layouts

LAYOUTS = {  # cosmos-policy's LIBERO (9 latent frames) and RoboCasa (11) layouts, and the CPU's tiny one. Cameras:
    # `grid` (a grid folder's frame) or a views folder's slots (stitch.py --layout views: ext_1, ext_2, wrist)
    "tiny": "blank,proprio,image:grid,action,future_proprio,future_image:grid,value",
    "libero": "blank,proprio,image:wrist,image:ext_1,action,future_proprio,future_image:wrist,future_image:ext_1,value",
    "robocasa": "blank,proprio,image:wrist,image:ext_1,image:ext_2,action,future_proprio,future_image:wrist,"
                "future_image:ext_1,future_image:ext_2,value",
}
KINDS = ("blank", "proprio", "image", "action", "future_proprio", "future_image", "value")
SAMPLE_TYPES = ("policy", "world_model", "value")
GENERATED = {"policy": {"action", "future_proprio", "future_image", "value"},  # the rest is clean conditioning
             "world_model": {"future_proprio", "future_image", "value"},
             "value": {"value"}}
LOGNORMAL_P, LOG_MEAN, LOG_SD, UNIFORM = 0.7, math.log(4.0), 1.2, (1.0, 85.0)  # cosmos-policy's training sigmas
SAMPLE_SIGMAS = (80.0, 4.0)  # the policy sampler's first and last noise level
TINY_DATA = "data/tiny_policy_grid"  # recipes/tiny_policy.py's folder: squares an expert steers (make_tiny_dataset)


@dataclass(frozen=True)
class PolicyConfig:
    """Cosmos-Policy's knobs (--policy-*); the optimizer and schedule are TrainConfig's (--lr, --warmup, ...)."""
    layout: str = "tiny"  # tiny | libero | robocasa | a comma list of slots (KINDS; image:CAM, future_image:CAM)
    chunk: int = 8  # action rows (the dataset's own steps) a sample predicts; a multiple of the folder's stride
    gamma: float = 0.99  # discount of the Monte-Carlo return (success 1 at the episode's end)
    world_model: float = 0.25  # fraction of world-model samples (conditioned on the action)
    value: float = 0.25  # fraction of value samples (conditioned on everything but the value); the rest: policy
    eval_samples: int = 32  # held-out (episode, frame) samples of the validation, fixed for the whole run
    success: str = "data"  # each episode's success (the value's return): data (its npz flag, from the LeRobot
    # dataset's next.success / next.reward; a folder without flags is refused) | all (every episode a successful
    # demonstration: the value is then gamma^(steps to the end), a clock, not a judgement)
    imitate: str = "success"  # the episodes policy samples (the action generated) are drawn from: success (the
    # successful ones: a failure's actions are not imitated; world-model and value samples use every episode) | all

    def __post_init__(self):
        slots(self.layout)  # raises naming the bad slot
        if self.chunk < 1 or not 0 < self.gamma <= 1 or self.eval_samples < 1:
            raise ValueError(f"--policy-chunk {self.chunk}, --policy-gamma {self.gamma}, --policy-eval-samples "
                             f"{self.eval_samples}: need chunk >= 1, 0 < gamma <= 1, eval_samples >= 1")
        if self.imitate not in ("success", "all"):
            raise ValueError(f"--policy-imitate {self.imitate!r}: success (the successful episodes) or all")
        if self.success not in ("data", "all"):
            raise ValueError(f"--policy-success {self.success!r}: data (the episodes' flags) or all (demonstrations)")
        if min(self.world_model, self.value) < 0 or self.world_model + self.value > 1:
            raise ValueError(f"--policy-world-model {self.world_model}, --policy-value {self.value}: fractions >= 0 "
                             "summing to <= 1 (the rest are policy samples)")


def slots(layout):
    """[(kind, camera or None)] of a layout name or comma list; ValueError naming a bad slot."""
    parts = LAYOUTS.get(layout, layout).split(",")
    out = [(p.split(":")[0], p.split(":")[1] if ":" in p else None) for p in parts]
    for kind, camera in out:
        if kind not in KINDS or (camera is None) == (kind in ("image", "future_image")):
            raise ValueError(f"--policy-layout {layout!r}: slot {kind}{':' + camera if camera else ''} is not one of "
                             f"{', '.join(KINDS)} (image and future_image name a camera: image:CAM)")
    if out[0][0] != "blank" or [k for k, _ in out].count("action") != 1 or out[-1][0] != "value":
        raise ValueError(f"--policy-layout {layout!r}: starts with blank (the VAE codes frame 0 alone), has one "
                         "action slot and ends with value")
    return out


def condition_slots(layout, sample_type):
    """[S] bool: which slots a sample of `sample_type` sees clean (its conditioning: no loss there)."""
    return [kind not in GENERATED[sample_type] for kind, _ in slots(layout)]


# -----------------------------------------------------------------------------
# Inject / extract: a vector in one latent frame, tiled; read back as the mean of its full copies


def inject(values_B_N, frame_shape):
    """[B, C, H, W]: each row of values tiled to fill C*H*W, cut at the end."""
    B, n = values_B_N.shape
    size = math.prod(frame_shape)
    if n > size:
        raise ValueError(f"{n} values do not fit one latent frame of {size} ({'x'.join(map(str, frame_shape))}): "
                         "a smaller --policy-chunk, or larger frames")
    return values_B_N.repeat(1, -(-size // n))[:, :size].reshape(B, *frame_shape)


def extract(frame_B_C_H_W, n):
    """[B, n]: the mean of the frame's full copies of an n-vector (inject's inverse; the cut tail is left out)."""
    flat = frame_B_C_H_W.flatten(1)
    copies = flat.shape[1] // n
    return flat[:, :copies * n].reshape(flat.shape[0], copies, n).mean(1)


def to_unit(x, low, high):
    """Min-max normalisation to [-1, 1] per dimension; a constant dimension maps to 0."""
    span = np.where(high > low, high - low, 1.0)
    return np.where(high > low, 2 * (x - low) / span - 1, 0.0).astype(np.float32)


def from_unit(x, low, high):
    return ((x + 1) / 2 * (high - low) + low).astype(np.float32)


def mc_return(steps_to_end, success, gamma):
    """The Monte-Carlo return of sparse success (1 at the episode's last step) scaled to [-1, 1]."""
    return 2.0 * (gamma ** steps_to_end if success else 0.0) - 1.0


# -----------------------------------------------------------------------------
# Data: a stitched folder with actions (stitch.py SRC OUT: actions/<stem>.npz, action_stats.json)


class PolicyData:
    """A stitched folder's episodes (grid, or views: one video per camera) as policy samples: (episode, frame t) ->
    each camera's images at t and t + chunk / stride, observation.state there, the action rows between, the return at
    the future step. Read with the repo's readers (clips.data.GridClips' or ViewClips' videos and prompts,
    base.actions' files and statistics); each episode's
    frames are decoded once and kept (a tiny folder's reader: a large dataset needs a worker pool, not done yet).
    An episode's success (success="data") is its npz's `success` flag, which stitch.py writes from the LeRobot
    dataset's next.success or next.reward (base.actions.episode_success); a folder where an episode has none is
    refused. success="all": every episode a success (demonstrations), flags or not."""

    def __init__(self, root, layout, chunk, gamma, height, width, text, success="data"):
        cameras = {c for _, c in slots(layout) if c}
        if cameras != {"grid"} and not cameras <= set(VIEW_ORDER):
            raise ValueError(f"--policy-layout {layout!r}: cameras {sorted(cameras)}; `grid` (a grid folder's frame) "
                             f"or a views folder's {', '.join(VIEW_ORDER)} (stitch.py --layout views), not both")
        # its videos (name order), prompts and text settings; a views folder's videos carry each camera's file
        self.clips = (GridClips if cameras == {"grid"} else ViewClips)(root, 1, height, width, **text)
        self.cameras = sorted(cameras)
        stats_path = os.path.join(root, STATS_FILE)
        if not os.path.isfile(stats_path):
            raise ValueError(f"--data {root}: no {STATS_FILE}: the policy needs a folder stitched from a LeRobot "
                             "dataset with `action` and `observation.state` (`python stitch.py SRC OUT`)")
        with open(os.path.join(root, "RECIPE.json"), encoding="utf-8") as f:
            self.stride = int(json.load(f)["stride"])
        if chunk % self.stride:
            raise ValueError(f"--policy-chunk {chunk}: a multiple of {root}'s stride {self.stride} (a sample's "
                             "future image is a stitched frame)")
        self.steps, self.gamma, self.height, self.width = chunk // self.stride, gamma, height, width
        episodes = [dict(video=v, **read_arrays(action_file(root, v.stem), ("action", "state", "success")))
                    for v in self.clips.videos]
        self.episodes = [ep for ep in episodes if len(ep["state"]) > self.steps]  # those with a whole chunk
        if not self.episodes:
            raise ValueError(f"--data {root}: no episode is longer than --policy-chunk {chunk} rows: stitch longer "
                             "episodes or pass a smaller chunk")
        self.short = len(episodes) - len(self.episodes)
        unflagged = [ep["video"].stem for ep in self.episodes if ep.get("success") is None]
        if success == "data" and unflagged:
            raise ValueError(f"--data {root}: {len(unflagged)} of {len(self.episodes)} episodes have no success flag "
                             f"(actions/{unflagged[0]}.npz has no `success`), and the value slot is trained on "
                             "returns from it: stitch a LeRobot dataset with next.success or next.reward, or pass "
                             "--policy-success all (every episode a successful demonstration)")
        self.all_success = success == "all"
        self.action_dim, self.state_dim = self.episodes[0]["action"].shape[2], self.episodes[0]["state"].shape[1]
        if not self.state_dim and any(k.endswith("proprio") for k, _ in slots(layout)):
            raise ValueError(f"--data {root}: no {STATE} stitched, but --policy-layout {layout!r} has proprio slots")
        with open(stats_path, encoding="utf-8") as f:
            raw = json.load(f)
        stats = checked_stats(raw, {ACTION: self.action_dim, **({STATE: self.state_dim} if self.state_dim else {})},
                              stats_path)
        self.stats = {k: {"min": np.asarray(v["min"], np.float32), "max": np.asarray(v["max"], np.float32)}
                      for k, v in stats.items() if k in (ACTION, STATE)}
        self.chunk, self.frames = chunk, {}

    def record(self):
        """What policy_stats.json keeps with the run: the normalisation and the chunk, so a sampled chunk decodes."""
        return {"stride": self.stride, "chunk": self.chunk, "gamma": self.gamma, "action_dim": self.action_dim,
                "state_dim": self.state_dim,
                **{k: {s: v.tolist() for s, v in d.items()} for k, d in self.stats.items()}}

    def starts(self, episode):
        """The frames t of an episode that have a future frame t + steps."""
        return range(max(0, len(self.episodes[episode]["state"]) - self.steps))

    def image(self, episode, camera, t):
        """[3, H, W] in [-1, 1]: frame t of the episode's video of `camera` (each video decoded once)."""
        if (episode, camera) not in self.frames:
            video = self.episodes[episode]["video"]
            path = video.path if camera == "grid" else video.views[camera].path
            n = len(self.episodes[episode]["state"])
            self.frames[episode, camera] = torch.from_numpy(read_clip(path, 0, n, self.height, self.width))
        return self.frames[episode, camera][t].permute(2, 0, 1).float() / 127.5 - 1

    def success(self, episode):
        """Whether the episode succeeded: its npz's `success` flag (stitch.py's, from next.success / next.reward),
        or True for every episode under success="all"."""
        return self.all_success or bool(np.asarray(self.episodes[episode]["success"]).reshape(-1)[-1])

    def item(self, episode, t):
        """One sample's parts: images, normalised and raw vectors, the value, the prompt embedding."""
        ep, f = self.episodes[episode], t + self.steps
        chunk = ep["action"][t:f].reshape(self.chunk, self.action_dim)
        act, state = self.stats[ACTION], self.stats.get(STATE)
        steps_to_end = (len(ep["state"]) - 1 - f) * self.stride
        unit = lambda x, s: torch.from_numpy(to_unit(x, s["min"], s["max"]))  # noqa: E731
        return {**{f"image:{c}": self.image(episode, c, t) for c in self.cameras},
                **{f"future_image:{c}": self.image(episode, c, f) for c in self.cameras},
                "action": unit(chunk, act).reshape(-1), "raw_action": torch.from_numpy(chunk.reshape(-1)),
                "proprio": unit(ep["state"][t], state) if state else torch.zeros(0),
                "future_proprio": unit(ep["state"][f], state) if state else torch.zeros(0),
                "value": torch.tensor([mc_return(steps_to_end, self.success(episode), self.gamma)],
                                      dtype=torch.float32),
                "text_emb": text_lib.clip_text(self.clips, ep["video"])[0]}


# -----------------------------------------------------------------------------
# The batch: pixels with blank and repeated frames -> the VAE -> vectors written into their latent frames


def pixel_video(items, layout):
    """[B, 3, 1 + 4 (S - 1), H, W]: slot 0 blank (one frame), every other slot 4 frames: its image repeated, or blank
    (zeros) for a vector slot, overwritten after encoding."""
    frames, blank = [], torch.zeros_like(next(v for k, v in items[0].items() if k.startswith("image:")))
    for s, (kind, camera) in enumerate(slots(layout)):
        image = torch.stack([it[f"{kind}:{camera}"] for it in items]) if camera else \
            blank.expand(len(items), -1, -1, -1)
        frames += [image] * (1 if s == 0 else 4)
    return torch.stack(frames, dim=2)


@torch.no_grad()
def encode_batch(vae, items, layout, device, dtype):
    """The clean latent x0 [B, C, S, h, w] of items: pixel_video encoded, the vector slots injected."""
    latent = vae.encode(pixel_video(items, layout).to(device, dtype)).float()
    for s, (kind, _) in enumerate(slots(layout)):
        if kind in ("proprio", "action", "future_proprio", "value"):
            values = torch.stack([it[kind] for it in items]).to(device)
            latent[:, :, s] = inject(values, latent.shape[1:2] + latent.shape[3:])
    return latent


def condition_of(items, x0, layout, types, device, dtype):
    """The Condition (condition.from_batch) of a batch: the prompts, x0 as gt_frames, the per-type slot mask."""
    cond = from_batch({"text_emb": torch.stack([it["text_emb"] for it in items])}, device, 0, 0, dtype, -1.0,
                      latent=x0)
    clean = torch.tensor([condition_slots(layout, t) for t in types], dtype=x0.dtype, device=device)
    mask = clean[:, None, :, None, None].expand(x0.shape[0], 1, *x0.shape[2:]).contiguous()
    return replace(cond, condition_mask=mask)


# -----------------------------------------------------------------------------
# Loss and sampler


def draw_sigma(generator, latent_frames):
    """Cosmos-policy's training sigma: 70% log-normal (mean ln 4, sd 1.2), 30% uniform [1, 85], x sqrt(frames)."""
    if torch.rand((), generator=generator) < LOGNORMAL_P:
        sigma = math.exp(LOG_MEAN + LOG_SD * float(torch.randn((), generator=generator)))
    else:
        sigma = UNIFORM[0] + (UNIFORM[1] - UNIFORM[0]) * float(torch.rand((), generator=generator))
    return sigma * math.sqrt(latent_frames)


def sample_type(generator, cfg: PolicyConfig):
    u = float(torch.rand((), generator=generator))
    return "world_model" if u < cfg.world_model else "value" if u < cfg.world_model + cfg.value else "policy"


def policy_loss(net, x0, cond, seeds, loss_scale):
    """Predict2's velocity loss |v - (eps - x0)|^2 on the generated slots only (edm.denoise keeps the clean slots at
    sigma 1e-4 and replaces them by gt_frames; their error is masked out), one seed per sample."""
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    sigma = torch.tensor([draw_sigma(g, x0.shape[2]) for g in gens], device=x0.device)
    eps = torch.stack([torch.randn(x0.shape[1:], generator=g) for g in gens]).to(x0.device)
    _, velocity = edm.denoise(net, x0 + sigma.view(-1, 1, 1, 1, 1) * eps, sigma, cond)
    return ((velocity - (eps - x0)).square() * (1 - cond.condition_mask)).mean() * loss_scale


@torch.no_grad()
def sample(net, cond, noise, steps=4):
    """x0 from unit noise: Karras sigmas 80 -> 4 in `steps` Euler / Adams-Bashforth steps (edm.sampler_step), then a
    clean pass at sigma 4; conditioning slots clean (cond's mask), no guidance."""
    sigmas = edm.karras_sigmas(steps, sigma_min=SAMPLE_SIGMAS[1], sigma_max=SAMPLE_SIGMAS[0])
    x, x0_prev = noise.float() * SAMPLE_SIGMAS[0], None
    at = lambda s: torch.full((x.shape[0],), float(s), device=x.device)  # noqa: E731
    for i in range(steps):
        x0, _ = edm.denoise(net, x, at(sigmas[i]), cond)
        x, x0_prev = edm.sampler_step(x0, i, x, x0_prev, sigmas)
    return edm.denoise(net, x, at(sigmas[-1]), cond)[0]


def slot_image(vae, x0, slot):
    """[B, 3, H, W]: the slot's latent frame decoded (with the blank frame 0 the VAE needs), its 4 frames averaged."""
    video = vae.decode(torch.cat([x0[:, :, :1], x0[:, :, slot: slot + 1]], dim=2).to(next(vae.parameters()).dtype))
    return video[:, :, 1:].float().mean(2)


# -----------------------------------------------------------------------------
# Held-out evaluation: action L1 (normalised and raw), future-image PSNR, value error, the held-out loss


def psnr(images, truths):
    """PSNR in dB of images against truths, both [B, 3, H, W] in [-1, 1] (peak 1 on the [0, 1] scale)."""
    mse = ((images.clamp(-1, 1) - truths) / 2).square().mean()
    return -10 * torch.log10(mse.clamp(min=1e-10))


@torch.no_grad()
def evaluate(net, vae, data, items, layout, cfg, device, dtype):
    """The validation row of fixed held-out samples from fixed noise: as policy samples (the action, the future image
    and the value generated; eval_action_l1_zero: the L1 of always predicting the data's centre, the bar to beat)
    and as world-model samples (the action given: eval_wm_psnr, eval_wm_proprio_l1); eval_loss: the policy loss;
    eval_psnr_codec: the VAE's own ceiling (the true latent decoded)."""
    kinds = [kind for kind, _ in slots(layout)]
    x0 = encode_batch(vae, items, layout, device, dtype)
    truth = {k: torch.stack([it[k] for it in items]) for k in ("action", "raw_action", "value", "future_proprio")}
    futures = [(s, torch.stack([it[f"future_image:{c}"] for it in items])) for s, (kind, c) in
               enumerate(slots(layout)) if kind == "future_image"]  # PSNR: the mean over the future cameras
    mean = lambda x: collectives.all_mean(float(x), device)  # noqa: E731

    def future_psnr(x):
        return mean(sum(psnr(slot_image(vae, x, s).cpu(), t) for s, t in futures) / len(futures))

    row = {"eval_psnr_codec": future_psnr(x0)}  # the ceiling: the true latent decoded
    for sample_type, prefix in (("policy", "eval_"), ("world_model", "eval_wm_")):
        cond = condition_of(items, x0, layout, [sample_type] * len(items), device, dtype)
        noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(sample_seed(cfg.seed, sample_type)))
        pred = sample(net, cond, noise.to(device))
        row[prefix + "psnr"] = future_psnr(pred)
        if "future_proprio" in kinds and truth["future_proprio"].shape[1]:
            proprio = extract(pred[:, :, kinds.index("future_proprio")], truth["future_proprio"].shape[1]).cpu()
            row[prefix + "proprio_l1"] = mean((proprio - truth["future_proprio"]).abs().mean())
        row[prefix + "value_error"] = mean((extract(pred[:, :, kinds.index("value")], 1).cpu()
                                            - truth["value"]).abs().mean())
        if sample_type == "policy":
            row["eval_loss"] = mean(policy_loss(net, x0, cond, [sample_seed(cfg.seed, "eval", i) for i in
                                                                range(len(items))], cfg.loss_scale))
            action = extract(pred[:, :, kinds.index("action")], truth["action"].shape[1]).cpu()
            act = data.stats[ACTION]
            raw = from_unit(action.numpy().reshape(len(items), -1, data.action_dim), act["min"], act["max"])
            row.update(eval_action_l1=mean((action - truth["action"]).abs().mean()),
                       eval_action_l1_raw=mean(np.abs(raw.reshape(len(items), -1) - truth["raw_action"].numpy())
                                               .mean()),
                       eval_action_l1_zero=mean(truth["action"].abs().mean()))
    return row


# -----------------------------------------------------------------------------
# The objective train.py's loop calls (train.OBJECTIVES lists it; sft.SFT has the same names)


class Policy:
    """Cosmos-Policy for train.py: Policy(run, net, params, vae, neg_text, terms). It draws its own samples from
    --data (PolicyData: a stitched folder with actions), so train.py fetches no clip batches for it (reads_clips);
    step(step, batches) -> the metrics row; evaluate -> the validation row. The data's statistics go to OUT/policy_stats.json."""
    NAME = "policy"
    CONFIG = PolicyConfig  # TrainConfig.policy: the --policy-* flags
    MAY_CHANGE = ("eval_samples",)
    TINY_RECIPES = ("tiny_policy",)  # recipes/tiny_policy.py: the tiny action folder, the policy's schedule
    mfu = False  # its tokens are not train.py's clip tokens
    reads_clips = False  # it draws its own samples: train.py fetches and encodes no clips for it
    eval_at_start = True  # the validation curve starts at the untrained net
    max_psnr_drop = 0.0

    @staticmethod
    def validate(cfg, given):
        if family_of(get_config(cfg.config)).NAME != edm.NAME:
            raise ValueError(f"--objective policy with --config {cfg.config}: Cosmos-Policy is a Predict2 net "
                             "(tiny, v2w-2b, ...): its sampler and loss are nets/edm.py's")
        if cfg.lora:
            raise ValueError("--objective policy fine-tunes the whole net, as cosmos-policy does: drop --lora")
        if cfg.sample_every and "sample_every" in given:
            raise ValueError(f"--sample-every {cfg.sample_every}: train.py's sample videos are clips, not policy "
                             "samples; pass 0 (the policy's validation is its held-out evaluation)")
        cfg.sample_every = 0  # the presets' (real.py: 1000) too
        if os.path.normpath(cfg.data) == os.path.normpath(TINY_DATA) and not os.path.isdir(cfg.data):
            make_tiny_dataset(cfg.data, orbit=True)  # the tiny recipe's own synthetic folder, built on first use
        if os.path.normpath(cfg.data) == os.path.normpath(TINY_DATA) and "success" not in given.get("policy", {}):
            cfg.policy = replace(cfg.policy, success="all")  # its orbit expert's episodes: demonstrations, no flags
        return {**unused_rl_flags(cfg, given, Policy.NAME),
                **{k: "with --objective policy (its own noise draw, no prompt dropout, its own samples)"
                   for k in ("text_dropout", "high_sigma_ratio", "cond_frames", "latents") if k in given}}

    @staticmethod
    def resume_keys(cfg):
        """Every --policy-* knob but MAY_CHANGE's, as flattened TrainConfig keys."""
        return [f"policy.{f.name}" for f in fields(PolicyConfig) if f.name not in Policy.MAY_CHANGE]

    @staticmethod
    def rewards(cfg):
        return None

    def __init__(self, run, net, params, vae, neg_text, terms):
        cfg = run.cfg
        self.run, self.net, self.params, self.vae, self.cfg, self.knobs = run, net, params, vae, cfg, cfg.policy
        self.betas, self.weight_decay, self.guidance, self.name = (cfg.beta1, cfg.beta2), cfg.weight_decay, 0.0, \
            "policy"
        self.schedule = f"lr {cfg.lr:g} (warm-up {cfg.warmup}, cosine to x{cfg.lr_min_ratio}), clip {cfg.grad_clip}"
        self.lr_flag, self.state = "--lr", {}
        text = dict(text_len=cfg.text_len, text_dim=net.cfg.crossattn_proj_in_channels, seed=cfg.seed,
                    text="standin" if text_lib.standin_text(cfg.config, cfg.data) else "t5", text_encoder="t5")
        self.data = PolicyData(cfg.data, self.knobs.layout, self.knobs.chunk, self.knobs.gamma, cfg.height, cfg.width,
                               text, self.knobs.success)
        n = len(self.data.episodes)
        holdout = cfg.holdout if cfg.holdout >= 0 else max(1, n // 50)
        if n - holdout < 1:
            raise ValueError(f"--holdout {holdout}: {cfg.data} has {n} episodes with a whole chunk; keep at least one "
                             "to train on")
        self.train_ids, held = list(range(n - holdout)), list(range(n - holdout, n)) or list(range(n))
        self.imitated = [e for e in self.train_ids if self.knobs.imitate == "all" or self.data.success(e)]
        if not self.imitated:
            raise ValueError(f"--data {cfg.data}: none of the {len(self.train_ids)} episodes trained on succeeded, and "
                             "--policy-imitate success draws policy samples from successes: pass --policy-imitate all")
        pairs = [(e, t) for e in held for t in self.data.starts(e)]
        pick = np.linspace(0, len(pairs) - 1, self.knobs.eval_samples).round().astype(int)
        self.held_out = [self.data.item(*pairs[i]) for i in pick]
        if run.master:
            write_atomic(os.path.join(cfg.out, "policy_stats.json"), json.dumps(
                dict(self.data.record(), layout=slots(self.knobs.layout)), indent=1).encode())
        run.say(f"policy: {n} episodes ({len(self.train_ids)} trained on, {self.data.short} shorter than a chunk "
                f"left out), layout {self.knobs.layout} "
                f"({len(slots(self.knobs.layout))} latent frames), chunk {self.knobs.chunk} x {self.data.action_dim},"
                f" {sum(map(self.data.success, range(n)))} of them successes"
                f"{' (--policy-success all)' if self.data.all_success else ''}, policy samples from "
                f"{len(self.imitated)}; statistics -> policy_stats.json")

    def lr_at(self, step):
        return lr_at(self.cfg, step)

    def batch(self, step, micro):
        """This rank's cfg.batch_size samples of micro-batch `micro` of step `step`: (items, sample types), drawn from
        (seed, step, micro, dp rank) only."""
        g = torch.Generator().manual_seed(sample_seed(self.cfg.seed, step, micro, self.run.dp_rank, "policy"))
        items, types = [], []
        pick = lambda ids: ids[int(torch.randint(len(ids), (), generator=g))]  # noqa: E731
        for _ in range(self.cfg.batch_size):
            episode = pick(self.train_ids)
            start = pick(self.data.starts(episode))
            types.append(sample_type(g, self.knobs))
            if types[-1] == "policy" and episode not in self.imitated:  # its actions are not imitated: redrawn
                episode = pick(self.imitated)
                start = pick(self.data.starts(episode))
            items.append(self.data.item(episode, start))
        return items, types

    def step(self, step, batches):
        """One optimizer step over cfg.grad_accum micro-batches of this step's own samples (train.py's clip batches
        are not read). A NaN/Inf loss on any rank skips the step on every rank, as SFT's."""
        layout, device, dtype, loss_sum = self.knobs.layout, self.run.device, self.run.compute_dtype, 0.0
        for micro in range(self.cfg.grad_accum):
            items, types = self.batch(step, micro)
            x0 = encode_batch(self.vae, items, layout, device, dtype)
            seeds = [sample_seed(self.cfg.seed, step, micro, self.run.dp_rank, b) for b in range(len(items))]
            loss = policy_loss(self.net, x0, condition_of(items, x0, layout, types, device, dtype), seeds,
                               self.cfg.loss_scale) / self.cfg.grad_accum
            loss.backward()
            loss_sum += loss.item()
        bad_loss, = ranks_any([not math.isfinite(loss_sum)], device)
        grad_norm, _ = clip_and_step(self.run.optimizer, self.params, self.cfg.grad_clip, skip=bad_loss)
        bad = bad_loss or not math.isfinite(grad_norm)
        return {"loss": collectives.all_mean(loss_sum, device), "grad_norm": grad_norm,
                **nonfinite_fields(f"a NaN/Inf loss or gradient (--lr {self.cfg.lr:g} too high?)" if bad else None)}

    def evaluate(self, batches, truths):
        return evaluate(self.net, self.vae, self.data, self.held_out, self.knobs.layout, self.cfg, self.run.device,
                        self.run.compute_dtype)

    def evaluated(self, result):
        return result

    def watch(self, row, history):
        return None

    def bar(self, row):
        return {"loss": f"{row['loss']:.4f}"}

