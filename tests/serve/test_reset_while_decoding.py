"""A cache reset while a request that hit the cache is decoding (issue 54): the
coordinator forgets the replica's cache (a restart without a persistent journal, a
replica judged silent), the replica registers again and reconciles, and the reconcile's
frees reach rows the running request still reads in place. The store defers those frees
until the request ends (`StateStore.pin_reads`), so the next prefill never writes them:
the request's tokens equal an uncached run's, and once idle the store holds exactly what
the new tree refers to. No Ray: a real `CacheCoordinator` and a real tiny-model `Worker`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from coordinator_helpers import (
    GREEDY,
    Clock,
    applied,
    apply,
    make_settings,
    make_worker,
    register,
    turn,
)
from replica_harness import in_step

from marconi_ray.engine.presets.factory import make_model
from marconi_ray.engine.worker import Worker
from marconi_ray.protocol.orders import PrefillOrder
from marconi_ray.serve.coordinator.actor import CacheCoordinator
from marconi_ray.serve.coordinator.journal import MemoryJournal

LONG = replace(GREEDY, max_tokens=16)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("reset") / "tiny")


def _uncached(model_dir: Path, prompt: np.ndarray) -> list[int]:
    worker = make_worker(model_dir)
    worker.start(PrefillOrder(1, prompt, LONG, LONG.max_tokens))
    while worker.num_running:
        worker.step()
    (done,) = worker.take_finished()
    return list(done.tokens)


def _reset_and_reconcile(coord: CacheCoordinator, worker: Worker) -> None:
    """What a coordinator that lost the replica's cache does: forget it, register it
    again (a new generation), and free what the store holds that no tree refers to."""
    coord.unregister_replica("r0")
    register(coord, worker)
    states, slots = worker.holdings()
    _, answer = coord.reconcile("r0", states, slots, applied=applied(worker))
    apply(worker, answer)


def test_a_reset_while_a_hit_decodes_leaves_its_rows_alone(model_dir: Path) -> None:
    coord = CacheCoordinator(make_settings(model_dir), journal=MemoryJournal(), clock=Clock())
    worker = make_worker(model_dir)
    register(coord, worker)
    rng = np.random.default_rng(54)
    first = rng.integers(7, 263, 40).tolist()
    out, _ = turn(coord, worker, first)
    prompt = np.asarray(first + out + rng.integers(7, 263, 6).tolist(), np.int32)
    dispatch = coord.plan(prompt, LONG)
    assert dispatch.order.hit_len >= 40  # it reads the first turn's rows in place
    apply(worker, dispatch.releases)
    worker.start(dispatch.order)
    for _ in range(4):
        worker.step()
    _reset_and_reconcile(coord, worker)  # frees every row the cache held, the hit's too
    other = coord.plan(rng.integers(7, 263, 60).astype(np.int32), LONG)
    assert other.order.hit_len == 0  # a fresh prompt: its prefill writes new rows
    apply(worker, other.releases)
    worker.start(other.order)
    while worker.num_running:
        worker.step()
    done = {d.request_id: d for d in worker.take_finished()}
    assert list(done[dispatch.order.request_id].tokens) == _uncached(model_dir, prompt)
    for d in done.values():  # the first request's plan is gone: an orphan, freed directly
        apply(worker, coord.commit("r0", d, applied(worker)))
    apply(worker, coord.drain("r0", applied(worker)))
    worker.store.check()
    assert len(worker.store.released_slots()) == 0
    in_step(coord, worker)
