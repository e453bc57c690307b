# The tiny default (--config tiny, p25-tiny, p25-tiny-agibot, tiny-action, p25-tiny-action): CPU-fast, a few minutes.
# Its data is train.py's own synthetic folder for the config (inits.tiny_data: data/tiny_grid, tiny_views,
# tiny_action_grid), stitched at these clips (clips/tiny.py reads them too). Copy this file, edit it, pass
# --recipe yours.py; a flag given on the command line still wins.
vae = "tiny"  # the tiny codec, no checkpoint
frames, height, width = 9, 64, 112  # 9 frames of a 2x2 grid of 32x56 views
text_len = 16  # stand-in prompt embeddings
steps, lr, warmup = 1000, 2e-3, 20
save_every, sample_every = 500, 500
workers = 0
cache_latents = True  # the folder's few clips, encoded once
holdout = 2  # the last 2 of the 6 videos, never trained on
