"""Per-request sampling settings: `SamplingParams` (torch-free; the engine's `Sampler`
applies them, see `marconi_ray.engine.sampler` for the sampling order).

Validated on construction, so a bad request fails at the API boundary, before anything in
the cache or the store changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_SEED = 2**64 - 1  # torch generators take 64-bit seeds
MAX_LOGPROBS = 20
"""Most alternatives a request may ask for per token (`logprobs`, `prompt_logprobs`), as
OpenAI's chat API and vLLM allow."""


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one request; validated on construction.

    `top_k` 0 or -1 means no top-k cut; `top_p` 1.0 means no nucleus cut; `seed` None means
    an unseeded (non-reproducible) draw. `stop_token_ids` (a list is converted to a tuple)
    and `ignore_eos` are read by the decode loop, not by the `Sampler`. Invalid values raise
    ValueError naming the field and the value; bools are not accepted as numbers.

    `logprobs` k (None: off) returns, with every sampled token, its log-probability and
    the k most likely tokens' (0 <= k <= `MAX_LOGPROBS`); `prompt_logprobs` k does the
    same for every prompt token after the first (OpenAI's `echo`). Both are of the
    model's distribution (log-softmax of the raw logits, before temperature, top-k and
    top-p, and before a grammar's mask), as vLLM reports them by default.

    `grammar` (None: free text) constrains the output to a grammar: llguidance's
    serialized form (`LLMatcher.grammar_from_*`), built and validated at the API
    (`serve.ingress.structured`). Each step only the tokens the grammar allows can be
    sampled, and the request stops once the grammar is complete. `grammar_prefix` are
    output tokens an earlier attempt already generated under it (a re-planned request's
    prompt ends with them): the grammar consumes them before the first new token.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    grammar: str | None = None
    grammar_prefix: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if (
            not isinstance(self.temperature, (int, float))
            or isinstance(self.temperature, bool)
            or not math.isfinite(self.temperature)
            or self.temperature < 0
        ):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if (
            not isinstance(self.top_p, (int, float))
            or isinstance(self.top_p, bool)
            or not 0 < self.top_p <= 1
        ):
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if not is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"top_k must be an int >= -1 (0 or -1: off), got {self.top_k!r}")
        if self.seed is not None and (not is_int(self.seed) or not 0 <= self.seed <= MAX_SEED):
            raise ValueError(f"seed must be None or an int in [0, 2**64), got {self.seed!r}")
        if isinstance(self.stop_token_ids, (str, bytes)) or not isinstance(
            self.stop_token_ids, (tuple, list)
        ):
            raise ValueError(
                f"stop_token_ids must be a tuple or list of ints, got {self.stop_token_ids!r}"
            )
        stops = tuple(self.stop_token_ids)
        bad = [t for t in stops if not is_int(t) or t < 0]
        if bad:
            raise ValueError(f"stop_token_ids must be ints >= 0, got {bad[0]!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and (not is_int(k) or not 0 <= k <= MAX_LOGPROBS):
                raise ValueError(f"{name} must be None or an int in [0, {MAX_LOGPROBS}], got {k!r}")
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar):
            raise ValueError(f"grammar must be None or a non-empty string, got {self.grammar!r}")
        prefix = tuple(self.grammar_prefix)
        if any(not is_int(t) or t < 0 for t in prefix):
            raise ValueError(f"grammar_prefix must be ints >= 0, got {self.grammar_prefix!r}")
        if prefix and self.grammar is None:
            raise ValueError("grammar_prefix needs a grammar")
        object.__setattr__(self, "grammar_prefix", prefix)
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_p", float(self.top_p))
        object.__setattr__(self, "stop_token_ids", stops)

    @property
    def greedy(self) -> bool:
        """True when tokens are picked by argmax (temperature 0)."""
        return self.temperature == 0.0
