"""`benchmarks/bench_cluster.py`: its options, and a tiny `scaling` section end to end
(both variants, in process, no Ray) with its JSON, table, verdicts and plot."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_cluster.py"
sys.path.insert(0, str(SCRIPT.parent))
import bench_cluster as bc  # noqa: E402


def test_options() -> None:
    args = bc.parse_args([])
    assert args.sections == ["scaling", "ray", "node_loss"] and args.replicas == [1, 8, 32, 128]
    assert args.reference_routing and (args.sessions, args.turns) == (12, 4)
    quick = bc.parse_args(["--quick", "--sections", "scaling", "--no-reference-routing"])
    assert quick.sections == ["scaling"] and not quick.reference_routing
    assert (quick.pairs, quick.sessions, quick.ray_pairs) == (400, 4, 1000)
    assert args.coordinators == [1, 2] and args.group_key_tokens == 256
    assert bc.parse_args(["--coordinators", "1,2,4"]).coordinators == [1, 2, 4]
    assert args.commits == ["replica", "relay"]
    assert bc.parse_args(["--commits", "relay"]).commits == ["relay"]
    with pytest.raises(SystemExit):
        bc.parse_args(["--commits", "ingress"])
    bad_args = (["--sections", "node-loss"], ["--replicas", "1,x"], ["--replicas", "0"])
    for bad in (*bad_args, ["--coordinators", "0"], ["--coordinators", "one"]):
        with pytest.raises(SystemExit):
            bc.parse_args(bad)


def test_scaling_section_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--sections", "scaling", "--replicas", "1,3", "--sessions", "2", "--turns", "2"]
    argv += ["--pairs", "30", "--rounds", "2", "--first-tokens", "40", "--turn-tokens", "10"]
    report = bc.main([*argv, "--out", str(tmp_path)])
    sc = report["scaling"]
    assert set(sc) == {"1", "3"} and set(sc["3"]) == {"indexed", "reference"}
    for r in sc.values():
        for f in r.values():
            assert f["pair"]["n"] == 30 and f["pairs_s"] > 0 and f["mean_hit_tokens"] > 0
        assert r["indexed"]["mean_hit_tokens"] == r["reference"]["mean_hit_tokens"]  # same routes
    assert [t["target"] for t in report["targets"]] == ["<= 1.5", ">= 3,000"]
    saved = json.loads((tmp_path / "bench_cluster.json").read_text())
    assert saved["scaling"]["3"]["indexed"]["pair"]["n"] == 30
    assert (tmp_path / "cluster.png").stat().st_size > 0
    assert "reference/indexed" in capsys.readouterr().out
