"""Argument checks shared by the model-spec dataclasses; each raises ValueError naming the value."""

from __future__ import annotations


def require_positive(name: str, value: int) -> None:
    """Raise ValueError unless `value` is an int (not a bool) greater than zero."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def require_non_negative(name: str, value: int) -> None:
    """Raise ValueError unless `value` is an int (not a bool) greater than or equal to zero."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
