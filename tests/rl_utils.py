"""What the GRPO, NFT and fp8 tests share: a tiny LoRA policy, one group's stand-in condition, adapters moved off
zero (so LoRA-on and LoRA-off differ), and a group's rollout."""
import torch

from base.inits import get_config
from condition import Condition, condition_mask
from engine.rl import Scoring
from engine.rollout import rollout_group
from reward import RewardTerm
from model import build_model
from nets.lora import add_lora

LATENT = (16, 3, 4, 4)  # C, T, H, W: 3 latent frames, the first one conditioning


def tiny_policy(seed=0, rank=4, config="tiny"):
    """(net, its LoRA adapters) of a seeded tiny config."""
    torch.manual_seed(seed)
    net = build_model(get_config(config))
    return net, add_lora(net, rank)


def tiny_condition(seed=0, config="tiny", text_tokens=8, cond_frames=1, cft=None):
    """One group's record: random prompt and negative prompt, a random clean latent, its first cond_frames latent
    frames conditioning."""
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(2, text_tokens, get_config(config).crossattn_proj_in_channels, generator=g)
    gt = torch.randn(1, *LATENT, generator=g)
    return Condition(crossattn_emb=emb[:1], neg_crossattn_emb=emb[1:], gt_frames=gt,
                     condition_mask=condition_mask(gt, cond_frames), key=("ep0", "pick"), conditional_frame_timestep=cft)


def perturb(params, scale=0.05, seed=1):
    """Zero-init B makes LoRA-on == LoRA-off; move the adapters so the two policies differ."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.add_(scale * torch.randn(p.shape, generator=g))


def rollout(net, cfg, seed=0, cond=None):
    """GRPO's K trajectories of one group (rollout.rollout_group) from tiny_condition or `cond`."""
    return rollout_group(net, cond or tiny_condition(), LATENT, cfg, torch.Generator().manual_seed(seed))


def latent_reward(fn):
    """rl.Scoring of one reward term fn(latent) -> [K] (weight 1: the total reward is fn's)."""
    return Scoring([RewardTerm(name="r", fn=fn, weight=1.0, inputs=("latent",))])
