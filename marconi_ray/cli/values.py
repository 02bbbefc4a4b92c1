"""Parsers for option values: each turns one command-line string into a checked value.

They raise `argparse.ArgumentTypeError` with a message naming the bad value, which the
parser reports as a one-line error.
"""

from __future__ import annotations

import argparse
import math

from marconi_ray.core.cache.systems import get_system

_GRID_MAX_POINTS = 10_000


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{what} {text!r} is not finite")
    return value


def cache_sizes(text: str) -> tuple[int, ...]:
    """`1e9,2e9` -> (1000000000, 2000000000); each size must be > 0 bytes."""
    sizes: list[int] = []
    for part in _split(text):
        value = _number(part, "cache size")
        if int(value) <= 0:
            raise argparse.ArgumentTypeError(f"cache size {part!r} must be > 0 bytes")
        sizes.append(int(value))
    if not sizes:
        raise argparse.ArgumentTypeError(f"no cache size given in {text!r}")
    return tuple(dict.fromkeys(sizes))


def host_sizes(text: str) -> tuple[int, ...]:
    """`0,2e11` -> (0, 200000000000); each host tier size must be >= 0 bytes (0: none)."""
    sizes: list[int] = []
    for part in _split(text):
        value = _number(part, "host size")
        if value < 0:
            raise argparse.ArgumentTypeError(f"host size {part!r} must be >= 0 bytes")
        sizes.append(int(value))
    if not sizes:
        raise argparse.ArgumentTypeError(f"no host size given in {text!r}")
    return tuple(dict.fromkeys(sizes))


def system(text: str) -> str:
    """One known system name (see `core.cache.systems.get_system`)."""
    try:
        return get_system(text.strip()).name
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def systems(text: str) -> tuple[str, ...]:
    """`vllm+,marconi` -> ('vllm+', 'marconi'); every name must be a known system."""
    names = _split(text)
    for name in names:
        try:
            get_system(name)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    if not names:
        raise argparse.ArgumentTypeError(f"no system given in {text!r}")
    return tuple(dict.fromkeys(names))


def non_negative(text: str, what: str) -> float:
    """A finite float >= 0."""
    value = _number(text, what)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{what} {text!r} must be >= 0")
    return value


def alpha(text: str) -> float | None:
    """`auto` -> None (bootstrap tuning), else a fixed alpha >= 0."""
    if text.strip().lower() == "auto":
        return None
    return non_negative(text, "alpha")


def alpha_grid(text: str) -> tuple[float, ...]:
    """`start:stop:step` (stop included) or a comma list of alphas >= 0; never empty."""
    if ":" in text:
        parts = text.split(":")
        if len(parts) != 3:
            raise argparse.ArgumentTypeError(f"alpha grid {text!r} is not start:stop:step")
        start, stop, step = (non_negative(p, "alpha grid value") for p in parts)
        if step <= 0 or stop < start:
            raise argparse.ArgumentTypeError(
                f"alpha grid {text!r} needs step > 0 and stop >= start"
            )
        n = math.floor((stop - start) / step + 1e-9)
        if n + 1 > _GRID_MAX_POINTS:
            raise argparse.ArgumentTypeError(f"alpha grid {text!r} has over 10000 points")
        grid = [round(start + i * step, 10) for i in range(n + 1)]
    else:
        grid = [non_negative(p, "alpha grid value") for p in _split(text)]
    if not grid:
        raise argparse.ArgumentTypeError(f"alpha grid {text!r} is empty")
    return tuple(dict.fromkeys(grid))


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return value


def positive_float(text: str) -> float:
    """A finite float > 0."""
    value = _number(text, "value")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return value
