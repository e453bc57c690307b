"""sample.py CLI: video2world from a first frame, written as an mp4 with the requested number of frames."""
import os
import subprocess
import sys

import imageio.v2 as imageio
import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_sample_cli_writes_a_video_from_an_image(tmp_path):
    image = str(tmp_path / "first.png")
    frame = np.zeros((90, 160, 3), np.uint8)
    frame[:45, :80] = (200, 30, 30)
    imageio.imwrite(image, frame)
    out = str(tmp_path / "video.mp4")
    proc = subprocess.run([sys.executable, "sample.py", "--ckpt", "random", "--image", image, "--steps", "3",
                           "--out", out], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "RANDOM weights" in proc.stdout
    frames = imageio.mimread(out)
    assert len(frames) == 9 and frames[0].shape == (64, 112, 3)


def test_sample_cli_refuses_a_missing_checkpoint_and_real_configs_without_embeddings(tmp_path):
    proc = subprocess.run([sys.executable, "sample.py", "--ckpt", str(tmp_path / "nope.pt")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "nope.pt" in proc.stderr
    sys.path.insert(0, ROOT)
    import sample
    with pytest.raises(ValueError, match="prompt-emb"):
        sample.parse_config(["--config", "v2w-2b", "--ckpt", "droid"])


def test_sample_from_a_lora_run_with_ema(tmp_path):
    run_dir, grid = str(tmp_path / "run"), str(tmp_path / "grid")
    sys.path.insert(0, ROOT)
    import train
    train.make_tiny_dataset(grid)  # train.py reads --data, never writes it
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "train.py", "--data", grid, "--out", run_dir, "--steps", "2", "--lora", "4",
                           "--ema", "0.1", "--sample-every", "0"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for extra in ([], ["--ema"], ["--no-ema"]):
        out = str(tmp_path / f"v{len(extra)}.mp4")
        # no --config, --data or size: the run's own config.json says how it was trained
        proc = subprocess.run([sys.executable, "sample.py", "--ckpt", run_dir, "--steps", "2", "--out", out, *extra],
                              cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert "step 2" in proc.stdout and len(imageio.mimread(out)) == 9
        assert ("(EMA)" in proc.stdout) == (extra == ["--ema"])
    proc = subprocess.run([sys.executable, "sample.py", "--ckpt", run_dir, "--config", "v2w-2b"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2 and "trained tiny" in proc.stderr and "Traceback" not in proc.stderr


def test_no_ema_picks_the_raw_copy_of_a_file_holding_both(tmp_path):
    """--no-ema works for a release file that holds net. and net_ema.; without a choice it is an error."""
    import torch
    sys.path.insert(0, ROOT)
    from model import DiT, get_config
    net = DiT(get_config("tiny"))
    torch.manual_seed(0)
    net.init_weights()
    both = {**{"net." + k: v for k, v in net.state_dict().items()},
            **{"net_ema." + k: v + 1 if v.is_floating_point() else v for k, v in net.state_dict().items()}}
    path = str(tmp_path / "both.pt")
    torch.save(both, path)
    image = str(tmp_path / "first.png")
    imageio.imwrite(image, np.zeros((64, 112, 3), np.uint8))
    outputs = {}
    for extra in ([], ["--ema"], ["--no-ema"]):
        out = str(tmp_path / f"b{len(extra)}{extra[:1]}.mp4")
        proc = subprocess.run([sys.executable, "sample.py", "--ckpt", path, "--steps", "1", "--out", out, "--image",
                               image, *extra],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
        outputs[tuple(extra)] = proc
    assert outputs[()].returncode == 2 and "both" in outputs[()].stderr
    assert outputs[("--ema",)].returncode == 0 and outputs[("--no-ema",)].returncode == 0, outputs[("--ema",)].stderr
    proc = subprocess.run([sys.executable, "sample.py", "--ckpt", "random", "--data", str(tmp_path / "nowhere")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "pass --image" in proc.stderr


def test_p25_cli_samples_with_unipc_and_refuses_unipc_flags_for_predict2(tmp_path):
    out = str(tmp_path / "p25.mp4")
    proc = subprocess.run([sys.executable, "sample.py", "--config", "p25-tiny", "--ckpt", "random", "--steps", "2",
                           "--grid", "karras", "--image", os.path.join(ROOT, "tests", "data", "nope.png"), "--out",
                           out],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "nope.png" in proc.stderr  # checked before any model is built
    image = str(tmp_path / "first.png")
    imageio.imwrite(image, np.full((64, 112, 3), 90, np.uint8))
    proc = subprocess.run([sys.executable, "sample.py", "--config", "p25-tiny", "--ckpt", "random", "--steps", "2",
                           "--grid", "karras", "--image", image, "--out", out], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "UniPC karras grid, conditional-frame timestep -1.0" in proc.stdout and len(imageio.mimread(out)) == 9
    sys.path.insert(0, ROOT)
    import sample
    with pytest.raises(ValueError, match="--grid is a Predict2.5"):
        sample.parse_config(["--grid", "shift"])
    with pytest.raises(ValueError, match="--grid 'euler'"):
        sample.parse_config(["--config", "p25-tiny", "--grid", "euler"])
    cfg = sample.parse_config(["--config", "p25-2b", "--ckpt", "p25-2b-post", "--prompt-emb", image, "--vae-ckpt",
                               image])
    assert (cfg.grid, cfg.conditional_frame_timestep) == ("karras", 0.1)  # upstream's 2B post-trained sampler


def test_generate_p25_is_flow_sample_decoded():
    sys.path.insert(0, ROOT)
    import torch

    import flow
    import sample
    import vae as vae_lib
    from model import build_model, condition_mask, get_config
    torch.manual_seed(0)
    net, vae = build_model(get_config("p25-tiny")).eval(), vae_lib.build_vae("tiny", "", torch.device("cpu"),
                                                                               torch.float32)
    video = torch.rand(1, 3, 9, 32, 32) * 2 - 1
    text, neg = torch.randn(1, 4, 96), torch.randn(1, 4, 96)
    got = sample.generate(net, vae, video, text, neg, 2, 7.0, 3, grid="shift", conditional_frame_timestep=0.1)
    latent = vae.encode(video).float()
    x0 = flow.sample(net, flow.initial_noise(tuple(latent.shape), 3), text, neg, 7.0, latent, condition_mask(latent, 1),
                     "shift", 2, 0.1)
    assert torch.equal(got, vae.decode(x0))
    with pytest.raises(ValueError, match="pass grid"):
        sample.generate(net, vae, video, text, neg, 2)


def test_views_side_by_side_and_split_views():
    sys.path.insert(0, ROOT)
    import torch

    import sample
    views = torch.arange(3.0)[:, None, None, None, None].expand(3, 3, 2, 4, 5)
    video = sample.views_side_by_side(views)
    assert video.shape == (3, 2, 4, 15) and video[0, 0, 0].tolist() == [0] * 5 + [1] * 5 + [2] * 5
    latent = torch.arange(6.0)[None, None, :, None, None].expand(2, 16, 6, 2, 2)  # 3 views x 2 latents, stacked on T
    split = sample.split_views(latent, 3)
    assert split.shape == (6, 16, 2, 2, 2) and split[:3, 0, :, 0, 0].tolist() == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(ValueError, match="not 4 views"):
        sample.split_views(latent, 4)


def test_stack_views_inverts_split_views():
    import sample
    latent = torch.randn(2, 4, 3 * 5, 2, 3)
    per_view = sample.split_views(latent, 3)
    assert per_view.shape == (6, 4, 5, 2, 3) and torch.equal(per_view[4], latent[1, :, 5:10])  # sample 1, view 1
    assert torch.equal(sample.stack_views(per_view, 3), latent)
    with pytest.raises(ValueError, match="whole samples"):
        sample.stack_views(per_view[:5], 3)
