"""Torch inference engine for hybrid Attention+SSM models (no Ray).

Model, weight loading, state store, runner, sampling and tokenizer.
"""
