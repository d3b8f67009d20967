"""Baselines trained beside DLR with the same budget: a small causal Transformer."""
