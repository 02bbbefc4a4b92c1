"""`run_load` end to end against the fake server, the files it writes, and the CLI."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest

from loadgen import cli
from loadgen.config import LoadConfig
from loadgen.output import write_run
from loadgen.runner import run_load

SUMMARY_KEYS = (
    "requests", "completed", "failed", "errors", "ttft_ms", "tpot_ms", "itl_ms", "e2el_ms",
    "request_throughput", "output_throughput", "total_token_throughput", "goodput",
    "goodput_fraction", "ttft_by_turn_ms", "cached_tokens", "prompt_tokens",
    "client_token_hit_rate", "non_extending_turns", "server",
)  # fmt: skip


def _config(url: str, **kw) -> LoadConfig:
    base = LoadConfig(
        url=url,
        trace="sample",
        sessions=3,
        session_rate=50.0,
        vocab_size=264,
        max_output=4,
        max_prompt=600,
        slo_ttft_ms=10_000.0,
    )
    return replace(base, **kw)


def test_run_load_end_to_end_writes_everything(fake, tmp_path):
    url, state = fake
    n_before = len(state.bodies)
    result = run_load(_config(url, warmup=1), progress=False)
    s = result.summary
    assert all(k in s for k in SUMMARY_KEYS), sorted(set(SUMMARY_KEYS) - set(s))
    assert s["failed"] == 0 and s["sessions"] == 3 and s["model"] == "fake-model"
    assert s["completed"] == len(result.records) - 1 and s["warmup_requests"] == 1
    assert len(result.records) == len(state.bodies) - n_before >= 6
    assert {r.session_id for r in result.records} == {0, 1, 2}
    for r in result.records:
        assert r.error is None and r.output_ids == [100, 101, 102, 103] and r.output_tokens == 4
        assert r.prompt_tokens == len(r.input_ids) <= 600
        assert all(7 <= t < 263 or t >= 100 for t in r.input_ids)
    by_session: dict[int, list] = {}
    for r in result.records:
        by_session.setdefault(r.session_id, []).append(r)
    for recs in by_session.values():  # live history: each prompt extends the last + reply
        for a, b in itertools.pairwise(recs):
            assert b.input_ids[: len(a.input_ids) + 4] == a.input_ids + a.output_ids
            assert b.cached_tokens >= len(a.input_ids) + 3
    body = state.bodies[-1]
    assert body["ignore_eos"] and body["stream"] and body["temperature"] == 0
    assert body["model"] == "fake-model" and body["max_tokens"] == 4
    assert s["client_token_hit_rate"] > 0.3 and s["goodput_fraction"] == 1.0
    assert s["server"]["token_hit_rate"] is not None and s["server"]["alpha"] == {"r0": 0.5}

    write_run(result, tmp_path)
    lines = (tmp_path / "requests.jsonl").read_text().splitlines()
    assert len(lines) == len(result.records)
    first = json.loads(lines[0])
    assert {"tpot_ms", "input_ids", "output_ids", "itl_ms", "error"} <= set(first)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["completed"] == s["completed"] and "server_before" in summary
    for png in ("ttft_cdf.png", "ttft_by_turn.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trace_history_and_bounds(fake):
    url, state = fake
    result = run_load(
        _config(url, history="trace", session_rate=None, concurrency=2, max_requests=4),
        progress=False,
    )
    assert len(result.records) == 4 and result.summary["failed"] == 0
    sent = state.bodies[-4:]
    assert all(b["max_tokens"] == 4 for b in sent)


def test_failed_turn_ends_its_session(fake):
    url, state = fake
    state.fail_over = 300
    try:
        result = run_load(_config(url, sessions=2, max_prompt=2000), progress=False)
    finally:
        state.fail_over = None
    s = result.summary
    assert s["failed"] == s["sessions_failed"] == 2 and s["errors"] == {"http_5xx": 2}
    for sid in (0, 1):
        recs = [r for r in result.records if r.session_id == sid]
        assert recs[-1].error == "http_5xx" and all(r.error is None for r in recs[:-1])


def test_run_against_nothing_finishes_with_connect_errors(tmp_path):
    result = run_load(_config("http://127.0.0.1:1"), progress=False)
    assert result.summary["errors"] == {"connect": 3} and result.server_before is None
    write_run(result, tmp_path)
    assert (tmp_path / "ttft_cdf.png").is_file()


def test_max_seconds_stops_the_run(fake):
    url, _ = fake
    result = run_load(
        _config(url, sessions=20, session_rate=1.0, max_seconds=0.5, think="fixed:5"),
        progress=False,
    )
    assert result.wall_s < 3.0 and 1 <= len(result.records) <= 2


def test_cli_run(fake, tmp_path, capsys):
    url, _ = fake
    code = cli.main(
        ["run", "--url", url, "--trace", "sample", "--sessions", "2", "--session-rate", "20",
         "--vocab-size", "264", "--max-output", "3", "--max-prompt", "400", "--no-progress",
         "--out", str(tmp_path)]
    )  # fmt: skip
    assert code == 0 and (tmp_path / "summary.json").is_file()
    assert "ttft_ms" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "word"),
    [
        (["--url", "http://10.1.2.3:8000"], "'10.1.2.3'"),
        (["--trace", "no-such-trace"], "'no-such-trace'"),
        (["--think", "later"], "'later'"),
        (["--sessions", "0"], "sessions"),
        (["--vocab-size", "4"], "vocab_size"),
    ],
)
def test_cli_bad_values_exit_2_naming_them(tmp_path, capsys, args, word):
    base = ["run", "--url", "http://127.0.0.1:1", "--trace", "sample", "--out", str(tmp_path)]
    assert cli.main([*base, *args]) == 2
    err = capsys.readouterr().err
    assert word in err and len(err.strip().splitlines()) == 1


def test_cli_help_lists_every_option(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    opts = "--session-rate --burstiness --think --history --prompt-mode --vocab-size"
    opts += " --max-seconds --slo-tpot-ms --allow-host --warmup --concurrency --seed"
    assert all(opt in out for opt in opts.split())


def test_cli_skips_a_missing_subcommand_module():
    parser = cli.build_parser(["run", "no_such_subcommand"])
    assert parser.parse_args(["run", "--url", "u", "--out", "o"]).command == "run"


def test_trace_arrivals_follow_the_trace_clock(fake, tmp_path):
    """`--arrivals trace`: each session starts at its first request's time in the trace
    (an Azure CSV here), scaled by `time_scale`; the session rate is unused."""
    url, _ = fake
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    rows += [f"2023-11-16 18:15:{46 + 2 * i:02d}.000,{5 + i},2" for i in range(3)]
    path = tmp_path / "azure.csv"
    path.write_text("\n".join(rows) + "\n")
    for scale in (0.25, 0.5):
        cfg = _config(
            url, trace=f"azure:{path}", arrivals="trace", time_scale=scale, session_rate=None
        )
        result = run_load(cfg, progress=False)
        starts = sorted(r.start_s for r in result.records)
        assert result.summary["failed"] == 0 and len(starts) == 3
        for i, at in enumerate(starts):
            assert at == pytest.approx(2 * i * scale, abs=0.15)


def test_bad_arrivals_are_named(tmp_path, capsys):
    base = ["run", "--url", "http://127.0.0.1:1", "--trace", "sample", "--out", str(tmp_path)]
    assert cli.main([*base, "--arrivals", "clock"]) == 2
    assert "'clock'" in capsys.readouterr().err
    assert cli.main([*base, "--arrivals", "trace", "--time-scale", "0"]) == 2
    assert "time_scale" in capsys.readouterr().err
