"""nets/vae.py: upstream reference cases, the released key table, input checks, chunking invariance, the bench path."""
import glob
import io
import json
import os
from contextlib import redirect_stdout

import pytest
import torch
from safetensors.torch import load_file

import vae_bench
from nets.vae import WanVAE, get_vae_config, vae_config_from_upstream
from ref_vae import run_vae_case

REF_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "reference")
CASES = sorted(glob.glob(os.path.join(REF_DIR, "vae_*.json")))
KWARGS_KEY = "VAE_ kwargs as built (upstream _video_vae cfg + overrides)"


def tiny_vae(seed=0):
    torch.manual_seed(seed)
    return WanVAE(get_vae_config("tiny")).eval()


def random_video(B, T, H, W, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(B, 3, T, H, W, generator=g) * 2 - 1


def test_reference_cases_present():
    assert len(CASES) >= 2, f"expected the vae_* reference cases in {REF_DIR}"


@pytest.mark.parametrize("json_path", CASES, ids=os.path.basename)
def test_reference_case(json_path):
    rows = run_vae_case(json_path)
    labels = [label for label, _, _ in rows]
    assert any(label.endswith("latent") for label in labels) and any(label.endswith("decoded") for label in labels)
    bad = [(label, err, bound) for label, err, bound in rows if not err <= bound]
    assert not bad, f"outside bounds: {bad}"


def test_real_config_meta_build_matches_checkpoint_table():
    case = json.load(open(CASES[0]))
    real = case["real_config_width96"]
    assert vae_config_from_upstream({**case["constructor"][KWARGS_KEY], "dim": 96}) == get_vae_config("real")
    with torch.device("meta"):
        model = WanVAE(get_vae_config("real"))
    ours = [[k, list(v.shape)] for k, v in model.state_dict().items()]
    assert ours == [[k, shape] for k, shape, _ in real["state_dict_keys [key, shape, dtype]"]]  # same order too
    assert len(ours) == 194
    assert sum(p.numel() for p in model.parameters()) == real["num_parameters"] == 126_892_531
    for name, n in real["num_parameters_by_top_module"].items():
        assert sum(p.numel() for p in getattr(model, name).parameters()) == n, name


def test_tiny_config_is_the_reference_width():
    kwargs = json.load(open(os.path.join(REF_DIR, "vae_image_and_video_t13.json")))["constructor"][KWARGS_KEY]
    assert vae_config_from_upstream(kwargs) == get_vae_config("tiny")


def test_upstream_kwargs_not_supported_raise():
    with pytest.raises(ValueError, match="attn_scales"):
        vae_config_from_upstream({"dim": 8, "attn_scales": [0.25]})
    with pytest.raises(ValueError, match="unknown_arg"):
        vae_config_from_upstream({"dim": 8, "unknown_arg": 1})


@pytest.mark.parametrize("T", [2, 4, 6, 12, 92])
def test_frame_count_must_be_4k_plus_1(T):
    with pytest.raises(ValueError, match=f"T={T} frames"):
        tiny_vae().encode(torch.zeros(1, 3, T, 16, 16))


@pytest.mark.parametrize("H,W", [(20, 32), (32, 12), (4, 16)])
def test_height_width_must_be_multiples_of_8(H, W):
    with pytest.raises(ValueError, match=f"{H} x {W}"):
        tiny_vae().encode(torch.zeros(1, 3, 5, H, W))


def test_bad_inputs_raise():
    model = tiny_vae()
    with pytest.raises(ValueError, match="uint8"):
        model.encode(torch.zeros(1, 3, 5, 16, 16, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"\(1, 4, 5, 16, 16\)"):
        model.encode(torch.zeros(1, 4, 5, 16, 16))
    with pytest.raises(ValueError, match="temporal_window=6"):
        model.encode(torch.zeros(1, 3, 5, 16, 16), temporal_window=6)
    with pytest.raises(ValueError, match=r"\(1, 8, 2, 2, 2\)"):
        model.decode(torch.zeros(1, 8, 2, 2, 2))


def test_window_4_and_16_agree():
    model, video = tiny_vae(), random_video(1, 21, 16, 16)
    w16 = model.encode(video)
    assert (model.encode(video, temporal_window=4) - w16).abs().max() < 1e-5
    assert (model.encode(video, temporal_window=8) - w16).abs().max() < 1e-5


def test_encoding_is_causal():
    # frames 0..8 -> latents 0..2, whatever comes later (so the first latent can condition generation)
    model, video = tiny_vae(), random_video(1, 17, 16, 16)
    changed = video.clone()
    changed[:, :, 9:] = random_video(1, 8, 16, 16, seed=2)
    a, b = model.encode(video, temporal_window=4), model.encode(changed, temporal_window=4)
    assert torch.equal(a[:, :, :3], b[:, :, :3]) and not torch.equal(a[:, :, 3:], b[:, :, 3:])


@pytest.mark.parametrize("B,T,H,W", [(2, 1, 16, 24), (1, 9, 24, 16), (1, 21, 8, 8)])
def test_encode_decode_shapes(B, T, H, W):
    model = tiny_vae()
    latent = model.encode(random_video(B, T, H, W))
    assert latent.shape == (B, 16, 1 + (T - 1) // 4, H // 8, W // 8)
    video = model.decode(latent)
    assert video.shape == (B, 3, T, H, W) and video.dtype == torch.float32 and torch.isfinite(video).all()


def test_bf16_close_to_upstream_fp32():
    # the pipelines run the VAE in bf16; upstream's own CPU bf16 run deviates from fp32 by the json's numbers
    json_path = os.path.join(REF_DIR, "vae_nonsquare_t17.json")
    case = json.load(open(json_path))
    info = next(v for k, v in case["calls"]["video"].items() if k.startswith("bf16_info"))
    model = WanVAE(vae_config_from_upstream(case["constructor"][KWARGS_KEY]))
    model.load_state_dict(load_file(json_path.replace(".json", ".weights.safetensors")))
    model = model.to(torch.bfloat16)
    ref = load_file(json_path.replace(".json", ".io.safetensors"))
    latent = model.encode(ref["in.video"])  # fp32 in -> bf16 compute -> fp32 out, like upstream VAE.encode
    assert latent.dtype == torch.float32
    assert (latent - ref["out.latent"]).abs().max() < 3 * info["latent_max_abs_diff_vs_fp32"]
    decoded = model.decode(ref["out.latent"].bfloat16())
    assert decoded.dtype == torch.bfloat16
    assert (decoded.float() - ref["out.decoded"]).abs().max() < 3 * info["decoded_max_abs_diff_vs_fp32"]


def test_bench_runs_on_cpu():
    out = io.StringIO()
    with redirect_stdout(out):
        vae_bench.main(["--bench", "--device", "cpu", "--config", "tiny", "--frames", "5", "--height", "16",
                  "--width", "16", "--dtype", "fp32", "--runs", "1", "--window", "4"])
    result = json.loads(out.getvalue().strip().splitlines()[-1])
    assert result["latent"] == [1, 16, 2, 2, 2] and result["encode_s"] > 0 and result["decode_s"] > 0


def test_tokenizer_pth_loads_through_the_strict_checkpoint_path(tmp_path):
    """tokenizer.pth is a plain state_dict saved with torch.save: ckpt.load takes it key for key."""
    import ckpt
    from nets.vae import WanVAE, get_vae_config
    torch.manual_seed(0)
    src = WanVAE(get_vae_config("tiny"))
    path = str(tmp_path / "tokenizer.pth")
    torch.save(src.state_dict(), path)
    torch.manual_seed(1)
    dst = WanVAE(get_vae_config("tiny"))
    report = ckpt.load(dst, path)
    assert report.ok and not report.missing and not report.unexpected
    assert all(torch.equal(a, b) for a, b in zip(src.state_dict().values(), dst.state_dict().values()))
    broken = {k: v for k, v in src.state_dict().items() if not k.startswith("decoder.head")}
    torch.save(broken, path)
    with pytest.raises(ckpt.CheckpointError, match="missing"):
        ckpt.load(dst, path)
