"""SWE-bench agent builder: prefix extensions, token means, Marconi's observation drop."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from marconi_ray.traces.swebench import build_swebench
from marconi_ray.traces.tokenizer import Tokenizer
from marconi_ray.traces.trace import Request, Trace


def _extends(a: Request, b: Request) -> bool:
    n = a.n_input + a.n_output
    return b.n_input > n and np.array_equal(b.input_tokens[:n], a.tokens)


@pytest.mark.data("swebench", "llama2_tokenizer")
def test_real_trace_prefix_extension_and_mean(swe: Trace) -> None:
    s = swe.stats()
    assert s["sessions"] == 50
    assert 10_000 <= s["mean_input_tokens"] <= 20_000
    assert s["max_input_tokens"] <= 32768
    for reqs in swe.sessions().values():
        assert all(_extends(a, b) for a, b in itertools.pairwise(reqs))


@pytest.mark.data("swebench", "llama2_tokenizer")
def test_real_trace_drop_mode_breaks_prefixes(swe: Trace, swe_drop: Trace) -> None:
    full = swe.sessions()
    for sid, reqs in swe_drop.sessions().items():
        assert len(reqs) > 7
        for k, (a, b) in enumerate(itertools.pairwise(reqs), start=1):
            assert _extends(a, b) == (k < 6), (sid, k)
        for k in range(min(len(reqs), len(full[sid]))):
            assert reqs[k].n_input <= full[sid][k].n_input
            assert np.array_equal(reqs[k].output_tokens, full[sid][k].output_tokens)


@pytest.mark.data("swebench", "llama2_tokenizer")
def test_real_trace_arrivals(swe: Trace, llama: Tokenizer) -> None:
    starts = [reqs[0].ts for reqs in swe.sessions().values()]
    assert starts[0] == 0.0 and starts == sorted(starts)
    gaps = [b.ts - a.ts for reqs in swe.sessions().values() for a, b in itertools.pairwise(reqs)]
    assert all(g >= 0 for g in gaps)
    assert 3.0 < float(np.mean(gaps)) < 12.0  # recorded gaps average ~7 s
    again = build_swebench(n_sessions=3, gaps="poisson", tokenizer=llama, seed=5, max_turns=4)
    assert all(len(reqs) == 4 for reqs in again.sessions().values())
    same = build_swebench(n_sessions=3, gaps="poisson", tokenizer=llama, seed=5, max_turns=4)
    assert [r.ts for r in again] == [r.ts for r in same]


def _traj(n_rounds: int) -> dict[str, object]:
    msgs: list[dict[str, object]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "task"},
    ]
    for k in range(n_rounds):
        msgs.append(
            {
                "role": "assistant",
                "content": f"act{k}",
                "extra": {"response": {"created": 100 + 3 * k}},
            }
        )
        msgs.append({"role": "user", "content": f"obs{k}"})
    return {"instance_id": "x", "messages": msgs}


@pytest.fixture()
def traj_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "trajs"
    folder.mkdir()
    for name, rounds in (("b.traj.json", 9), ("a.traj.json", 3)):
        (folder / name).write_text(json.dumps(_traj(rounds)))
    return tmp_path


def _contents(tok: Tokenizer, r: Request) -> list[str]:
    """Decode a CharTokenizer input back into the message contents it holds."""
    text = "".join(chr(t - 2) if t != 1 else "\0" for t in r.input_tokens.tolist())
    return [json.loads(part)["content"] for part in text.split("\0") if part]


def test_synthetic_recorded_gaps_and_order(traj_dir: Path, char_tok: Tokenizer) -> None:
    t = build_swebench(traj_dir, n_sessions=2, tokenizer=char_tok, sessions_per_second=100.0)
    sess = t.sessions()
    assert [len(sess[0]), len(sess[1])] == [3, 9]  # files sorted by name: a first
    assert [r.ts for r in sess[0]] == pytest.approx([0.0, 3.0, 6.0])
    assert _contents(char_tok, sess[0][2]) == ["sys", "task", "act0", "obs0", "act1", "obs1"]
    capped = build_swebench(traj_dir, n_sessions=2, tokenizer=char_tok, max_turns=2)
    assert len(capped) == 4


def test_synthetic_drop_keeps_task_and_last_five_observations(
    traj_dir: Path, char_tok: Tokenizer
) -> None:
    t = build_swebench(traj_dir, n_sessions=2, tokenizer=char_tok, drop_old_observations=True)
    reqs = t.sessions()[1]
    assert _contents(char_tok, reqs[5]) == [
        "sys",
        "task",
        "act0",
        "obs0",
        "act1",
        "obs1",
        "act2",
        "obs2",
        "act3",
        "obs3",
        "act4",
        "obs4",
    ]
    last = _contents(char_tok, reqs[8])
    assert last == [
        "sys",
        "task",
        "act0",
        "act1",
        "act2",
        "act3",
        "obs3",
        "act4",
        "obs4",
        "act5",
        "obs5",
        "act6",
        "obs6",
        "act7",
        "obs7",
    ]
    assert sum(c.startswith("obs") for c in last) == 5


def test_bad_arguments(traj_dir: Path, tmp_path: Path, char_tok: Tokenizer) -> None:
    with pytest.raises(ValueError, match="'sometimes'"):
        build_swebench(traj_dir, gaps="sometimes", tokenizer=char_tok)
    with pytest.raises(ValueError, match="n_sessions=3"):
        build_swebench(traj_dir, n_sessions=3, tokenizer=char_tok)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        build_swebench(tmp_path / "nowhere", tokenizer=char_tok)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "z.traj.json").write_text("{")
    with pytest.raises(ValueError, match=r"z\.traj\.json"):
        build_swebench(bad, n_sessions=1, tokenizer=char_tok)
