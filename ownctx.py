"""Own-context SFT (issue 52): SFT whose conditioning frame is the model's own. A chained rollout (generate.rollout,
evaluate.py --chunks) starts chunk k from the last frame the model generated, a frame SFT never trains on (exposure
bias: PSNR falls chunk after chunk). Here a sample's target chunk k (1..--ownctx-chunks) of a training episode is
conditioned on the last frame of a (k-1)-chunk rollout the model makes now, without gradient, from the episode's true
frame at the window start under the episode's true actions (the same sampler as evaluate.py's rollouts, at
--ownctx-context-steps steps), and its target is the episode's TRUE continuation under the true actions: the true
window with its frame 0 replaced by the generated frame, then encoded. k = 1 is SFT's own sample (a true frame 0);
--ownctx-true-share of the samples are k = 1, the rest draw k uniformly in 2..chunks. The loss, its seeds, the
schedule, the NaN/Inf guard and the held-out loss are sft.py's. train.py runs it as the `ownctx` objective
(docs/actions.md "Own-context SFT").

    python train.py --config tiny-action --objective ownctx --init runs/act/step_00006000 --steps 200 --out runs/own

Contents: config -> a sample's draw -> OwnContext, the objective train.py calls (a sample's context frame and
batch: engine/chain.py, shared with nft.py's --nft-chain-chunks).
"""
import os
import time
from dataclasses import dataclass, fields

import torch

from base.collectives import all_mean
from engine.chain import check_chain, encode, sample_item
from engine.objective import sample_seed
from sft import SFT, nonfinite_fields, sft_step, unused_rl_flags

NAME = "ownctx"


@dataclass(frozen=True)
class OwnContextConfig:
    """Own-context SFT's knobs (--ownctx-*); the optimizer and schedule are SFT's (--lr, --warmup, ...)."""
    chunks: int = 3  # the longest chain: a sample's target is chunk k <= this of a rollout from a true frame
    true_share: float = 0.9  # fraction of samples on a true frame 0 (k = 1, SFT's sample); the rest own context
    # (0.9: the best of the mixes measured, docs/actions.md "Own-context SFT"; more own context costs chunk 1)
    context_steps: int = 10  # sampler steps of each generated context chunk (evaluate.py samples at --steps 35)

    def __post_init__(self):
        if self.chunks < 2 or not 0 <= self.true_share < 1 or self.context_steps < 1:
            raise ValueError(f"--ownctx-chunks {self.chunks}, --ownctx-true-share {self.true_share}, "
                             f"--ownctx-context-steps {self.context_steps}: need chunks >= 2 (1 is --objective sft), "
                             "0 <= true_share < 1, context_steps >= 1")


# -----------------------------------------------------------------------------
# A sample: (episode, k, window start, noise seed), drawn from (seed, step, micro-batch, dp rank, row) only


def draw(cfg, n_train, lengths, step, micro, rank, row):
    """(video index, k, start of chunk 1's window, the context's noise seed) of one sample. k is drawn without the
    rank: every rank generates as many chunks, so FSDP's collectives stay in step."""
    g = torch.Generator().manual_seed(sample_seed(cfg.seed, step, micro, row, NAME))
    own = bool(torch.rand((), generator=g) >= cfg.ownctx.true_share)
    k = int(torch.randint(2, cfg.ownctx.chunks + 1, (), generator=g)) if own else 1
    g = torch.Generator().manual_seed(sample_seed(cfg.seed, step, micro, rank, row, NAME))
    index = int(torch.randint(n_train, (), generator=g))
    span = 1 + k * (cfg.frames - 1)
    start = int(torch.randint(lengths[index] - span + 1, (), generator=g))
    return index, k, start, sample_seed(cfg.seed, step, micro, rank, row, "context") % 2 ** 31


class CallCounter:
    """Network calls (forwards) of `net` inside the with-block: the generation's compute, counted, not estimated."""

    def __init__(self, net):
        self.net, self.calls = net, 0

    def __enter__(self):
        self.handle = self.net.register_forward_pre_hook(lambda module, args: self.count())
        return self

    def count(self):
        self.calls += 1

    def __exit__(self, *exc):
        self.handle.remove()


# -----------------------------------------------------------------------------
# The objective train.py's loop calls (train.OBJECTIVES lists it)


class OwnContext(SFT):
    """Own-context SFT for train.py: SFT's loss, schedule, held-out loss and guard on samples it draws itself from
    run.clips (train.py fetches no clip batches for it: reads_clips), each step's metrics adding ctx_chunks (chunks
    generated for context), ctx_calls (their network calls) and s_draw (the seconds spent reading, generating
    and encoding the samples, inside s_per_step)."""
    NAME = NAME
    CONFIG = OwnContextConfig  # TrainConfig.ownctx: the --ownctx-* flags
    MAY_CHANGE = ()
    TINY_RECIPES = ()
    mfu = False  # the generation's forwards are not train.py's clip tokens
    reads_clips = False

    @staticmethod
    def validate(cfg, given):
        if cfg.guidance != 0:
            raise ValueError(f"--objective ownctx with --guidance {cfg.guidance:g}: the context is generated without "
                             "CFG, as the action nets sample (recipes/action.py): pass --guidance 0")
        check_chain(cfg, cfg.ownctx.chunks, "--ownctx-chunks", "--objective ownctx")
        return {**unused_rl_flags(cfg, given, NAME),
                **{k: "with --objective ownctx (its windows are encoded each step)" for k in ("cache_latents",)
                   if k in given}}

    @staticmethod
    def resume_keys(cfg):
        return [f"ownctx.{f.name}" for f in fields(OwnContextConfig)]

    def __init__(self, run, net, params, vae, neg_text, terms):
        super().__init__(run, net, params, vae, neg_text, terms)
        self.vae, self.knobs, self.name = vae, run.cfg.ownctx, NAME
        self.lengths = [v.frames for v in run.clips.videos]
        run.say(f"ownctx: chunk k <= {self.knobs.chunks} of {run.n_train} training episodes, {self.knobs.true_share:g}"
                f" of the samples on a true frame 0, the rest on the model's own ({self.knobs.context_steps} sampler "
                "steps a context chunk)")

    def batches(self, step):
        """This rank's grad_accum micro-batches of step `step` and what their context cost."""
        cfg, run, counter = self.cfg, self.run, CallCounter(self.net)
        batches, chunks, t0 = [], 0, time.perf_counter()
        with counter:
            for micro in range(cfg.grad_accum):
                items = []
                for row in range(cfg.batch_size):
                    index, k, begin, seed = draw(cfg, run.n_train, self.lengths, step, micro, run.dp_rank, row)
                    items.append(sample_item(self.net, self.vae, run, run.clips, index, k, begin, seed,
                                              self.knobs.context_steps))
                    chunks += k - 1
                batches.append(encode(self.vae, run, items))
        return batches, {"ctx_chunks": chunks, "ctx_calls": counter.calls, "s_draw": time.perf_counter() - t0}

    def step(self, step, batches):
        own, cost = self.batches(step)
        loss, grad_norm, cause = sft_step(self.net, self.run.optimizer, self.params, self.cfg, own, step,
                                          self.run.dp_rank, self.run.dp_world)
        return {"loss": all_mean(loss, self.run.device), "grad_norm": grad_norm, **cost, **nonfinite_fields(cause)}
