# On top of tiny.py for an action config (tiny-action, p25-tiny-action): the tiny action nets learn to follow their
# commands with 36 episodes for 6000 steps at 3e-3, 4 held out (docs/actions.md).
steps, lr, holdout = 6000, 3e-3, 4
