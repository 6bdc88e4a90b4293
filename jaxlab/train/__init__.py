"""Training: train state, step, loop, checkpointing (the one orbax wrapper), metrics and progress."""
