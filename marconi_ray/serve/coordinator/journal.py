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
records (field `r`); `<prefix>:snapshot` holds the latest snapshot; `<prefix>:seq` the
last seq written (a record's or the snapshot's). Writing a snapshot replaces it, deletes
the stream and sets `seq` in one MULTI transaction (the coordinator is the only writer
and the snapshot covers every record so far).

Degraded mode: when Redis does not answer, records queue in memory, at most
`max_backlog_bytes` of them (their encoded bytes), and the coordinator keeps serving; the
outage is logged once. Appends retry at most every `retry_s`. A backlog that would pass
the bound is dropped: the journal is then *lost* and `needs_snapshot` asks the coordinator
for a snapshot, which supersedes the dropped records; until one is written nothing more is
queued (only the snapshot matters), so memory stays bounded however long the outage.

Continuity, checked on every append, not only after a failed one: records are appended
by a server-side script (`APPEND_SCRIPT`, atomic) that first compares `<prefix>:seq` with
the last seq Redis acknowledged to this journal. Redis restarted from older data (even
between two appends, with redis-py reconnecting on its own so that no call fails) holds
an older `seq`: the script appends nothing, the missing seqs are logged, the backlog is
dropped and the journal is lost as above, so records are never appended on top of a hole.
A newer `seq` that the backlog explains (a flush whose reply was lost) drops the records
Redis already has and flushes the rest. `health()` reports `ok` / `degraded` / `lost`, the
backlog and the snapshot's age.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal, Protocol

import msgpack

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

DEFAULT_MAX_BACKLOG_BYTES: Final = 64 << 20
"""Encoded bytes of records a Redis journal queues in memory while Redis is unreachable
(3,000-5,000 records of 3k-token prompts, 12-24 KB each)."""

NOT_TRUSTED: Final = "what the store holds is not trusted"
"""`mark_lost`'s default reason."""

PEEK_BYTES: Final = 64
"""Leading bytes of an encoded record or snapshot that hold its `v` and `seq`."""

APPEND_SCRIPT: Final = """
local held = redis.call('GET', KEYS[2])
if ARGV[1] ~= '' and held ~= ARGV[1] then
    return {0, held or ''}
end
for i = 3, #ARGV do
    redis.call('XADD', KEYS[1], '*', 'r', ARGV[i])
end
redis.call('SET', KEYS[2], ARGV[2])
return {1, ARGV[2]}
"""
"""Append records if Redis still holds what this journal last wrote. KEYS: the stream,
the seq key. ARGV: the expected seq ('' when none is known yet), the seq of the last
record, then the records. Returns {1, new seq}, or {0, the seq Redis holds ('' for
none)} having appended nothing."""

JournalState = Literal["ok", "degraded", "lost"]
JOURNAL_STATES: Final[tuple[JournalState, ...]] = ("ok", "degraded", "lost")
"""`ok`: every record is in the store. `degraded`: the store is unreachable and records
are queued in memory (flushed when it answers). `lost`: records were dropped (backlog over
its bound, a hole in the store, an unusable journal at start); the next snapshot replaces
them."""


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


def peek_seq(data: bytes) -> int:
    """The `seq` of an encoded record or snapshot, read from its first `PEEK_BYTES` alone
    (both are maps that start with `v` then `seq`); JournalError when they do not hold a
    non-negative int `seq`."""
    unpacker = wire.bounded_unpacker(PEEK_BYTES)
    unpacker.feed(bytes(data[:PEEK_BYTES]))
    try:
        for _ in range(min(unpacker.read_map_header(), 2)):
            key, value = unpacker.unpack(), unpacker.unpack()
            is_int = isinstance(value, int) and not isinstance(value, bool)
            if key == "seq" and is_int and value >= 0:
                return int(value)
    except (msgpack.UnpackException, ValueError, TypeError) as exc:
        raise JournalError(f"no seq in the first {PEEK_BYTES} bytes ({exc})") from None
    raise JournalError(f"no non-negative int seq in the first {PEEK_BYTES} bytes")


def span(first: int, last: int) -> str:
    """`"41"` or `"41-47"`: a range of seqs as logs name it."""
    return str(first) if first == last else f"{first}-{last}"


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


# ---------------------------------------------------------------------- health
@dataclass(frozen=True)
class JournalHealth:
    """A journal's health as `/health` and `/metrics` report it (`to_dict` for the wire).

    Attributes:
        state: `ok`, `degraded` or `lost` (see `JOURNAL_STATES`).
        persistent: whether the journal survives the coordinator (Redis).
        backlog_records: records queued in memory, not yet in the store.
        backlog_bytes: their encoded bytes (never over `max_backlog_bytes`).
        max_backlog_bytes: the bound on `backlog_bytes`.
        lost_records: records dropped since the last snapshot (the next one covers them;
            at least 1 while `lost`).
        last_snapshot_age_s: seconds since this journal last wrote a snapshot; None
            before its first.
        last_error: the last store error or continuity problem (None: none so far).
    """

    state: JournalState
    persistent: bool
    backlog_records: int
    backlog_bytes: int
    max_backlog_bytes: int
    lost_records: int
    last_snapshot_age_s: float | None
    last_error: str | None

    def to_dict(self) -> dict[str, Any]:
        """A plain dict of the fields (JSON- and msgpack-able)."""
        return asdict(self)


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
        """True when records were lost (backlog overflow, a hole in the store,
        unreadable journal) and a snapshot is due now."""
        ...

    def mark_lost(self, reason: str = NOT_TRUSTED) -> None:
        """What the store holds is stale for `reason` (the coordinator could not load it,
        or trusts only part of it): queue nothing until a snapshot replaces it."""
        ...

    def health(self) -> JournalHealth:
        """State, backlog and snapshot age (see `JournalHealth`)."""
        ...

    def status(self) -> dict[str, Any]: ...


class MemoryJournal:
    """In-process journal: survives nothing but is the embedded default (no Redis).

    Args:
        clock: monotonic seconds (the snapshot's age).
    """

    persistent = False

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._snapshot: bytes | None = None
        self._records: list[bytes] = []
        self._clock = clock
        self._snapshot_at: float | None = None
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
        self._snapshot_at = self._clock()
        self.snapshots += 1
        return True

    @property
    def needs_snapshot(self) -> bool:
        return False

    def mark_lost(self, reason: str = NOT_TRUSTED) -> None:
        self._snapshot, self._records = None, []

    def health(self) -> JournalHealth:
        age = None if self._snapshot_at is None else self._clock() - self._snapshot_at
        return JournalHealth("ok", False, 0, 0, 0, 0, age, None)

    def status(self) -> dict[str, Any]:
        return {
            "kind": "memory",
            **self.health().to_dict(),
            "healthy": True,
            "backlog": 0,
            "appended": self.appended,
            "snapshots": self.snapshots,
            "records_since_snapshot": len(self._records),
        }


class RedisJournal:
    """Journal in a Redis stream; see the module docstring for layout, degraded mode and
    continuity.

    Args:
        url: `redis://[:password@]host:port/db` (or `rediss://`).
        prefix: key prefix (one per application).
        max_backlog_bytes: encoded bytes of records held in memory while Redis is
            unreachable (>= 0); past it they are dropped and a snapshot is due.
        retry_s: least seconds between reconnection attempts during an outage.
        timeout_s: socket timeout of each Redis call (bounds the stall per attempt).
        clock: monotonic seconds (tests may pass their own).
    """

    persistent = True

    def __init__(
        self,
        url: str,
        prefix: str,
        max_backlog_bytes: int = DEFAULT_MAX_BACKLOG_BYTES,
        retry_s: float = 1.0,
        timeout_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        import redis

        if max_backlog_bytes < 0:
            raise ValueError(f"max_backlog_bytes must be >= 0, got {max_backlog_bytes}")
        self._redis = redis
        self._url = url
        self.timeout_s = timeout_s
        self._client = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self.stream_key = f"{prefix}:journal"
        self.snapshot_key = f"{prefix}:snapshot"
        self.seq_key = f"{prefix}:seq"
        self._append = self._client.register_script(APPEND_SCRIPT)
        self.max_backlog_bytes = max_backlog_bytes
        self.retry_s = retry_s
        self._clock = clock
        self._backlog: list[bytes] = []
        self._backlog_bytes = 0
        self._lost = 0
        self._acked: int | None = None  # last seq Redis acknowledged (record or snapshot)
        self._down_since: float | None = None
        self._next_try = 0.0
        self._snapshot_at: float | None = None
        self.last_error: str | None = None
        self.appended = 0
        self.snapshots = 0
        self.outages = 0

    # ------------------------------------------------------------------ health
    @property
    def healthy(self) -> bool:
        return self._down_since is None

    def health(self) -> JournalHealth:
        state: JournalState = "ok"
        if self._lost:
            state = "lost"
        elif self._backlog or self._down_since is not None:
            state = "degraded"
        age = None if self._snapshot_at is None else self._clock() - self._snapshot_at
        return JournalHealth(
            state,
            True,
            len(self._backlog),
            self._backlog_bytes,
            self.max_backlog_bytes,
            self._lost,
            age,
            self.last_error,
        )

    def _failed(self, exc: Exception) -> None:
        now = self._clock()
        self.last_error = f"Redis unreachable: {type(exc).__name__}: {exc}"
        if self._down_since is None:
            self._down_since = now
            self.outages += 1
            log.warning(
                "coordinator journal: Redis unreachable (%s); serving degraded, "
                "queueing up to %d bytes of records in memory",
                type(exc).__name__,
                self.max_backlog_bytes,
            )
        self._next_try = now + self.retry_s

    def _may_try(self) -> bool:
        return self._down_since is None or self._clock() >= self._next_try

    def _recovered(self, flushed: int) -> None:
        if self._down_since is not None:
            log.warning(
                "coordinator journal: Redis is back after %.1f s; caught up (%d queued "
                "records written, continuous up to seq %s)",
                self._clock() - self._down_since,
                flushed,
                self._acked,
            )
        self._down_since = None

    def _drop(self, reason: str) -> None:
        """Drop the backlog: the journal is lost until a snapshot replaces it."""
        self._lost += max(1, len(self._backlog))
        self._backlog, self._backlog_bytes = [], 0
        self.last_error = reason
        log.error(
            "coordinator journal: %s; %d records lost, a snapshot replaces them as soon "
            "as Redis takes one",
            reason,
            self._lost,
        )

    # ------------------------------------------------------------------ protocol
    def load(self) -> tuple[bytes | None, list[bytes]]:
        """The snapshot and the records, the stream read in pages of `LOAD_PAGE` with a
        longer socket timeout (a big journal on a busy Redis). Raises the Redis error
        when Redis cannot be read (the caller decides). What it read is the baseline of
        the continuity check (its last seq, when readable; a journal written before the
        seq key existed gets one)."""
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
                    break
                start = "(" + page[-1][0].decode()
            tail = records[-1] if records else snapshot
            try:
                self._acked = None if tail is None else peek_seq(tail)
            except JournalError:
                self._acked = None  # recovery decodes it and says what is wrong
            if self._acked is not None:
                client.set(self.seq_key, self._acked, nx=True)
        finally:
            client.close()
        return snapshot, records

    def append(self, record: bytes) -> None:
        """Queue `record` (an `encode_record`) and flush the queue when Redis may be
        tried. Once records are lost nothing is queued (the pending snapshot covers it);
        a backlog over `max_backlog_bytes` is dropped (lost)."""
        if self._lost:
            self._lost += 1
            return
        self._backlog.append(record)
        self._backlog_bytes += len(record)
        self._flush()
        if self._backlog_bytes > self.max_backlog_bytes:
            self._drop(
                f"backlog of {len(self._backlog)} records ({self._backlog_bytes} bytes) "
                f"over max_backlog_bytes={self.max_backlog_bytes} while Redis is unreachable"
            )

    def mark_lost(self, reason: str = NOT_TRUSTED) -> None:
        self._lost = max(self._lost, 1) + len(self._backlog)
        self._backlog, self._backlog_bytes = [], 0
        self.last_error = reason

    def _flush(self) -> None:
        # after a loss only a snapshot may write: records on a stale stream would mix
        if not self._backlog or self._lost or not self._may_try():
            return
        flushed = 0
        try:
            while self._backlog:
                expected = "" if self._acked is None else str(self._acked)
                last = peek_seq(self._backlog[-1])
                done, held = self._append(
                    keys=[self.stream_key, self.seq_key], args=[expected, last, *self._backlog]
                )
                if done:
                    flushed += len(self._backlog)
                    self._acked = last
                    self._backlog, self._backlog_bytes = [], 0
                    break
                hole = self._behind(_held_seq(held), last)
                if hole is not None:
                    self._down_since = None
                    self._drop(hole)
                    return
        except self._redis.RedisError as exc:
            self._failed(exc)
            return
        self.appended += flushed
        self._recovered(flushed)

    def _behind(self, held: int | None, last: int) -> str | None:
        """Redis holds seq `held` (None: none) where this journal expected `self._acked`
        and wants to append up to `last`. When the backlog explains it (an earlier flush
        landed but its reply was lost), drop what Redis has and return None (flush the
        rest); otherwise what is missing."""
        acked = self._acked
        if held is not None and acked is not None and acked < held <= last:
            keep = [r for r in self._backlog if peek_seq(r) > held]
            self._backlog, self._backlog_bytes = keep, sum(len(r) for r in keep)
            self._acked = held
            return None
        if held is None:
            return (
                f"Redis holds no journal though it acknowledged up to seq {acked}: seq "
                f"{span(0, acked or 0)} missing (Redis restarted empty?)"
            )
        if acked is not None and held < acked:
            return (
                f"Redis holds the journal up to seq {held} though it acknowledged up to "
                f"seq {acked}: records {span(held + 1, acked)} missing (Redis restarted "
                f"from older data?)"
            )
        return f"Redis holds seq {held}, past this journal's {acked}: another writer?"

    def _hole(self) -> str | None:
        """What Redis lost of what it acknowledged (None: nothing), read before
        appending after an outage. More than acknowledged is fine (a flush cut short
        wrote part of the backlog; replay skips the repeats). Raises RedisError."""
        if self._acked is None:
            return None
        acked = self._acked
        try:
            tail = self._tail_seq()
        except JournalError as exc:
            return f"after an outage, Redis's last record is unreadable ({exc})"
        if tail is not None and tail >= acked:
            return None
        if tail is None:
            return (
                f"after an outage, Redis holds no journal though it acknowledged up to "
                f"seq {acked}: seq {span(0, acked)} missing (Redis restarted empty?)"
            )
        return (
            f"after an outage, Redis holds the journal up to seq {tail} though it "
            f"acknowledged up to seq {acked}: records {span(tail + 1, acked)} missing "
            f"(Redis restarted from older data?)"
        )

    def _tail_seq(self) -> int | None:
        """The last seq Redis holds: its last record's, else its snapshot's; None when it
        holds neither."""
        last: Any = self._client.xrevrange(self.stream_key, count=1)
        if last:
            return peek_seq(bytes(last[0][1][b"r"]))
        head: Any = self._client.getrange(self.snapshot_key, 0, PEEK_BYTES - 1)
        return peek_seq(bytes(head)) if head else None

    def snapshot(self, data: bytes) -> bool:
        if not self._may_try():
            return False
        try:
            pipe = self._client.pipeline(transaction=True)
            pipe.set(self.snapshot_key, data)
            pipe.delete(self.stream_key)
            pipe.set(self.seq_key, peek_seq(data))
            pipe.execute()
        except self._redis.RedisError as exc:
            self._failed(exc)
            return False
        if self._lost:
            log.warning("coordinator journal: a snapshot replaced the %d lost records", self._lost)
        self._backlog, self._backlog_bytes = [], 0
        self._lost = 0
        self._acked = peek_seq(data)
        self._snapshot_at = self._clock()
        self.snapshots += 1
        self._recovered(0)
        return True

    @property
    def needs_snapshot(self) -> bool:
        return self._lost > 0 and self._may_try()

    def status(self) -> dict[str, Any]:
        return {
            "kind": "redis",
            **self.health().to_dict(),
            "healthy": self.healthy,
            "backlog": len(self._backlog),
            "lost": self._lost,
            "appended": self.appended,
            "snapshots": self.snapshots,
            "outages": self.outages,
        }

    def clear(self) -> None:
        """Delete the snapshot and the stream (a fresh deployment)."""
        self._client.delete(self.snapshot_key, self.stream_key, self.seq_key)
        self._acked = None


def _held_seq(held: Any) -> int | None:
    """The seq `APPEND_SCRIPT` reports Redis holds (None: none)."""
    text = held.decode() if isinstance(held, bytes) else str(held)
    return int(text) if text else None


def open_journal(
    redis_url: str | None, prefix: str, max_backlog_bytes: int = DEFAULT_MAX_BACKLOG_BYTES
) -> Journal:
    """The Redis journal for `redis_url` (queueing at most `max_backlog_bytes` during an
    outage), or the in-memory one when it is None."""
    if redis_url is None:
        return MemoryJournal()
    return RedisJournal(redis_url, prefix, max_backlog_bytes)


def clear_journal(redis_url: str, prefix: str) -> bool:
    """Delete an application's snapshot and records; False when Redis is unreachable."""
    import redis

    try:
        RedisJournal(redis_url, prefix).clear()
    except redis.RedisError as exc:
        log.warning("could not clear the coordinator journal: %s", exc)
        return False
    return True
