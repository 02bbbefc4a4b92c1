"""A group of coordinators (`settings.coordinators`): each owns a partition of the
replicas; the ingress plans a request at the coordinator its group key picks, spills to
the next when that one cannot place it, and sends everything about a dispatch (its
relayed commit, an abandon) to the coordinator that planned it. No Ray: real
`CacheCoordinator`s with real tiny-model workers behind the real `RayBackend`, each
coordinator called through an actor-style handle (`replica_harness.Handle`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from coordinator_helpers import GREEDY, make_settings, make_worker, register, run_dispatch
from replica_harness import Handle

from marconi_ray.engine.presets.factory import make_model
from marconi_ray.serve.coordinator.actor import CacheCoordinator
from marconi_ray.serve.coordinator.journal import MemoryJournal
from marconi_ray.serve.ingress.group_key import group_of, spill_order
from marconi_ray.serve.ingress.metrics import IngressMetrics
from marconi_ray.serve.ingress.ray_backend import RayBackend, worst_journal
from marconi_ray.serve.messages import ReplicasUnconfirmed
from marconi_ray.serve.replica.deployment import coordinator_of
from marconi_ray.serve.settings import ServeSettings

KEY = 16


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("group") / "tiny")


def _group(model_dir: Path) -> tuple[list[CacheCoordinator], dict[str, object]]:
    """Two coordinators, replica r0 registered at the first and r1 at the second."""
    settings = make_settings(model_dir, coordinators=2, group_key_tokens=KEY)
    coords = [CacheCoordinator(s, journal=MemoryJournal()) for s in settings.group()]
    workers = {"r0": make_worker(model_dir), "r1": make_worker(model_dir)}
    register(coords[0], workers["r0"], "r0")
    register(coords[1], workers["r1"], "r1")
    return coords, workers


def _prompt(head: int, n: int = 40) -> np.ndarray:
    return np.asarray([head, *range(7, 7 + n)], np.int32)


def test_the_group_key_is_stable_and_spreads_prompts() -> None:
    rng = np.random.default_rng(0)
    prompts = [rng.integers(7, 30_000, 300).astype(np.int32) for _ in range(400)]
    groups = [group_of(p, 2, 256) for p in prompts]
    assert groups == [group_of(p.copy(), 2, 256) for p in prompts], "stable"
    assert 150 < sum(groups) < 250, "about half each"
    p = prompts[0]
    longer = np.concatenate([p, rng.integers(7, 999, 50).astype(np.int32)])
    assert group_of(longer, 2, 256) == group_of(p, 2, 256), "a longer turn stays"
    assert group_of(p, 1, 256) == 0 and spill_order(1, 3) == [1, 2, 0]


def test_settings_name_each_member_and_one_keeps_the_old_names(model_dir: Path) -> None:
    one = make_settings(model_dir)
    two = make_settings(model_dir, coordinators=2)
    assert two.group()[0].coordinator_name == one.coordinator_name
    assert two.group()[0].journal_prefix == one.journal_prefix
    names = {(s.coordinator_name, s.journal_prefix, s.tuner_name) for s in two.group()}
    assert len(names) == 2 and len({n for triple in names for n in triple}) == 6
    with pytest.raises(ValueError, match="coordinator_index"):
        ServeSettings(str(model_dir), "tiny", coordinators=2, coordinator_index=2)
    with pytest.raises(ValueError, match="group_replicas_by"):
        ServeSettings(str(model_dir), "tiny", group_replicas_by="zone")


def test_replicas_are_given_to_coordinators_by_rank_or_node(model_dir: Path) -> None:
    def context(rank: int, node: int) -> SimpleNamespace:
        rid = SimpleNamespace(unique_id=f"replica-{rank}")
        return SimpleNamespace(rank=SimpleNamespace(rank=rank, node_rank=node), replica_id=rid)

    by_rank = make_settings(model_dir, coordinators=2)
    by_node = make_settings(model_dir, coordinators=2, group_replicas_by="node")
    contexts = [context(r, r // 2) for r in range(4)]  # two replicas per node
    assert [coordinator_of(by_rank, c) for c in contexts] == [0, 1, 0, 1]
    assert [coordinator_of(by_node, c) for c in contexts] == [0, 0, 1, 1]
    assert coordinator_of(make_settings(model_dir), contexts[3]) == 0
    no_rank = SimpleNamespace(rank=None, replica_id=SimpleNamespace(unique_id="x"))
    assert coordinator_of(by_rank, no_rank) in (0, 1)


def test_requests_go_to_their_keys_coordinator_and_its_replicas(model_dir: Path) -> None:
    """Each request is planned by the coordinator its key picks, on that one's replica;
    a session's next turn goes back there and hits; its relayed commit goes there too."""
    coords, workers = _group(model_dir)
    backend = RayBackend([Handle(c) for c in coords], None, key_tokens=KEY)  # type: ignore[arg-type]

    async def main() -> None:
        by_key: dict[int, int] = {}
        for head in range(300, 312):
            prompt = _prompt(head)
            d = await backend.plan(prompt, GREEDY, 0.0)
            key = group_of(prompt, 2, KEY)
            assert d.coordinator == key and d.replica_id == f"r{key}"
            by_key[key] = by_key.get(key, 0) + 1
            (done,) = run_dispatch(workers[d.replica_id], d)
            await backend.relay(d, done)
            nxt = np.concatenate([prompt, np.asarray(done.tokens, np.int32), [9, 9]])
            again = await backend.plan(nxt, GREEDY, 0.0)
            assert (again.coordinator, again.order.hit_len) == (key, len(prompt) + len(done.tokens))
            backend.coordinator_of(again).abandon.remote(again)
            await asyncio.sleep(0)
        assert set(by_key) == {0, 1}, by_key
        assert backend.batchers[0].commits + backend.batchers[1].commits == 12

    asyncio.run(main())
    for c in coords:
        c.check_invariants()
        assert all(p.open_requests == 0 for p in c.planners.values())


def test_a_coordinator_without_a_free_replica_spills_to_the_next(model_dir: Path) -> None:
    coords, _ = _group(model_dir)
    coords[0].unregister_replica("r0")  # its only replica is gone
    metrics = IngressMetrics()
    backend = RayBackend([Handle(c) for c in coords], None, metrics, key_tokens=KEY)  # type: ignore[arg-type]

    async def main() -> None:
        heads = [h for h in range(300, 340) if group_of(_prompt(h), 2, KEY) == 0][:3]
        for head in heads:
            d = await backend.plan(_prompt(head), GREEDY, 0.0)
            assert (d.coordinator, d.replica_id) == (1, "r1")
            backend.coordinator_of(d).abandon.remote(d)
            await asyncio.sleep(0)
        assert metrics.spills._value.get() == len(heads) == 3

    asyncio.run(main())


def test_health_of_a_group_sums_replicas_and_takes_the_worst_journal(model_dir: Path) -> None:
    coords, _ = _group(model_dir)
    for c in coords:
        c.heartbeat(next(iter(c.planners)), [])
    backend = RayBackend([Handle(c) for c in coords], None, key_tokens=KEY)  # type: ignore[arg-type]
    health = asyncio.run(backend.health())
    assert (health["replicas"], health["registered"]) == (2, 2)
    assert len(health["coordinators"]) == 2 and health["journal"]["state"] == "ok"
    assert len(asyncio.run(backend.stats())) == 2
    ok, lost = {"state": "ok", "n": 1}, {"state": "lost", "n": 2}
    assert worst_journal([ok, lost, ok]) is lost


def test_a_restarted_coordinator_is_waited_for_not_spilled_from(model_dir: Path) -> None:
    """A first choice whose replicas are restored but not confirmed yet (it restarted,
    they have not reconciled) holds the request's cache: the ingress waits for it
    instead of planning the request elsewhere, without a hit."""
    coords, _ = _group(model_dir)
    coords[0].state.set_confirmed("r0", False)
    backend = RayBackend([Handle(c) for c in coords], None, key_tokens=KEY)  # type: ignore[arg-type]
    head = next(h for h in range(300, 340) if group_of(_prompt(h), 2, KEY) == 0)

    async def main() -> None:
        with pytest.raises(ReplicasUnconfirmed):
            await backend._plan_in_group(_prompt(head), GREEDY, 0.0)
        coords[0].state.set_confirmed("r0", True)
        d = await backend._plan_in_group(_prompt(head), GREEDY, 0.0)
        assert (d.coordinator, d.replica_id) == (0, "r0")
        backend.coordinator_of(d).abandon.remote(d)
        await asyncio.sleep(0)

    asyncio.run(main())
