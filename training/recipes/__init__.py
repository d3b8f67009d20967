"""Training recipes: speech commands (raw audio), byte-level LM, the synthetic task suite."""
