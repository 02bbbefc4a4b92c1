"""Cache entries moved between two Ray actors' engines over Ray Direct Transport (GLOO on
this CPU) and through the object store: the receiver's next turn hits the moved entry
and equals the uncached engine's tokens; a source killed before its export, or a
receiver killed while an entry is on its way, leaves the survivor exact and accounted
(its store holds exactly what its cache accounts, no plan left open); bad transfer
settings are refused naming the value."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
from serve_helpers import local_ray

from marconi_ray.engine.presets.factory import make_model
from marconi_ray.serve.replica.engine_endpoint import EngineEndpoint
from marconi_ray.serve.replica.entry_endpoint import join_transfer_group, move_entry, settle_move
from marconi_ray.serve.transfer_modes import TRANSFER_MODES, resolve_transfer, transfer_mode

pytestmark = [pytest.mark.ray]

Endpoint = ray.remote(num_cpus=1)(EngineEndpoint)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("transfer") / "tiny")


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    with local_ray():
        yield


def _endpoints(model_dir: Path, n: int, system: str = "marconi") -> list[Any]:
    return [Endpoint.remote(str(model_dir), system=system) for _ in range(n)]


def _chat(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


def _exact(actor: Any) -> None:
    acc = ray.get(actor.accounting.remote())
    assert acc["exact"] == 1 and acc["open_plans"] == 0
    assert acc["store_bytes"] == acc["cache_bytes"]


@pytest.mark.parametrize("mode", ["gloo", "object_store"])
def test_a_moved_entry_serves_the_next_turn(ray_session, model_dir, mode):
    source, receiver, reference = _endpoints(model_dir, 3)
    m = transfer_mode(mode, "cpu")
    join_transfer_group([source, receiver], m)
    chat = _chat(1, 40)
    out, _ = ray.get(source.generate.remote(chat, 6))
    history = np.asarray(chat + out, dtype=np.int32)
    got = settle_move(move_entry(source, receiver, history, 0, m), 60)
    assert got.refused == "" and got.tokens == len(history) and got.nbytes > 0
    follow = history.tolist() + _chat(2, 5)
    tokens, cached = ray.get(receiver.generate.remote(follow, 6))
    assert cached == len(history)
    want, want_cached = ray.get(reference.generate.remote(follow, 6))
    assert tokens == want and want_cached == 0
    for actor in (source, receiver):
        _exact(actor)
    # only what the receiver lacks travels: it holds the whole entry now
    again = settle_move(move_entry(source, receiver, history, len(history), m), 60)
    assert again.tokens == 0 and "no entry deeper" in again.refused
    for actor in (source, receiver, reference):
        ray.kill(actor)


def test_a_dead_source_or_receiver_leaves_the_other_exact(ray_session, model_dir):
    source, receiver, spare = _endpoints(model_dir, 3)
    m = TRANSFER_MODES["gloo"]
    join_transfer_group([source, receiver, spare], m)
    chat = _chat(3, 40)
    out, _ = ray.get(source.generate.remote(chat, 6))
    history = np.asarray(chat + out, dtype=np.int32)
    # the receiver dies with the entry on its way: the source is unchanged and can move
    # the entry again to another
    ref = move_entry(source, receiver, history, 0, m)
    ray.kill(receiver)
    lost = settle_move(ref, 60)
    assert lost.tokens == 0 and lost.refused
    _exact(source)
    moved = settle_move(move_entry(source, spare, history, 0, m), 60)
    assert moved.tokens == len(history)
    # the source dies before its export: the receiver gets nothing and recomputes exactly
    ray.kill(source)
    follow = history.tolist() + _chat(4, 5)
    other = _chat(5, 30)
    gone = settle_move(move_entry(source, spare, np.asarray(other, np.int32), 0, m), 60)
    assert gone.tokens == 0 and gone.refused
    _exact(spare)
    tokens, cached = ray.get(spare.generate.remote(follow, 4))
    assert cached == len(history)
    fresh = Endpoint.remote(str(model_dir), system="vanilla")
    assert tokens == ray.get(fresh.generate.remote(follow, 4))[0]
    _exact(spare)
    for actor in (spare, fresh):
        ray.kill(actor)


def test_transfer_settings_are_checked():
    assert resolve_transfer("auto", "cpu", False).name == "gloo"
    assert resolve_transfer("auto", "cuda:0", False).name == "nccl"
    assert resolve_transfer("auto", "cuda", True).name == "nixl"
    with pytest.raises(ValueError, match="'tcp'"):
        resolve_transfer("tcp", "cpu", False)
    with pytest.raises(ValueError, match="'nccl' cannot move cpu"):
        resolve_transfer("nccl", "cpu", False)
    with pytest.raises(ValueError, match="nixl package"):
        resolve_transfer("nixl", "cuda", False)
