"""Typed journal operations: every kind round-trips through its record and msgpack, and a
malformed record names the field (never another exception)."""

from __future__ import annotations

import dataclasses

import msgpack
import numpy as np
import pytest

from marconi_ray.core.cache.tuner import TuneResult
from marconi_ray.core.wire import pack, unpack
from marconi_ray.protocol.ops import (
    OP_TYPES,
    Abort,
    Adopt,
    Commit,
    Import,
    Pin,
    Plan,
    Register,
    Unregister,
    decode_op,
    encode_op,
)
from marconi_ray.protocol.orders import Finished
from marconi_ray.protocol.results import Timings
from marconi_ray.protocol.sampling import SamplingParams

DONE = Finished(
    request_id=4,
    tokens=(5, 6, 7),
    finish_reason="length",
    state_ids={12: 3, 15: 9},
    kv_slots=np.arange(10, 20, dtype=np.int64),
    timings=Timings(1.0, 2.0, 3.0, 4.0),
)
OPS = [
    Register("r0", 1024, 2048, 17),
    Unregister("r0"),
    Plan("r0", 4, np.arange(3, 40, dtype=np.int32), SamplingParams(7, 0.5, 0.9, 3, 11, (2,)), 2.5),
    Commit("r0", DONE),
    Abort("r0", 4, "lease"),
    Adopt("r0", TuneResult(0.4, ((0.0, 0.1), (0.4, 0.3)), 50, 120, 0.25)),
    Adopt(
        "r1",
        TuneResult(0.0, ((0.0, 0.5),), 9, 3, 0.1, True, ((0.0, True, 0.5), (0.0, False, 0.25))),
    ),
    Pin("r0", 8, np.arange(3, 30, dtype=np.int32)),
    Import("r1", 9, np.arange(3, 30, dtype=np.int32)),
]


def _same(a, b) -> bool:
    if isinstance(a, Plan):
        return (a.replica, a.request, a.params, a.submitted) == (
            b.replica,
            b.request,
            b.params,
            b.submitted,
        ) and np.array_equal(a.prompt, b.prompt)
    if isinstance(a, Pin):  # and Import
        return (a.replica, a.request) == (b.replica, b.request) and np.array_equal(
            a.tokens, b.tokens
        )
    if isinstance(a, Commit):
        x, y = a.done, b.done
        return (
            a.replica == b.replica
            and (x.request_id, x.tokens, x.finish_reason, x.state_ids)
            == (y.request_id, y.tokens, y.finish_reason, y.state_ids)
            and np.array_equal(x.kv_slots, y.kv_slots)
        )
    return a == b


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.NAME)
def test_every_op_round_trips_through_msgpack(op):
    record = encode_op(op)
    assert record["op"] == op.NAME and set(record) == {"op", *op.KEYS}
    back = decode_op(unpack(pack(record)))
    assert type(back) is type(op) and _same(back, op)


def test_every_op_kind_is_covered():
    assert {type(o) for o in OPS} == set(OP_TYPES.values())


def test_abort_does_not_journal_what_the_request_stored():
    op = Abort("r0", 4, "client", DONE)
    assert "done" not in encode_op(op) and decode_op(encode_op(op)).done is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.update(op="drop"), "unknown record op"),
        (lambda r: r.pop("request"), "'request'"),
        (lambda r: r.update(request="4"), r"\.request"),
        (lambda r: r.update(request=-1), r"\.request: must be >= 0"),
        (lambda r: r.update(prompt={"dtype": "<i8", "data": b""}), r"\.prompt: expected dtype"),
        (lambda r: r["params"].update(temperature=-1), "temperature"),
        (lambda r: r["params"].update(bogus=1), "bogus"),
        (lambda r: r.update(extra=1), "'extra'"),
    ],
)
def test_malformed_plan_records_name_the_field(change, message):
    record = msgpack.unpackb(pack(encode_op(OPS[2])))
    change(record)
    with pytest.raises(ValueError, match=message):
        decode_op(record)


def test_malformed_commit_and_adopt_records_name_the_field():
    commit = encode_op(OPS[3])
    commit["state_ids"] = [[12, 3], [15]]
    with pytest.raises(ValueError, match=r"state_ids\[1\]"):
        decode_op(commit)
    adopt = encode_op(OPS[5])
    adopt["result"] = {**adopt["result"], "scores": [[0.0, "x"]]}
    with pytest.raises(ValueError, match="scores"):
        decode_op(adopt)
    with pytest.raises(ValueError, match="expected a map"):
        decode_op([1, 2])


def test_ops_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        OPS[0].replica = "r1"  # type: ignore[misc]
