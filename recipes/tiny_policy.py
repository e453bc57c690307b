# On top of tiny.py for --objective policy (docs/policy.md): 24 synthetic episodes of a square an expert steers round
# the frame (base/squareworld.py orbit_command: 2-d actions and states, stride 4; policy.py builds data/tiny_policy_grid
# on first use) as 7-slot policy samples, 8 a step, 4 episodes held out for the action / image / value validation.
data = "data/tiny_policy_grid"
steps, lr, warmup = 300, 2e-3, 20
batch_size, holdout = 8, 4
save_every, sample_every, eval_every = 300, 0, 50
