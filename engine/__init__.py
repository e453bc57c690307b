"""What the commands run on: the network built in one place, generation from a first frame, GRPO's rollouts, what
every objective shares, the run directory and its checkpoints. Imports everything below it, no command."""
