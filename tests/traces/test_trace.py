"""Tests for marconi_ray.traces.trace: Request/Trace contracts and the artifact JSONL format."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from marconi_ray.traces.trace import (
    Request,
    Trace,
    TraceFormatError,
    read_jsonl,
    with_session_rate,
    write_jsonl,
)


def _req(sid: int, turn: int, ts: float, inp: list[int], out: list[int] | None = None) -> Request:
    return Request(sid, turn, ts, np.array(inp), np.array(out or [], dtype=np.int64))


def _trace() -> Trace:
    return Trace.from_requests(
        "t",
        [
            _req(1, 1, 3.0, [1, 5, 6, 2, 9], [4]),
            _req(0, 0, 0.0, [1, 5], [6]),
            _req(1, 0, 1.0, [1, 5, 6], [2]),
            _req(0, 1, 1.0, [1, 5, 6, 7], []),
        ],
    )


def test_request_properties_and_dtype() -> None:
    r = _req(3, 2, 1.5, [1, 2, 3], [4, 5])
    assert (r.n_input, r.n_output) == (3, 2)
    assert r.input_tokens.dtype == np.int32 and r.output_tokens.dtype == np.int32
    assert r.tokens.tolist() == [1, 2, 3, 4, 5] and r.tokens.dtype == np.int32
    with pytest.raises(ValueError):
        r.input_tokens[0] = 7  # stored read-only


def test_request_does_not_freeze_callers_array() -> None:
    arr = np.array([1, 2], dtype=np.int32)
    Request(0, 0, 0.0, arr, arr)
    arr[0] = 9
    assert arr[0] == 9


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"input_tokens": np.array([], np.int32)}, "input_tokens must be non-empty"),
        ({"input_tokens": np.array([[1, 2]])}, "1-D"),
        ({"input_tokens": np.array([1, -3])}, "-3"),
        ({"output_tokens": np.array([1.5])}, "float64"),
        ({"ts": -1.0}, "-1.0"),
        ({"ts": float("nan")}, "nan"),
        ({"ts": float("inf")}, "inf"),
        ({"session_id": -2}, "-2"),
        ({"turn_id": True}, "True"),
    ],
)
def test_request_validation_names_bad_value(kwargs: dict[str, object], needle: str) -> None:
    base: dict[str, object] = {
        "session_id": 0,
        "turn_id": 0,
        "ts": 0.0,
        "input_tokens": np.array([1]),
        "output_tokens": np.array([2]),
    }
    with pytest.raises(ValueError, match=needle.replace(".", r"\.").replace("[", r"\[")):
        Request(**(base | kwargs))  # type: ignore[arg-type]


def test_trace_sorted_len_iter_sessions() -> None:
    t = _trace()
    assert [(r.ts, r.session_id, r.turn_id) for r in t] == [
        (0.0, 0, 0),
        (1.0, 0, 1),
        (1.0, 1, 0),
        (3.0, 1, 1),
    ]
    assert len(t) == 4 and t.n_sessions == 2
    assert len(t.head(2)) == 2 and t.head(0).requests == ()
    one = t.first_sessions(1)
    assert {r.session_id for r in one} == {0} and one.name == "t"
    with pytest.raises(ValueError, match="-1"):
        t.head(-1)


def test_trace_rejects_duplicates() -> None:
    with pytest.raises(ValueError, match=r"\(0, 0\)"):
        Trace("d", (_req(0, 0, 0.0, [1]), _req(0, 0, 1.0, [1])))


def test_stats() -> None:
    s = _trace().stats()
    assert s == {
        "requests": 4.0,
        "sessions": 2.0,
        "mean_input_tokens": 3.5,
        "max_input_tokens": 5.0,
        "mean_output_tokens": 0.75,
        "total_input_tokens": 14.0,
    }
    assert Trace("e", ()).stats()["mean_input_tokens"] == 0.0


def test_with_session_rate_keeps_internal_gaps() -> None:
    t = with_session_rate(_trace(), 0.5)
    by = {(r.session_id, r.turn_id): r.ts for r in t}
    assert by == {(0, 0): 0.0, (0, 1): 1.0, (1, 0): 2.0, (1, 1): 4.0}
    with pytest.raises(ValueError, match="sessions_per_second"):
        with_session_rate(_trace(), 0.0)


def _same(a: Trace, b: Trace) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert (x.session_id, x.turn_id, x.ts) == (y.session_id, y.turn_id, y.ts)
        assert np.array_equal(x.input_tokens, y.input_tokens)
        assert np.array_equal(x.output_tokens, y.output_tokens)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_jsonl_round_trip(tmp_path: Path, suffix: str) -> None:
    path = write_jsonl(_trace(), tmp_path / f"sub/x{suffix}")
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    back = read_jsonl(path)
    assert back.name == "x"
    _same(_trace(), back)
    if suffix == ".jsonl.gz":
        with gzip.open(path, "rt") as fh:
            first = json.loads(fh.readline())
        assert set(first) == {
            "session_id",
            "turn_id",
            "ts",
            "num_input_tokens",
            "num_output_tokens",
            "input_tokens",
            "output_tokens",
        }
        assert write_jsonl(_trace(), tmp_path / "y.jsonl.gz").read_bytes() == path.read_bytes()


GOOD = {
    "session_id": 0,
    "turn_id": 0,
    "ts": 0.0,
    "num_input_tokens": 2,
    "num_output_tokens": 1,
    "input_tokens": [1, 2],
    "output_tokens": [3],
}


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("{not json", "Expecting property name"),
        ("[1, 2]", "JSON object"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "ts"}), "missing key"),
        (json.dumps(GOOD | {"session_id": "a"}), "session_id"),
        (json.dumps(GOOD | {"ts": "1"}), "ts"),
        (json.dumps(GOOD | {"input_tokens": [1, "x"]}), "input_tokens"),
        (json.dumps(GOOD | {"input_tokens": [1, 2.5]}), "input_tokens"),
        (json.dumps(GOOD | {"input_tokens": "12"}), "input_tokens"),
        (json.dumps(GOOD | {"num_input_tokens": 3}), "num_input_tokens=3"),
        (json.dumps(GOOD | {"output_tokens": [-1], "num_output_tokens": 1}), "-1"),
        (json.dumps(GOOD | {"ts": -2.0}), "-2.0"),
        (json.dumps(GOOD | {"input_tokens": [], "num_input_tokens": 0}), "non-empty"),
        (json.dumps(GOOD), "duplicate (session_id, turn_id) (0, 0), first on line 1"),
    ],
)
@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_malformed_line_reports_file_and_line(
    tmp_path: Path, line: str, needle: str, suffix: str
) -> None:
    path = tmp_path / f"bad{suffix}"
    text = json.dumps(GOOD) + "\n\n" + line + "\n"
    if suffix.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    with pytest.raises(TraceFormatError) as info:
        read_jsonl(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}:3:"), msg
    assert needle in msg, msg


def test_missing_file_names_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl"):
        read_jsonl(missing)


def test_sessions_group_by_first_arrival_and_order_turns() -> None:
    sessions = _trace().sessions()
    assert list(sessions) == [0, 1]
    assert [(r.session_id, r.turn_id) for r in sessions[1]] == [(1, 0), (1, 1)]
    assert [r.n_input for r in sessions[0]] == [2, 4]
