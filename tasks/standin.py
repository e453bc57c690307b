"""Stand-ins for timing a world model without a task of its own (policyeval.py --task held-out on a GPU): a policy of
random raw actions and a judge that never calls success. They measure the cost, never the quality."""
import numpy as np
import torch


def random_actions(frames, info: dict) -> torch.Tensor:
    """[B, info["steps"], info["action_dim"]] standard-normal raw actions, seeded by (info["seed"], chunk)."""
    rng = np.random.default_rng([info["seed"], info["chunk"]])
    return torch.from_numpy(rng.standard_normal((len(frames), info["steps"], info["action_dim"])).astype(np.float32))


def never(frames, info: dict) -> torch.Tensor:
    """[B] zeros: no success is judged."""
    return torch.zeros(len(frames))
