"""The coordinator's journal: versioned msgpack records of every cache operation, plus
compact snapshots, in a Redis stream (persistent) or in memory (the embedded default).

What is journalled is the coordinator's *operations* on its planners, not the tensors:
`register`/`unregister`/`reset` of a replica, `plan` (the lease grant: route decision,
prompt, sampling parameters), `commit` (what a finished request stored), `abort` (client
gone, lease expired, reconciliation) and `adopt` (an alpha change). The planners are
deterministic (logical clocks, no randomness), so replaying the records in order on the
last snapshot rebuilds every tree, lock, reservation, open plan and alpha exactly.

Records and snapshots are msgpack maps `{"v": SCHEMA_VERSION, "seq": n, "op": name, ...}`;
an operation's fields are laid out by its typed record in `protocol.ops` (numpy arrays in
`wire.encode_array` form). Decoding is bounded (`max_bin_len` and friends
from a byte limit), refuses ext types and never unpickles; a record that fails the schema
is a `JournalError` naming the offending field.

Redis layout (one application = one key prefix): `<prefix>:journal` is a stream of
records (field `r`); `<prefix>:snapshot` holds the latest snapshot. Writing a snapshot
replaces it and deletes the stream in one MULTI transaction (the coordinator is the only
writer and the snapshot covers every record so far).

Degraded mode: when Redis does not answer, records queue in memory (bounded by
`max_backlog`) and the coordinator keeps serving; the outage is logged once. Appends retry
at most every `retry_s`; when Redis answers again the backlog is flushed in order (caught
up). If the backlog overflows it is dropped and `needs_snapshot` asks the coordinator for
a snapshot, which supersedes the lost records.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

from marconi_ray.core import wire
from marconi_ray.protocol.ops import Op, decode_op, encode_op

log = logging.getLogger(__name__)

SCHEMA_VERSION: Final = 1
"""Bumped on any incompatible change of a record or snapshot layout."""

MAX_RECORD_BYTES: Final = 64 << 20
"""Largest record accepted when decoding (a prompt of 16M tokens)."""

LOAD_TIMEOUT_S: Final = 30.0
"""Socket timeout of the reads at recovery (appends keep a short one)."""

LOAD_PAGE: Final = 5000
"""Records read per XRANGE call at recovery."""

MAX_SNAPSHOT_BYTES: Final = 2 << 30
"""Largest snapshot accepted when decoding."""

class JournalError(ValueError):
    """A record or snapshot that cannot be decoded or fails the schema."""


# ---------------------------------------------------------------------- encoding
def unpack(data: bytes, limit: int) -> Any:
    """msgpack-decode `data` with every length bounded by `limit` (`wire.unpack`);
    JournalError on any malformed, oversized or ext-typed input."""
    try:
        return wire.unpack(data, limit)
    except ValueError as exc:
        raise JournalError(f"undecodable msgpack: {exc}") from None


def encode_record(seq: int, op: Op) -> bytes:
    """One record as bytes: `{"v": SCHEMA_VERSION, "seq": seq, "op": name, ...fields}`."""
    return wire.pack({"v": SCHEMA_VERSION, "seq": seq, **encode_op(op)})


def check_record(record: Any) -> tuple[int, Op]:
    """(seq, operation) of a decoded record of this schema version, else JournalError
    naming the offending field."""
    if not isinstance(record, dict):
        raise JournalError(f"a record must be a map, got {type(record).__name__}")
    if record.get("v") != SCHEMA_VERSION:
        raise JournalError(f"record schema version {record.get('v')!r} != {SCHEMA_VERSION}")
    seq = record.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise JournalError(f"record seq must be a non-negative int, got {seq!r}")
    body = {k: v for k, v in record.items() if k not in ("v", "seq")}
    try:
        return seq, decode_op(body, f"record {seq}")
    except ValueError as exc:
        raise JournalError(str(exc)) from None


def decode_record(data: bytes) -> tuple[int, Op]:
    """(seq, operation) of a record's bytes (bounded, validated)."""
    return check_record(unpack(data, MAX_RECORD_BYTES))


def encode_snapshot(seq: int, state: Mapping[str, Any]) -> bytes:
    return wire.pack({"v": SCHEMA_VERSION, "seq": seq, "state": dict(state)})


def decode_snapshot(data: bytes) -> tuple[int, dict[str, Any]]:
    """(seq, state) of a snapshot; JournalError when malformed."""
    snap = unpack(data, MAX_SNAPSHOT_BYTES)
    if not isinstance(snap, dict) or snap.get("v") != SCHEMA_VERSION:
        raise JournalError("snapshot: not a map of this schema version")
    seq, state = snap.get("seq"), snap.get("state")
    if not isinstance(seq, int) or seq < 0 or not isinstance(state, dict):
        raise JournalError(f"snapshot: bad seq {seq!r} or state")
    return seq, state


# ---------------------------------------------------------------------- journals
class Journal(Protocol):
    """Where the coordinator's records go. Single writer; records in `seq` order."""

    persistent: bool

    def load(self) -> tuple[bytes | None, list[bytes]]:
        """The latest snapshot (or None) and the encoded records written after it."""
        ...

    def append(self, record: bytes) -> None:
        """Add one encoded record (never raises for an unreachable store)."""
        ...

    def snapshot(self, data: bytes) -> bool:
        """Replace the snapshot with `data` (which covers every record so far) and drop
        the records; False when the store did not take it (try again later)."""
        ...

    @property
    def needs_snapshot(self) -> bool:
        """True when records were lost (backlog overflow, unreadable journal) and a
        snapshot is due now."""
        ...

    def mark_lost(self) -> None:
        """What the store holds is stale (the coordinator could not load it and started
        empty): stop appending until a snapshot replaces it."""
        ...

    def status(self) -> dict[str, Any]: ...


class MemoryJournal:
    """In-process journal: survives nothing but is the embedded default (no Redis)."""

    persistent = False

    def __init__(self) -> None:
        self._snapshot: bytes | None = None
        self._records: list[bytes] = []
        self.appended = 0
        self.snapshots = 0
        log.warning(
            "coordinator journal is in memory: cache metadata is NOT persistent "
            "(set redis_url to survive coordinator restarts)"
        )

    def load(self) -> tuple[bytes | None, list[bytes]]:
        return self._snapshot, list(self._records)

    def append(self, record: bytes) -> None:
        self._records.append(record)
        self.appended += 1

    def snapshot(self, data: bytes) -> bool:
        self._snapshot, self._records = data, []
        self.snapshots += 1
        return True

    @property
    def needs_snapshot(self) -> bool:
        return False

    def mark_lost(self) -> None:
        self._snapshot, self._records = None, []

    def status(self) -> dict[str, Any]:
        return {
            "kind": "memory",
            "persistent": False,
            "healthy": True,
            "backlog": 0,
            "appended": self.appended,
            "snapshots": self.snapshots,
            "records_since_snapshot": len(self._records),
        }


class RedisJournal:
    """Journal in a Redis stream; see the module docstring for layout and degraded mode.

    Args:
        url: `redis://[:password@]host:port/db` (or `rediss://`).
        prefix: key prefix (one per application).
        max_backlog: records held in memory while Redis is unreachable.
        retry_s: least seconds between reconnection attempts during an outage.
        timeout_s: socket timeout of each Redis call (bounds the stall per attempt).
        clock: monotonic seconds (tests may pass their own).
    """

    persistent = True

    def __init__(
        self,
        url: str,
        prefix: str,
        max_backlog: int = 100_000,
        retry_s: float = 1.0,
        timeout_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        import redis

        self._redis = redis
        self._url = url
        self.timeout_s = timeout_s
        self._client = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self.stream_key = f"{prefix}:journal"
        self.snapshot_key = f"{prefix}:snapshot"
        self.max_backlog = max_backlog
        self.retry_s = retry_s
        self._clock = clock
        self._backlog: list[bytes] = []
        self._lost = 0
        self._down_since: float | None = None
        self._next_try = 0.0
        self.appended = 0
        self.snapshots = 0
        self.outages = 0

    # ------------------------------------------------------------------ health
    @property
    def healthy(self) -> bool:
        return self._down_since is None

    def _failed(self, exc: Exception) -> None:
        now = self._clock()
        if self._down_since is None:
            self._down_since = now
            self.outages += 1
            log.warning(
                "coordinator journal: Redis unreachable (%s); serving degraded, "
                "queueing records in memory",
                type(exc).__name__,
            )
        self._next_try = now + self.retry_s

    def _may_try(self) -> bool:
        return self._down_since is None or self._clock() >= self._next_try

    def _recovered(self) -> None:
        if self._down_since is not None:
            log.warning(
                "coordinator journal: Redis is back after %.1f s; caught up",
                self._clock() - self._down_since,
            )
        self._down_since = None

    # ------------------------------------------------------------------ protocol
    def load(self) -> tuple[bytes | None, list[bytes]]:
        """The snapshot and the records, the stream read in pages of `LOAD_PAGE` with a
        longer socket timeout (a big journal on a busy Redis). Raises the Redis error
        when Redis cannot be read (the caller decides)."""
        client = self._redis.Redis.from_url(
            self._url, socket_timeout=LOAD_TIMEOUT_S, socket_connect_timeout=self.timeout_s
        )
        try:
            snapshot: Any = client.get(self.snapshot_key)
            records: list[bytes] = []
            start = "-"
            while True:
                page: Any = client.xrange(self.stream_key, min=start, count=LOAD_PAGE)
                records.extend(bytes(fields[b"r"]) for _, fields in page)
                if len(page) < LOAD_PAGE:
                    return snapshot, records
                start = "(" + page[-1][0].decode()
        finally:
            client.close()

    def append(self, record: bytes) -> None:
        self._backlog.append(record)
        if len(self._backlog) > self.max_backlog:
            self._lost += len(self._backlog)
            self._backlog = []
            log.error(
                "coordinator journal: backlog over %d records dropped; a snapshot will "
                "replace them when Redis is back",
                self.max_backlog,
            )
        self._flush()

    def mark_lost(self) -> None:
        self._lost = max(self._lost, 1)

    def _flush(self) -> None:
        # after a loss only a snapshot may write: records on a stale stream would mix
        if not self._backlog or self._lost or not self._may_try():
            return
        try:
            pipe = self._client.pipeline(transaction=False)
            for record in self._backlog:
                pipe.xadd(self.stream_key, {"r": record})
            pipe.execute()
        except self._redis.RedisError as exc:
            self._failed(exc)
            return
        self.appended += len(self._backlog)
        self._backlog = []
        self._recovered()

    def snapshot(self, data: bytes) -> bool:
        if not self._may_try():
            return False
        try:
            pipe = self._client.pipeline(transaction=True)
            pipe.set(self.snapshot_key, data)
            pipe.delete(self.stream_key)
            pipe.execute()
        except self._redis.RedisError as exc:
            self._failed(exc)
            return False
        self._backlog = []
        self._lost = 0
        self.snapshots += 1
        self._recovered()
        return True

    @property
    def needs_snapshot(self) -> bool:
        return self._lost > 0 and self._may_try()

    def status(self) -> dict[str, Any]:
        return {
            "kind": "redis",
            "persistent": True,
            "healthy": self.healthy,
            "backlog": len(self._backlog),
            "lost": self._lost,
            "appended": self.appended,
            "snapshots": self.snapshots,
            "outages": self.outages,
        }

    def clear(self) -> None:
        """Delete the snapshot and the stream (a fresh deployment)."""
        self._client.delete(self.snapshot_key, self.stream_key)


def open_journal(redis_url: str | None, prefix: str) -> Journal:
    """The Redis journal for `redis_url`, or the in-memory one when it is None."""
    if redis_url is None:
        return MemoryJournal()
    return RedisJournal(redis_url, prefix)


def clear_journal(redis_url: str, prefix: str) -> bool:
    """Delete an application's snapshot and records; False when Redis is unreachable."""
    import redis

    try:
        RedisJournal(redis_url, prefix).clear()
    except redis.RedisError as exc:
        log.warning("could not clear the coordinator journal: %s", exc)
        return False
    return True
