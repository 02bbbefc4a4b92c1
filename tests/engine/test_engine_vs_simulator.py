"""The engine drives the same `core.PrefixCache` the replay simulator runs: for the
sequences the engine served, in the same order, at the same capacity, the simulator
predicts exactly the engine's hits, evictions and tuned alpha (bootstrap tuning included)."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import GREEDY

from marconi_ray.core.cache.admission import MarconiPlusAdmission
from marconi_ray.core.cache.tuner import TunerConfig
from marconi_ray.core.sim.replay import RunConfig, run_replay
from marconi_ray.engine.engine import Engine
from marconi_ray.traces.trace import Request


@pytest.mark.parametrize(
    ("family", "system", "capacity"),
    [
        ("nemotron_h", "marconi", 300_000),
        ("nemotron_h", "marconi+", 300_000),
        ("qwen3_5", "marconi", 700_000),  # a Gated DeltaNet state is ~60 KB here
        ("lfm2", "marconi", 200_000),  # short-conv states: 2.3 KB, KV 512 B a token
    ],
)
def test_engine_hit_rate_equals_simulator_with_tuning(
    model_dirs, family, system, capacity, monkeypatch
):
    # marconi+ with 16-token blocks, so these short conversations speculate
    monkeypatch.setattr(MarconiPlusAdmission.__init__, "__defaults__", (16, True))
    tuner = TunerConfig(multiplier=1, grid=(0.0, 0.5, 2.0))
    engine = Engine(model_dirs[family], system=system, cache_bytes=capacity, tuner=tuner)
    rng = np.random.default_rng(9)
    vocab = engine.config.vocab_size
    shared = rng.integers(7, vocab, 24).tolist()
    histories = [shared + rng.integers(7, vocab, 10).tolist() for _ in range(5)]
    served: list[Request] = []
    for i in range(40):
        s = int(rng.integers(0, len(histories)))
        histories[s] += rng.integers(7, vocab, int(rng.integers(3, 20))).tolist()
        out = engine.generate(histories[s], GREEDY)
        served.append(
            Request(
                s, i, float(i), np.asarray(histories[s], np.int32), np.asarray(out.tokens, np.int32)
            )
        )
        histories[s] += list(out.tokens)
        assert engine.store.bytes_used == engine.cache.bytes_used <= capacity
    assert engine.cache.stats.evictions > 0
    assert engine.tuner is not None and engine.tuner.history, "the tuner should have run"
    sim = run_replay(served, engine.cache.cost, RunConfig(system, capacity, tuner=tuner))
    assert sim.token_hit_rate == engine.cache.stats.token_hit_rate
    assert sim.evictions == engine.cache.stats.evictions
    assert sim.alpha_history == tuple((h.start_request, h.best_alpha) for h in engine.tuner.history)
    if system == "marconi+":
        assert engine.cache.stats.states_admitted["speculative"] > 0
        assert sim.states_by_reason == engine.cache.stats.states_admitted
