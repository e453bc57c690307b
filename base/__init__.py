"""The ground floor: files and their formats (LeRobot, video, checkpoints), the configs, flags, ranks and kernels the
network and every command stand on. Imports nothing of nanocosmos above it."""
