# On top of tiny_rl.py for --objective nft: 8 samples a group (docs/nft.md).
nft = dict(group_size=8, lr=3e-3)
