"""Rebuilding the coordinator's `CacheState` from its journal at start.

`recover` reads the journal (retrying), restores the last snapshot, then applies the
later records in seq order with the same `CacheState.apply` the live coordinator uses.
Restored replicas are unconfirmed (no traffic until they reconcile) and every restored
lease is renewed, so requests in flight at the crash get a full lease to report back.
A repeated seq (a flush cut short, then retried) is skipped.

A hole in the seqs (Redis restarted from older data, then records were appended) is
named: "missing records 41-42 after snapshot 40". The state kept is what can be trusted:
the snapshot and the continuous records before the hole. The hidden operations may have
touched any replica, and a tree may then name KV slots its replica has since freed and
reused, which `reconcile` (it compares ids) cannot see; so every restored replica is reset
(empty tree, its open plans released, a new generation; its registration is kept) and
frees what its store holds when it reconciles at its next heartbeat. No tree can then
claim a state its replica does not hold. The journal is marked lost: the coordinator
writes a snapshot before anything else.

When the journal cannot be read, or its snapshot or a record does not decode or apply,
the state starts empty and the journal is marked lost; the summary names the record and
the error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from marconi_ray.protocol.ops import Register, Unregister
from marconi_ray.serve.coordinator.cache_state import CacheState
from marconi_ray.serve.coordinator.journal import (
    Journal,
    JournalError,
    decode_record,
    decode_snapshot,
    span,
)

log = logging.getLogger(__name__)

LOAD_ATTEMPTS: Final = 3
"""Reads of the journal at start before starting empty."""

LOAD_RETRY_S: Final = 1.0
"""Seconds before the second read (doubled, then tripled, ...)."""


class UnusableJournal(Exception):
    """The snapshot or a record does not decode or apply (the message names which)."""


@dataclass(frozen=True)
class Gap:
    """Seqs `first`..`last` missing from the journal at replay.

    Attributes:
        snapshot: the seq of the snapshot replayed from (None: no snapshot).
        after: the last seq applied (the snapshot's, or the last continuous record's).
        first, last: the missing seqs (`first == after + 1`).
        unapplied: records after the gap, not applied.
    """

    snapshot: int | None
    after: int
    first: int
    last: int
    unapplied: int

    def describe(self) -> str:
        """E.g. "missing records 41-42 after snapshot 40 (3 later records not applied)"."""
        if self.snapshot is None:
            where = "the start of the journal" if self.after == 0 else f"record {self.after}"
            where += " (no snapshot)"
        elif self.after == self.snapshot:
            where = f"snapshot {self.snapshot}"
        else:
            where = f"record {self.after} (snapshot {self.snapshot})"
        return (
            f"missing records {span(self.first, self.last)} after {where} "
            f"({self.unapplied} later records not applied)"
        )


def load_journal(
    journal: Journal, sleep: Callable[[float], None] = time.sleep
) -> tuple[bytes | None, list[bytes]]:
    """The journal's (snapshot, records), read up to `LOAD_ATTEMPTS` times; the last
    failure propagates."""
    for attempt in range(1, LOAD_ATTEMPTS + 1):
        try:
            return journal.load()
        except Exception as exc:
            if attempt == LOAD_ATTEMPTS:
                raise
            log.warning("reading the coordinator journal failed (%s); retrying", exc)
            sleep(LOAD_RETRY_S * attempt)
    raise AssertionError("unreachable")


def recover(state: CacheState, journal: Journal, now: float) -> tuple[int, dict[str, Any]]:
    """Rebuild `state` from `journal`; returns (last applied seq, summary). `now` starts
    the restored leases (`lease_s` each) and the replicas' silence clocks. The summary's
    `gap` is None, or the missing seqs and the replicas reset (see the module docstring);
    `ok` is False after a gap or when starting empty, and `error` then says why."""
    start = time.perf_counter()
    try:
        snapshot, records = load_journal(journal)
    except Exception as exc:  # the store is unreachable
        return _start_empty(state, journal, start, f"unreadable: {exc}")
    state.replaying = True
    try:
        snap_seq = _restore(state, snapshot)
        seq, applied, gap = _replay(state, records, snap_seq)
        reset = _reset_all(state) if gap is not None else []
    except UnusableJournal as exc:
        return _start_empty(state, journal, start, f"corrupt: {exc}")
    finally:
        state.replaying = False
    for rid, info in state.replicas.items():
        state.set_confirmed(rid, False)
        info.last_seen = now
    state.leases.renew_all(now + state.settings.lease_s)
    summary: dict[str, Any] = {
        "ok": gap is None,
        "snapshot": snapshot is not None,
        "records": applied,
        "replicas": len(state.planners),
        "nodes": state.node_count(),
        "open_plans": len(state.leases),
        "seconds": time.perf_counter() - start,
        "gap": None,
    }
    if gap is not None:
        error = f"gap: {gap.describe()}"
        summary["error"] = error
        summary["gap"] = {
            "snapshot": gap.snapshot,
            "after": gap.after,
            "first_missing": gap.first,
            "last_missing": gap.last,
            "unapplied": gap.unapplied,
            "reset_replicas": reset,
        }
        log.error(
            "coordinator journal %s; kept the snapshot and %d continuous records (up to "
            "seq %d); reset replicas %s (the hidden operations may have reused their KV "
            "slots): they reconcile at their next heartbeat; a snapshot replaces the journal",
            error,
            applied,
            seq,
            reset,
        )
        journal.mark_lost(f"recovery found a {error}")
    elif state.planners:
        log.warning("coordinator restored from its journal: %s", summary)
    return seq, summary


def _restore(state: CacheState, snapshot: bytes | None) -> int | None:
    """Restore the snapshot (if any) into `state`; its seq. UnusableJournal when it does
    not decode or restore."""
    if snapshot is None:
        return None
    try:
        seq, record = decode_snapshot(snapshot)
        state.restore(record)
    except (JournalError, ValueError, KeyError, TypeError) as exc:
        raise UnusableJournal(f"snapshot: {type(exc).__name__}: {exc}") from None
    return seq


def _replay(
    state: CacheState, records: list[bytes], snap_seq: int | None
) -> tuple[int, int, Gap | None]:
    """Apply the records that continue `snap_seq` (0 without a snapshot) in order, up to
    the first gap; (last seq applied, records applied, the gap or None). UnusableJournal
    naming the record when one does not decode or apply."""
    seq = 0 if snap_seq is None else snap_seq
    applied = 0
    for index, data in enumerate(records):
        try:
            rec_seq, op = decode_record(data)
        except JournalError as exc:
            raise UnusableJournal(
                f"record #{index + 1} of the stream (after seq {seq}): {exc}"
            ) from None
        if rec_seq <= seq:
            continue
        if rec_seq != seq + 1:
            return seq, applied, Gap(snap_seq, seq, seq + 1, rec_seq - 1, len(records) - index)
        try:
            state.apply(op)
        except (ValueError, KeyError, RuntimeError) as exc:
            raise UnusableJournal(
                f"record {rec_seq} ({op.NAME} on replica {op.replica!r}) does not apply: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        seq = rec_seq
        applied += 1
    return seq, applied, None


def _reset_all(state: CacheState) -> list[str]:
    """Give every replica an empty cache under a new generation, keeping its
    registration (byte prices); their ids, sorted."""
    for rid, info in list(state.replicas.items()):
        generation = max(time.time_ns(), info.generation + 1)
        state.apply(Unregister(rid))
        state.apply(Register(rid, info.kv_bytes_per_token, info.state_bytes, generation))
    return sorted(state.replicas)


def _start_empty(
    state: CacheState, journal: Journal, start: float, error: str
) -> tuple[int, dict[str, Any]]:
    """Recovery failed: no trees (replicas re-register and free what they hold), and the
    stale journal is replaced by a snapshot before anything is appended to it."""
    log.error(
        "coordinator journal unusable (%s); starting empty: replicas register again and "
        "free what they hold; a snapshot replaces the journal",
        error,
    )
    state.clear()
    journal.mark_lost(f"unusable at start: {error}")
    summary = {
        "ok": False,
        "error": error,
        "snapshot": False,
        "records": 0,
        "replicas": 0,
        "nodes": 0,
        "open_plans": 0,
        "seconds": time.perf_counter() - start,
        "gap": None,
    }
    return 0, summary
