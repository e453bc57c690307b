"""The Predict2.5 reference files that are not network cases, checked in full through nets/flow.py.

Called by tests/check_reference.py for `p25_unipc_ref`, `p25_training_ref` and `p25_sampler_ref` (the format of the
predict25 reference folder); each function returns [(label, max-abs error, bound)] like the rest of the checker:
* p25_unipc_ref: every grid (flow.time_grid: timesteps exact, sigmas 1e-7) and every step of the 35-step runs given
  the recorded velocities (flow.unipc: x0 and sample after each step, 1e-5).
* p25_training_ref: the time draws (flow.shifted_timesteps on the recorded normals: exact; the json's u grid and
  200,000-draw statistics: 1e-6), the n_cond masks (flow.num_conditional_frames fed Python's `random` stream, which
  is what upstream draws from; our training draws come from per-sample torch generators by design), and both RF loss
  runs given the recorded draws (flow.loss_given_draws: per-instance loss rtol 1e-5, what the net sees, its output).
* p25_sampler_ref: both runs through flow.sample on the p25_v2w_proj network (same folder): initial noise, grids,
  every step's latents and guided velocity (the latter given the stored latents, flow.guided_velocity), v_cond and
  v_uncond where recorded (flow.velocity), final latents (3e-4; 2e-5 for single network calls).
Every tensor of a file is compared or named with the reason it is not; a tensor this script does not account for
is a failure, and so is a missing nets/flow.py function.
"""
import json
import os
import random
import re
from dataclasses import replace

import numpy as np
import torch
from safetensors.torch import load_file

from check_reference import BOUND, MISSING, build_dit_case, max_abs
from condition import Condition, condition_mask
from nets import flow

GRID_SIGMA_BOUND = 1e-7  # the reference README: fp32 sigmas are 3e-8 from the float64 formula
UNIPC_BOUND = 1e-5  # the README: a float64 implementation of the formulas moves the states by 1.4e-6
DRAW_BOUND = 1e-6  # sigma from the formula (the README: 9.6e-8 from float64); timesteps = 1000 sigma: 1e-3
LOSS_RTOL = 1e-5  # per-instance loss, float64 from the recorded draws: 1.5e-7
SAMPLER_BOUND = 3e-4  # guided velocities / latents over a whole run: 2e-5 x (1 + 2g), g = 7
NETWORK = "p25_v2w_proj"  # the network the training and sampler files were made with


class Ledger:
    """The results of one reference file plus the tensors they used and the ones named as not checked."""

    def __init__(self, ref):
        self.ref, self.results, self.used, self.notes = ref, [], set(), {}

    def compare(self, key, ours, bound, label=None, theirs=None):
        """max-abs of ours against the tensor `key` (or `theirs`, a tensor made from it)."""
        self.used.add(key)
        self.results.append((label or key, max_abs(ours, self.ref[key] if theirs is None else theirs), bound))

    def relative(self, key, ours, bound):
        self.used.add(key)
        theirs = self.ref[key].double()
        err = ((ours.double().reshape(theirs.shape) - theirs).abs() / theirs.abs()).max().item()
        self.results.append((key + " (relative)", err, bound))

    def value(self, label, ours, theirs, bound):  # a json value, not a tensor
        diff = np.abs(np.asarray(ours, dtype=np.float64) - np.asarray(theirs, dtype=np.float64))
        self.results.append((label, float(diff.max()) if diff.size else 0.0, bound))

    def input(self, key):
        self.used.add(key)
        return self.ref[key]

    def not_checked(self, key, why):
        self.notes[key] = why

    def close(self):
        """Print the tensors named as not checked; any other unused tensor is a failure."""
        for key, why in sorted(self.notes.items()):
            print(f"    {key}: not checked: {why}")
        for key in sorted(set(self.ref) - self.used - set(self.notes)):
            self.results.append((f"{key}: not accounted for by this checker", MISSING, 0.0))
        return self.results


def missing_functions(*names):
    """A MISSING result per nets/flow.py function the check needs and that does not exist."""
    return [(f"flow.{n} does not exist", MISSING, 0.0) for n in names if not hasattr(flow, n)]


def step_indices(ref, pattern):
    return sorted(int(m.group(1)) for k in ref for m in [re.fullmatch(pattern, k)] if m)


# -----------------------------------------------------------------------------
# p25_unipc_ref: FlowUniPCMultistepScheduler grids and steps


def grid_args(name):
    """'shift5_N35' -> ('shift', 35); 'karras_N8' -> ('karras', 8)."""
    grid, n = re.fullmatch(r"(shift5|karras)_N(\d+)", name).groups()
    return ("shift" if grid == "shift5" else "karras"), int(n)


def check_unipc(json_path):
    missing = missing_functions("time_grid", "unipc", "initial_noise")
    if missing:
        return missing
    info = json.load(open(json_path))
    book = Ledger(load_file(json_path[: -len(".json")] + ".safetensors"))
    for name in sorted({k.split(".")[1] for k in book.ref if k.startswith("grid.")}):
        sigmas, timesteps = flow.time_grid(*grid_args(name))
        book.compare(f"grid.{name}.timesteps_int64", timesteps, 0.0)
        book.compare(f"grid.{name}.sigmas_fp32", sigmas, GRID_SIGMA_BOUND)
    for name in sorted({k.split(".")[1] for k in book.ref if k.startswith("step.")}):
        p = f"step.{name}."
        sigmas, _ = flow.time_grid(*grid_args(name))
        book.compare(p + "in.sample0", flow.initial_noise((1, 16, 2, 2, 2), 0), 0.0,
                     p + "in.sample0 (flow.initial_noise seed 0, the json's arch_invariant_rand)")
        states = {}
        flow.unipc(lambda x, i: book.input(p + f"in.velocity_step{i}"), book.ref[p + "in.sample0"], sigmas,
                   callback=lambda i, x, x0: states.__setitem__(i, (x, x0)))
        recorded = step_indices(book.ref, re.escape(p) + r"out\.sample_after_step(\d+)")
        if sorted(states) != recorded:
            book.results.append((f"{p}: flow.unipc ran steps {sorted(states)}, the reference {recorded}", MISSING, 0))
        for i in sorted(set(states) & set(recorded)):
            book.compare(p + f"out.x0_step{i}", states[i][1], UNIPC_BOUND)
            book.compare(p + f"out.sample_after_step{i}", states[i][0], UNIPC_BOUND)
        orders = info.get("step_" + name, {}).get("orders", [])
        # measured: order 1 everywhere, or order 1 already at step N-2, moves the states by 5e-3 to 8e-2; the last
        # step's order cannot show (sigma_N = 0 lands on x0 whatever the order)
        print(f"    p25_unipc_ref.json step_{name}.orders ({len(orders)} steps): not checked as such: flow.unipc "
              "keeps its order schedule internal; another schedule moves the step states checked above")
    return book.close()


# -----------------------------------------------------------------------------
# p25_training_ref: time draws, conditional-frame draws, the RF loss given the draws


def check_training(json_path, network):
    missing = missing_functions("shifted_timesteps", "num_conditional_frames", "loss_given_draws", "velocity",
                                "net_time")
    if missing:
        return missing
    info = json.load(open(json_path))
    book = Ledger(load_file(json_path[: -len(".json")] + ".safetensors"))
    # time: the recorded normals -> timesteps, sigma in upstream's fp32 ops (bit-equal)
    timesteps, sigma = flow.shifted_timesteps(book.input("time.normal_draws_S_B"))
    book.compare("time.timesteps_S_B", timesteps, 0.0)
    book.compare("time.sigma_S_B", sigma, 0.0)
    book.not_checked("time.u_S_B", "flow.shifted_timesteps keeps u = sigmoid(normal) internal; the timesteps and "
                                   "sigma made from it are bit-equal above")
    spec = info["time_sampling"]
    # the json's u grid, fed as normals logit(u) (float64, then flow's fp32 ops: 1 ulp of u at most)
    grid_t, grid_sigma = flow.shifted_timesteps(torch.logit(torch.tensor(spec["grid_u"], dtype=torch.float64)))
    book.value("time_sampling.grid_sigma (json) from grid_u", grid_sigma, spec["grid_sigma"], DRAW_BOUND)
    book.value("time_sampling.grid_timesteps (json) from grid_u", grid_t, spec["grid_timesteps"], 1000 * DRAW_BOUND)
    # 200,000 draws: the same normals (torch's CPU stream at seed 1234) through our formula
    stats = spec["statistics_200000_draws_seed_1234"]
    _, many = flow.shifted_timesteps(torch.randn(200_000, generator=torch.Generator().manual_seed(1234)))
    many = many.double()
    quantiles = torch.quantile(many, torch.tensor([0.05, 0.25, 0.5, 0.75, 0.95], dtype=torch.float64))
    book.value("time_sampling 200k draws: mean sigma, 5 quantiles, fraction > 0.9 (json)",
               [many.mean(), *quantiles, (many > 0.9).double().mean()],
               [stats["mean_sigma"], *stats["quantiles_0.05_0.25_0.5_0.75_0.95"], stats["fraction_sigma_gt_0.9"]],
               DRAW_BOUND)
    check_condition_draws(book, info["conditioning_frames"])
    for run in sorted({k.split(".")[1] for k in book.ref if k.startswith("loss.")}):
        check_loss_run(book, f"loss.{run}.", info["rf_loss"]["runs"][run], network)
    return book.close()


def check_condition_draws(book, spec):
    """Upstream draws n per sample by random.choices over {0: 0.5, 1: 0.25, 2: 0.25}, one uniform random.random()
    each; flow.num_conditional_frames inverts the same CDF, so the same uniforms give the same n, masks, frequencies."""
    for key in sorted(k for k in book.ref if k.startswith("cond.mask_seed")):
        seed = int(re.fullmatch(r"cond\.mask_seed(\d+)_B_1_T_1_1", key).group(1))
        stream = random.Random(seed)
        theirs = book.ref[key]
        B, T = theirs.shape[0], theirs.shape[2]
        n = [flow.num_conditional_frames(stream.random(), T) for _ in range(B)]
        book.compare(key, condition_mask(torch.zeros(B, 1, T, 1, 1), torch.tensor(n)), 0.0,
                     f"{key} (n = {n}, condition.condition_mask)")
    stream = random.Random(0)
    n = [flow.num_conditional_frames(stream.random(), 4) for _ in range(40_000)]
    frequencies = spec["empirical_frequencies_40000_draws_random_seed_0"]
    book.value("conditioning_frames empirical frequencies of 40000 draws (json)",
               np.bincount(n, minlength=3) / len(n), [frequencies[str(k)] for k in range(3)], 0.0)
    image_rule = [flow.num_conditional_frames(u, 1) for u in (0.0, 0.6, 0.9)]
    book.value("conditioning_frames image batch (T = 1) -> n = 0 (json)", image_rule, spec["image_batch_T1"], 0.0)


def check_loss_run(book, p, spec, network):
    """flow.loss_given_draws given the recorded u, n_cond, epsilon and dropped text, with the net's inputs and output
    recorded on the way; flow.velocity on the recorded xt for velocity_pred."""
    x0, eps = book.input(p + "in.x0_B_C_T_H_W"), book.input(p + "draw.epsilon_B_C_T_H_W")
    text = book.input(p + "draw.crossattn_emb_after_dropout")
    n_cond = book.input(p + "draw.n_cond_B")
    cft = spec["experiment_config"]["conditional_frame_timestep"]
    # u -> our timesteps: logit(u) is the normal upstream drew (float64, then flow's fp32 ops)
    timesteps, sigma = flow.shifted_timesteps(torch.logit(book.input(p + "draw.u_B").double()))
    book.compare(p + "out.timesteps_B_1", timesteps.view(-1, 1), 1000 * DRAW_BOUND)
    book.compare(p + "out.sigma_B_1", sigma.view(-1, 1), DRAW_BOUND)
    mask = condition_mask(x0, n_cond)
    seen = {}

    def recording_net(x, t, cond):
        out = network(x, t, cond)
        seen.update(x=x, t=t, mask=cond.condition_mask, out=out)
        return out

    cond = Condition(text, gt_frames=x0, condition_mask=mask, conditional_frame_timestep=cft)
    with torch.no_grad():
        per_instance = flow.loss_given_draws(recording_net, x0, cond, eps, timesteps)
        velocity_pred = flow.velocity(network, book.ref[p + "out.xt_B_C_T_H_W"], timesteps, cond, eps)
    book.relative(p + "out.per_instance_loss_B", per_instance, LOSS_RTOL)
    book.relative(p + "out.loss", per_instance.mean(), LOSS_RTOL)
    book.compare(p + "out.net_input_condition_mask_B_1_T_H_W", seen["mask"], 0.0)
    # the net's t is upstream's timesteps x 0.001, the fp32 multiply upstream's net does first (bit-equal)
    book.compare(p + "out.net_input_timesteps", seen["t"], 0.0, p + "out.net_input_timesteps x 0.001 (our net's t)",
                 book.ref[p + "out.net_input_timesteps"].float() * flow.TIMESTEP_SCALE)
    book.compare(p + "out.net_input_x_B_C_T_H_W", seen["x"], DRAW_BOUND)
    book.compare(p + "out.net_output_B_C_T_H_W", seen["out"], BOUND)
    book.compare(p + "out.velocity_pred_B_C_T_H_W", velocity_pred, BOUND, p + "out.velocity_pred_B_C_T_H_W"
                 " (flow.velocity on the recorded xt)")
    # xt is what the net sees on the noisy frames; on the conditional frames it is replaced by gt before the net
    noisy = 1 - mask
    book.compare(p + "out.xt_B_C_T_H_W", seen["x"] * noisy, DRAW_BOUND,
                 p + "out.xt_B_C_T_H_W on the noisy frames (the net's input there)",
                 book.ref[p + "out.xt_B_C_T_H_W"] * noisy)
    book.not_checked(p + "out.xt_B_C_T_H_W [conditional frames]", "replaced by gt before the net (net_input_x there)")
    book.not_checked(p + "out.target_velocity_B_C_T_H_W", "flow.loss_given_draws forms eps - x0 internally; it "
                                                          "enters the per-instance loss checked above")
    book.not_checked(p + "in.t5_text_embeddings", "upstream's text before dropout; the loss takes the recorded "
                                                  "draw.crossattn_emb_after_dropout (our dropout draws differ by "
                                                  "design: per-sample torch generators)")


# -----------------------------------------------------------------------------
# p25_sampler_ref: generate_samples_from_batch with CFG on the p25_v2w_proj network


def check_sampler(json_path, network):
    missing = missing_functions("sample", "time_grid", "initial_noise", "guided_velocity", "velocity")
    if missing:
        return missing
    info = json.load(open(json_path))
    book = Ledger(load_file(json_path[: -len(".json")] + ".safetensors"))
    x0 = book.input("in.x0_latent_B_C_T_H_W")
    emb, neg = book.input("in.crossattn_emb"), book.input("in.neg_crossattn_emb")
    for run in sorted({k.split(".")[0] for k in book.ref if not k.startswith("in.")}):
        spec, p = info[run], run + "."
        grid = "karras" if spec["use_kerras_sigma_at_inference"] else "shift"
        guidance, cft = spec["guidance"], spec["conditional_frame_timestep"]
        mask = condition_mask(x0, spec["num_conditional_frames"])
        noise = flow.initial_noise(tuple(x0.shape), spec["seed"])
        book.compare(p + "initial_noise", noise, 0.0)
        sigmas, timesteps = flow.time_grid(grid, spec["num_steps"])
        book.compare(p + "sigmas_fp32", sigmas, GRID_SIGMA_BOUND)
        book.compare(p + "timesteps_int64", timesteps, 0.0)
        # the whole run, as sample.py runs it
        cond = Condition(emb, neg, x0, mask, conditional_frame_timestep=cft)
        states = {}
        with torch.no_grad():
            final = flow.sample(network, noise, cond, guidance, grid, spec["num_steps"],
                                callback=lambda i, x, x0_pred: states.__setitem__(i, (x, x0_pred)))
        recorded = step_indices(book.ref, re.escape(p) + r"step(\d+)\.latents_after")
        if sorted(states) != recorded:
            book.results.append((f"{p}: flow.sample ran steps {sorted(states)}, the reference {recorded}", MISSING, 0))
        for i in sorted(set(states) & set(recorded)):
            s = f"{p}step{i}."
            book.compare(s + "latents_after", states[i][0], SAMPLER_BOUND)
            if s + "x0_pred" in book.ref:
                book.compare(s + "x0_pred", states[i][1], SAMPLER_BOUND)
            if s + "net_timesteps" in book.ref:
                book.compare(s + "net_timesteps", timesteps[i].view(1, 1), 0.0, s + "net_timesteps (flow.time_grid)")
            # single steps given the stored latents the net saw (upstream's, so no drift from our own run)
            x = noise if i == 0 else book.ref[f"{p}step{i - 1}.latents_after"]
            t = timesteps[i].expand(x.shape[0])
            with torch.no_grad():
                book.compare(s + "v_guided", flow.guided_velocity(network, x, t, cond, guidance, noise=noise),
                             SAMPLER_BOUND, s + "v_guided (given the stored latents)")
                for name, text in (("v_cond", emb), ("v_uncond", neg)):
                    if s + name in book.ref:
                        v = flow.velocity(network, x, t, replace(cond, crossattn_emb=text), noise)
                        book.compare(s + name, v, BOUND, s + name + " (given the stored latents)")
        # upstream returns the last x0 as is: its conditional frames hold (1 - sigma_0) noise + sigma_0 gt (the
        # exact solution for the constant velocity noise - gt); flow.sample's last state is that, its return puts
        # gt back on the conditional frames
        last = states[max(states)][0]
        book.compare(p + "final_latents", last, SAMPLER_BOUND,
                     p + "final_latents vs our last state (upstream's convention on the conditional frames)")
        book.results.append((p + "flow.sample's return: gt on the conditional frames", max_abs(final * mask, x0 * mask),
                             0.0))
        book.results.append((p + "flow.sample's return: the last state elsewhere",
                             max_abs(final * (1 - mask), last * (1 - mask)), 0.0))
    return book.close()


# -----------------------------------------------------------------------------


def p25_network(ref_dir):
    stem = os.path.join(ref_dir, NETWORK)
    if not os.path.exists(stem + ".json"):
        raise FileNotFoundError(f"{stem}.json: the training and sampler references need their network case there")
    return build_dit_case(json.load(open(stem + ".json")), stem + ".weights.safetensors")


def check_file(json_path):
    """[(label, error, bound)] of one of the three files, by its name."""
    name = os.path.basename(json_path)[: -len(".json")]
    if name == "p25_unipc_ref":
        return check_unipc(json_path)
    if name == "p25_training_ref":
        return check_training(json_path, p25_network(os.path.dirname(json_path)))
    if name == "p25_sampler_ref":
        return check_sampler(json_path, p25_network(os.path.dirname(json_path)))
    raise ValueError(f"{json_path}: not a Predict2.5 reference file this checker knows")
