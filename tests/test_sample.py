"""sample.py CLI: video2world from a first frame, written as an mp4 with the requested number of frames.

One run is the real command line; the others are sample.main / train.main in this process (run_utils.in_process:
the same cli.main, ~4.5 s of imports saved per run)."""
import os
import shutil

import imageio.v2 as imageio
import numpy as np
import pytest
import torch

import evaluate
import export
import sample
import train
from base import camera
from base.inits import get_config
from condition import Condition
from run_utils import check, in_process, script, suggested

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_sample_cli_writes_a_video_from_an_image(tmp_path):
    image = str(tmp_path / "first.png")
    frame = np.zeros((90, 160, 3), np.uint8)
    frame[:45, :80] = (200, 30, 30)
    imageio.imwrite(image, frame)
    out = str(tmp_path / "video.mp4")
    proc = check(script(["--ckpt", "random", "--image", image, "--steps", "3", "--out", out], name="sample.py"))
    assert "RANDOM weights" in proc.stdout
    frames = imageio.mimread(out)
    assert len(frames) == 9 and frames[0].shape == (64, 112, 3)


def test_sample_cli_refuses_a_missing_checkpoint_and_real_configs_without_embeddings(tmp_path):
    proc = in_process(sample, ["--ckpt", str(tmp_path / "nope.pt")])
    assert proc.returncode == 2 and "nope.pt: no such file or directory; pass a train.py run directory" in proc.stderr
    assert "--init" not in proc.stderr  # train.py's flag: sample.py has none
    proc = in_process(sample, [])  # the default --ckpt out, before `python train.py` wrote it
    assert proc.returncode == 2 and "--ckpt out (the default): no such run" in proc.stderr, proc.stderr
    raw = os.path.join(ROOT, "tests", "data", "lerobot_v21_tiny")  # a LeRobot dataset where a stitched one goes
    proc = in_process(sample, ["--ckpt", "random", "--data", raw])
    assert proc.returncode == 2 and "is a LeRobot dataset" in proc.stderr and "run stitch.py first" in proc.stderr
    with pytest.raises(ValueError, match="prompt-emb"):
        sample.parse_config(["--config", "v2w-2b", "--ckpt", "droid"])


def test_sample_from_a_lora_run_with_ema(tiny_grid, tmp_path):
    run_dir = str(tmp_path / "run")
    check(in_process(train, ["--data", tiny_grid, "--out", run_dir, "--steps", "2", "--lora", "4", "--ema", "0.1",
                             "--sample-every", "0"]))
    for extra in ([], ["--ema"], ["--no-ema"]):
        out = str(tmp_path / f"v{len(extra)}.mp4")
        # no --config, --data or size: the run's own config.json says how it was trained
        proc = check(in_process(sample, ["--ckpt", run_dir, "--steps", "2", "--out", out, *extra]))
        assert "step 2" in proc.stdout and len(imageio.mimread(out)) == 9
        assert ("(EMA)" in proc.stdout) == (extra == ["--ema"])
    proc = in_process(sample, ["--ckpt", run_dir, "--config", "v2w-2b"])
    assert proc.returncode == 2 and "trained tiny" in proc.stderr and "Traceback" not in proc.stderr
    proc = in_process(sample, ["--ckpt", run_dir, "--config", "p25-tiny"])  # a KeyError before
    assert proc.returncode == 2 and "trained tiny; pass --ckpt with a p25-tiny run" in proc.stderr, proc.stderr
    step = os.path.join(run_dir, "step_00000002")  # a LoRA-only step: its run rebuilt, base + adapters
    proc = check(in_process(sample, ["--ckpt", step, "--steps", "2", "--out", str(tmp_path / "s.mp4")]))
    assert f"weights {step}, step 2" in proc.stdout and len(imageio.mimread(str(tmp_path / "s.mp4"))) == 9
    for args, message in ((["--image", str(tmp_path / "notes.txt")], "not a readable image (ValueError"),
                          (["--image", str(tmp_path / "broken.png")], "broken.png: not a readable image ("),
                          (["--steps", "0"], "--steps 0 must be >= 1"), (["--guidance", "-3"], "--guidance -3.0")):
        (tmp_path / "notes.txt").write_text("notes\n")
        imageio.imwrite(str(tmp_path / "good.png"), np.zeros((64, 112, 3), np.uint8))
        (tmp_path / "broken.png").write_bytes((tmp_path / "good.png").read_bytes()[:60])
        proc = in_process(sample, ["--ckpt", run_dir, "--out", str(tmp_path / "x.mp4"), *args])
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "ckpt:" not in proc.stdout  # before any checkpoint is read


def test_no_ema_picks_the_raw_copy_of_a_file_holding_both(tmp_path):
    """--no-ema works for a release file that holds net. and net_ema.; without a choice it is an error."""
    from base.inits import get_config
    from model import DiT
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
        outputs[tuple(extra)] = in_process(sample, ["--ckpt", path, "--steps", "1", "--out", out, "--image", image,
                                                    *extra])
    assert outputs[()].returncode == 2 and "both" in outputs[()].stderr
    assert outputs[("--ema",)].returncode == 0 and outputs[("--no-ema",)].returncode == 0, outputs[("--ema",)].stderr
    proc = in_process(sample, ["--ckpt", "random", "--data", str(tmp_path / "nowhere")])
    assert proc.returncode == 2 and "pass --image" in proc.stderr


def test_p25_cli_samples_with_unipc_and_refuses_unipc_flags_for_predict2(tmp_path):
    out = str(tmp_path / "p25.mp4")
    proc = in_process(sample, ["--config", "p25-tiny", "--ckpt", "random", "--steps", "2", "--grid", "karras",
                               "--image", os.path.join(ROOT, "tests", "data", "nope.png"), "--out", out])
    assert proc.returncode == 2 and "nope.png" in proc.stderr  # checked before any model is built
    image = str(tmp_path / "first.png")
    imageio.imwrite(image, np.full((64, 112, 3), 90, np.uint8))
    proc = check(in_process(sample, ["--config", "p25-tiny", "--ckpt", "random", "--steps", "2", "--grid", "karras",
                                     "--image", image, "--out", out]))
    assert "UniPC karras grid, conditional-frame timestep -1.0" in proc.stdout and len(imageio.mimread(out)) == 9
    with pytest.raises(ValueError, match="--grid is a Predict2.5"):
        sample.parse_config(["--ckpt", "random", "--grid", "shift"])
    with pytest.raises(ValueError, match="--grid 'euler'"):
        sample.parse_config(["--ckpt", "random", "--config", "p25-tiny", "--grid", "euler"])
    cfg = sample.parse_config(["--config", "p25-2b", "--ckpt", "p25-2b-post", "--prompt-emb", image, "--vae-ckpt",
                               image])
    assert (cfg.grid, cfg.conditional_frame_timestep) == ("karras", 0.1)  # upstream's 2B post-trained sampler


def test_generate_p25_is_flow_sample_decoded():
    from base.inits import get_config
    from condition import Condition, condition_mask
    from engine.build import build_vae
    from engine.generate import generate
    from model import build_model
    from nets import flow
    torch.manual_seed(0)
    net, vae = build_model(get_config("p25-tiny")).eval(), build_vae("tiny", "", torch.device("cpu"), torch.float32)
    video = torch.rand(1, 3, 9, 32, 32) * 2 - 1
    text, neg = torch.randn(1, 4, 96), torch.randn(1, 4, 96)
    cond = Condition(text, neg, conditional_frame_timestep=0.1)
    got = generate(net, vae, video, cond, 2, 7.0, 3, grid="shift")
    latent = vae.encode(video).float()
    x0 = flow.sample(net, flow.initial_noise(tuple(latent.shape), 3),
                     Condition(text, neg, latent, condition_mask(latent, 1), conditional_frame_timestep=0.1),
                     7.0, "shift", 2)
    assert torch.equal(got, vae.decode(x0))
    p2 = build_model(get_config("tiny")).eval()
    with pytest.raises(ValueError, match="Predict2 samples on its Karras sigmas only"):
        generate(p2, vae, video, Condition(torch.randn(1, 4, 1024)), 2, 7.0, 3, grid="shift")


def test_views_side_by_side_and_split_views():
    views = torch.arange(3.0)[:, None, None, None, None].expand(3, 3, 2, 4, 5)
    video = sample.views_side_by_side(views)
    assert video.shape == (3, 2, 4, 15) and video[0, 0, 0].tolist() == [0] * 5 + [1] * 5 + [2] * 5
    latent = torch.arange(6.0)[None, None, :, None, None].expand(2, 16, 6, 2, 2)  # 3 views x 2 latents, stacked on T
    split = camera.split_views(latent, 3)
    assert split.shape == (6, 16, 2, 2, 2) and split[:3, 0, :, 0, 0].tolist() == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(ValueError, match="not 4 views"):
        camera.split_views(latent, 4)


def test_stack_views_inverts_split_views():
    latent = torch.randn(2, 4, 3 * 5, 2, 3)
    per_view = camera.split_views(latent, 3)
    assert per_view.shape == (6, 4, 5, 2, 3) and torch.equal(per_view[4], latent[1, :, 5:10])  # sample 1, view 1
    assert torch.equal(camera.stack_views(per_view, 3), latent)
    with pytest.raises(ValueError, match="whole samples"):
        camera.stack_views(per_view[:5], 3)


# -----------------------------------------------------------------------------
# Issue 35: a damaged step, a LoRA base gone, adapters or a killed save where weights go: one line, before any weights


@pytest.fixture(scope="module")
def base_and_lora(tiny_grid, tmp_path_factory):
    """{"base": an SFT run saved at steps 1 and 2, "lora": a 1-step LoRA run whose --init is base's step 2 (the run
    records its base as a path only)}."""
    root = tmp_path_factory.mktemp("base_and_lora")
    base, lora = str(root / "base"), str(root / "lora")
    check(in_process(train, ["--data", tiny_grid, "--out", base, "--steps", "2", "--save-every", "1",
                             "--sample-every", "0"]))
    check(in_process(train, ["--data", tiny_grid, "--out", lora, "--steps", "1", "--lora", "4", "--init",
                             os.path.join(base, "step_00000002"), "--guard-max-ratio", "100", "--sample-every", "0"]))
    return {"base": base, "lora": lora}


def refused(proc, *words, prog="sample.py"):
    """The error line of a run refused before any weights were read, checked to hold `words`."""
    assert proc.returncode == 2 and proc.stderr.startswith(f"{prog}: error: "), (proc.stdout[-2000:], proc.stderr)
    assert proc.stderr.count("\n") == 1 and "ckpt: loaded" not in proc.stdout, proc.stderr
    assert all(w in proc.stderr for w in words), (words, proc.stderr)
    return proc.stderr


def test_a_truncated_newest_step_is_named_with_the_intact_step_to_pass(base_and_lora, tmp_path):
    """Item 7: no silent fallback to an older step, no empty "EOFError:": the damaged file, and the earlier step."""
    run = str(tmp_path / "run")
    shutil.copytree(base_and_lora["base"], run)
    shard = os.path.join(run, "step_00000002", "__0_0.distcp")
    os.truncate(shard, 1000)
    out = str(tmp_path / "x.mp4")
    for ckpt in (run, os.path.join(run, "step_00000002")):
        refused(in_process(sample, ["--ckpt", ckpt, "--steps", "1", "--out", out]),
                f"{shard}: truncated (1000 of the", "step 2 of", "damaged",
                f"pass it explicitly: --ckpt {run}/step_00000001")
    assert not os.path.exists(out)
    proc = check(in_process(sample, ["--ckpt", f"{run}/step_00000001", "--steps", "1", "--out", out]))
    assert f"weights {run}/step_00000001, step 1" in proc.stdout


def test_a_lora_run_whose_base_is_gone_says_so(base_and_lora):
    """Item 11: sample.py and evaluate.py have no --init: the run's recorded base is named, not train.py's advice."""
    base = os.path.join(base_and_lora["base"], "step_00000002")
    os.rename(base, base + ".away")
    try:
        lora = base_and_lora["lora"]
        for module, argv in ((sample, ["--ckpt", lora]), (sample, ["--ckpt", f"{lora}/step_00000001"]),
                             (evaluate, [lora])):
            message = refused(in_process(module, argv + ["--steps", "1"]), f"{base}, the run's recorded LoRA base",
                              "`init` in its config.json", "is gone", "the adapters cannot be used without it",
                              "restore it at that path", prog=f"{module.__name__}.py")
            assert "--init random" not in message
    finally:
        os.rename(base + ".away", base)


def test_an_adapters_export_or_a_killed_save_is_named_for_what_it_is(base_and_lora, tiny_grid, tmp_path):
    """Item 12: not "would NOT load: 3 tensors match; missing 47, unexpected 40": what the file is, and what to pass."""
    lora = base_and_lora["lora"]
    adapters = str(tmp_path / "adapters.safetensors")
    export.export_safetensors(lora, adapters)
    message = refused(in_process(sample, ["--ckpt", adapters, "--data", tiny_grid, "--steps", "1"]),
                      f"{adapters}: adapters only (a LoRA export", f"or pass the run directory ({lora})")
    (script_name, argv), = suggested(message)  # the merge it names works, and the merged file samples
    assert script_name == "export" and argv[-1] == "--merge-lora", argv
    check(in_process(export, argv))
    check(in_process(sample, ["--ckpt", argv[1], "--data", tiny_grid, "--steps", "1"]))
    run = str(tmp_path / "run")
    shutil.copytree(base_and_lora["base"], run)
    for source, name, drop in ((f"{lora}/step_00000001", "step_00000003.tmp", ["meta.json"]),  # LoRA: a report
                               (f"{run}/step_00000002", "step_00000004.tmp", ["meta.json"]),  # whole: sampled
                               (f"{run}/step_00000002", "step_00000005.tmp", ["meta.json", ".metadata"])):
        killed = os.path.join(run, name)
        shutil.copytree(source, killed)
        for file in drop:
            os.remove(os.path.join(killed, file))
        refused(in_process(sample, ["--ckpt", killed, "--steps", "1"]),
                f"{killed}: an incomplete save (no meta.json", "a killed save",
                f"pass the run directory ({run}) or an intact step")


def test_the_fast_sampling_flags_are_checked_and_for_sampling_folds_adapters(capsys):
    """--compile auto|on|off and --fp8 (a GPU's): refused in one line otherwise; for_sampling folds a LoRA net's
    adapters (the same velocity as the unfolded net) and compiles nothing on the CPU under auto."""
    from engine import runs
    from model import DiT
    from nets.lora import add_lora
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="--compile 'yes': one of auto, on, off"):
        runs.check_fast_flags("yes", False, cpu)
    with pytest.raises(ValueError, match="--fp8: fp8 GEMMs are for a GPU"):
        runs.check_fast_flags("auto", True, cpu)
    torch.manual_seed(0)
    net = DiT(get_config("tiny")).eval()
    add_lora(net, 4)
    for m in net.modules():
        if hasattr(m, "lora_b"):
            torch.nn.init.normal_(m.lora_b.weight, std=0.1)
    x, t = torch.randn(1, 16, 3, 8, 8), torch.rand(1)
    cond = Condition(crossattn_emb=torch.randn(1, 4, 1024))
    with torch.no_grad():
        before = net(x, t, cond)
        folded = runs.for_sampling(net, torch.float32, cpu)
        assert not any(getattr(m, "lora_enabled", False) for m in folded.modules())
        torch.testing.assert_close(folded(x, t, cond), before, atol=1e-5, rtol=1e-5)
    assert "compiled" not in capsys.readouterr().out
    for rank in (0, 4):  # --fp8's plumbing (emulated on the CPU): a full net's Linears, a folded LoRA base
        net = DiT(get_config("tiny")).eval()
        if rank:
            add_lora(net, rank)
        with torch.no_grad():
            before = net(x, t, cond)
            after = runs.for_sampling(net, torch.float32, cpu, "off", fp8=True)(x, t, cond)
        assert 0 < ((after - before).norm() / before.norm()).item() < 0.06  # e4m3: measured 0.029 and 0.036
    assert capsys.readouterr().out.count("fp8 GEMMs in 20 block Linears") == 2
