"""Data sources for training: synthetic speech commands, real Speech Commands, text, synthetic tasks."""
