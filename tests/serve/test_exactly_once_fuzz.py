"""The exactly-once fuzzer (`exactly_once_fuzz`) on a bounded number of cases: random
interleavings across two replicas with the host tier on, checked after every event.
`benchmarks/fuzz_exactly_once.py` runs it longer."""

from __future__ import annotations

from pathlib import Path

import pytest
from exactly_once_fuzz import EVENTS, run_case

from marconi_ray.engine.presets.factory import make_model

CASES = 4
EVENTS_PER_CASE = 150


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("fuzz") / "tiny")


@pytest.mark.parametrize("seed", range(CASES))
def test_random_interleavings_free_and_move_every_id_exactly_once(model_dir, seed):
    counts = run_case(model_dir, seed, EVENTS_PER_CASE)
    assert counts["checks"] == EVENTS_PER_CASE + 1
    assert sum(counts.get(kind, 0) for kind in EVENTS) == EVENTS_PER_CASE + 1  # + the last expiry
