# On top of tiny.py for an RL objective (--objective grpo or nft, from the tiny SFT checkpoint; docs/grpo.md "The tiny
# default"): 4 groups an update, a held-out evaluation every 5 updates, the toy wrist-brightness reward.
steps, save_every, sample_every = 30, 15, 15
eval_every, eval_steps = 5, 20
batch_size = 4
reward = "reward:wrist_brightness"
