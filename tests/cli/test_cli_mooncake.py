"""`marconi-ray replay` and `trace stats` on Mooncake-format files (`mooncake[-chained]:FILE`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from marconi_ray.cli.main import main


def _row(ts: int, n_in: int, n_out: int, ids: list[int]) -> dict[str, Any]:
    return {"timestamp": ts, "input_length": n_in, "output_length": n_out, "hash_ids": ids}


# Block size 512: B extends A, D extends B, E shares A's first block but is too short.
ROWS = [
    _row(0, 700, 50, [1, 2]),  # A
    _row(400, 1300, 20, [1, 10, 11]),  # B: 1300 >= 700 + 50
    _row(900, 300, 10, [20]),  # C
    _row(1500, 1800, 30, [1, 10, 30, 31]),  # D: 1800 >= 1300 + 20
    _row(2100, 600, 5, [1, 40]),  # E: 600 < 750
]


@pytest.fixture()
def moon(tmp_path: Path) -> Path:
    path = tmp_path / "moon.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


@pytest.mark.parametrize("kind", ["mooncake", "mooncake-chained"])
def test_replay_on_a_mooncake_file(
    tmp_path: Path, moon: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["replay", "--trace", f"{kind}:{moon}", "--systems", "marconi,marconi+,sglang+"]
    assert main([*argv, "--cache-bytes", "1e9", "--out", str(out)]) == 0
    records = json.loads((out / "results.json").read_text())
    assert {r["system"] for r in records} == {"marconi", "marconi+", "sglang+", "oracle"}
    for r in records:
        assert 0.0 <= r["token_hit_rate"] <= 1.0
    oracle = next(r for r in records if r["system"] == "oracle")
    trace = json.loads((out / "run.json").read_text())["trace"]
    assert trace["name"] == f"{kind}:moon" and trace["requests"] == len(ROWS)
    if kind == "mooncake-chained":
        assert trace["chain_chained"] == 2 and trace["chain_too_short"] == 1
        assert trace["sessions"] == 3 and oracle["token_hit_rate"] > 0.5
    else:
        assert "chain_chained" not in trace and trace["sessions"] == len(ROWS)
    assert f"trace {kind}:moon: 5 requests" in capsys.readouterr().out


def test_trace_stats_prints_chains_and_reuse(
    moon: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["trace", "stats", f"mooncake-chained:{moon}"]) == 0
    lines = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines())
    assert lines["chain_chained"] == "2" and lines["reuse_continuation_requests"] == "2"
    assert lines["reuse_inside_input_requests"] == "1"  # E: inside A's first block
    fractions = [float(lines[f"reuse_{k}_fraction"]) for k in ("continuation", "branch")]
    assert sum(fractions) + float(lines["reuse_inside_input_fraction"]) == pytest.approx(1, 1e-3)


@pytest.mark.parametrize(
    ("spec", "named"),
    [("mooncake:", "no file after 'mooncake:'"), ("mooncake:/no/such.jsonl", "/no/such.jsonl")],
)
def test_bad_mooncake_specs_exit_2(
    spec: str, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["trace", "stats", spec]) == 2
    err = capsys.readouterr().err
    assert err.startswith("marconi-ray: error:") and named in err


def test_bad_mooncake_line_names_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(_row(5, 700, 1, [1])) + "\n")
    assert main(["trace", "stats", f"mooncake:{bad}"]) == 2
    assert f"{bad}:2: len(hash_ids)=1" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["replay"], ["trace", "build"], ["trace", "stats"]])
def test_help_explains_mooncake_specs(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*argv, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "mooncake:FILE / mooncake-chained:FILE" in text
    assert "mooncake/synthetic_trace.jsonl" in text
