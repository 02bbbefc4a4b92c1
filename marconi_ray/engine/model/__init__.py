"""The hybrid decoder: its config (from one HF parse), TP layers, per-sequence state, loading."""
