"""The phases of one RL update, between its rollouts and its update, that GRPO (grpo.py) and DiffusionNFT
(nft.py) share: timing each phase, refusing NaN/Inf samples before any reward sees them, and scoring every
group's samples into group-normalised advantages over all ranks (reward.group_advantages).

Its own module, below both objectives: nft.py imports grpo.py for the step math and rl.py imports both, so
what both updates call lives under them and no import points back up.
"""
import time

import torch

import collectives
from reward import group_advantages


def phase_timer(device):
    """(times, timed): timed(name, fn) runs fn and adds its seconds to times[name] (CUDA synchronised around it)."""
    times = {}

    def timed(name, fn):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        result = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times[name] = times.get(name, 0.0) + time.perf_counter() - start
        return result
    return times, timed


def check_samples(x0s, conds):
    """FloatingPointError naming the groups whose samples to reward (x0s: per group [K, C, T, H, W]) hold NaN/Inf, and
    why: NaN/Inf inputs (the conditioning frames, prompt or camera of its Condition) or, from finite inputs, a diverged
    policy. Called before scoring, so a reward is never blamed for (or fed) a broken sample."""
    bad = [g for g, x0 in enumerate(x0s) if not bool(torch.isfinite(x0).all())]
    if not bad:
        return
    cond = conds[bad[0]]
    frames = cond.gt_frames if cond.gt_frames is None or cond.condition_mask is None else \
        torch.where(cond.condition_mask.bool(), cond.gt_frames, 0.0)  # only the conditioning frames are read
    inputs = [name for name, t in (("conditioning frames", frames), ("prompt embedding", cond.crossattn_emb),
                                   ("negative prompt embedding", cond.neg_crossattn_emb), ("camera", cond.camera))
              if t is not None and not bool(torch.isfinite(t).all())]
    cause = (f"its {', '.join(inputs)} hold NaN/Inf: the clip or its text embedding is damaged" if inputs else
             "its inputs are finite: the policy diverged (lower the --grpo-lr / --nft-lr, resume from an earlier "
             "checkpoint)")
    raise FloatingPointError(f"RL rollouts of {len(bad)} of {len(x0s)} groups are NaN/Inf before scoring (the "
                             f"rewards were not called); group {bad[0]} (key {cond.key}): {cause}")


def agreed_names(scores):
    """The reward component names, the same for every group on every rank (collective), or a ValueError listing them:
    the rewards are gathered by position, so differing names would mix components or hang the gather."""
    mine = sorted({tuple(sorted(s)) for s in scores})  # one entry when every group has the same names
    everyone = collectives.gather(mine)
    if len(everyone[0]) != 1 or any(e != everyone[0] for e in everyone):
        raise ValueError("reward components differ between clips or ranks (" + "; ".join(
            f"rank {r}: {' / '.join(map(str, map(list, e)))}" for r, e in enumerate(everyone)) + "): every reward "
            "term must return the same components for every batch")
    return list(everyone[0][0])


def score_groups(x0s, score, decode, cfg, timed, agree=None, cp_size=1):
    """Decode (only if a reward needs pixels) and score every group's K samples, gather all ranks' scores and turn
    the rewards into advantages over all ranks' groups (collective). x0s: per group a [K, C, T, H, W] latent.
    cfg: any config with group_size, adv_eps, adv_clip, global_std, std_ddof (GRPO's, NFT's).
    Returns (this rank's advantages [groups, K] on x0s' device, metrics: rewards, components, adv_std)."""
    device = x0s[0].device

    def score_all():
        out = []
        for x0 in x0s:
            video = timed("decode", lambda: decode(x0))
            out.append(timed("reward", lambda: score(video, x0)))
        return out
    scores = agree("scoring the rollouts", score_all) if agree is not None else score_all()
    names = agreed_names(scores)
    local = torch.stack([torch.cat([s[n].float().reshape(-1) for s in scores]).to(device) for n in names])
    everyone = collectives.gather_groups(local, cp_size).double().cpu()  # [names, dp * groups * K], dp-rank-major
    rank, world = collectives.dp_coords(cp_size)  # --cp: a cp group's ranks scored the same rollouts; one copy counts
    keys = [(r, g) for r in range(world) for g in range(len(x0s)) for _ in range(cfg.group_size)]
    rewards = everyone[names.index("reward")]
    advantages = group_advantages(rewards, keys, eps=cfg.adv_eps, clip=cfg.adv_clip, global_std=cfg.global_std,
                                  ddof=cfg.std_ddof)
    metrics = {"reward_mean": float(rewards.mean()), "reward_std": float(rewards.std(correction=0)),
               "reward_group_std": float(rewards.view(-1, cfg.group_size).std(dim=1, correction=0).mean()),
               "adv_std": float(advantages.std(correction=0))}
    metrics.update({f"reward_{name.replace('/', '_')}": float(everyone[i].mean())
                    for i, name in enumerate(names) if name != "reward"})
    return advantages.view(world, len(x0s), cfg.group_size)[rank].to(device), metrics
