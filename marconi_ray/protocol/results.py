"""What `Engine.generate` returns: tokens, OpenAI-style usage, timings and
log-probabilities."""

from __future__ import annotations

from dataclasses import dataclass, field


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
class SpecCounts:
    """A request's speculative decoding: tokens drafted for it and drafts kept, and per
    draft position j (0: a step's first draft) how many were drafted and kept there."""

    drafted: int = 0
    accepted: int = 0
    drafted_at: tuple[int, ...] = ()
    kept_at: tuple[int, ...] = ()


@dataclass(frozen=True)
class Timings:
    """Seconds: `ttft` from submission to the first sampled token, `prefill` in the model's
    prefill, `decode` in decode steps that included this request, `total` end to end."""

    ttft: float
    prefill: float
    decode: float
    total: float


@dataclass(frozen=True)
class Logprob:
    """A token's log-probability under the model, and the `top` most likely tokens at its
    position as (token id, log-probability) pairs, most likely first (ties: lower id)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class GenerationResult:
    """One finished request. `finish_reason` is `stop` (EOS or a stop id) or `length`.

    Attributes:
        logprobs: one `Logprob` per token when its params asked for `logprobs`, else ().
        prompt_logprobs: one entry per prompt token (None for the first) when its params
            asked for `prompt_logprobs`, else ().
        spec: its speculative decoding counts (zeros without speculation).
    """

    request_id: int
    tokens: tuple[int, ...]
    finish_reason: str
    usage: Usage
    timings: Timings
    logprobs: tuple[Logprob, ...] = ()
    prompt_logprobs: tuple[Logprob | None, ...] = ()
    spec: SpecCounts = field(default_factory=SpecCounts)
