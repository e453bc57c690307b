"""An experiment is a file: the presets are recipes/*.py, and a user's copy passed as --recipe counts as flags given."""
import os
import re

import pytest
import torch

import train
from base import cli
from base.inits import TINY_CONFIGS


def test_the_presets_are_the_recipe_files():
    """--config picks recipes/ files; every shipped recipe is read by some preset (or run by the README as --recipe
    FILE), and names only TrainConfig fields."""
    tiny, real = train.parse_config([]), train.preset("v2w-2b", "sft")
    assert (tiny.frames, tiny.height, tiny.width, tiny.steps, tiny.vae) == (9, 64, 112, 1000, "tiny")
    assert (real["frames"], real["height"], real["width"], real["steps"], real["vae"]) == (93, 432, 768, 20000, "real")
    action = train.preset("tiny-action", "sft")
    assert action["steps"] == 6000 and action["guidance"] == 0.0 and action["data"] == "data/tiny_action_grid"
    assert train.preset("tiny", "grpo")["grpo"] == {"group_size": 8, "lr": 3e-3}
    shipped = {f[:-3] for f in os.listdir(cli.RECIPES) if f.endswith(".py")}
    read = {name for config in TINY_CONFIGS + ("v2w-2b", "v2w-2b-action") for objective in train.OBJECTIVES
            for name in train.recipes_of(config, objective)}
    with open(os.path.join(os.path.dirname(cli.RECIPES), "README.md"), encoding="utf-8") as f:
        run_by_flag = set(re.findall(r"--recipe recipes/(\w+)\.py", f.read()))  # a recipe the README runs as a file
    assert run_by_flag <= shipped and read | run_by_flag == shipped, \
        f"recipes neither a preset nor the README reads: {sorted(shipped - read - run_by_flag)}; missing: " \
        f"{sorted((read | run_by_flag) - shipped)}"


def test_a_copied_recipe_is_an_experiment_and_its_settings_count_as_flags(tmp_path):
    mine = tmp_path / "mine.py"
    mine.write_text("# my experiment\nsteps = 7\nlr = 1e-3\nholdout = 1\n")
    cfg = train.parse_config(["--recipe", str(mine), "--lr", "5e-4"])
    assert (cfg.steps, cfg.lr, cfg.holdout, cfg.frames) == (7, 5e-4, 1, 9)  # the recipe over the preset, flags win
    rl = tmp_path / "rl.py"
    rl.write_text("grpo = dict(kl_coef=0.01)\n")
    with pytest.raises(ValueError, match="--grpo-kl-coef does nothing with --objective sft"):
        train.parse_config(["--recipe", str(rl)])  # checked as a flag is: nothing silently ignored
    cfg = train.parse_config(["--recipe", str(rl), "--objective", "grpo", "--lora", "2", "--grpo-lr", "1e-3"])
    assert (cfg.grpo.kl_coef, cfg.grpo.lr, cfg.grpo.group_size) == (0.01, 1e-3, 8)  # nested: merged key by key
    typo = tmp_path / "typo.py"
    typo.write_text("stepz = 7\n")
    with pytest.raises(ValueError, match="stepz"):
        train.parse_config(["--recipe", str(typo)])
    with pytest.raises(ValueError, match="--recipe .*nope.py: no such file"):
        train.parse_config(["--recipe", str(tmp_path / "nope.py")])


def test_the_wide_action_preset_is_tiny_action_at_twice_the_width():
    """tiny-action-wide (docs/policyeval.md): the same recipe, data and action layout as tiny-action, 128 channels."""
    from dataclasses import replace
    from base.inits import get_config
    assert train.preset("tiny-action-wide", "sft") == train.preset("tiny-action", "sft")
    assert get_config("tiny-action-wide") == replace(get_config("tiny-action"), model_channels=128)


def test_cond_frames_fixes_the_conditioning_frames_and_leaves_every_other_draw_as_it_was():
    """--cond-frames 1 (docs/policyeval.md): every clip trains with one conditioning latent frame, as policyeval
    chains its chunks; its sigma, noise and prompt drop are those of the default's draw (0: 1 or 2 drawn). Refused
    where it cannot hold (3 latent frames need fewer than 3) and for a Predict2.5 net (its own draw)."""
    from nets import edm
    latent = torch.zeros(16, 3, 4, 4)
    cfg = train.parse_config(["--config", "tiny-action"])
    assert cfg.cond_frames == 0
    drawn = [edm.draw_sample(latent, seed, cfg) for seed in range(40)]
    assert {d[2] for d in drawn} == {1, 2}
    cfg.cond_frames = 1
    for seed, d in enumerate(drawn):
        one = edm.draw_sample(latent, seed, cfg)
        assert one[2] == 1 and one[0] == d[0] and torch.equal(one[1], d[1]) and one[3] == d[3]
    assert train.parse_config(["--config", "tiny-action", "--cond-frames", "1"]).cond_frames == 1
    for bad in ("3", "-1"):
        with pytest.raises(ValueError, match="--cond-frames"):
            train.parse_config(["--config", "tiny-action", "--cond-frames", bad])
    with pytest.raises(ValueError, match="--cond-frames does nothing with --config p25-tiny"):
        train.parse_config(["--config", "p25-tiny", "--cond-frames", "1"])
