# --objective policy on PushT (docs/policy.md "PushT"): tasks/pushtworld.py's 60 episodes (expert, noisy expert, random
# play; `python -m tasks.pushtworld data/pusht`), each with its success flag (coverage > 0.6, next.success), as 7-slot
# policy samples of the tiny net: chunk 8 (one expert target), 4 episodes held out.
data = "data/pusht_grid"
steps, lr, warmup = 2400, 2e-3, 20
batch_size, holdout = 8, 4
save_every, sample_every, eval_every = 2400, 0, 600
policy = dict(chunk=8, success="data")
