"""Trace builders that need a tokenizer (ShareGPT, SWE-bench agent trajectories)."""
