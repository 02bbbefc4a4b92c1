"""Journal records: schema, bounded decoding, no pickle/ext types; the Redis journal's
stream/snapshot layout and degraded mode against a real `redis-server`."""

from __future__ import annotations

import pickle

import msgpack
import numpy as np
import pytest

from marconi_ray.protocol.ops import Abort, Plan
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.coordinator.journal import (
    MAX_RECORD_BYTES,
    SCHEMA_VERSION,
    JournalError,
    MemoryJournal,
    RedisJournal,
    decode_record,
    decode_snapshot,
    encode_record,
    encode_snapshot,
    unpack,
)

ABORT = {"replica": "r0", "request": 7, "reason": "client"}
ABORT_OP = Abort(**ABORT)


def _raw(record: dict) -> bytes:
    return msgpack.packb(record, use_bin_type=True)


def test_records_round_trip_with_arrays():
    prompt = np.arange(5, 300, dtype=np.int32)
    params = SamplingParams(max_tokens=4, stop_token_ids=(2, 3))
    data = encode_record(3, Plan("r0", 9, prompt, params, 1.5))
    raw = msgpack.unpackb(data)
    assert raw["seq"] == 3 and raw["op"] == "plan" and raw["v"] == SCHEMA_VERSION
    seq, op = decode_record(data)
    assert seq == 3 and isinstance(op, Plan)
    assert np.array_equal(op.prompt, prompt)
    assert (op.replica, op.request, op.params, op.submitted) == ("r0", 9, params, 1.5)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"v": 99, "seq": 1, "op": "abort", **ABORT}, "schema version 99"),
        ({"v": SCHEMA_VERSION, "seq": -1, "op": "abort", **ABORT}, "seq"),
        ({"v": SCHEMA_VERSION, "seq": 1, "op": "drop_table", **ABORT}, "unknown record op"),
        ({"v": SCHEMA_VERSION, "seq": 1, "op": "abort", "replica": "r0"}, "'request'"),
        ({"v": SCHEMA_VERSION, "seq": 1, "op": "abort", **ABORT, "request": "7"}, r"\.request"),
        ({"v": SCHEMA_VERSION, "seq": 1, "op": "abort", **ABORT, "request": True}, r"\.request"),
        ({"v": SCHEMA_VERSION, "seq": 1, "op": "abort", **ABORT, "extra": 1}, "'extra'"),
        ([1, 2, 3], "must be a map"),
    ],
)
def test_schema_violations_name_the_field(record, message):
    with pytest.raises(JournalError, match=message):
        decode_record(_raw(record))


def test_hostile_bytes_are_journal_errors_never_pickle():
    good = encode_record(1, ABORT_OP)
    for data in (good[:-3], b"", b"\xc1", pickle.dumps({"op": "abort"})):
        with pytest.raises(JournalError):
            decode_record(data)
    ext = msgpack.packb(msgpack.ExtType(5, b"payload"))
    with pytest.raises(JournalError, match="ext"):
        unpack(ext, 1024)
    with pytest.raises(JournalError, match="over the limit"):
        unpack(b"\x00" * 2048, 1024)
    claims_huge = b"\xc6\x7f\xff\xff\xff" + b"x" * 10  # bin32 of 2 GiB, 10 bytes follow
    with pytest.raises(JournalError):
        unpack(claims_huge, 1024)
    plan = msgpack.unpackb(encode_record(2, Plan("r0", 1, np.arange(3), SamplingParams(), 0.0)))
    plan["prompt"] = {"dtype": "<i4", "data": b"\x00" * 5}
    with pytest.raises(JournalError, match="whole number"):
        decode_record(_raw(plan))
    assert MAX_RECORD_BYTES >= 1 << 20


def test_snapshot_round_trip_and_errors():
    seq, state = decode_snapshot(encode_snapshot(12, {"next_request": 4, "replicas": []}))
    assert seq == 12 and state == {"next_request": 4, "replicas": []}
    with pytest.raises(JournalError, match="snapshot"):
        decode_snapshot(_raw({"v": SCHEMA_VERSION, "seq": "x", "state": {}}))


def test_memory_journal_snapshot_replaces_records():
    journal = MemoryJournal()
    journal.append(encode_record(1, ABORT_OP))
    journal.append(encode_record(2, ABORT_OP))
    assert journal.load()[0] is None and len(journal.load()[1]) == 2
    journal.snapshot(encode_snapshot(2, {}))
    snapshot, records = journal.load()
    assert snapshot is not None and records == []


def test_redis_journal_layout_and_outage(redis_server):
    two = 2 * len(encode_record(1, ABORT_OP))  # a backlog of two records (seqs 1..8 encode alike)
    journal = RedisJournal(redis_server.url, "marconi:j", retry_s=0.0, max_backlog_bytes=two)
    for seq in (1, 2):
        journal.append(encode_record(seq, ABORT_OP))
    client = redis_server.client()
    assert client.xlen("marconi:j:journal") == 2
    assert journal.snapshot(encode_snapshot(2, {"x": 1}))
    assert client.xlen("marconi:j:journal") == 0 and client.exists("marconi:j:snapshot")
    journal.append(encode_record(3, ABORT_OP))
    redis_server.stop()
    journal.append(encode_record(4, ABORT_OP))
    assert not journal.healthy and journal.status()["backlog"] == 1
    assert not journal.snapshot(encode_snapshot(4, {}))
    redis_server.start()
    journal.append(encode_record(5, ABORT_OP))
    assert journal.healthy and journal.status()["backlog"] == 0
    snapshot, records = RedisJournal(redis_server.url, "marconi:j").load()
    assert decode_snapshot(snapshot) == (2, {"x": 1})
    assert [decode_record(r)[0] for r in records] == [3, 4, 5]
    redis_server.stop()
    for seq in (6, 7, 8):
        journal.append(encode_record(seq, ABORT_OP))
    assert journal.status()["lost"] == 3 and journal.status()["backlog"] == 0
    redis_server.start()
    assert journal.needs_snapshot


def test_wrong_password_is_a_redis_error_at_load(redis_server):
    import redis

    url = redis_server.url.replace("test-journal-password", "wrong")
    with pytest.raises(redis.RedisError):
        RedisJournal(url, "marconi:j").load()
