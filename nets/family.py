"""The model family, chosen in one place: family_of(cfg) returns nets/edm.py (Predict2: EDM sigma, T5 text, Karras
Euler/AB2) or nets/flow.py (Predict2.5: rectified flow, Reason1 text, UniPC). Both have the same functions under the same
names (tests/test_repo.py holds them alike), so every caller (sft, rollout, grpo, nft, rl, generate, sample,
evaluate, smoke, bench) uses the module it gets without asking which it is."""
from base.inits import is_p25
from nets import edm, flow

FAMILIES = (edm, flow)


def family_of(cfg):
    """The model family's math of a DiTConfig: flow (Predict2.5) or edm (Predict2). Predict2.5's action-chunk net
    (action_per_frame) is flow's: its class defaults to timestep_scale 1 (Predict2's reading), but its release and
    every config here take Predict2.5's 0.001; one with 1 is refused rather than given the wrong family's sampler."""
    if cfg.action_per_frame and not is_p25(cfg):
        raise ValueError("an action_per_frame config with timestep_scale 1: Predict2.5's action-chunk net is trained "
                         "with timestep_scale 0.001 (its release's); build it from p25-2b-action or p25-tiny-action")
    return flow if is_p25(cfg) else edm
