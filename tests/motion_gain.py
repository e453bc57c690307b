"""How far the tiny-action world model moves the square, against the truth, under the same constant commands (issue
51: go_to_target succeeds in the simulator, far less in the world model; why?).

    python tests/motion_gain.py RUN                          # rates 2, 4, 8 px a step in x, 8 starts each way
    python tests/motion_gain.py RUN --steps 10,35,70 --chunks 3
    python tests/motion_gain.py RUN --ema                    # the run's EMA weights (train.py --ema)
    python tests/motion_gain.py RUN --action-guidance 2      # policyeval --action-guidance's sampling

From starts where a command held for --chunks chunks stays inside SQUARE_RANGE, each rate r (pixels a raw step, +x
and -x, dy 0) is held in the world model (engine/world.model_world, as policyeval.py builds it) and in tasks/square.py's
simulator. Per rate and chunk it prints, at the chunk's middle and last frame, the median over episodes of
  gain        (world displacement of the square's centre along x) / (true displacement): 1 is right
  codec_gain  the same for the simulator's frames through the run's codec (encode, decode): what the codec alone
              loses (a cell blurs, a latent frame averages its 4 frames)
  soft_gain   the world's frames read by a threshold-free centroid (min(R, G) - B weighted over the best cell):
              whether the judge's solid-pixel threshold, not the motion, is what lags on blurred frames
  found       the share of world frames where square.locate finds the square
and the whole chunk's gain per frame. One JSON line at the end: {"steps": {S: {rate: {...}}}}.

    python tests/motion_gain.py RUN --probe                  # inside the net: the action's embedding, x0 per sigma
    python tests/motion_gain.py --ceiling                  # no run: the best any world model on this codec can do

--probe prints (1) the action embedding's RMS (what model.py adds to the time sinusoid before t_embedding_norm) at
rates 0, 2, 8 against the sinusoid's, and the cosine of the normalised sum at rates 4 and 8 (1: the normalised
embedding no longer tells them apart, only adaLN-LoRA's un-normalised branch can); (2) teacher-forced: the net's x0
(one call of the family's denoise) for the true chunk noised at each sigma, with 1 conditioning latent frame (as
sampled) or 2 (latent frame 1 given too, as half of training draws), read like gain at the chunk's end.

--ceiling runs every policy (tasks/square.py's and tests/outside_policies.py's, 32 tasks, 3 chunks) in the simulator
and in codec_world, the simulator seen through the codec as a perfect world model on it would show it (each chunk's
frames encoded and decoded; the next chunk starts where the square is located in the decoded last frame, as a world
model's next chunk starts from its decoded last frame), and prints the agreement (policyeval.ranking): what the
codec alone costs calibration and ranking.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", nargs="?", default="", help="a train.py run of --config tiny-action (its newest checkpoint) or a step folder")
    p.add_argument("--rates", default="2,4,8", help="pixels a raw step, held in x (each rate +x and -x)")
    p.add_argument("--episodes", type=int, default=8, help="starts per rate and direction")
    p.add_argument("--chunks", type=int, default=1, help="chained chunks under the same command")
    p.add_argument("--steps", default="35", help="sampler steps per chunk, a comma list")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ema", action="store_true", help="the run's EMA weights (train.py --ema), as policyeval --ema")
    p.add_argument("--action-guidance", type=float, default=0.0, help="as policyeval --action-guidance: CFG against "
                   "the still command")
    p.add_argument("--probe", action="store_true", help="the action embedding and teacher-forced x0 per sigma")
    p.add_argument("--ceiling", action="store_true", help="no run: the policies in codec_world against the simulator")
    args = p.parse_args(argv)
    if bool(args.run) == args.ceiling:
        raise SystemExit("motion_gain: give a run, or --ceiling (no run)")
    args.rates = [float(r) for r in args.rates.split(",")]
    args.steps = [int(s) for s in args.steps.split(",")]
    if min(args.rates) <= 0 or min(args.steps) < 1 or min(args.episodes, args.chunks) < 1 or args.action_guidance < 0:
        raise SystemExit("motion_gain: --rates > 0, --steps >= 1, --episodes and --chunks >= 1, --action-guidance >= 0")
    for rate in args.rates:
        starts(rate, args.chunks, 1, args.seed)  # a path longer than the range: one line, before any model is built
    return args


def starts(rate, chunks, n, seed):
    """([2n, 2] corners, [2n, 2] commands): n starts moving +x, n moving -x, each with room for the whole path."""
    from tasks import square
    span = rate * square.STEPS * chunks
    room = float(square.HIGH[0] - square.LOW[0]) - span
    if room < 0:
        raise SystemExit(f"motion_gain: rate {rate} for {chunks} chunks moves {span:.0f} px, the range is "
                         f"{square.HIGH[0] - square.LOW[0]:.0f}: fewer --chunks or a lower rate")
    rng = np.random.default_rng([7, seed, int(rate * 64)])
    x = np.round(rng.uniform(0, room, n) / 2) * 2
    y = np.round(rng.uniform(square.LOW[1], square.HIGH[1], 2 * n) / 2) * 2
    corners = np.stack([np.concatenate([x, square.HIGH[0] - x]), y], 1).astype(np.float32)
    commands = np.stack([np.repeat([rate, -rate], n), np.zeros(2 * n)], 1).astype(np.float32)
    return corners, commands


def soft_centre(frames):
    """[B, T] x of the square's centre in 320x180 pixels: min(R, G) - B weighted over the cell locate picks (every
    cell's weight summed, no threshold)."""
    h, w = frames.shape[3] // 2, frames.shape[4] // 2
    cells = torch.stack([frames[:, :, :, y: y + h, x: x + w] for y, x in ((0, 0), (0, w), (h, 0))]).float()
    a = ((torch.minimum(cells[:, :, 0], cells[:, :, 1]) - cells[:, :, 2]) / 2).clamp(0, 1)  # [3, B, T, h, w]
    best = a.sum((-2, -1)).argmax(0)  # [B, T]
    a = a.gather(0, best[None, ..., None, None].expand(1, *a.shape[1:])).squeeze(0)
    cols = torch.arange(w) + 0.5
    return (a.sum(-2) * cols).sum(-1) / a.sum((-2, -1)).clamp_min(1e-6) * 320 / w


def gains(x_B_T, start_x, true_x):
    """[T] median over episodes of (x - start) / (true - start), NaN where the truth has not moved."""
    moved = true_x - start_x
    ratio = (x_B_T - start_x) / np.where(np.abs(moved) > 1e-3, moved, np.nan)
    with np.errstate(all="ignore"):
        return np.nanmedian(ratio, 0)


def measure(args, steps, run, world):
    """{rate: {"gain", "codec_gain", "soft_gain", "found": [chunks x (T-1)] per frame after each chunk's first}}."""
    from engine.world import model_world
    from tasks import square
    import condition
    net, vae, record, dtype, grid = world
    frames = run.cfg["frames"]
    out = {}
    for rate in args.rates:
        corners, commands = starts(rate, args.chunks, args.episodes, args.seed)
        B = len(corners)
        first = square.render(corners[:, None])
        cond = condition.map_tensors(record, lambda v: v.expand(B, *v.shape[1:]))
        still = torch.from_numpy(run.dataset.actions.normalise(np.zeros((1, square.STEPS, 2), np.float32)))
        step = model_world(net, vae, cond, run.dataset.actions.normalise, frames, steps,
                           args.action_guidance or run.guidance, [args.seed + 1000 * e for e in range(B)], grid, dtype,
                           first, still if args.action_guidance else None)
        sim = square.simulator({"start": corners})
        raw = torch.from_numpy(np.broadcast_to(commands[:, None], (B, square.STEPS, 2)).copy())
        world_x, codec_x, soft_x, true_x, found = [], [], [], [], []
        for k in range(args.chunks):
            with torch.no_grad():
                dreamt = step(raw, k)[:, :, 1:].float()
                truth = sim(raw, k)[:, :, 1:]
                coded = vae.decode(vae.encode(torch.cat([sim_first(sim, k), truth], 2).to(dtype))).float()[:, :, 1:]
            centre, seen = square.locate(dreamt)
            world_x.append(centre[..., 0].numpy())
            found.append(seen.float().mean(0).numpy())
            codec_x.append(square.locate(coded)[0][..., 0].numpy())
            soft_x.append(soft_centre(dreamt).numpy())
            true_x.append(square.locate(truth)[0][..., 0].numpy())
        start = corners[:, :1] + square.ACTION_SQUARE / 2
        true_x = np.concatenate(true_x, 1)
        out[rate] = {"gain": gains(np.concatenate(world_x, 1), start, true_x),
                     "codec_gain": gains(np.concatenate(codec_x, 1), start, true_x),
                     "soft_gain": gains(np.concatenate(soft_x, 1), start, true_x),
                     "found": np.concatenate(found)}
    return out


def sim_first(sim, k):
    """The simulator's frame at chunk k's start (a chunk's frame 0, the codec's causal first frame)."""
    from tasks import square
    return square.render(sim.path[:, k * square.STEPS][:, None])


def codec_world(tasks: dict, vae):
    """A step function (engine/world.closed_loop) of the simulator as a perfect world model on `vae` would show it:
    each chunk's true frames through vae.encode and vae.decode; the next chunk starts from the square located in the
    decoded last frame (where a world model's next chunk starts), or its true end where none is found. Its .corner:
    where the next chunk starts [B, 2]."""
    from tasks import square

    def advance(raw_actions, chunk):
        path = square.step(advance.corner, np.asarray(raw_actions, np.float32)[:, :, :2])
        with torch.no_grad():
            coded = vae.decode(vae.encode(square.render(path[:, ::square.STRIDE]))).float().clamp(-1, 1)
        centre = square.locate(coded[:, :, -1:])[0][:, 0].numpy()
        seen = np.clip(centre - square.ACTION_SQUARE / 2, square.LOW, square.HIGH)
        advance.corner = np.where(np.isnan(seen), path[:, -1], seen).astype(np.float32)
        return coded
    advance.corner = np.asarray(tasks["start"], np.float32)
    return advance


def ceiling(seed=0, episodes=32, chunks=3):
    """{policy: (success in codec_world, in the simulator)} and their agreement (policyeval.ranking)."""
    import policyeval
    from engine.build import build_vae
    from engine.world import closed_loop
    from tasks import square
    from tests import outside_policies
    from tests.family_sweep import OUTSIDE
    vae = build_vae("tiny", "", torch.device("cpu"), torch.float32)
    tasks = square.sample_tasks(episodes, seed)
    info = {"task": tasks, "steps": square.STEPS, "action_dim": 2, "seed": seed}
    rows = {}
    for policy in list(square.POLICIES.values()) + [getattr(outside_policies, n) for n in OUTSIDE]:
        got = []
        for world in (codec_world(tasks, vae), square.simulator(tasks)):
            run = closed_loop(world, policy, policy.__name__, square.first_frames(tasks), info, chunks,
                              (episodes, square.STEPS, 2))
            got.append(round(float(square.judge(run["frames"], info).mean()), 3))
        rows[policy.__name__] = tuple(got)
        print(f"{policy.__name__}: codec world {got[0]:.2f}, simulator {got[1]:.2f}", flush=True)
    agree = policyeval.ranking([w for w, _ in rows.values()], [s for _, s in rows.values()])
    return rows, {k: round(v, 3) for k, v in agree.items()}


def probe(args, run, world):
    """The action embedding against the time sinusoid, and the teacher-forced x0 gain per sigma (module docstring)."""
    import torch.nn.functional as F
    from dataclasses import replace
    import condition
    from nets.family import family_of
    from tasks import square
    net, vae, record, dtype, grid = world
    norm = run.dataset.actions.normalise

    def action_emb(rate):
        raw = np.zeros((1, square.STEPS, 2), np.float32)
        raw[..., 0] = rate
        return net.action_embedder_B_D(torch.from_numpy(norm(raw)).reshape(1, 1, -1).to(dtype)).float().flatten()
    rms = lambda x: float(x.square().mean().sqrt())  # noqa: E731
    sinusoid = net.t_embedder[0](torch.tensor([[0.9]])).float().flatten()
    if net.cfg.action_after_norm:  # the embedding joins past the norm (DiTConfig.action_after_norm)
        summed = lambda r: F.rms_norm(sinusoid, sinusoid.shape) + action_emb(r)  # noqa: E731
    else:
        summed = lambda r: F.rms_norm(sinusoid + action_emb(r), sinusoid.shape)  # noqa: E731
    print(f"probe: action embedding RMS at rates 0 / 2 / 8: {' / '.join(f'{rms(action_emb(r)):.2f}' for r in (0, 2, 8))}"
          f"; time sinusoid {rms(sinusoid):.2f}; cosine of the normalised sums, rate 4 vs 8: "
          f"{float(F.cosine_similarity(summed(4), summed(8), 0)):.4f}", flush=True)
    from nets import edm
    if family_of(net.cfg) is not edm:
        raise SystemExit(f"motion_gain --probe: {run.cfg['config']} is a Predict2.5 (flow) net; the probe calls "
                         "Predict2's edm.denoise (tiny-action, tiny-action-wide)")
    denoise = edm.denoise
    for rate in args.rates:
        corners, commands = starts(rate, 1, args.episodes, args.seed)
        B = len(corners)
        raw = torch.from_numpy(np.broadcast_to(commands[:, None], (B, square.STEPS, 2)).copy())
        truth = square.simulator({"start": corners})(raw, 0)
        latent = vae.encode(truth.to(dtype)).float()
        true_x = square.locate(truth[:, :, 1:])[0][..., 0].numpy()
        start = corners[:, :1] + square.ACTION_SQUARE / 2
        for n in (1, 2):
            cond = replace(condition.map_tensors(record, lambda v: v.expand(B, *v.shape[1:])),
                           action=torch.from_numpy(norm(raw.numpy())), gt_frames=latent,
                           condition_mask=condition.condition_mask(latent, n))
            row = []
            for sigma in (0.2, 1.0, 5.0, 80.0):
                eps = torch.randn(latent.shape, generator=torch.Generator().manual_seed(args.seed))
                with torch.no_grad():
                    x0 = denoise(net, latent + sigma * eps, torch.full((B,), sigma), cond)[0].float()
                x0 = torch.cat([latent[:, :, :n], x0[:, :, n:]], 2)
                x = square.locate(vae.decode(x0.to(dtype)).float()[:, :, 1:])[0][..., 0].numpy()
                row.append(f"sigma {sigma:g}: {gains(x, start, true_x)[-1]:.2f}")
            print(f"probe: rate {rate:g}, {n} conditioning latent frame(s), x0 gain at the chunk's end: "
                  + ", ".join(row), flush=True)


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.ceiling:
        rows, agree = ceiling(args.seed)
        print(json.dumps({"ceiling": agree, "policies": rows}), flush=True)
        return
    import policyeval
    from engine.runs import open_run
    run = open_run(args.run, args.ema, -1.0)
    cfg = policyeval.PolicyEvalConfig(run=args.run, compile="off", device="cpu", ema=args.ema)
    world = policyeval.load_world(cfg, run, torch.device("cpu"))
    if args.probe:
        probe(args, run, world)
        return
    summary = {}
    for steps in args.steps:
        result = measure(args, steps, run, world)
        summary[steps] = {}
        for rate, r in result.items():
            T = len(r["gain"]) // args.chunks
            picks = [(k, j) for k in range(args.chunks) for j in (T // 2 - 1, T - 1)]
            cols = "  ".join(f"c{k} f{j + 1}: gain {r['gain'][k * T + j]:.2f} codec {r['codec_gain'][k * T + j]:.2f} "
                             f"soft {r['soft_gain'][k * T + j]:.2f} found {r['found'][k * T + j]:.2f}"
                             for k, j in picks)
            print(f"steps {steps} rate {rate:g}: {cols}", flush=True)
            print(f"   gain per frame {np.round(r['gain'], 2).tolist()}", flush=True)
            summary[steps][rate] = {k: [round(float(v), 3) for v in r[k]] for k in r}
    print(json.dumps({"run": args.run, "steps": summary}), flush=True)


if __name__ == "__main__":
    main()
