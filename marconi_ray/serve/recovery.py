"""Rebuilding the coordinator's `CacheState` from its journal at start.

`recover` reads the journal (retrying), restores the last snapshot, then applies every
later record with the same `CacheState.apply` the live coordinator uses. Restored
replicas are unconfirmed (no traffic until they reconcile) and every restored lease is
renewed, so requests in flight at the crash get a full lease to report back. When the
journal cannot be read or does not decode, the state starts empty and the journal is
marked lost (only a snapshot may be written next, so new records never follow stale
ones); the summary says why.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Final

from marconi_ray.serve.caches import CacheState
from marconi_ray.serve.journal import Journal, JournalError, decode_record, decode_snapshot

log = logging.getLogger(__name__)

LOAD_ATTEMPTS: Final = 3
"""Reads of the journal at start before starting empty."""

LOAD_RETRY_S: Final = 1.0
"""Seconds before the second read (doubled, then tripled, ...)."""


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
    the restored leases (`lease_s` each) and the replicas' silence clocks."""
    start = time.perf_counter()
    try:
        snapshot, records = load_journal(journal)
    except Exception as exc:  # the store is unreachable
        return _start_empty(state, journal, start, f"unreadable: {exc}")
    seq = 0
    applied = 0
    state.replaying = True
    try:
        if snapshot is not None:
            seq, record = decode_snapshot(snapshot)
            state.restore(record)
        for data in records:
            rec_seq, op = decode_record(data)
            if rec_seq <= seq:
                continue
            state.apply(op)
            seq = rec_seq
            applied += 1
    except (JournalError, ValueError, KeyError, RuntimeError) as exc:
        return _start_empty(state, journal, start, f"corrupt: {exc}")
    finally:
        state.replaying = False
    for info in state.replicas.values():
        info.confirmed, info.last_seen = False, now
    state.leases.renew_all(now + state.settings.lease_s)
    summary = {
        "ok": True,
        "snapshot": snapshot is not None,
        "records": applied,
        "replicas": len(state.planners),
        "nodes": state.node_count(),
        "open_plans": len(state.leases),
        "seconds": time.perf_counter() - start,
    }
    if state.planners:
        log.warning("coordinator restored from its journal: %s", summary)
    return seq, summary


def _start_empty(
    state: CacheState, journal: Journal, start: float, error: str
) -> tuple[int, dict[str, Any]]:
    """Recovery failed: no trees (replicas re-register and free what they hold), and the
    stale journal is replaced by a snapshot before anything is appended to it."""
    log.error("coordinator journal unusable (%s); starting empty", error)
    state.clear()
    journal.mark_lost()
    summary = {
        "ok": False,
        "error": error,
        "snapshot": False,
        "records": 0,
        "replicas": 0,
        "nodes": 0,
        "open_plans": 0,
        "seconds": time.perf_counter() - start,
    }
    return 0, summary
