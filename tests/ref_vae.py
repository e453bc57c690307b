"""Run one upstream Wan2.1 VAE reference case (`vae_<case>.json` + `.weights.safetensors` + `.io.safetensors`,
the format of tests/data/reference/) through nets/vae.py and report the max-abs error of every output.

Called by tests/check_reference.py for every VAE case it finds, and by tests/test_vae.py.
Bounds (from the reference README): 1e-5 on latents, 3e-5 on decoded frames; key tables must match exactly.
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from nets.vae import WanVAE, get_vae_config, vae_config_from_upstream  # noqa: E402

LATENT_BOUND = 1e-5
DECODED_BOUND = 3e-5


def max_abs(ours, theirs):
    if tuple(ours.shape) != tuple(theirs.shape):
        return float("inf")
    return (ours.double() - theirs.double()).abs().max().item()


def key_table_rows(label, model, table, num_parameters):
    """Our state_dict (names, shapes) against a reference [key, shape, dtype] table, plus the parameter count."""
    ours = {(k, tuple(v.shape)) for k, v in model.state_dict().items()}
    theirs = {(k, tuple(shape)) for k, shape, _ in table}
    wrong = len(ours ^ theirs)
    n_params = sum(p.numel() for p in model.parameters())
    return [(f"{label} key/shape differences", float(wrong), 0.0),
            (f"{label} parameter count {n_params} vs {num_parameters}", float(abs(n_params - num_parameters)), 0.0)]


def run_vae_case(json_path: str) -> list[tuple[str, float, float]]:
    """[(label, max_abs_err, bound)] for every output of one VAE reference case."""
    case = json.load(open(json_path))
    stem = json_path[: -len(".json")]
    cfg = vae_config_from_upstream(case["constructor"]["VAE_ kwargs as built (upstream _video_vae cfg + overrides)"])
    model = WanVAE(cfg)
    model.load_state_dict(load_file(stem + ".weights.safetensors"), strict=True)
    model.eval()
    io = load_file(stem + ".io.safetensors")

    rows = key_table_rows("case", model, case["state_dict_keys [key, shape, dtype]"], case["num_parameters"])
    real = case.get("real_config_width96")
    if real is not None:
        with torch.device("meta"):
            real_model = WanVAE(get_vae_config("real"))
        rows += key_table_rows("real width-96", real_model, real["state_dict_keys [key, shape, dtype]"],
                               real["num_parameters"])

    # one call per `in.<prefix>video` tensor: the prefix is "image_" or "" in the published cases
    prefixes = sorted(k[len("in."):-len("video")] for k in io if k.startswith("in.") and k.endswith("video"))
    if not prefixes:
        raise ValueError(f"{json_path}: no in.<prefix>video tensor in {stem}.io.safetensors")
    for p in prefixes:
        video = io[f"in.{p}video"]
        rows.append((f"{p}latent", max_abs(model.encode(video), io[f"out.{p}latent"]), LATENT_BOUND))
        if f"out.{p}latent_window4" in io:  # stored only when window 4 is not bit-identical to window 16
            rows.append((f"{p}latent_window4", max_abs(model.encode(video, temporal_window=4),
                                                        io[f"out.{p}latent_window4"]), LATENT_BOUND))
        # upstream decoded its own latent, so decoding the reference latent isolates the decoder
        rows.append((f"{p}decoded", max_abs(model.decode(io[f"out.{p}latent"]), io[f"out.{p}decoded"]),
                     DECODED_BOUND))
    return rows

