"""What `Engine.generate` returns: tokens, OpenAI-style usage and timings."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Usage:
    """Token counts, as in OpenAI's `usage` (`cached_tokens` = prompt tokens reused)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Timings:
    """Seconds: `ttft` from submission to the first sampled token, `prefill` in the model's
    prefill, `decode` in decode steps that included this request, `total` end to end."""

    ttft: float
    prefill: float
    decode: float
    total: float


@dataclass(frozen=True)
class GenerationResult:
    """One finished request. `finish_reason` is `stop` (EOS or a stop id) or `length`."""

    request_id: int
    tokens: tuple[int, ...]
    finish_reason: str
    usage: Usage
    timings: Timings
