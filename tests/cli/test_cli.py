"""End-to-end tests of the `marconi-ray` CLI, run in-process on the packaged sample trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from marconi_ray.cli import values
from marconi_ray.cli.main import main
from marconi_ray.core.cache.tuner import default_grid

SYSTEMS = ("vanilla", "vllm+", "sglang+", "marconi")
SIZES = (200_000_000, 1_000_000_000)
REQUIRED_KEYS = {
    "system",
    "cache_bytes",
    "token_hit_rate",
    "request_hit_rate",
    "flops_saved",
    "peak_bytes",
    "states_admitted",
    "evictions",
    "alpha",
    "wall_s",
}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _replay(out: Path, *extra: str, trace: str = "sample", jobs: int = 1) -> int:
    return main(
        [
            "replay",
            "--trace",
            trace,
            "--cache-bytes",
            "2e8,1e9",
            "--systems",
            ",".join(SYSTEMS),
            "--jobs",
            str(jobs),
            "--out",
            str(out),
            *extra,
        ]
    )


def _results(out: Path) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = json.loads((out / "results.json").read_text())
    return records


def _numbers(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records without their timings (which differ from run to run)."""
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in records]


def test_replay_writes_results_plot_and_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert _replay(out) == 0
    records = _results(out)
    runs = [r for r in records if r["system"] != "oracle"]
    oracle = [r for r in records if r["system"] == "oracle"]
    assert len(oracle) == 1
    assert {(r["system"], r["cache_bytes"]) for r in runs} == {
        (s, c) for s in SYSTEMS for c in SIZES
    }
    assert len(runs) == len(SYSTEMS) * len(SIZES)
    by_key = {(r["system"], r["cache_bytes"]): r for r in runs}
    for r in runs:
        assert set(r) >= REQUIRED_KEYS
        assert 0 <= r["peak_bytes"] <= r["cache_bytes"]
        assert 0.0 <= r["token_hit_rate"] <= 1.0
        assert 0.0 <= r["request_hit_rate"] <= 1.0
        assert oracle[0]["token_hit_rate"] >= r["token_hit_rate"]
    for size in SIZES:
        assert (
            by_key[("marconi", size)]["token_hit_rate"] >= by_key[("vllm+", size)]["token_hit_rate"]
        )
        assert by_key[("vanilla", size)]["token_hit_rate"] == 0.0

    png = out / "hit_rate_vs_cache.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    run = json.loads((out / "run.json").read_text())
    assert run["argv"][:3] == ["replay", "--trace", "sample"]
    assert run["options"]["cache_bytes"] == list(SIZES)
    assert run["trace"]["requests"] == 257

    stdout = capsys.readouterr().out
    assert "token hit %" in stdout and "peak/capacity" in stdout
    for name in (*SYSTEMS, "oracle"):
        assert f"\n{name} " in stdout


def test_parallel_jobs_give_the_serial_numbers(tmp_path: Path) -> None:
    assert _replay(tmp_path / "serial", jobs=1) == 0
    assert _replay(tmp_path / "parallel", jobs=2) == 0
    assert _numbers(_results(tmp_path / "parallel")) == _numbers(_results(tmp_path / "serial"))


def _bad_jsonl(tmp_path: Path) -> Path:
    good = {
        "session_id": 0,
        "turn_id": 0,
        "ts": 0.0,
        "num_input_tokens": 2,
        "num_output_tokens": 1,
        "input_tokens": [1, 2],
        "output_tokens": [3],
    }
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(good) + "\n" + '{"session_id": 1, oops\n')
    return path


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--systems", "vanilla,nosuch"], "nosuch"),
        (["--cache-bytes", "0"], "'0'"),
        (["--cache-bytes", "-1"], "'-1'"),
        (["--cache-bytes", "abc"], "abc"),
        (["--cache-bytes", "1e9,0"], "'0'"),
        (["--alpha-grid", ""], "alpha grid"),
        (["--alpha-grid", ","], "alpha grid"),
        (["--alpha", "-0.5"], "-0.5"),
        (["--model", "no-such-model"], "no-such-model"),
        (["--recency", "sometimes"], "sometimes"),
        (["--efficiency", "magic"], "magic"),
    ],
)
def test_bad_option_exits_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], named: str
) -> None:
    out = tmp_path / "out"
    assert _replay(out, *extra) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("marconi-ray: error:")
    assert "\n" not in err
    assert named in err
    assert not out.exists()


def test_missing_trace_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere.jsonl"
    out = tmp_path / "out"
    assert _replay(out, trace=str(missing)) == 2
    err = capsys.readouterr().err
    assert err.startswith("marconi-ray: error:") and str(missing) in err
    assert not out.exists()


def test_malformed_trace_line_names_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = _bad_jsonl(tmp_path)
    out = tmp_path / "out"
    assert _replay(out, trace=str(bad)) == 2
    err = capsys.readouterr().err
    assert err.startswith("marconi-ray: error:")
    assert f"{bad}:2" in err
    assert not out.exists()
    assert main(["trace", "stats", str(bad)]) == 2
    assert f"{bad}:2" in capsys.readouterr().err


def test_trace_build_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    exported = tmp_path / "traces" / "sample_copy.jsonl"
    assert main(["trace", "build", "--trace", "sample", "--out", str(exported)]) == 0
    assert "requests: 257" in capsys.readouterr().out
    assert exported.is_file()

    assert main(["trace", "stats", str(exported)]) == 0
    stats = capsys.readouterr().out
    assert "requests: 257" in stats and "sessions: 20" in stats

    assert _replay(tmp_path / "from_sample") == 0
    assert _replay(tmp_path / "from_file", trace=str(exported)) == 0
    assert _numbers(_results(tmp_path / "from_file")) == _numbers(
        _results(tmp_path / "from_sample")
    )


def test_trace_build_rejects_bad_out_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sample.txt"
    assert main(["trace", "build", "--trace", "sample", "--out", str(out)]) == 2
    assert str(out) in capsys.readouterr().err
    assert not out.exists()


REPLAY_OPTIONS = (
    "--trace",
    "--cache-bytes",
    "--systems",
    "--sessions",
    "--sessions-per-second",
    "--model",
    "--alpha",
    "--recency",
    "--objective",
    "--multiplier",
    "--alpha-grid",
    "--retune-every",
    "--jobs",
    "--check",
    "--data-dir",
    "--tokenizer",
    "--out",
)
SOURCE_OPTIONS = ("--sessions", "--sessions-per-second", "--data-dir", "--tokenizer")


@pytest.mark.parametrize(
    ("argv", "mentions"),
    [
        ([], ("replay", "trace", "--version")),
        (["replay"], REPLAY_OPTIONS),
        (["trace"], ("build", "stats")),
        (["trace", "build"], ("--trace", *SOURCE_OPTIONS, "--out")),
        (["trace", "stats"], ("FILE_OR_NAME", *SOURCE_OPTIONS)),
    ],
)
def test_help_exits_0_and_mentions_every_option(
    capsys: pytest.CaptureFixture[str], argv: list[str], mentions: tuple[str, ...]
) -> None:
    assert main([*argv, "--help"]) == 0
    text = capsys.readouterr().out
    for option in mentions:
        assert option in text, option


def test_alpha_grid_forms() -> None:
    assert values.alpha_grid("0:2:0.1") == default_grid()
    assert values.alpha_grid("0:1:0.25") == (0.0, 0.25, 0.5, 0.75, 1.0)
    assert values.alpha_grid("0.5, 1,2") == (0.5, 1.0, 2.0)
    assert values.alpha("auto") is None
    assert values.cache_sizes("1e9,2.5e9") == (1_000_000_000, 2_500_000_000)


def test_explain_writes_every_decision_and_a_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code = main(
        [
            "replay", "--trace", "sample", "--cache-bytes", "2e8", "--systems", "marconi",
            "--alpha", "1.0", "--efficiency", "uniform", "--explain", "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    lines = (out / "explain.jsonl").read_text().splitlines()
    (record,) = json.loads((out / "results.json").read_text())[:1]
    assert record["efficiency"] == "uniform" and len(lines) == record["evictions"] > 0
    first = json.loads(lines[0])
    assert {"recency", "efficiency", "score", "lru_rank", "leaf", "reason"} <= set(first)
    assert (out / "explain.png").read_bytes().startswith(PNG_MAGIC)
    assert f"explained {len(lines)} eviction decisions" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("systems", "sizes", "named"),
    [("marconi,sglang+", "2e8", "one system"), ("marconi", "2e8,1e9", "one system"),
     ("sglang+", "2e8", "flop_aware")],
)  # fmt: skip
def test_explain_refuses_what_it_cannot_explain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], systems: str, sizes: str, named: str
) -> None:
    out = tmp_path / "out"
    argv = ["replay", "--trace", "sample", "--cache-bytes", sizes, "--systems", systems]
    assert main([*argv, "--explain", "--out", str(out)]) == 2
    assert named in capsys.readouterr().err and not out.exists()


def test_replay_with_a_host_tier_reports_each_tier_and_the_clock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--host-bytes 0,8e8`: each device size runs alone and with 0.8 GB of host memory;
    the two-tier runs hit at least as much, some of it on the host, and the clock's
    TTFT saved follows; the table grows the tier columns."""
    out = tmp_path / "tiers"
    args = ("--host-bytes", "0,8e8", "--host-gbps", "25", "--prefill-tflops", "300", "--check")
    argv = ["replay", "--trace", "sample", "--cache-bytes", "2e8", "--systems", "marconi"]
    assert main([*argv, "--jobs", "1", "--out", str(out), *args]) == 0
    by_host = {r["host_bytes"]: r for r in _results(out) if r["system"] != "oracle"}
    alone, tiered = by_host[0], by_host[800_000_000]
    assert alone["host_hit_tokens"] == alone["demotions"] == 0
    assert tiered["demotions"] > 0 and tiered["host_hit_tokens"] > 0
    assert tiered["token_hit_rate"] >= alone["token_hit_rate"]
    assert tiered["ttft_saved_fraction"] > alone["ttft_saved_fraction"] > 0
    assert tiered["host_peak_bytes"] <= 800_000_000 and tiered["peak_bytes"] <= 200_000_000
    stdout = capsys.readouterr().out
    assert "host hit %" in stdout and "TTFT saved %" in stdout
    run = json.loads((out / "run.json").read_text())
    assert run["options"]["host_bytes"] == [0, 800_000_000]
    assert run["options"]["host_gbps"] == 25.0


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--host-bytes", "-1", "host size '-1' must be >= 0 bytes"),
        ("--host-gbps", "0", "'0' must be > 0"),
        ("--placement", "mru", "invalid choice: 'mru'"),
    ],
)
def test_bad_tier_options_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, message: str
) -> None:
    assert _replay(tmp_path / "bad", f"{option}={value}") == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
