"""GRPO's rollouts: the stochastic step, its exact log-density, and K trajectories of one group (docs/grpo.md).

A rollout walks the net's family's grid (nets/family.family_of: nets/edm.py's N Karras sigmas for Predict2, whose state is
x = x0 + sigma * eps; nets/flow.py's shift-5 grid for Predict2.5) with a stochastic first-order x0 step ("DDIM-eta"):

    x' = mean + beta * z,  mean = c * x + (1 - c) * x0_hat(x, sigma),  c = alpha / sigma,  alpha^2 + beta^2 = sigma'^2

(Predict2.5: the same step in rectified-flow coordinates, docs/grpo.md §10; the family's step_mean), so every
transition is an exact Gaussian whose log-density is stored (fp32, averaged over the generated, i.e.
non-conditioning, latent elements). grpo.py trains on what this file stores, with the same `predict` / `guide` /
`mean_of` / `gaussian_log_prob`; `cfg` below is a grpo.GRPOConfig.

The network calls of a rollout (branch_predictions) come in three layouts, cfg.rollout_batch: "none" (one B = 1
call per state and CFG branch: training's own layout, so the stored log-probs are bit for bit what training
recomputes), "cfg" (cond and uncond in one B = 2 call) and "group" (every state of a group and both branches in
one call). All three draw the same noise (draw_noise) and differ only in rounding.

Contents, top to bottom: conditions -> the stochastic step and its log-prob -> one network evaluation -> rollout.
"""
import math
from dataclasses import dataclass, replace

import torch

from condition import Condition, map_tensors, uncond
from nets import edm
from nets.family import family_of

SDE_TYPES = ("ddim_eta", "cps")
ROLLOUT_BATCHES = ("none", "cfg", "group")
DETERMINISTIC_STD = 1e-8  # a step with beta below this is an ODE step: no noise, no log-prob, not trained
MIN_TRAIN_STD = 1e-6  # trained steps must have at least this much noise (the smallest at eta 0.5, N 8 is ~1e-3)
LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


# -----------------------------------------------------------------------------
# Conditions (condition.Condition): built once per group, cached, and reused by rollout, training and the KL reference.
# Re-encoding text or frames (T5, VAE) or calling a conditioner with dropout would change bits and break ratio == 1.


def generated_mask(cond: Condition, latent_shape, device):
    """[1, 1, T, H, W] fp32: 1 on generated latent frames, 0 on conditioning frames (excluded from log-probs)."""
    C, T, H, W = latent_shape
    if cond.condition_mask is None:
        return torch.ones(1, 1, T, H, W, device=device)
    if tuple(cond.condition_mask.shape) != (1, 1, T, H, W):
        raise ValueError(f"condition_mask {tuple(cond.condition_mask.shape)} does not match latent {latent_shape}")
    return 1.0 - cond.condition_mask.float()


# -----------------------------------------------------------------------------
# The stochastic step and its exact log-density


def step_coefficients(sde_type, sigma, sigma_next, eta, family=edm):
    """(alpha, beta) in float64 for x' = x0_hat + alpha * eps_hat + beta * z, with alpha^2 + beta^2 = sigma'^2.

    ddim_eta: beta = eta * sigma' * sqrt(1 - sigma'^2 / sigma^2); eta = 1 is the exact posterior q(x_sigma' | x,
    x0), eta = 0 is Predict2's Euler x0 step. cps: beta = sigma' * sin(eta * pi / 2), Flow-GRPO's "cps" step.
    family: the grid's (nets/family.family_of). flow (Predict2.5, sigma in [0, 1), x' = (1 - sigma') x0_hat + alpha eps_hat
    + beta z): the same, the ratio in EDM units s = sigma / (1 - sigma); the step onto sigma' = 0 is deterministic
    (x' = x0_hat). docs/grpo.md §10.
    """
    family.check_step(sigma, sigma_next)
    s, s_next = family.edm_sigma(sigma), family.edm_sigma(sigma_next)
    if sde_type == "ddim_eta":  # RF: the ratio in EDM units (0 at sigma' = 0: the last step is deterministic)
        beta = eta * sigma_next * math.sqrt(1.0 - s_next ** 2 / s ** 2)
    elif sde_type == "cps":
        beta = sigma_next * math.sin(eta * math.pi / 2)
    else:
        raise ValueError(f"sde_type={sde_type!r}; valid: {SDE_TYPES}")
    if beta < DETERMINISTIC_STD:
        return sigma_next, 0.0
    return math.sqrt(sigma_next ** 2 - beta ** 2), beta


def gaussian_log_prob(x_next, mean, std, gen_mask):
    """log N(x_next; mean, std^2) averaged over generated elements: [B] fp32. The gradient flows through mean only.

    The mean (not the sum) over ~2e6 elements keeps ratios exp(mean delta) near 1 (Flow-GRPO does the same); the
    constants are kept so E[logp] = -log(std) - 1.4189 can be checked. gen_mask: [B or 1, 1, T, H, W].
    """
    if std < MIN_TRAIN_STD:
        raise ValueError(f"step std {std} < {MIN_TRAIN_STD}: a deterministic step has no log-prob")
    squared = ((x_next.detach() - mean) ** 2 * gen_mask).sum(dim=(1, 2, 3, 4))
    count = gen_mask.sum(dim=(1, 2, 3, 4)) * x_next.shape[1]
    return -squared / count / (2.0 * std ** 2) - math.log(std) - LOG_SQRT_2PI


# -----------------------------------------------------------------------------
# One network evaluation of a step, in the training layout (B = 1, cond and uncond as separate calls) or batched


def predict(net, x, step, rollout_grid, cond: Condition, noise):
    """The net's raw prediction at step `step` for states x [B, ...] (its family's predict: x0_hat for Predict2, the
    velocity for Predict2.5, whose conditional frames read noise: [B, ...] initial states). One call, fp32."""
    family, sigmas, _, timesteps = rollout_grid
    return family.predict(net, x, sigmas[step], timesteps[step], cond, noise)


def guide(pred_cond, pred_uncond, guidance):
    """Predict2's CFG on x0 and Predict2.5's on the velocity: c + g (c - u); no uncond branch: c."""
    return pred_cond if pred_uncond is None else pred_cond + guidance * (pred_cond - pred_uncond)


def mean_of(guided, x, step, rollout_grid):
    """The Gaussian mean of step `step` from states x and the guided prediction (fp32, the same ops everywhere)."""
    family, sigmas, alphas, _ = rollout_grid
    return family.step_mean(x, guided, sigmas[step], sigmas[step + 1], alphas[step])


def stacked(cond: Condition, n, with_uncond):
    """cond as one batch: n rows of the prompt, then (with_uncond) n rows of the negative prompt."""
    rows = map_tensors(replace(cond, neg_crossattn_emb=None), lambda v: torch.cat([v] * (2 * n if with_uncond else n)))
    if with_uncond:
        rows = replace(rows, crossattn_emb=torch.cat([cond.crossattn_emb] * n + [cond.neg_crossattn_emb] * n))
    return rows


def with_uncond(cond: Condition, guidance):
    """Whether CFG runs an uncond branch (guidance != 0); refuses guidance without a negative prompt."""
    if guidance != 0 and cond.neg_crossattn_emb is None:
        raise ValueError(f"guidance={guidance} needs cond.neg_crossattn_emb (an empty negative prompt makes CFG a "
                         "no-op; use Predict2's default negative prompt)")
    return guidance != 0


@torch.no_grad()
def branch_predictions(net, xs, noises, step, rollout_grid, cond: Condition, cfg):
    """(cond, uncond) predictions [n, ...] of states xs [n, ...] without autograd, in cfg.rollout_batch's layout:
    "none" one B = 1 call per state and branch (the training layout), "cfg" one B = 2 call per state, "group" one
    call of B = 2n. uncond is None without guidance."""
    two = with_uncond(cond, cfg.guidance)
    n = xs.shape[0]
    if cfg.rollout_batch == "none" or not two and cfg.rollout_batch == "cfg":
        c = torch.cat([predict(net, xs[j: j + 1], step, rollout_grid, cond, noises[j: j + 1]) for j in range(n)])
        u = torch.cat([predict(net, xs[j: j + 1], step, rollout_grid, uncond(cond), noises[j: j + 1])
                       for j in range(n)]) if two else None
        return c, u
    if cfg.rollout_batch == "cfg":
        both = [predict(net, torch.cat([xs[j: j + 1]] * 2), step, rollout_grid, stacked(cond, 1, True),
                        torch.cat([noises[j: j + 1]] * 2)) for j in range(n)]
        return torch.cat([b[:1] for b in both]), torch.cat([b[1:] for b in both])
    pred = predict(net, torch.cat([xs] * (1 + two)), step, rollout_grid, stacked(cond, n, two),
                   torch.cat([noises] * (1 + two)))
    return pred[:n], (pred[n:] if two else None)


# -----------------------------------------------------------------------------
# Rollout: K trajectories of one group


@dataclass(kw_only=True)
class Rollout:
    cond: Condition
    family: object  # the net's family module (nets/family.family_of): edm or flow
    sigmas: list  # N + 1 python floats (float64): sigma_0 = 80 ... sigma_N = 0.002 (Predict2.5: ~1 ... 0)
    alphas: list  # N
    betas: list  # N; 0.0 marks a deterministic step
    train_steps: list  # steps trained for this group
    states: torch.Tensor  # [K, N + 1, C, T, H, W] fp32: x_0 = sigma_0 * noise (RF: the noise), ..., x_N
    log_probs: torch.Tensor  # [K, N] fp32 log-density of each transition under the sampler (its layout); NaN if none
    x0_final: torch.Tensor  # [K, C, T, H, W] fp32: the clean pass at sigma_N (RF: x_N), the sample to reward
    timesteps: list = None  # Predict2.5 (RF): the net's int timesteps floor(1000 sigma_i); Predict2: None each
    shared_until: int = -1  # same_latent: states x_0 .. x_shared_until are one state for all K (the prefix and the
    # first stochastic step's input): its mean is computed once, in the rollout and in training; -1: none shared
    uncond: dict = None  # {(k, step): [1, ...]} the uncond prediction at theta_old of each trained step (training
    # reuses it while theta == theta_old: the same value, one forward less)
    old_log_probs: torch.Tensor = None  # [K, N] the ratio's logp_old: log_probs, or the training forward's own
    calls: int = 0  # network calls of the rollout
    forwards: int = 0  # samples through the network (a B = 2 call counts 2)

    @property
    def grid(self):
        return self.family, self.sigmas, self.alphas, self.timesteps

    def shares(self, step):
        return step <= self.shared_until


def draw_window_start(cfg, generator):
    """A Flow-GRPO-Fast window start, uniform over the starts that fit the window inside cfg.window."""
    lo, hi = cfg.window
    return lo + int(torch.randint(hi - cfg.window_size - lo + 1, (1,), generator=generator, device=generator.device))


def step_noise_levels(cfg, generator, window_start=None):
    """Per-step eta: cfg.eta everywhere, or (Flow-GRPO-Fast) only inside one window per group, starting at
    window_start or, if None, at a start drawn from the generator."""
    N = cfg.num_steps
    if not cfg.window_size:
        if window_start is not None:
            raise ValueError("window_start given but window_size is 0")
        return [cfg.eta] * N
    lo, hi = cfg.window
    if window_start is None:
        window_start = draw_window_start(cfg, generator)
    if not lo <= window_start <= hi - cfg.window_size:
        raise ValueError(f"window_start {window_start} outside [{lo}, {hi - cfg.window_size}]")
    return [cfg.eta if window_start <= i < window_start + cfg.window_size else 0.0 for i in range(N)]


def steps_to_train(cfg, betas):
    N = cfg.num_steps
    if cfg.window_size:
        steps = [i for i in range(N) if betas[i] > 0]
    elif cfg.train_steps:
        steps = sorted(set(cfg.train_steps))
    else:
        steps = [i for i in range(N - 1) if betas[i] > 0]
    if N - 1 in steps:
        raise ValueError(f"step {N - 1} (the last) must never be trained: its log-prob is ~700x more sensitive")
    weak = [i for i in steps if betas[i] < MIN_TRAIN_STD]
    if weak:
        raise ValueError(f"train_steps {weak} have std < {MIN_TRAIN_STD} (deterministic): nothing to train")
    return steps


def draw_noise(cfg, latent_shape, random_steps, generator):
    """(initial noises [K, ...], step noises [K, len(random_steps), ...]) in the one-trajectory-at-a-time order (its
    initial noise, then its steps'; same_latent: one initial draw first), so every layout samples the same noise."""
    K, device = cfg.group_size, generator.device
    draw = lambda: torch.randn(1, *latent_shape, generator=generator, device=device)[0]  # noqa: E731
    shared = draw() if cfg.same_latent else None
    init = torch.empty(K, *latent_shape, device=device)
    z = torch.empty(K, len(random_steps), *latent_shape, device=device)
    for k in range(K):
        init[k] = shared if shared is not None else draw()
        for j in range(len(random_steps)):
            z[k, j] = draw()
    return init, z


@torch.no_grad()
def rollout_group(net, cond: Condition, latent_shape, cfg, generator, window_start=None):
    """Sample K trajectories for one group. latent_shape: (C, T, H, W). generator: a torch.Generator on the device.

    Conditioning elements get no noise (their mean is theta-independent), so they stay on Predict2's deterministic
    path. Log-probs are computed from the stored next state, exactly as training will recompute them.
    window_start (Flow-GRPO-Fast only) fixes the window instead of drawing it. Under FSDP every rank must run the
    same number of forwards: pass the same start everywhere (same_latent computes the shared prefix once).
    """
    N, K = cfg.num_steps, cfg.group_size
    if cfg.rollout_batch != "none" and not cfg.recompute_old_logp:
        raise ValueError(f"rollout_batch={cfg.rollout_batch!r} rounds unlike the training forward (B = 1 calls): set "
                         "recompute_old_logp (--grpo-recompute-old-logp), or the ratio would not start at 1")
    device = generator.device
    family = family_of(net.cfg)
    sigmas, timesteps = family.rollout_grid(N)
    etas = step_noise_levels(cfg, generator, window_start)
    alphas, betas = zip(*(step_coefficients(cfg.sde_type, sigmas[i], sigmas[i + 1], etas[i], family)
                          for i in range(N)))
    random_steps = [i for i in range(N) if betas[i] > 0]
    ro = Rollout(cond=cond, family=family, sigmas=sigmas, alphas=list(alphas), betas=list(betas),
                 train_steps=steps_to_train(cfg, betas), states=torch.empty(K, N + 1, *latent_shape, device=device),
                 log_probs=torch.full((K, N), float("nan"), device=device), x0_final=None, timesteps=timesteps,
                 shared_until=(random_steps[0] if random_steps else N) if cfg.same_latent else -1, uncond={})
    gen_mask = generated_mask(cond, latent_shape, device)
    init, z = draw_noise(cfg, latent_shape, random_steps, generator)
    ro.states[:, 0] = family.initial_state(init)  # Predict2: sigma_0 * noise; RF: the unit-variance noise
    for i in range(N):
        rows = [0] if ro.shares(i) else list(range(K))
        x = ro.states[rows, i]
        pred_c, pred_u = branch_predictions(net, x, ro.states[rows, 0], i, ro.grid, cond, cfg)
        count_calls(ro, cfg, len(rows))
        mean = mean_of(guide(pred_c, pred_u, cfg.guidance), x, i, ro.grid).expand(K, *latent_shape)
        if i in ro.train_steps and pred_u is not None:
            ro.uncond.update({(k, i): pred_u[min(k, len(rows) - 1)][None] for k in range(K)})
        if betas[i] > 0:
            ro.states[:, i + 1] = mean + betas[i] * z[:, random_steps.index(i)] * gen_mask
            for k in range(K):
                ro.log_probs[k, i] = gaussian_log_prob(ro.states[k, i + 1: i + 2], mean[k: k + 1], betas[i],
                                                       gen_mask)[0]
        else:
            ro.states[:, i + 1] = mean

    def guided_at_last(x):  # Predict2's clean pass at sigma_N (RF: x_N is x0_hat already, no call)
        pred_c, pred_u = branch_predictions(net, x, ro.states[:, 0], N, ro.grid, cond, cfg)
        count_calls(ro, cfg, K)
        return guide(pred_c, pred_u, cfg.guidance)
    ro.x0_final = family.final_x0(guided_at_last, ro.states[:, N], cond)
    ro.old_log_probs = ro.log_probs.clone()
    return ro


def count_calls(rollout: Rollout, cfg, states):
    """Add the network calls and samples of branch_predictions on `states` states to the rollout's counts."""
    branches = 1 + (cfg.guidance != 0)
    rollout.forwards += states * branches
    rollout.calls += {"none": states * branches, "cfg": states, "group": 1}[cfg.rollout_batch]
