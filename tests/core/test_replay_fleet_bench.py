"""`benchmarks/replay_fleet.py`: its defaults, marconi's lead over sglang+, and a tiny run
on the real ShareGPT trace that writes the JSON, the tables and both plots (and redraws
them from the JSON)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from marconi_ray.core.model.presets import PRESETS

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "replay_fleet.py"
sys.path.insert(0, str(SCRIPT.parent))
import replay_fleet as rf  # noqa: E402


def test_defaults_are_the_fleet_on_the_swe_trace() -> None:
    args = rf.parse_args([])
    assert args.models == list(PRESETS) and len(args.models) >= 9
    assert args.traces == ["swebench"] and args.sizes["swebench"] == [10.0, 20.0, 50.0, 100.0]
    assert args.systems == ["vllm+", "sglang+", "marconi"] and args.jobs == 1
    with pytest.raises(ValueError, match="nope"):
        rf.parse_args(["--models", "nope"])
    with pytest.raises(SystemExit):
        rf.parse_args(["--swe-sizes", "0"])


def _report() -> dict[str, Any]:
    def run(model: str, cache: str, system: str, rate: float) -> dict[str, Any]:
        return {"model": model, "cache": cache, "system": system, "token_hit_rate": rate}

    runs = [
        run("big", "10 GB", "sglang+", 0.40),
        run("big", "10 GB", "marconi", 0.55),
        run("small", "10 GB", "sglang+", 0.90),
        run("small", "10 GB", "marconi", 0.90),
        run("small", "20 GB", "marconi", 0.95),
    ]
    return {
        "models": [
            {"model": "big", "tokens_of_kv_per_state": 9000.0},
            {"model": "small", "tokens_of_kv_per_state": 16.5},
        ],
        "traces": {"swebench": {"runs": runs}},
    }


def test_leads_are_marconi_minus_sglang_in_points() -> None:
    rows = rf.leads(_report(), "swebench")
    assert [r["model"] for r in rows] == ["big", "small"]
    assert rows[0]["lead"]["10 GB"] == pytest.approx(15.0)
    assert rows[1]["lead"] == {"10 GB": 0.0, "20 GB": None}  # sglang+ not run at 20 GB
    assert rows[0]["state_tokens"] == 9000.0


def test_lead_table_orders_presets_by_state_size() -> None:
    text = rf.lead_table(_report())
    small, big = text.index("| small | 16.5 |"), text.index("| big | 9,000 |")
    assert small < big
    assert "| big | 9,000 | +15.00 | - | +15.00 |" in text
    assert "| small | 16.5 | +0.00 | - | +0.00 |" in text


@pytest.mark.data("sharegpt", "llama2_tokenizer")
def test_tiny_run_writes_tables_and_plots(tmp_path: Path) -> None:
    argv = [
        "--models", "paper-7b,falcon-h1-7b", "--traces", "sharegpt", "--sessions", "5",
        "--sharegpt-sizes", "0.2,1", "--out", str(tmp_path),
    ]  # fmt: skip
    assert rf.main(argv) == 0
    report = json.loads((tmp_path / "fleet_replay.json").read_text())
    runs = report["traces"]["sharegpt"]["runs"]
    assert {(r["model"], r["system"]) for r in runs} == {
        (m, s) for m in ("paper-7b", "falcon-h1-7b") for s in ("vllm+", "sglang+", "marconi")
    }
    assert all(r["peak_bytes"] <= r["cache_bytes"] for r in runs)
    assert [row["model"] for row in report["leads"]["sharegpt"]] == ["paper-7b", "falcon-h1-7b"]
    text = (tmp_path / "fleet_replay.md").read_text()
    assert "| falcon-h1-7b | 44 + 44 | 139.7 MB | 44 KiB | 3,100 |" in text
    assert "marconi's lead over sglang+" in text
    for name in ("fleet_hit_rates.png", "fleet_lead.png"):
        assert (tmp_path / name).stat().st_size > 0
    redraw = tmp_path / "redraw"
    assert rf.main(["--from-json", str(tmp_path / "fleet_replay.json"), "--out", str(redraw)]) == 0
    assert (redraw / "fleet_replay.md").read_text() == text
    assert (redraw / "fleet_lead.png").stat().st_size > 0
