"""The Redis journal's byte bound, its continuity check after an outage and its health
(`ok` / `degraded` / `lost`, in `/metrics` too), against a real `redis-server`."""

from __future__ import annotations

import logging
import shutil
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis_server import RedisServer

from marconi_ray.protocol.ops import Abort, Plan
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.config import config_from_mapping
from marconi_ray.serve.coordinator.journal import (
    NOT_TRUSTED,
    MemoryJournal,
    RedisJournal,
    decode_record,
    decode_snapshot,
    encode_record,
    encode_snapshot,
    open_journal,
)
from marconi_ray.serve.ingress.metrics import IngressMetrics, render_metrics

PROMPT_TOKENS = 3000
BOUND = 1 << 20
TIMEOUT_S = 5.0  # Redis calls on a loaded machine (a stopped server refuses at once)
HEALTH_KEYS = {
    "state",
    "persistent",
    "backlog_records",
    "backlog_bytes",
    "max_backlog_bytes",
    "lost_records",
    "last_snapshot_age_s",
    "last_error",
}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _plan(seq: int) -> bytes:
    """A record of a 3k-token prompt (~12 KB)."""
    prompt = np.random.default_rng(seq).integers(7, 263, PROMPT_TOKENS).astype(np.int32)
    return encode_record(seq, Plan("r0", seq, prompt, SamplingParams(), 0.0))


def _abort(seq: int) -> bytes:
    return encode_record(seq, Abort("r0", seq, "client"))


def _freeze(server: RedisServer) -> Path:
    """A copy of the server's persistence now (its AOF, fsynced at every write)."""
    old = server.workdir.parent / "older-aof"
    shutil.copytree(server.workdir / "appendonlydir", old)
    return old


def _restart_from(server: RedisServer, old: Path) -> None:
    """Start the (stopped) server from older persistence files: acknowledged writes made
    after `old` was taken are gone."""
    shutil.rmtree(server.workdir / "appendonlydir")
    shutil.copytree(old, server.workdir / "appendonlydir")
    server.start()


def _six_acknowledged_then_stopped(server: RedisServer) -> tuple[RedisJournal, Path]:
    """A journal that appended records 1-6, the server's persistence as it was after 3,
    and the server stopped."""
    journal = RedisJournal(server.url, "marconi:h", retry_s=0.0, timeout_s=TIMEOUT_S)
    for seq in (1, 2, 3):
        journal.append(_abort(seq))
    old = _freeze(server)
    for seq in (4, 5, 6):
        journal.append(_abort(seq))
    server.stop()
    return journal, old


def test_byte_bound_holds_through_an_outage_and_nothing_is_queued_once_lost(redis_server):
    """Redis down while 3k-token records arrive: the backlog stays within its bytes
    (degraded), the record that would pass the bound drops it (lost), and nothing is
    queued after that however many records follow; memory stays under the bound. Redis
    back: the snapshot is due, replaces everything, and the journal is ok again."""
    clock = Clock()
    journal = RedisJournal(
        redis_server.url,
        "marconi:h",
        max_backlog_bytes=BOUND,
        retry_s=0.0,
        timeout_s=TIMEOUT_S,
        clock=clock,
    )
    journal.append(_plan(1))
    assert journal.snapshot(encode_snapshot(1, {"x": 1}))
    health = journal.health().to_dict()
    assert set(health) == HEALTH_KEYS
    assert health["state"] == "ok" and health["last_snapshot_age_s"] == 0.0
    redis_server.stop()
    record_bytes = len(_plan(2))
    fits = BOUND // record_bytes
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        states = []
        for seq in range(2, 2 + 4 * fits):
            journal.append(_plan(seq))
            health = journal.health().to_dict()
            assert health["backlog_bytes"] <= BOUND, seq
            states.append(health["state"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # 4x the bound arrived: the peak is the bound, plus the transient buffers of encoding
    # one record (msgpack's 256 KiB)
    assert peak - before < BOUND * 3 // 2, "memory stays within the bound"
    assert states[:fits] == ["degraded"] * fits
    assert set(states[fits:]) == {"lost"}
    health = journal.health().to_dict()
    assert health["backlog_records"] == 0 and health["backlog_bytes"] == 0
    assert health["lost_records"] == 4 * fits
    assert "max_backlog_bytes" in health["last_error"]
    assert not journal.snapshot(encode_snapshot(2, {}))
    assert "Redis unreachable" in journal.health().to_dict()["last_error"]
    redis_server.start()
    assert journal.needs_snapshot
    clock.now += 5.0
    assert journal.health().to_dict()["last_snapshot_age_s"] == 5.0
    assert journal.snapshot(encode_snapshot(4 * fits + 1, {"x": 2}))
    health = journal.health().to_dict()
    assert health["state"] == "ok" and health["lost_records"] == 0
    assert health["last_snapshot_age_s"] == 0.0 and not journal.needs_snapshot
    snapshot, records = RedisJournal(redis_server.url, "marconi:h").load()
    assert decode_snapshot(snapshot) == (4 * fits + 1, {"x": 2}) and records == []


def test_marked_lost_queues_nothing(redis_server):
    """A journal marked lost (recovery could not trust what Redis holds) neither queues
    nor writes records until a snapshot replaces the journal."""
    journal = RedisJournal(redis_server.url, "marconi:h", retry_s=0.0, timeout_s=TIMEOUT_S)
    journal.mark_lost()
    redis_server.stop()
    for seq in range(1, 51):
        journal.append(_abort(seq))
    assert journal.status()["backlog"] == 0, "nothing queued"
    redis_server.start()
    journal.append(_abort(51))
    assert redis_server.client().xlen("marconi:h:journal") == 0
    assert journal.needs_snapshot
    health = journal.health().to_dict()
    assert health["state"] == "lost" and health["backlog_records"] == 0
    assert health["lost_records"] == 52 and health["last_error"] == NOT_TRUSTED


def test_catch_up_names_the_records_redis_lost_and_asks_for_a_snapshot(redis_server, caplog):
    """Redis restarted from older persistence during an outage: it lost records 4-6 it
    had acknowledged. The catch-up reads Redis's last seq, names the missing records and
    asks for a snapshot instead of appending 7 and 8 on top of the hole."""
    journal, old = _six_acknowledged_then_stopped(redis_server)
    journal.append(_abort(7))
    assert not journal.healthy
    _restart_from(redis_server, old)
    with caplog.at_level(logging.ERROR, logger="marconi_ray.serve.coordinator.journal"):
        journal.append(_abort(8))
    client = redis_server.client()
    assert client.xlen("marconi:h:journal") == 3, "nothing appended on top of the hole"
    assert journal.needs_snapshot, "a snapshot must replace the journal"
    assert "records 4-6 missing" in caplog.text
    assert "up to seq 3" in caplog.text and "acknowledged up to seq 6" in caplog.text
    health = journal.health().to_dict()
    assert health["state"] == "lost" and "records 4-6 missing" in health["last_error"]
    assert journal.snapshot(encode_snapshot(8, {"x": 8}))
    journal.append(_abort(9))
    snapshot, records = RedisJournal(redis_server.url, "marconi:h").load()
    assert decode_snapshot(snapshot)[0] == 8
    assert [decode_record(r)[0] for r in records] == [9]


def test_catch_up_after_a_snapshot_checks_the_snapshot_seq(redis_server, caplog):
    """Redis lost a snapshot it acknowledged (its stream is empty then): the check falls
    back to the snapshot's seq and names what is missing."""
    journal = RedisJournal(redis_server.url, "marconi:h", retry_s=0.0, timeout_s=TIMEOUT_S)
    assert journal.snapshot(encode_snapshot(10, {}))
    old = _freeze(redis_server)
    assert journal.snapshot(encode_snapshot(12, {}))
    redis_server.stop()
    journal.append(_abort(13))
    _restart_from(redis_server, old)
    with caplog.at_level(logging.ERROR, logger="marconi_ray.serve.coordinator.journal"):
        journal.append(_abort(14))
    assert "up to seq 10" in caplog.text and "records 11-12 missing" in caplog.text
    assert journal.needs_snapshot


def test_catch_up_that_finds_redis_whole_flushes_in_order(redis_server):
    """An outage without data loss: the backlog is flushed after the check, in order."""
    journal = RedisJournal(redis_server.url, "marconi:h", retry_s=0.0, timeout_s=TIMEOUT_S)
    journal.append(_abort(1))
    redis_server.stop()
    journal.append(_abort(2))
    redis_server.start()
    journal.append(_abort(3))
    assert journal.healthy and not journal.needs_snapshot
    assert journal.status()["backlog"] == 0
    _, records = RedisJournal(redis_server.url, "marconi:h").load()
    assert [decode_record(r)[0] for r in records] == [1, 2, 3]


def test_health_in_metrics_text():
    """`render_metrics` with the coordinator's `journal_health()`: one gauge per state
    (1 for the current one), the backlog, the bound, the lost records, the snapshot's
    age (left out before the first snapshot)."""
    health = {
        "state": "lost",
        "persistent": True,
        "backlog_records": 0,
        "backlog_bytes": 0,
        "max_backlog_bytes": BOUND,
        "lost_records": 7,
        "last_snapshot_age_s": 12.5,
        "last_error": "x",
    }
    text = render_metrics(IngressMetrics(), None, journal=health).decode()
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert got[("marconi_journal_state", (("state", "lost"),))] == 1
    assert got[("marconi_journal_state", (("state", "ok"),))] == 0
    assert got[("marconi_journal_state", (("state", "degraded"),))] == 0
    assert got[("marconi_journal_backlog_bytes", ())] == 0
    assert got[("marconi_journal_backlog_records", ())] == 0
    assert got[("marconi_journal_max_backlog_bytes", ())] == BOUND
    assert got[("marconi_journal_lost_records", ())] == 7
    assert got[("marconi_journal_last_snapshot_age_seconds", ())] == 12.5
    fresh = MemoryJournal().health().to_dict()
    assert set(fresh) == HEALTH_KEYS and fresh["state"] == "ok"
    text = render_metrics(IngressMetrics(), None, journal=fresh).decode()
    assert "marconi_journal_last_snapshot_age_seconds" not in text
    assert 'marconi_journal_state{state="ok"} 1.0' in text
    with pytest.raises(ValueError, match="'sideways'"):
        render_metrics(IngressMetrics(), None, journal={**health, "state": "sideways"})
    with pytest.raises(ValueError, match=r"'backlog_bytes'.*'lots'"):
        render_metrics(IngressMetrics(), None, journal={**health, "backlog_bytes": "lots"})


def test_backlog_bound_setting(redis_server):
    """`journal_max_backlog_bytes`: a number of bytes (numeric strings too), >= 0, and
    what the coordinator's Redis journal is opened with."""
    assert config_from_mapping({}).journal_max_backlog_bytes == 64 << 20
    config = config_from_mapping({"journal_max_backlog_bytes": "1e6"})
    assert config.journal_max_backlog_bytes == 1_000_000
    with pytest.raises(ValueError, match="journal_max_backlog_bytes"):
        config_from_mapping({"journal_max_backlog_bytes": -1})
    journal = open_journal(redis_server.url, "marconi:h", 1_000_000)
    assert isinstance(journal, RedisJournal) and journal.max_backlog_bytes == 1_000_000
    assert journal.health().to_dict()["max_backlog_bytes"] == 1_000_000
    with pytest.raises(ValueError, match="-5"):
        RedisJournal(redis_server.url, "marconi:h", max_backlog_bytes=-5)


def test_a_restart_from_older_data_between_two_appends_is_found_at_the_next(redis_server, caplog):
    """Redis restarts from older data between two appends, quickly enough that no call
    fails (redis-py reconnects on its own): the next append still finds the hole (the
    seq Redis holds is checked by every append, not only after a failed one), appends
    nothing on top of it and asks for a snapshot; `health()` says `lost`, not `ok`."""
    journal, old = _six_acknowledged_then_stopped(redis_server)
    _restart_from(redis_server, old)
    with caplog.at_level(logging.ERROR, logger="marconi_ray.serve.coordinator.journal"):
        journal.append(_abort(7))
        journal.append(_abort(8))
    assert journal.status()["outages"] == 0, "redis-py reconnected: no append failed"
    client = redis_server.client()
    assert client.xlen("marconi:h:journal") == 3, "nothing appended on top of the hole"
    assert journal.needs_snapshot
    assert "records 4-6 missing" in caplog.text
    health = journal.health().to_dict()
    assert health["state"] == "lost" and health["lost_records"] >= 2


def test_a_flush_whose_reply_was_lost_is_not_written_twice(redis_server):
    """A flush that reached Redis but whose reply was lost is retried: Redis holds a seq
    the backlog explains, so what it has is dropped from the backlog and the rest is
    appended once, in order, and the journal stays ok."""
    journal = RedisJournal(redis_server.url, "marconi:h", retry_s=0.0, timeout_s=TIMEOUT_S)
    journal.append(_abort(1))
    other = RedisJournal(redis_server.url, "marconi:h", retry_s=0.0, timeout_s=TIMEOUT_S)
    other.load()
    other.append(_abort(2))  # as if journal's own flush of 2 had landed unanswered
    journal._backlog = [_abort(2)]  # the backlog that unanswered flush left behind
    journal.append(_abort(3))
    assert journal.health().state == "ok" and not journal.needs_snapshot
    _, records = RedisJournal(redis_server.url, "marconi:h").load()
    assert [decode_record(r)[0] for r in records] == [1, 2, 3]
