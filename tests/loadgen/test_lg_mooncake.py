"""`run_load` and `marconi-loadgen run` on Mooncake traces (`mooncake[-chained]:FILE`)."""

from __future__ import annotations

import itertools
import json

from loadgen import cli
from loadgen.config import LoadConfig
from loadgen.runner import run_load
from loadgen.sessions import map_ids
from marconi_ray.traces.registry import load_trace

ROWS = [  # block size 512: B extends A (700 + 50 <= 1300); C stands alone
    {"timestamp": 0, "input_length": 700, "output_length": 50, "hash_ids": [1, 2]},
    {"timestamp": 300, "input_length": 200, "output_length": 10, "hash_ids": [20]},
    {"timestamp": 400, "input_length": 1300, "output_length": 20, "hash_ids": [1, 10, 11]},
]


def _file(tmp_path):
    path = tmp_path / "moon.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def test_chained_mooncake_sessions_send_token_ids(fake, tmp_path):
    url, _ = fake
    spec = f"mooncake-chained:{_file(tmp_path)}"
    config = LoadConfig(
        url=url, trace=spec, sessions=2, session_rate=50.0, vocab_size=264, max_output=4,
        max_prompt=4000, history="trace",
    )  # fmt: skip
    result = run_load(config, progress=False)
    s = result.summary
    assert s["failed"] == 0 and s["sessions"] == 2 and s["non_extending_turns"] == 0
    trace = load_trace(spec)
    want = {(r.session_id, r.turn_id): map_ids(r.input_tokens.tolist(), 264) for r in trace}
    assert {(r.session_id, r.turn): r.input_ids for r in result.records} == want
    _, b = sorted((r for r in result.records if r.session_id == 0), key=lambda r: r.turn)
    assert b.cached_tokens >= 700 and len(b.input_ids) == 1300


def test_cli_run_on_mooncake(fake, tmp_path, capsys):
    url, _ = fake
    code = cli.main(
        ["run", "--url", url, "--trace", f"mooncake:{_file(tmp_path)}", "--sessions", "3",
         "--session-rate", "20", "--vocab-size", "264", "--max-output", "3",
         "--max-prompt", "4000", "--no-progress", "--out", str(tmp_path / "out")]
    )  # fmt: skip
    assert code == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["sessions"] == 3 and summary["failed"] == 0
    assert "ttft_ms" in capsys.readouterr().out


def test_live_history_extends_prompts(fake, tmp_path):
    url, _ = fake
    config = LoadConfig(
        url=url, trace=f"mooncake-chained:{_file(tmp_path)}", sessions=1, session_rate=50.0,
        vocab_size=264, max_output=4, max_prompt=4000,
    )  # fmt: skip
    recs = sorted(run_load(config, progress=False).records, key=lambda r: r.turn)
    assert len(recs) == 2
    for prev, nxt in itertools.pairwise(recs):
        assert nxt.input_ids[: len(prev.input_ids) + 4] == prev.input_ids + prev.output_ids
