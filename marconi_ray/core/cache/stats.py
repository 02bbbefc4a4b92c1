"""Counters a prefix cache keeps: hit rates, FLOPs saved, bytes, admissions, evictions."""

from __future__ import annotations

from dataclasses import dataclass, field

LOCAL_REASONS = ("branch", "last_token", "block", "speculative")
"""Why an admission policy checkpoints a state of a request the replica computed itself;
the by-reason counters of a fresh `CacheStats` hold these keys."""

ADMISSION_REASONS = (*LOCAL_REASONS, "transfer")
"""Every reason a state can enter a cache; `transfer`: copied in from another replica's
cache (`PrefixCache.plan_import`). Its key appears in the by-reason counters from the
first transfer on (`count_reason`), so a replica that never imports reports as before."""


def count_reason(counts: dict[str, int], reason: str, n: int = 1) -> None:
    """Add `n` to `counts[reason]`, starting a reason the dict does not hold yet at 0."""
    counts[reason] = counts.get(reason, 0) + n


STATELESS_MIN_TOKENS = 32
"""Tokens of a request's input the tree must hold for a hit of 0 to count as missed for
want of a state (`CacheStats.stateless_misses`): fewer is a shared first token or two."""


@dataclass
class CacheStats:
    """Running totals over committed requests (aborted requests are not counted).

    Token hit rate = reused input tokens / input tokens (outputs are not counted), as in
    the paper. FLOPs are prefill FLOPs of the inputs from the cost model.
    """

    requests: int = 0
    hit_requests: int = 0
    input_tokens: int = 0
    hit_tokens: int = 0
    flops_total: float = 0.0
    flops_saved: float = 0.0
    evictions: int = 0
    states_admitted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LOCAL_REASONS, 0))
    states_dropped: int = 0
    states_superseded: int = 0
    """States a later one replaced in place (`AdmissionPolicy.superseded_by`)."""
    hits_by_reason: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LOCAL_REASONS, 0))
    """Requests whose hit came from a state admitted for each reason."""
    hit_tokens_by_reason: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(LOCAL_REASONS, 0)
    )
    """Input tokens those hits reused."""
    states_hit: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LOCAL_REASONS, 0))
    """States of each reason that served at least one hit (each counted once)."""
    peak_bytes: int = 0
    """Most device bytes held after a commit."""
    host_hit_tokens: int = 0
    """Hit tokens whose KV was on the host tier when planned (two-tier caches)."""
    host_hit_bytes: int = 0
    """Host bytes those hits read (KV and states copied to the device)."""
    promotions: int = 0
    promoted_bytes: int = 0
    demotions: int = 0
    demoted_bytes: int = 0
    host_evictions: int = 0
    """Nodes dropped from the host tier."""
    host_peak_bytes: int = 0
    stateless_misses: int = 0
    """Requests whose hit was 0 although the tree held at least `STATELESS_MIN_TOKENS` of
    their input: a prefix matched, but no state stood at its end (a recurrent layer can
    resume only from a state at exactly that depth)."""
    stateless_miss_tokens: int = 0
    """The input tokens those requests found in the tree and could not reuse."""

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.input_tokens if self.input_tokens else 0.0

    @property
    def request_hit_rate(self) -> float:
        return self.hit_requests / self.requests if self.requests else 0.0

    @property
    def stateless_miss_share(self) -> float:
        """Requests that missed for want of a state / requests."""
        return self.stateless_misses / self.requests if self.requests else 0.0

    @property
    def flops_saved_fraction(self) -> float:
        return self.flops_saved / self.flops_total if self.flops_total else 0.0

    def record_request(
        self, n_input: int, hit_len: int, flops: float, saved: float, matched_len: int = 0
    ) -> None:
        """Count one committed request (`matched_len`: its input tokens the tree held when
        it was planned, with or without a state at their end)."""
        if hit_len == 0 and matched_len >= STATELESS_MIN_TOKENS:
            self.stateless_misses += 1
            self.stateless_miss_tokens += matched_len
        self.requests += 1
        self.hit_requests += hit_len > 0
        self.input_tokens += n_input
        self.hit_tokens += hit_len
        self.flops_total += flops
        self.flops_saved += saved

    def to_dict(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "hit_requests": self.hit_requests,
            "input_tokens": self.input_tokens,
            "hit_tokens": self.hit_tokens,
            "token_hit_rate": self.token_hit_rate,
            "request_hit_rate": self.request_hit_rate,
            "flops_total": self.flops_total,
            "flops_saved": self.flops_saved,
            "evictions": self.evictions,
            "states_admitted": dict(self.states_admitted),
            "states_dropped": self.states_dropped,
            "states_superseded": self.states_superseded,
            "hits_by_reason": dict(self.hits_by_reason),
            "hit_tokens_by_reason": dict(self.hit_tokens_by_reason),
            "states_hit": dict(self.states_hit),
            "peak_bytes": self.peak_bytes,
            "host_hit_tokens": self.host_hit_tokens,
            "host_hit_bytes": self.host_hit_bytes,
            "promotions": self.promotions,
            "promoted_bytes": self.promoted_bytes,
            "demotions": self.demotions,
            "demoted_bytes": self.demoted_bytes,
            "host_evictions": self.host_evictions,
            "host_peak_bytes": self.host_peak_bytes,
            "stateless_misses": self.stateless_misses,
            "stateless_miss_share": self.stateless_miss_share,
            "stateless_miss_tokens": self.stateless_miss_tokens,
        }
