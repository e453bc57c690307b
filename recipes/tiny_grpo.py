# On top of tiny_rl.py for --objective grpo: 8 samples a group (docs/grpo.md "The tiny default").
grpo = dict(group_size=8, lr=3e-3)
