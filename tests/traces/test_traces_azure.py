"""The Azure LLM inference trace CSV (`azure:FILE`): one single-turn session per row at
its offset from the first row, prompts and outputs of the recorded lengths; malformed
files fail naming the line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from marconi_ray.traces.azure import read_azure
from marconi_ray.traces.registry import load_trace
from marconi_ray.traces.trace import TraceFormatError

ROWS = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2000000,879,0
2023-11-16 18:16:46.6805900,10,3
"""


@pytest.fixture
def csv_file(tmp_path: Path) -> Path:
    path = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    path.write_text(ROWS)
    return path


def test_rows_become_timed_single_turn_sessions(csv_file: Path) -> None:
    trace = load_trace(f"azure:{csv_file}")
    reqs = trace.requests
    assert [r.session_id for r in reqs] == [0, 1, 2, 3] and {r.turn_id for r in reqs} == {0}
    assert [r.ts for r in reqs] == pytest.approx([0.0, 4.314579, 4.519410, 60.0])
    assert [(r.n_input, r.n_output) for r in reqs] == [(374, 44), (396, 109), (879, 0), (10, 3)]
    assert all(0 <= int(r.input_tokens.max()) < 32_000 for r in reqs)
    # content is pseudo-random per row: no prompt starts another
    assert not np.array_equal(reqs[0].input_tokens[:10], reqs[1].input_tokens[:10])
    assert trace.name == "azure:AzureLLMInferenceTrace_conv"


def test_sessions_and_rate_options(csv_file: Path) -> None:
    assert len(load_trace(f"azure:{csv_file}", n_sessions=2).requests) == 2
    timed = load_trace(f"azure:{csv_file}", sessions_per_second=2.0)
    assert [r.ts for r in timed.requests] == pytest.approx([0.0, 0.5, 1.0, 1.5])
    assert read_azure(csv_file, vocab_size=300).requests[0].input_tokens.max() < 300


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,3\n",
            ":1: missing column(s) GeneratedTokens",
        ),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,3,4\n", ":2:"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,x,4\n", ":2:"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,0,4\n", "ContextTokens"),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3,4\n"
            "2023-11-16 18:15:40,3,4\n",
            ":3: TIMESTAMP",
        ),
    ],
)
def test_malformed_files_name_the_line(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(TraceFormatError, match=r"bad\.csv") as exc:
        read_azure(path)
    assert needle in str(exc.value)


def test_bad_specs_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no file after 'azure:'"):
        load_trace("azure:")
    with pytest.raises(FileNotFoundError):
        load_trace(f"azure:{tmp_path / 'none.csv'}")
    with pytest.raises(ValueError, match="takes no option"):
        load_trace(f"azure:{tmp_path / 'none.csv'}", gaps="x")
