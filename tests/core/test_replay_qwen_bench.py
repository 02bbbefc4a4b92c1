"""`benchmarks/replay_qwen.py`: its options, and a tiny run on the real ShareGPT trace that
writes the JSON, the markdown tables and the plot."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from marconi_ray.core.model.presets import get_preset

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "replay_qwen.py"
sys.path.insert(0, str(SCRIPT.parent))
import replay_qwen as rq  # noqa: E402


def test_options() -> None:
    args = rq.parse_args(["--models", "qwen3.5-27b", "--unit", "states", "--swe-sizes", "5,7"])
    assert args.models == ["qwen3.5-27b"] and args.sizes["swebench"] == [5.0, 7.0]
    assert args.systems == ["vllm+", "sglang+", "marconi", "marconi+"]
    spec = get_preset("qwen3.5-27b")
    assert rq.capacity(spec, 5, "states") == 5 * spec.ssm_state_bytes
    assert rq.capacity(spec, 2, "gb") == 2 * 10**9
    with pytest.raises(ValueError, match="nope"):
        rq.parse_args(["--models", "nope"])
    for bad in (["--traces", "mooncake"], ["--sharegpt-sizes", "0"], ["--swe-sizes", "x"]):
        with pytest.raises(SystemExit):
            rq.parse_args(bad)


def test_model_row_is_the_state_to_kv_ratio() -> None:
    row = rq.model_row(get_preset("qwen3-next-80b-a3b"))
    assert row["tokens_of_kv_per_state"] == 3168.0
    assert row["state_bytes"] == row["recurrent_bytes"] + row["conv_bytes"]


@pytest.mark.data("sharegpt", "llama2_tokenizer")
def test_tiny_run_writes_tables_and_plot(tmp_path: Path) -> None:
    argv = [
        "--models", "paper-7b,qwen3.5-35b-a3b", "--systems", "sglang+,marconi",
        "--traces", "sharegpt", "--sessions", "5", "--sharegpt-sizes", "0.2",
        "--jobs", "1", "--out", str(tmp_path),
    ]  # fmt: skip
    assert rq.main(argv) == 0
    report = json.loads((tmp_path / "replay_qwen.json").read_text())
    runs = report["traces"]["sharegpt"]["runs"]
    assert {(r["model"], r["system"]) for r in runs} == {
        (m, s) for m in ("paper-7b", "qwen3.5-35b-a3b") for s in ("sglang+", "marconi")
    }
    assert all(r["peak_bytes"] <= r["cache_bytes"] == 2 * 10**8 for r in runs)
    text = (tmp_path / "replay_qwen.md").read_text()
    assert "| qwen3.5-35b-a3b | 30 + 10 | 64.9 MB | 20 KiB | 3,168 |" in text
    assert (tmp_path / "hit_rates.png").stat().st_size > 0
