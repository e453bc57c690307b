"""Training clips from stitched folders, with their text, cameras and actions, and the fidelity of a generated clip to
the true one. Imports base/, nets/ and reward.py."""
