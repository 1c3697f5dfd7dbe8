"""Training engine: trainer loop, AMP, EMA, optimizer and schedules, checkpoints, events."""
