"""Speculative decoding: drafters (`drafters`) and the acceptance of drafted tokens
(`acceptance`); the worker verifies drafts k + 1 positions per sequence in one forward and
keeps the exact state at the accepted depth (`Worker` docstring)."""
