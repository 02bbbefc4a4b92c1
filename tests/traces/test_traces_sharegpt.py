"""ShareGPT builders: the published artifact-mode numbers, prefixes, arrival times."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from marconi_ray.traces.sharegpt import build_sharegpt
from marconi_ray.traces.tokenizer import Tokenizer
from marconi_ray.traces.trace import Trace


def _assert_prefix_extensions(trace: Trace) -> None:
    for reqs in trace.sessions().values():
        assert [r.turn_id for r in reqs] == list(range(len(reqs)))
        for a, b in itertools.pairwise(reqs):
            assert b.n_input > a.n_input + a.n_output
            assert np.array_equal(b.input_tokens[: a.n_input + a.n_output], a.tokens)


@pytest.mark.data("sharegpt", "llama2_tokenizer")
def test_artifact_mode_matches_published_numbers(sharegpt100: Trace) -> None:
    s = sharegpt100.stats()
    assert s["requests"] == 1238
    assert round(s["mean_input_tokens"]) == 1162
    assert s["max_input_tokens"] == 5671
    assert s["sessions"] == 100
    assert s["total_input_tokens"] == 1_438_877


@pytest.mark.data("sharegpt", "llama2_tokenizer")
def test_artifact_mode_prefix_extensions(sharegpt100: Trace) -> None:
    _assert_prefix_extensions(sharegpt100)
    assert all(r.input_tokens[0] == 1 for r in sharegpt100)  # BOS


@pytest.mark.data("sharegpt", "llama2_tokenizer")
def test_artifact_mode_arrival_times(
    sharegpt100: Trace, sharegpt_records: list[dict[str, object]]
) -> None:
    for sid, reqs in sharegpt100.sessions().items():
        conv = sharegpt_records[sid]["conversations"]
        assert isinstance(conv, list)
        assert reqs[0].ts == pytest.approx(sid / 1.0)
        for k in range(1, len(reqs)):
            delay = conv[2 * k]["value"].count(" ") / 1.5
            assert reqs[k].ts == pytest.approx(reqs[k - 1].ts + delay)


@pytest.mark.data("sharegpt", "llama2_tokenizer")
def test_artifact_mode_rate_and_max_tokens(llama: Tokenizer) -> None:
    t = build_sharegpt(n_sessions=3, sessions_per_second=4.0, tokenizer=llama)
    firsts = sorted(r.ts for r in t if r.turn_id == 0)
    assert firsts == pytest.approx([0.0, 0.25, 0.5])
    capped = build_sharegpt(n_sessions=3, max_tokens=1500, tokenizer=llama)
    assert 0 < len(capped) < len(t) and max(r.n_input for r in capped) <= 1500


@pytest.mark.data("sharegpt_head4000", "llama2_tokenizer")
def test_rejoined_mode_basic(rejoined: Trace) -> None:
    sessions = rejoined.sessions()
    assert len(sessions) == 40 and rejoined.name == "sharegpt-rejoined"
    assert all(len(reqs) >= 2 for reqs in sessions.values())
    assert max(r.n_input for r in rejoined) <= 32768
    _assert_prefix_extensions(rejoined)
    starts = [sessions[i][0].ts for i in range(40)]
    assert starts[0] == 0.0 and starts == sorted(starts) and len(set(starts)) == 40


def _write(path: Path, records: list[dict[str, object]]) -> Path:
    path.write_text(json.dumps(records))
    return path


def test_positional_pairing_on_synthetic_file(tmp_path: Path, char_tok: Tokenizer) -> None:
    msgs = [
        {"from": "gpt", "value": "a b"},
        {"from": "human", "value": "c d e"},
        {"from": "gpt", "value": "f x y"},
        {"from": "human", "value": "g  h"},
        {"from": "gpt", "value": "i"},
    ]
    path = _write(tmp_path / "s.json", [{"id": "x_0", "conversations": msgs}])
    tok = char_tok
    t = build_sharegpt(path, n_sessions=1, tokenizer=tok)
    enc = [tok.encode(json.dumps(m), True) for m in msgs]
    assert len(t) == 2  # (gpt, human), (gpt, human); the trailing gpt is dropped
    assert t.requests[0].input_tokens.tolist() == enc[0]
    assert t.requests[0].output_tokens.tolist() == enc[1]
    assert t.requests[1].input_tokens.tolist() == enc[0] + enc[1] + enc[2]
    assert t.requests[1].ts == pytest.approx(2 / 1.5)  # spaces in conversations[2]


def test_rejoined_groups_segments_and_pairs_by_role(tmp_path: Path, char_tok: Tokenizer) -> None:
    recs: list[dict[str, object]] = [
        {
            "id": "a_0",
            "conversations": [
                {"from": "human", "value": "q1"},
                {"from": "gpt", "value": "r1"},
                {"from": "human", "value": "q2"},
            ],
        },
        {
            "id": "a_1",
            "conversations": [
                {"from": "gpt", "value": "r2"},
                {"from": "system", "value": "s"},
                {"from": "human", "value": "q3 x"},
                {"from": "gpt", "value": "r3"},
            ],
        },
        {"id": "b_0", "conversations": []},
        {
            "id": "c_0",
            "conversations": [{"from": "human", "value": "only"}, {"from": "gpt", "value": "one"}],
        },
    ]
    path = _write(tmp_path / "r.json", recs)
    t = build_sharegpt(path, n_sessions=1, mode="rejoined", tokenizer=char_tok)
    assert len(t) == 3 and t.n_sessions == 1
    _assert_prefix_extensions(t)
    with pytest.raises(ValueError, match="only 1 rejoined"):
        build_sharegpt(path, n_sessions=2, mode="rejoined", tokenizer=char_tok)


def test_bad_arguments(tmp_path: Path, char_tok: Tokenizer) -> None:
    path = _write(tmp_path / "s.json", [])
    with pytest.raises(ValueError, match="'nope'"):
        build_sharegpt(path, mode="nope", tokenizer=char_tok)
    with pytest.raises(ValueError, match="n_sessions=1"):
        build_sharegpt(path, n_sessions=1, tokenizer=char_tok)
    with pytest.raises(ValueError, match="sessions_per_second"):
        build_sharegpt(path, sessions_per_second=0, tokenizer=char_tok)
    with pytest.raises(FileNotFoundError, match=r"missing\.json"):
        build_sharegpt(tmp_path / "missing.json", tokenizer=char_tok)
