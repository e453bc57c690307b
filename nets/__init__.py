"""The network's math around model.py: LoRA, each model family's sampler and loss (edm: Predict2, flow: Predict2.5),
the video VAE. Imports model.py and base/ only."""
