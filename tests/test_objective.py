"""An objective is a small object train.py calls downward: a new one is one new file plus one registry line.

The test writes a dummy objective's file (plain flow matching on the batch, its own constant learning rate) into a
temporary folder, adds the one line train.OBJECTIVES needs, and trains it one step through train.py: the step, the
checkpoint, the held-out evaluation and the metrics row all come from the dummy's methods, with no other file touched.
"""
import importlib.util
import json
import os

import torch

from run_utils import check, in_process

DUMMY = '''
from engine.objective import clip_and_step, sample_seed
from nets.family import family_of


class Dummy:
    NAME = "dummy"
    CONFIG = None  # no flags of its own
    MAY_CHANGE = ()
    TINY_RECIPES = ()  # no recipes/tiny_dummy.py
    mfu, eval_at_start, max_psnr_drop, reads_clips = False, False, 0.0, True

    @staticmethod
    def validate(cfg, given):
        return {}

    @staticmethod
    def resume_keys(cfg):
        return []

    @staticmethod
    def rewards(cfg):
        return None

    def __init__(self, run, net, params, vae, neg_text, terms):
        self.run, self.net, self.params = run, net, params
        self.betas, self.weight_decay, self.guidance, self.name = (0.9, 0.99), 0.0, 0.0, "dummy"
        self.schedule, self.lr_flag, self.state = "lr 1e-3, constant", "--lr", {}
        self.steps = []

    def lr_at(self, step):
        return 1e-3

    def step(self, step, batches):
        (latent, cond), = batches
        seeds = [sample_seed(self.run.cfg.seed, step, b) for b in range(len(latent))]
        loss = family_of(self.net.cfg).training_loss(self.net, latent, cond, seeds, self.run.cfg)
        loss.backward()
        grad_norm, _ = clip_and_step(self.run.optimizer, self.params, 1.0)
        self.steps.append(step)
        return {"loss": loss.item(), "grad_norm": grad_norm, "dummy_steps": len(self.steps)}

    def evaluate(self, batches, truths):
        return {"eval_loss": 0.0, "eval_clips": len(batches)}

    def evaluated(self, result):
        return result

    def watch(self, row, history):
        return None

    def bar(self, row):
        return {"loss": f"{row['loss']:.4f}"}
'''


def test_a_new_objective_is_one_file_and_one_registry_line(tiny_grid, tmp_path, monkeypatch):
    import train
    path = tmp_path / "dummy_objective.py"
    path.write_text(DUMMY)
    spec = importlib.util.spec_from_file_location("dummy_objective", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(train.OBJECTIVES, module.Dummy.NAME, module.Dummy)  # the one registry line
    out = str(tmp_path / "run")
    check(in_process(train, ["--objective", "dummy", "--data", tiny_grid, "--out", out, "--steps", "1",
                             "--save-every", "1", "--sample-every", "0"]))
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    row = rows[-1]
    assert row["step"] == 1 and row["dummy_steps"] == 1 and row["eval_clips"] == 2 and row["lr"] == 1e-3, row
    assert torch.isfinite(torch.tensor(row["loss"])) and row["grad_norm"] > 0, row
    assert os.path.isfile(os.path.join(out, "step_00000001", "meta.json"))
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["objective"] == "dummy"
