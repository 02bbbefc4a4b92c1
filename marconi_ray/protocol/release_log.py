"""The release log: every free and tier move the cache decides for one replica, in the
order it decided them, applied by the replica exactly once and in that order.

The coordinator appends each journalled operation's `Release` (what a plan evicted or
moved, what a commit or an abort let go of) to the replica's `ReleaseLog` under the next
sequence number. Whoever carries part of the log to the replica (a dispatch, the answer
to a commit, an abort, a drain or a reconcile) carries every entry the replica has not
acknowledged yet, as `Releases`; the replica's `ReleaseCursor` takes the entries it has
not applied, in seq order, and skips the rest. So:

- an entry is applied once, however many carriers bring it, and none is lost with a
  dispatch that never starts (the next carrier brings it);
- entries are applied in the cache's order, whatever order the carriers arrive in: a
  dispatch planned after a demotion can never promote what the store has not demoted;
- a dispatch names the last seq before its plan (`Dispatch.needs`): it brings those
  entries itself, so its order starts on a store that matches the tree it was planned on.

Each entry that closes a plan names it (`Release.settled`: the request, and whether the
cache took charge of what it stored), so the replica learns every plan's end in order,
once, however the commit travelled (`serve.replica.relayed`).

Frees that no tree or log entry can name (what a request the coordinator no longer plans
stored, what a reconcile finds held but unreferenced) travel as `Releases.direct`: they
are request-owned or unreferenced ids, so their order against the log does not matter.

A log belongs to one generation of its replica (a reset starts a new generation and a
new log); a cursor ignores the entries of any other generation.

Invariants (`ReleaseLog.check`): seqs are consecutive from `acked + 1` to `last`; the
replica has applied every entry up to `acked` (it only rises with the replica's word).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from marconi_ray.protocol.orders import Release


@dataclass(frozen=True)
class LogEntry:
    """One operation's release, at its place `seq` (1, 2, ...) in the replica's log."""

    seq: int
    release: Release


@dataclass(frozen=True)
class Releases:
    """What a call brings a replica's store: `entries` of its release log of generation
    `generation` (consecutive seqs, maybe some it applied already), then `direct` frees."""

    generation: int = 0
    entries: tuple[LogEntry, ...] = ()
    direct: Release = field(default_factory=Release)

    @property
    def last(self) -> int:
        """The last seq carried (0: none)."""
        return self.entries[-1].seq if self.entries else 0


class ReleaseLog:
    """The coordinator's log of one replica generation (see the module docstring).

    Args:
        generation: the replica generation it belongs to.
    """

    def __init__(self, generation: int, acked: int = 0) -> None:
        self.generation = generation
        self.acked = acked
        self._entries: deque[LogEntry] = deque()

    @property
    def last(self) -> int:
        """The seq of the last entry (the acknowledged one when none is pending)."""
        return self._entries[-1].seq if self._entries else self.acked

    def append(self, release: Release) -> int:
        """Log `release` (an empty one, settling no plan, takes no seq); returns `last`
        after it."""
        if release.states or len(release.slots) or release.moves or release.settled:
            self._entries.append(LogEntry(self.last + 1, release))
        return self.last

    def settles(self, request_id: int) -> bool:
        """Whether an entry the replica has not acknowledged closes `request_id`'s plan
        (`Release.settled`): the replica will learn its outcome from the log, so nothing
        of what the request stored may be freed directly (O(pending entries))."""
        return any(rid == request_id for entry in self._entries for rid, _ in entry.release.settled)

    def ack(self, applied: int, generation: int | None = None) -> None:
        """The replica has applied every entry up to `applied` of its log of `generation`
        (None: this one): they need not travel again. A figure of another generation (a
        replica not yet told of a reset), a stale one (below `acked`) or one past `last`
        changes nothing."""
        if generation is not None and generation != self.generation:
            return
        if applied <= self.acked or applied > self.last:
            return
        while self._entries and self._entries[0].seq <= applied:
            self._entries.popleft()
        self.acked = applied

    def since(self, direct: Release | None = None) -> Releases:
        """Every entry not acknowledged yet (with `direct` frees), for a carrier."""
        return Releases(self.generation, tuple(self._entries), direct or Release())

    def pending(self, applied: int) -> Release:
        """The entries after `applied`, merged in order (what the replica still has to
        apply; its frees and moves are not yet in its store)."""
        out = Release()
        for entry in self._entries:
            if entry.seq > applied:
                out = out + entry.release
        return out

    def entries(self) -> tuple[LogEntry, ...]:
        return tuple(self._entries)

    def restore(self, entries: Iterable[LogEntry]) -> None:
        """Replace the pending entries (from a snapshot). ValueError naming the first
        entry whose seq does not follow `acked` consecutively; the log is then unchanged."""
        restored = deque(entries)
        expected = self.acked + 1
        for entry in restored:
            if entry.seq != expected:
                raise ValueError(
                    f"release log of generation {self.generation}: entry seq {entry.seq} "
                    f"where {expected} follows acknowledged {self.acked}"
                )
            expected += 1
        self._entries = restored

    def check(self) -> None:
        """AssertionError unless the seqs run consecutively from `acked + 1`."""
        expected = self.acked + 1
        for entry in self._entries:
            assert entry.seq == expected, (entry.seq, expected)
            expected += 1


class ReleaseCursor:
    """The replica's side: how far into its generation's log it has applied.

    `take` is called with everything a call brought; what it returns is handed to the
    store (one merged `Release`: the moves of the entries in order, then their frees,
    then the direct frees; a freed id is never moved by a later entry, so merging keeps
    the order's meaning).
    """

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.applied = 0
        self.gap = ""
        """Why the last `take` skipped entries ('' when it did not): they did not follow
        `applied`, so some were never seen (the replica must reconcile)."""

    def reset(self, generation: int) -> None:
        """A new generation (the replica's cache was reset): its log starts anew."""
        if generation != self.generation:
            self.generation, self.applied = generation, 0

    def take(self, releases: Releases) -> Release:
        """The entries of `releases` not applied yet, in order, then its direct frees;
        `applied` moves to the last entry taken. Entries of another generation are
        ignored. When the first new entry does not follow `applied`, no entry is taken
        (only the direct frees) and `gap` says so."""
        out, self.gap = Release(), ""
        if releases.generation == self.generation:
            new = [e for e in releases.entries if e.seq > self.applied]
            if new and new[0].seq != self.applied + 1:
                self.gap = (
                    f"release log of generation {self.generation}: entry {new[0].seq} "
                    f"arrived after {self.applied} (entries {self.applied + 1}.."
                    f"{new[0].seq - 1} never did)"
                )
                new = []
            for entry in new:
                out = out + entry.release
            if new:
                self.applied = new[-1].seq
        return out + releases.direct
