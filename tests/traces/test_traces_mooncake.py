"""Mooncake-format traces: reading, block tokens, chaining, errors, the registry specs."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from marconi_ray.core.sim.oracle import oracle_hits
from marconi_ray.core.sim.reuse import reuse_stats
from marconi_ray.traces.mooncake import MooncakeTrace, build_mooncake
from marconi_ray.traces.mooncake_format import read_rows
from marconi_ray.traces.mooncake_tokens import block_tokens, output_tokens
from marconi_ray.traces.registry import load_trace
from marconi_ray.traces.trace import Request, TraceFormatError

B = 4  # block size of the hand-made files


def _row(ts: Any, n_in: Any, n_out: Any, ids: list[Any]) -> dict[str, Any]:
    return {"timestamp": ts, "input_length": n_in, "output_length": n_out, "hash_ids": ids}


def write_mooncake(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Write Mooncake JSON lines (gzip when the name ends in .gz)."""
    text = "".join(json.dumps(r) + "\n" for r in rows).encode()
    path.write_bytes(gzip.compress(text) if path.suffix == ".gz" else text)
    return path


# A conversation A -> B -> E, a fork D of A, an unrelated C, F too short to extend A, and H,
# whose block 50 was fixed by F before H extends F (F's output differs): block size 4.
ROWS = [
    _row(0, 10, 3, [1, 2, 3]),  # 0 A
    _row(5, 6, 2, [20, 21]),  # 1 C
    _row(10, 17, 2, [1, 2, 10, 11, 12]),  # 2 B extends A (17 >= 10 + 3)
    _row(20, 18, 1, [1, 2, 30, 31, 32]),  # 3 D extends A too: a fork
    _row(30, 21, 1, [1, 2, 10, 11, 40, 41]),  # 4 E extends B (longer match than A)
    _row(40, 10, 1, [1, 2, 50]),  # 5 F shares A's full blocks but 10 < 13
    _row(50, 16, 1, [1, 2, 50, 51]),  # 6 H: F and A are candidates; block 50 fits neither
]


@pytest.fixture()
def small(tmp_path: Path) -> Path:
    return write_mooncake(tmp_path / "small.jsonl", ROWS)


def _by_index(trace: MooncakeTrace) -> list[Request]:
    """Requests in file order (all timestamps differ here)."""
    return sorted(trace.requests, key=lambda r: r.ts)


def _check_block_invariant(reqs: list[Request], rows: list[dict[str, Any]]) -> None:
    seen: dict[int, np.ndarray] = {}
    for req, row in zip(reqs, rows, strict=True):
        for j, h in enumerate(row["hash_ids"]):
            part = req.input_tokens[j * B : (j + 1) * B]
            ref = seen.setdefault(h, part)
            n = min(len(part), len(ref))
            assert np.array_equal(part[:n], ref[:n]), (row, j)


def test_unchained_tokens_are_pure_functions(small: Path) -> None:
    t = build_mooncake(small, block_size=B, seed=7)
    assert isinstance(t, MooncakeTrace) and t.chains is None and t.name == "mooncake:small"
    reqs = _by_index(t)
    assert [(r.session_id, r.turn_id) for r in reqs] == [(i, 0) for i in range(len(ROWS))]
    for i, (req, row) in enumerate(zip(reqs, ROWS, strict=True)):
        assert req.ts == row["timestamp"] / 1000
        assert (req.n_input, req.n_output) == (row["input_length"], row["output_length"])
        want = block_tokens(row["hash_ids"], B, seed=7).reshape(-1)[: row["input_length"]]
        assert np.array_equal(req.input_tokens, want)
        assert np.array_equal(req.output_tokens, output_tokens(i, row["output_length"], seed=7))
        assert req.input_tokens.dtype == np.int32 and req.input_tokens.min() >= 0
        assert req.input_tokens.max() < 32000
    _check_block_invariant(reqs, ROWS)
    assert "chain_chained" not in t.stats()


def test_block_tokens_depend_on_id_and_seed_only() -> None:
    a = block_tokens([5, 7, 5], 512)
    assert a.shape == (3, 512) and a.dtype == np.int32
    assert np.array_equal(a[0], a[2]) and not np.array_equal(a[0], a[1])
    assert np.array_equal(block_tokens([7], 512)[0], a[1])
    assert not np.array_equal(block_tokens([5], 512, seed=1)[0], a[0])
    small = block_tokens(np.arange(1000), 64, vocab_size=10)
    assert set(np.unique(small).tolist()) == set(range(10))
    assert np.array_equal(output_tokens(3, 9), output_tokens(3, 9))
    assert not np.array_equal(output_tokens(3, 9), output_tokens(4, 9))
    with pytest.raises(ValueError, match="vocab_size"):
        block_tokens([1], 4, vocab_size=1)
    with pytest.raises(ValueError, match="-3"):
        block_tokens([-3], 4)


def test_deterministic_and_gzip_equals_plain(small: Path, tmp_path: Path) -> None:
    gz = write_mooncake(tmp_path / "small.jsonl.gz", ROWS)
    one, two = (
        build_mooncake(small, chained=True, block_size=B),
        build_mooncake(gz, chained=True, block_size=B),
    )
    assert one.chains == two.chains
    for a, b in zip(one, two, strict=True):
        assert (a.session_id, a.turn_id, a.ts) == (b.session_id, b.turn_id, b.ts)
        assert np.array_equal(a.tokens, b.tokens)


def test_chaining_rebuilds_conversations(small: Path) -> None:
    t = build_mooncake(small, chained=True, block_size=B)
    assert t.name == "mooncake-chained:small"
    assert t.chains is not None
    assert (t.chains.chained, t.chains.forks, t.chains.inexact, t.chains.too_short) == (3, 1, 1, 1)
    stats = t.stats()
    assert stats["chain_chained"] == 3.0 and stats["chain_inexact"] == 1.0
    a, c, b, d, e, f, h = _by_index(t)
    assert (a.session_id, a.turn_id) == (0, 0)
    assert (b.session_id, b.turn_id) == (0, 1) and (e.session_id, e.turn_id) == (0, 2)
    assert d.turn_id == 0 and d.session_id not in {0, c.session_id}  # the fork: own session
    assert f.turn_id == 0 and h.turn_id == 0 and t.n_sessions == 5
    for child, parent in ((b, a), (d, a), (e, b)):
        assert np.array_equal(child.input_tokens[: len(parent.tokens)], parent.tokens)
    assert not np.array_equal(h.input_tokens[: len(f.tokens)], f.tokens)  # inexact: left alone
    _check_block_invariant([a, c, b, d, e, f, h], ROWS)
    # B's block 11 (positions 12-15) starts with A's last output token, then its own tokens
    assert b.input_tokens[12] == a.output_tokens[2]
    assert np.array_equal(b.input_tokens[13:16], block_tokens([11], B)[0][1:4])


def test_chained_trace_sessions_extend_and_reuse_continues(small: Path) -> None:
    t = build_mooncake(small, chained=True, block_size=B)
    for reqs in t.sessions().values():
        for prev, nxt in itertools.pairwise(reqs):
            assert np.array_equal(nxt.input_tokens[: len(prev.tokens)], prev.tokens)
    chained, plain = reuse_stats(t.requests), reuse_stats(build_mooncake(small, block_size=B))
    assert chained.continuation_requests == 3 and plain.continuation_requests == 0
    assert chained.hit_tokens == sum(oracle_hits(t.requests))


def test_selection_and_retiming(small: Path) -> None:
    t = load_trace(f"mooncake-chained:{small}", n_sessions=2, sessions_per_second=2.0, block_size=B)
    assert isinstance(t, MooncakeTrace) and t.n_sessions == 2 and len(t) == 4
    assert t.chains is not None and t.chains.requests == len(ROWS)  # counts: the whole file
    assert sorted(r.ts for r in t if r.turn_id == 0) == [0.0, 0.5]
    u = load_trace(f"mooncake:{small}", block_size=B, seed=3, vocab_size=100)
    assert len(u) == len(ROWS) and int(max(r.input_tokens.max() for r in u)) < 100


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("[1, 2]", "expected a JSON object"),
        ("{not json", "Expecting"),
        ('{"timestamp": 0, "input_length": 3, "hash_ids": [1]}', "missing key.*output_length"),
        (json.dumps(_row(0, 5, 1, [1])), r"len\(hash_ids\)=1.*ceil\(5/4\)=2"),
        (json.dumps(_row(0, 3, 1, [1, 2])), r"len\(hash_ids\)=2"),
        (json.dumps(_row(0, -1, 1, [])), "input_length must be >= 1, got -1"),
        (json.dumps(_row(0, 0, 1, [])), "input_length must be >= 1, got 0"),
        (json.dumps(_row(0, 3, -2, [1])), "output_length must be >= 0, got -2"),
        (json.dumps(_row(-5, 3, 1, [1])), "timestamp must be finite and >= 0"),
        (json.dumps(_row(0, 3.5, 1, [1])), "input_length must be an int"),
        (json.dumps(_row(0, True, 1, [1])), "input_length must be an int"),
        (json.dumps(_row(0, 3, 1, [-4])), "hash_ids must hold ints >= 0, got -4"),
        (json.dumps(_row(0, 3, 1, ["a"])), "hash_ids must hold ints"),
        ('{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": 5}', "a list"),
        (json.dumps(_row(2, 3, 1, [9])), "timestamp 2 is before the previous request's 5"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path: Path, line: str, match: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(_row(5, 3, 1, [1])) + "\n\n" + line + "\n")
    with pytest.raises(TraceFormatError, match=rf"^{path}:3: .*{match}"):
        build_mooncake(path, block_size=B)


def test_missing_files_and_bad_specs(tmp_path: Path, isolated_env: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"absent\.jsonl"):
        load_trace(f"mooncake:{tmp_path / 'absent.jsonl'}")
    with pytest.raises(FileNotFoundError, match=r"mooncake/synthetic_trace\.jsonl"):
        load_trace("mooncake-chained")
    with pytest.raises(ValueError, match="no file after 'mooncake:'"):
        load_trace("mooncake:")
    small = write_mooncake(tmp_path / "s.jsonl", ROWS[:2])
    with pytest.raises(ValueError, match="gaps"):
        load_trace(f"mooncake:{small}", gaps="poisson")
    with pytest.raises(ValueError, match="block_size"):
        read_rows(small, block_size=0)
    with pytest.raises(ValueError, match="n_sessions"):
        build_mooncake(small, n_sessions=-1)


def test_file_order_ties_are_allowed(tmp_path: Path) -> None:
    path = write_mooncake(tmp_path / "ties.jsonl", [_row(3, 3, 1, [1]), _row(3, 3, 1, [1])])
    t = build_mooncake(path, block_size=B)
    assert len(t) == 2 and np.array_equal(t.requests[0].input_tokens, t.requests[1].input_tokens)


@pytest.mark.data("mooncake")
def test_shared_file(mooncake_file: Path) -> None:
    plain = load_trace("mooncake")
    assert len(plain) == 3993 and plain.n_sessions == 3993
    assert plain.stats()["total_input_tokens"] == 61_194_628
    rows = read_rows(mooncake_file)
    reqs = sorted(plain.requests, key=lambda r: r.session_id)  # session id = file index
    assert [r.n_input for r in reqs] == [row.input_length for row in rows]
    chained = load_trace("mooncake-chained")
    assert isinstance(chained, MooncakeTrace) and chained.chains is not None
    c = chained.chains
    assert (c.chained, c.forks, c.inexact, c.too_short) == (418, 143, 4, 1033)
    assert chained.n_sessions == 3718
    for session in chained.sessions().values():
        for prev, nxt in itertools.pairwise(session):
            assert np.array_equal(nxt.input_tokens[: len(prev.tokens)], prev.tokens)
    p, q = reuse_stats(plain.requests), reuse_stats(chained.requests)
    assert p.continuation_tokens == 0 and q.continuation_requests >= 400
    assert p.hit_tokens / p.input_tokens == pytest.approx(0.651, abs=0.001)
    assert q.fraction("continuation") == pytest.approx(0.262, abs=0.002)
