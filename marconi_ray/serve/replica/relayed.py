"""`RelayedCommits`: the finished requests whose commits a replica sent through their
ingress (`settings.commit_relay`), until the replica reads in its release log how each
one's plan ended.

The commit of a request an ingress reads on its channel leaves with its `Completed`;
the ingress sends it to the coordinator with its next call (`PlanBatcher.commit`), where
it is applied only while the plan is open (`CacheCoordinator.relayed_commit`). Every end
of a plan (a commit, whoever sent it; an abort; an expired lease) is a log entry that
names it (`Release.settled`), and the replica applies each entry once, in order. So:

- a request settled with `taken` True: the cache took charge of what it stored (kept
  it, or logged its free in that entry); it just leaves the table;
- settled with `taken` False: the cache never learned what it stored; the replica frees
  it, once, as it applies that entry;
- not settled within `commit_relay_s` (the ingress died, the channel broke): the replica
  commits it itself; the coordinator drops a repeat whose end is still in the log, and
  frees an orphan's ids directly, so each id is freed once whichever way the ends race.

Invariant: a request is here from its relayed finish until its settlement, its own
commit's answer, or the end of its plan's generation, and never also in the replica's
running orders; what it stored is reported to a reconcile as held and as its own
(`owned`), so a reconcile never frees it.
"""

from __future__ import annotations

from typing import NamedTuple

from marconi_ray.protocol.orders import Finished, Release


class _Waiting(NamedTuple):
    done: Finished
    at: float
    """When it finished (monotonic seconds)."""
    generation: int
    """The replica generation its plan was made for."""


class RelayedCommits:
    """Relayed requests by id, each with when it finished and its plan's generation."""

    def __init__(self) -> None:
        self._waiting: dict[int, _Waiting] = {}

    def __contains__(self, request_id: int) -> bool:
        return request_id in self._waiting

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, done: Finished, now: float, generation: int = 0) -> None:
        """`done`'s commit, planned for replica `generation`, leaves through its ingress
        now."""
        self._waiting[done.request_id] = _Waiting(done, now, generation)

    def ids(self) -> list[int]:
        """The requests waiting (their leases stay renewed while they wait)."""
        return list(self._waiting)

    def settle(self, release: Release) -> Release:
        """Apply `release.settled`: each relayed request it names leaves; returns what
        those the cache never took stored (for the store to free), with nothing else."""
        freed = Release()
        for rid, taken in release.settled:
            waiting = self._waiting.pop(rid, None)
            if waiting is not None and not taken:
                freed = freed + waiting.done.stored()
        return freed

    def overdue(self, due: float) -> list[Finished]:
        """The requests that finished at or before `due` (monotonic seconds)."""
        return [w.done for w in self._waiting.values() if w.at <= due]

    def next_due(self, wait_s: float) -> float | None:
        """When the oldest waiting request becomes overdue after `wait_s` (None: none)."""
        if not self._waiting:
            return None
        return min(w.at for w in self._waiting.values()) + wait_s

    def drop(self, done: list[Finished]) -> None:
        """These leave without a settlement (the replica's own commit answered them)."""
        for d in done:
            self._waiting.pop(d.request_id, None)

    def owned(self) -> Release:
        """Everything the waiting requests stored."""
        out = Release()
        for w in self._waiting.values():
            out = out + w.done.stored()
        return out

    def clear(self) -> Release:
        """Forget every waiting request (their store is gone); returns what they stored."""
        owned = self.owned()
        self._waiting.clear()
        return owned

    def clear_other(self, generation: int) -> Release:
        """Forget the requests planned for another generation than `generation` (their
        plans ended with the tree a reset replaced: no log of this generation settles
        them); returns what they stored, for the replica to free."""
        out = Release()
        for rid in [r for r, w in self._waiting.items() if w.generation != generation]:
            out = out + self._waiting.pop(rid).done.stored()
        return out
