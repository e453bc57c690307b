"""tests/motion_gain.py's pieces on the simulator alone (no network): the starts leave room for the whole path, the
readers find the true motion (gain 1), and the tiny codec's own lag, which bounds any tiny world model's gain."""
import numpy as np
import torch

from engine.build import build_vae
from tasks import square
from tests import motion_gain


def test_starts_leave_room_for_the_whole_path_both_ways():
    corners, commands = motion_gain.starts(8.0, 1, 5, seed=0)
    path = square.step(corners, np.broadcast_to(commands[:, None], (10, square.STEPS, 2)))
    assert np.allclose(path[:, -1] - path[:, 0], commands * square.STEPS)  # never cut at a border
    assert (commands[:5, 0] > 0).all() and (commands[5:, 0] < 0).all()


def test_the_readers_give_gain_one_on_the_simulators_frames_and_the_codec_lags_a_latent_frames_average():
    corners, commands = motion_gain.starts(8.0, 1, 3, seed=1)
    sim = square.simulator({"start": corners})
    raw = torch.from_numpy(np.broadcast_to(commands[:, None], (6, square.STEPS, 2)).copy())
    frames = sim(raw, 0)
    start = corners[:, :1] + square.ACTION_SQUARE / 2
    true_x = square.locate(frames[:, :, 1:])[0][..., 0].numpy()
    assert np.allclose(motion_gain.gains(true_x, start, true_x), 1.0)
    soft = motion_gain.soft_centre(frames[:, :, 1:]).numpy()
    assert np.abs(soft - true_x).max() < 1.5  # pixels of 320: the threshold-free reader agrees on sharp frames
    vae = build_vae("tiny", "", torch.device("cpu"), torch.float32)
    coded = vae.decode(vae.encode(frames))[:, :, 1:]
    gain = motion_gain.gains(square.locate(coded)[0][..., 0].numpy(), start, true_x)
    # each latent frame holds its 4 frames' average: frames 5-8 show the square where frame 6.5 has it
    assert abs(gain[-1] - 6.5 / 8) < 0.05 and abs(gain[3] - 2.5 / 4) < 0.05


def test_the_codec_world_starts_its_next_chunk_where_the_decoded_last_frame_shows_the_square():
    """A perfect world model on the tiny codec continues from its decoded last frame, which shows the average of the
    chunk's last 4 frames: a held rate-4 command ends ~1.5 frames (6 steps, 24 px) short of the truth."""
    corners, commands = motion_gain.starts(4.0, 1, 2, seed=2)
    vae = build_vae("tiny", "", torch.device("cpu"), torch.float32)
    world = motion_gain.codec_world({"start": corners}, vae)
    raw = torch.from_numpy(np.broadcast_to(commands[:, None], (4, square.STEPS, 2)).copy())
    frames = world(raw, 0)
    assert frames.shape == (4, 3, square.FRAMES, square.HEIGHT, square.WIDTH)
    short = np.abs(corners[:, 0] + commands[:, 0] * square.STEPS - world.corner[:, 0])
    assert ((short > 15) & (short < 35)).all(), short
