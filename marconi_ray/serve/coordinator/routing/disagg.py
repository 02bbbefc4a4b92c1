"""Where a request runs when cache entries can move between replicas (`serve.disagg`):
the coordinator's choice between a local hit, a pulled hit and a prefill/decode hand-off,
priced in seconds by one clock (`MoveClock`).

Prefill/decode roles (`stage_roles`). The deepest hit on a decode replica, D* with hit
dD, and the prefill replica the router picks, P with hit hP, give three ways to run a
prompt of n tokens:
- *local*: D* prefills the suffix itself and decodes, as a mixed replica would. Its
  prefill stalls every request D* is decoding, so it costs `prefill(dD, n)` times
  (1 + D*'s open requests). Only a replica that holds a hit (dD > 0) is offered it: a
  prompt with nothing cached on the decode side is what prefill replicas are for.
- *hand-off*: P prefills from its own hit, then the entry at the prompt's end moves to
  the decode replica D (D* when it holds a hit, else the least loaded decode replica),
  which decodes: `prefill(hP, n) + move(dD', n)`, dD' being D's hit (only the KV it
  lacks moves).
- *pull, then hand-off*: D*'s hit first moves to P (when it is deeper than P's own):
  `move(hP, dD) + prefill(dD, n) + move(dD, n)`.
The cheapest wins; a tie goes to the hand-off (decode replicas are for decoding). With
no prefill replica free, the request runs on a decode replica as on a mixed one; with no
decode replica free, on P without a hand-off.

Remote hits for mixed replicas (`stage_remote`): the router's replica B (hit hB) pulls
the deepest hit held elsewhere, A with dA > hB, when `move(hB, dA) < prefill(hB, dA)`.

`prefill(a, b)`: seconds to prefill tokens [a, b) at `prefill_tflops` (the replica's cost
model's FLOPs); `move(a, b)`: `transfer_latency_s` plus the KV of tokens [a, b) and one
state at `transfer_gbps`. Pure and deterministic: the same views give the same choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from marconi_ray.core.model.cost_model import CostModel


@dataclass(frozen=True)
class Candidate:
    """One replica that may take the request: its usable hit on the prompt and its open
    requests (planned, not yet finished)."""

    replica_id: str
    hit: int
    open_requests: int


@dataclass(frozen=True)
class Pull:
    """Move `source`'s entry of the prompt's first `depth` tokens to the request's
    replica before it is planned there."""

    source: str
    depth: int


@dataclass(frozen=True)
class Staging:
    """How a request runs: planned on `replica` (after `pull`, when set); with `handoff`,
    `replica` prefills and emits the first token, and the entry at the prompt's end moves
    to the decode replica `handoff`, which decodes the rest. `way` names the choice
    (`local`, `handoff`, `pull+handoff`, `remote_hit`, `routed`) for metrics and tests."""

    replica: str
    pull: Pull | None = None
    handoff: str | None = None
    way: str = "routed"


@dataclass(frozen=True)
class MoveClock:
    """Seconds of prefill and of moves, for one model's cost model.

    Args:
        cost: the replicas' cost model (FLOPs of a prefix, bytes of KV and of a state).
        prefill_tflops: prefill speed, TFLOP/s.
        transfer_gbps: move speed, GB/s.
        transfer_latency_s: seconds per move on top of its bytes.
    """

    cost: CostModel
    prefill_tflops: float
    transfer_gbps: float
    transfer_latency_s: float

    def prefill(self, start: int, end: int) -> float:
        """Seconds to prefill tokens [start, end) given the state at `start`."""
        if end <= start:
            return 0.0
        return self.cost.prefill_flops(end - start, start) / (self.prefill_tflops * 1e12)

    def move(self, start: int, end: int) -> float:
        """Seconds to move the KV of tokens [start, end) and the state at `end`."""
        nbytes = self.cost.kv_bytes(max(end - start, 0)) + self.cost.state_bytes
        return self.transfer_latency_s + nbytes / (self.transfer_gbps * 1e9)


def _deepest(candidates: Sequence[Candidate]) -> Candidate | None:
    """The candidate with the deepest hit (ties: fewer open requests, then order)."""
    best = None
    for c in candidates:
        if best is None or (c.hit, -c.open_requests) > (best.hit, -best.open_requests):
            best = c
    return best


def _least_loaded(candidates: Sequence[Candidate]) -> Candidate:
    return min(candidates, key=lambda c: c.open_requests)


def stage_roles(
    n: int,
    prefill: Candidate | None,
    decode: Sequence[Candidate],
    clock: MoveClock,
) -> Staging:
    """The choice for a prompt of `n` tokens between the router's prefill replica
    `prefill` (None: none may take it) and the decode replicas that may (`decode`); see
    the module docstring. ValueError when neither role has a replica."""
    if prefill is None:
        if not decode:
            raise ValueError("no prefill or decode replica may take the request")
        held = _deepest(decode)
        assert held is not None
        chosen = held if held.hit else _least_loaded(decode)
        return Staging(chosen.replica_id, way="local")
    if not decode:
        return Staging(prefill.replica_id, way="routed")
    held = _deepest(decode)
    assert held is not None
    target = held if held.hit else _least_loaded(decode)
    hp, dd = prefill.hit, target.hit
    options: list[tuple[float, int, Staging]] = [
        (
            clock.prefill(hp, n) + clock.move(dd, n),
            0,
            Staging(prefill.replica_id, handoff=target.replica_id, way="handoff"),
        )
    ]
    if dd > hp:
        pulled = clock.move(hp, dd) + clock.prefill(dd, n) + clock.move(dd, n)
        staging = Staging(
            prefill.replica_id, Pull(target.replica_id, dd), target.replica_id, "pull+handoff"
        )
        options.append((pulled, 1, staging))
    if dd > 0:
        local = clock.prefill(dd, n) * (1 + target.open_requests)
        options.append((local, 2, Staging(target.replica_id, way="local")))
    return min(options, key=lambda o: (o[0], o[1]))[2]


def stage_remote(routed: Candidate, holders: Sequence[Candidate], clock: MoveClock) -> Staging:
    """The router's replica `routed`, pulling the deepest hit among `holders` (the other
    replicas) first when that is deeper than its own and moving it beats recomputing."""
    best = _deepest([h for h in holders if h.replica_id != routed.replica_id])
    if best is None or best.hit <= routed.hit:
        return Staging(routed.replica_id)
    if clock.move(routed.hit, best.hit) >= clock.prefill(routed.hit, best.hit):
        return Staging(routed.replica_id)
    return Staging(routed.replica_id, Pull(best.replica_id, best.hit), way="remote_hit")
