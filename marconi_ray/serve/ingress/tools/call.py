"""`ParsedCall`: one tool call read from a model's output."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ParsedCall:
    """One tool call read from the output: the function's name and its arguments as a
    JSON string (as OpenAI returns them)."""

    name: str
    arguments: str
