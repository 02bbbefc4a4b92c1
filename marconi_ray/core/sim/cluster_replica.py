"""A replica of the cluster replay (`core.sim.cluster_replay`): its role, its prefix cache
(a real `PrefixCache`, or none) and its queue.

The queue is a busy-until time: a job (a prefill, a decode) starts when it is ready and
the replica is free, and runs for its modelled seconds; jobs on one replica never
overlap, in the order they were queued. A request is *open* on a replica from its
arrival until its last job there ends (`hold`); the router weighs open requests.

The cache follows the live protocol: `serve` plans and commits one request; `import_entry`
admits an entry copied from another replica (`PrefixCache.plan_import`, committed
uncounted); `touch` plans and aborts on the source of a copy, so its hit is refreshed as
a hit is. Commits happen when a request is served, in arrival order (as in the
single-cache replay): the clock models time, the caches see requests one after another.

What a replica admits follows what it computed (`RoleAdmission`): a replica that did not
prefill a prompt (a decode replica that received it) holds no state inside it, so it
asks for no prefill checkpoint; it keeps the state after the last decoded token.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from marconi_ray.core.cache.admission import AdmissionPolicy, Checkpoint
from marconi_ray.core.cache.cache_types import as_tokens
from marconi_ray.core.cache.prefix_cache import PrefixCache
from marconi_ray.core.sim.cluster_route import NO_PROBE, Probe
from marconi_ray.core.tree.tree_types import Match

Tokens = npt.NDArray[np.int32]


class RoleAdmission(AdmissionPolicy):
    """`inner` with its prefill checkpoints switched off while `branches` is False (module
    docstring); every other answer is `inner`'s."""

    def __init__(self, inner: AdmissionPolicy) -> None:
        self.inner = inner
        self.name = inner.name
        self.branches = True

    def prefill_checkpoints(self, match: Match, n_input: int) -> list[Checkpoint]:
        return self.inner.prefill_checkpoints(match, n_input) if self.branches else []

    def decode_checkpoints(self, n_input: int, n_total: int) -> list[Checkpoint]:
        return self.inner.decode_checkpoints(n_input, n_total)

    def superseded_by(self, new_depths: Sequence[int]) -> tuple[int, Callable[[int], bool]] | None:
        return self.inner.superseded_by(new_depths)

    @property
    def only_reason(self) -> str | None:
        return self.inner.only_reason


class Replica:
    """One replica: its index among its role's, role, cache (None: caches nothing), queue."""

    def __init__(self, index: int, role: str, cache: PrefixCache | None) -> None:
        self.index = index
        self.role = role
        self.cache = cache
        self._admission: RoleAdmission | None = None
        if cache is not None:
            self._admission = RoleAdmission(cache.admission)
            cache.admission = self._admission
        self.busy_until = 0.0
        self.busy_s = 0.0
        """Seconds of jobs run so far."""
        self._ends: list[float] = []

    def __repr__(self) -> str:
        return f"Replica({self.role} {self.index})"

    # ------------------------------------------------------------------ queue
    def open_at(self, t: float) -> int:
        """Requests open on this replica at `t` (`t` never decreases between calls)."""
        ends = self._ends
        while ends and ends[0] <= t:
            heapq.heappop(ends)
        return len(ends)

    def hold(self, end: float) -> None:
        """Count a request as open here until `end`."""
        heapq.heappush(self._ends, end)

    def run(self, ready: float, seconds: float) -> float:
        """Queue a job ready at `ready` that takes `seconds`; returns when it ends."""
        end = self.finish_if(ready, seconds)
        self.busy_until = end
        self.busy_s += seconds
        return end

    def finish_if(self, ready: float, seconds: float) -> float:
        """When a job ready at `ready` taking `seconds` would end (nothing is queued)."""
        return max(ready, self.busy_until) + seconds

    # ------------------------------------------------------------------ cache
    def probe(self, tokens: Tokens) -> Probe:
        """What this replica's cache holds of `tokens` (no side effects)."""
        if self.cache is None:
            return NO_PROBE
        match = self.cache.tree.match(as_tokens(tokens))
        hit = match.hit_len
        return Probe(
            hit, min(match.matched_len, len(tokens)), hit > 0 and not match.hit_node.children
        )

    def serve(self, prompt: Tokens, committed: Tokens, prefilled: bool) -> int:
        """Plan `prompt` and commit `committed` (the prompt, or the prompt and its output);
        returns the hit. `prefilled`: this replica computed the prompt past its hit (it
        may checkpoint inside it); else it received the prompt's KV and state."""
        cache = self._require_cache()
        assert self._admission is not None
        self._admission.branches = prefilled
        try:
            plan = cache.plan(prompt)
        finally:
            self._admission.branches = True
        cache.commit(plan, committed)
        return plan.hit_len

    def import_entry(self, tokens: Tokens) -> None:
        """Admit the entry of `tokens` (their KV and the state after them) copied from
        another replica; its bytes are reserved first, evicting what the cache's policy
        picks, and the state is dropped when it cannot fit (`PrefixCache.plan_import`).
        The cache must not hold a state at the end of `tokens` already (ValueError)."""
        cache = self._require_cache()
        plan = cache.plan_import(tokens)
        cache.commit(plan, tokens, counted=False)

    def touch(self, prompt: Tokens) -> None:
        """Plan `prompt` and abort: the source of a copy refreshes its hit (admits nothing)."""
        cache = self._require_cache()
        cache.abort(cache.plan(prompt))

    def _require_cache(self) -> PrefixCache:
        if self.cache is None:
            raise ValueError(f"{self!r} caches nothing")
        return self.cache
