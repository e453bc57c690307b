"""How well does one GRPO update estimate the policy gradient? The table of docs/grpo.md §11 (not part of the suite).

    python tests/grpo_cosine.py INIT --data data/tiny_grid --reward wrist --trials 10 [--k 8 --eta 0.5]

INIT: a tiny train.py checkpoint (e.g. runs/tiny/step_00001000). The true gradient of E[reward] comes from --paths
reparameterised trajectories (x_{i+1} = mean + beta_i z with z held fixed, backpropagated through the whole chain and
the tiny codec); each trial is one group of K rollouts, whose per-step GRPO gradients (advantage x score) are
compared with it: cosine per step, and of the weighted sums that pg_step_weight would form.
"""
import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ckpt  # noqa: E402
import grpo  # noqa: E402
from base.inits import get_config  # noqa: E402
from clips import data  # noqa: E402
from condition import (  # noqa: E402
    Condition,
    condition_mask,
    uncond,  # noqa: E402
)
from engine import build  # noqa: E402
from engine.rollout import generated_mask, guide, mean_of, predict, rollout_group  # noqa: E402
from model import DiT
from nets.lora import add_lora  # noqa: E402


def branches(net, x, step, grid, cond, cfg):
    """(cond, uncond) predictions with autograd (the pathwise gradient; rollout.branch_predictions runs without)."""
    return (predict(net, x, step, grid, cond, None),
            predict(net, x, step, grid, uncond(cond), None) if cfg.guidance else None)


def guided_mean(net, x, step, grid, cond, cfg):
    return mean_of(guide(*branches(net, x, step, grid, cond, cfg), cfg.guidance), x, step, grid)

def flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def cosine(a, b):
    return float(a @ b / (a.norm() * b.norm() + 1e-30))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("init")
    p.add_argument("--data", default="data/tiny_grid")
    p.add_argument("--reward", default="wrist", choices=("wrist", "ch0"))
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--paths", type=int, default=48)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--eta", type=float, default=0.5)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = DiT(get_config("tiny"))
    net.init_weights()
    ckpt.load(net, args.init)
    params = add_lora(net, 4)
    codec = build.build_vae("tiny", "", torch.device("cpu"), torch.float32)
    item = data.GridClips(args.data, 9, 64, 112, text_len=16, text_dim=1024, text="standin")[(0, 0)]
    latent = codec.encode(item["video"][None]).float()
    cond = Condition(crossattn_emb=item["text_emb"][None], neg_crossattn_emb=torch.zeros(1, 16, 1024),
                          gt_frames=latent, condition_mask=condition_mask(latent, 1))
    shape = tuple(latent.shape[1:])

    def reward(x0):  # differentiable: the codec is linear
        if args.reward == "ch0":
            return x0[:, 0, 1:].mean(dim=(1, 2, 3))
        video = type(codec).decode.__wrapped__(codec, x0)
        H, W = video.shape[-2:]
        return ((video[:, :, :, H // 2:, : W // 2] + 1) / 2).mean(dim=(1, 2, 3, 4))
    cfg = grpo.GRPOConfig(group_size=args.k, eta=args.eta)
    probe = rollout_group(net, cond, shape, cfg, torch.Generator().manual_seed(0))
    grid, betas = (probe.sigmas, probe.alphas, probe.timesteps), probe.betas
    gen_mask = generated_mask(cond, shape, "cpu")
    g = torch.Generator().manual_seed(123)
    true = torch.zeros(sum(q.numel() for q in params))
    for _ in range(args.paths):
        x = probe.sigmas[0] * torch.randn(1, *shape, generator=g)
        for i in range(cfg.num_steps):
            x = guided_mean(net, x, i, grid, cond, cfg) + betas[i] * torch.randn(1, *shape, generator=g) * gen_mask
        x0 = guide(*branches(net, x, cfg.num_steps, grid, cond, cfg), cfg.guidance)
        true += flat(torch.autograd.grad(reward(x0).sum(), params)) / args.paths
    steps = probe.train_steps
    per_step = {i: [] for i in steps}
    totals = {w: [] for w in grpo.STEP_WEIGHTS}
    for trial in range(args.trials):
        ro = rollout_group(net, cond, shape, cfg, torch.Generator().manual_seed(1000 + trial))
        r = reward(ro.x0_final).detach()
        adv = (r - r.mean()) / (r.std(correction=0) + 1e-8)
        grads = {}
        for i in steps:
            logp = sum(adv[k] * grpo.step_log_prob(net, ro, k, i, cfg)[0].sum() for k in range(args.k))
            grads[i] = flat(torch.autograd.grad(logp, params))  # ascent direction of the surrogate
            per_step[i].append(cosine(grads[i], true))
        for w in grpo.STEP_WEIGHTS:
            weights = grpo.step_weights(ro, grpo.GRPOConfig(group_size=args.k, eta=args.eta, pg_step_weight=w))
            totals[w].append(cosine(sum(weights[i] * grads[i] for i in steps), true))
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    sem = lambda v: float(torch.tensor(v).std()) / math.sqrt(len(v))  # noqa: E731
    for i in steps:
        print(f"step {i}: sigma {ro.sigmas[i]:.4g} -> {ro.sigmas[i + 1]:.4g}, beta {ro.betas[i]:.3g}, cosine "
              f"{mean(per_step[i]):+.3f} +- {sem(per_step[i]):.3f}")
    for w, v in totals.items():
        print(f"pg_step_weight {w}: cosine {mean(v):+.3f} +- {sem(v):.3f} ({args.trials} groups of {args.k})")


if __name__ == "__main__":
    main()
