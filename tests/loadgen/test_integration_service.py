"""The load generator against our real service (local Ray + Serve, the tiny preset):
a multi-turn run's summary and cache hits, the measured hit rate equal to the
simulator's on the same requests (one request at a time), and a small `compare`
(`benchmarks/compare_systems.py`, what `marconi-loadgen compare` runs)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import ray
from ray import serve
from ray_session import SERVE_PORT, local_ray

from loadgen import compare_report
from loadgen.config import LoadConfig
from loadgen.runner import run_load
from loadgen.server_metrics import delta
from marconi_ray.core.sim.replay import run_replay
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.serve.app import build_app, shutdown_app, start_actors
from marconi_ray.serve.settings import NAMESPACE, ServeSettings

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import compare_systems

pytestmark = [pytest.mark.ray, pytest.mark.slow]
PORT = SERVE_PORT
URL = f"http://127.0.0.1:{PORT}"
SUMMARY_KEYS = (
    "requests", "completed", "failed", "errors", "ttft_ms", "tpot_ms", "itl_ms", "e2el_ms",
    "request_throughput", "output_throughput", "goodput", "ttft_by_turn_ms", "cached_tokens",
    "prompt_tokens", "client_token_hit_rate",
)  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return Path(make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("m") / "tiny"))


@pytest.fixture(scope="module")
def local_serve() -> Iterator[None]:
    with local_ray():  # Serve on PORT
        yield


@contextmanager
def deployed(settings: ServeSettings) -> Iterator[object]:
    """Our service for `settings` at URL; yields its coordinator actor."""
    start_actors(settings)
    try:
        serve.run(build_app(settings), name=settings.app_name, route_prefix="/")
        yield ray.get_actor(settings.coordinator_name, namespace=NAMESPACE)
    finally:
        shutdown_app(settings)


def _vocab(model_dir: Path) -> int:
    return int(json.loads((model_dir / "config.json").read_text())["vocab_size"])


@pytest.mark.parametrize(
    ("system", "alpha", "host"),
    [("marconi", 1.0, 0), ("vllm+", None, 0), ("marconi+:16", 1.0, 0), ("marconi", 1.0, 10**7)],
)
def test_sequential_run_hits_and_matches_the_simulator(model_dir, local_serve, system, alpha, host):
    """One session at a time, one request at a time: no interleaving, so the live cache
    and the simulator see the same sequence and must agree exactly, evictions included
    (the capacity holds about one session); with a host tier (LRU placement: the tiny
    model is never worth a copy under FLOP-aware placement), demotions, promotions and
    the hit tokens read from the host agree too."""
    settings = ServeSettings(
        model_dir=str(model_dir),
        model_name="tiny",
        cache_bytes=400_000,
        host_cache_bytes=host,
        host_placement="lru",
        system=system,
        alpha=alpha,
        port=PORT,
        app_name="lg-seq-" + system.replace("+", "plus").replace(":", "-") + f"-{host}",
    )
    load = LoadConfig(
        url=URL,
        trace="sample",
        sessions=4,
        session_rate=None,
        concurrency=1,
        vocab_size=_vocab(model_dir),
        max_output=4,
        max_prompt=512,
    )
    with deployed(settings) as coordinator:
        result = run_load(load, progress=False)
        replica = ray.get(coordinator.replicas.remote())[0]
        cost = ray.get(coordinator.cost.remote(replica))
    summary = result.summary
    assert all(k in summary for k in SUMMARY_KEYS), sorted(set(SUMMARY_KEYS) - set(summary))
    json.dumps(summary)  # JSON-ready
    assert summary["failed"] == 0 and summary["completed"] == len(result.records) >= 8
    later: dict[int, bool] = {}
    for r in result.records:
        assert r.error is None and r.input_ids and len(r.output_ids) == r.output_tokens == 4
        if r.turn >= 1:
            later[r.session_id] = later.get(r.session_id, False) or r.cached_tokens > 0
    assert len(later) >= 3 and sum(later.values()) >= len(later) - 1, later
    server = delta(result.server_before, result.server_after)
    assert server is not None and server["requests"] == len(result.records)
    assert server["evictions"] > 0
    sim = run_replay(
        compare_report.sim_requests(result.records),
        cost,
        compare_systems.sim_config(settings, load.max_output),
    )
    assert sim.token_hit_rate == server["token_hit_rate"] > 0
    assert sim.evictions == server["evictions"]
    assert sim.states_dropped == server["states_dropped"]
    if system.startswith("marconi+"):  # the live cache speculated as the simulator did
        assert sim.states_by_reason["speculative"] > 0
    if host:
        assert sim.host_hit_tokens == server["host_hit_tokens"] > 0
        assert sim.demotions == server["demotions"] > 0
        assert sim.promotions == server["promotions"] > 0
        assert sim.host_evictions == server["host_evictions"]
    assert summary["client_token_hit_rate"] == pytest.approx(server["token_hit_rate"])


def test_compare_end_to_end(model_dir, local_serve, tmp_path):
    load = LoadConfig(
        url=URL,
        trace="sample",
        sessions=2,
        session_rate=20.0,
        vocab_size=_vocab(model_dir),
        max_output=4,
        max_prompt=384,
    )
    cfg = compare_systems.CompareConfig(
        model=str(model_dir),
        systems=("vanilla", "marconi"),
        cache_bytes=10**8,
        out=tmp_path,
        load=load,
        port=PORT,
    )
    doc = compare_systems.compare(cfg, progress=False)
    for name in cfg.systems:
        assert (tmp_path / name).is_dir() and any((tmp_path / name).iterdir())
    for name in ("compare.json", "compare.md", "ttft_cdf.png", "ttft_by_turn.png"):
        assert (tmp_path / name).stat().st_size > 0
    rows = json.loads((tmp_path / "compare.json").read_text())["systems"]
    assert rows == json.loads(json.dumps(doc["systems"]))
    assert rows["vanilla"]["server_hit_rate"] == rows["vanilla"]["sim_hit_rate"] == 0.0
    assert rows["marconi"]["server_hit_rate"] > 0 and rows["marconi"]["failed"] == 0
    assert abs(rows["marconi"]["sim_minus_server"]) < 0.1
    assert "| marconi |" in (tmp_path / "compare.md").read_text()
