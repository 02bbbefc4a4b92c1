"""`SpeculativeConfig`: how a server drafts and verifies tokens (torch-free; the engine's
`engine.spec` runs it). Validated on construction: a bad value is a ValueError naming it.
"""

from __future__ import annotations

from dataclasses import dataclass

from marconi_ray.protocol.sampling import is_int

METHODS = ("ngram", "mtp", "draft:MODEL")
"""Drafters a setting may name: `ngram`, `mtp` (the checkpoint's own multi-token-prediction
layers), or `draft:` and a model folder with the target's tokenizer (the engine's registry
has `oracle` too, for benchmarks)."""
DRAFT_PREFIX = "draft:"
MAX_SPECULATIVE_TOKENS = 16


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding settings.

    Attributes:
        method: the drafter (`METHODS`): `ngram` proposes the tokens that followed the
            latest earlier occurrence of the sequence's last n tokens (prompt lookup);
            `mtp` has the target checkpoint's multi-token-prediction layers (Qwen3.5 /
            Qwen3-Next `mtp.*`) propose from the target's last hidden state;
            `draft:PATH` has a small model (the folder PATH, the same tokenizer as the
            target's) propose its greedy continuation.
        num_speculative_tokens: k, tokens drafted per step at most (1..16); a verified
            step then runs k + 1 positions of a sequence in one forward.
        prompt_lookup_min, prompt_lookup_max: the n-gram sizes `ngram` matches, longest
            first (vLLM's meaning).
        backoff: after a step that accepted no draft, a request drafts again only after
            2, 4, 8, ... up to this many steps (adaptive: speculation that keeps failing
            costs little); 0: never back off.
    """

    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4
    backoff: int = 32

    def __post_init__(self) -> None:
        draft = self.method.startswith(DRAFT_PREFIX) and len(self.method) > len(DRAFT_PREFIX)
        if self.method not in ("ngram", "mtp", "oracle") and not draft:
            raise ValueError(
                f"speculative method must be one of {', '.join(METHODS)}, got {self.method!r}"
            )
        k = self.num_speculative_tokens
        if not is_int(k) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(
                f"num_speculative_tokens must be an int in [1, {MAX_SPECULATIVE_TOKENS}], got {k!r}"
            )
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if not (is_int(lo) and is_int(hi)) or not 1 <= lo <= hi:
            raise ValueError(
                f"prompt_lookup_min and prompt_lookup_max must be ints with 1 <= min <= max, "
                f"got {lo!r}, {hi!r}"
            )
        if not is_int(self.backoff) or self.backoff < 0:
            raise ValueError(f"backoff must be an int >= 0, got {self.backoff!r}")
