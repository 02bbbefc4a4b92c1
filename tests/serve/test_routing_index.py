"""The structures that make routing and expiry independent of the replica count: the
`RoutingIndex` trie against a brute-force set of paths, `Deadlines` (through
`LeaseTable.expired`) against a scan of every lease, and the `ReplicaTable` columns."""

from __future__ import annotations

import numpy as np
import pytest

from marconi_ray.serve.coordinator.leases import LeaseTable
from marconi_ray.serve.coordinator.routing.prefix_index import RoutingIndex
from marconi_ray.serve.coordinator.routing.replica_table import ReplicaTable


def brute_candidates(held: dict[tuple[str, int], bytes], prompt: np.ndarray) -> set[str]:
    buf = prompt.astype(np.int32).tobytes()
    return {rid for (rid, _), path in held.items() if buf.startswith(path)}


def random_path(rng: np.random.Generator, paths: list[bytes]) -> np.ndarray:
    """A path sharing a random prefix of an earlier one (small alphabet: many splits)."""
    fresh = rng.integers(0, 4, int(rng.integers(1, 12))).astype(np.int32)
    if paths and rng.random() < 0.8:
        base = np.frombuffer(paths[int(rng.integers(len(paths)))], dtype=np.int32)
        cut = int(rng.integers(0, len(base) + 1))
        return np.concatenate([base[:cut], fresh if rng.random() < 0.7 else fresh[:0]])
    return fresh


@pytest.mark.parametrize("seed", range(4))
def test_index_matches_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    index = RoutingIndex()
    held: dict[tuple[str, int], bytes] = {}
    replicas = ["a", "b", "c"]
    next_state = 0
    for step in range(600):
        roll = rng.random()
        if roll < 0.55 or not held:
            path = random_path(rng, list(held.values()))
            if len(path) == 0:
                continue
            rid = replicas[int(rng.integers(3))]
            index.insert(rid, next_state, path)
            index.insert(rid, next_state, path)  # idempotent
            held[(rid, next_state)] = path.tobytes()
            next_state += 1
        elif roll < 0.9:
            keys = list(held)
            rid, sid = keys[int(rng.integers(len(keys)))]
            index.remove(rid, [sid, 10**9])  # an unknown id is ignored
            del held[(rid, sid)]
        else:
            rid = replicas[int(rng.integers(3))]
            index.drop_replica(rid)
            held = {k: v for k, v in held.items() if k[0] != rid}
        if step % 25 == 0:
            assert index.check() <= 2 * len(held) + 1
        assert set(index.entries()) == {(r, s, p) for (r, s), p in held.items()}
        for _ in range(3):
            prompt = random_path(rng, list(held.values()))
            assert index.candidates(prompt) == brute_candidates(held, prompt)
    index.clear()
    assert len(index) == 0 and index.check() == 1


def test_index_splits_merges_and_depths() -> None:
    index = RoutingIndex()
    index.insert("a", 1, np.arange(10, dtype=np.int32))
    index.insert("b", 2, np.arange(4, dtype=np.int32))  # splits a's edge at 4
    index.insert("c", 3, np.concatenate([np.arange(4), [99]]).astype(np.int32))
    assert index.check() == 4  # root, [0..4) (b), [4..10) (a), [99] (c)
    assert index.candidates(np.arange(3, dtype=np.int32)) == set()  # no state at depth <= 3
    assert index.candidates(np.arange(4, dtype=np.int32)) == {"b"}
    assert index.candidates(np.arange(12, dtype=np.int32)) == {"a", "b"}
    index.remove("b", [2])
    assert index.check() == 4  # [0..4) still branches: it stays, without a state
    index.remove("c", [3])
    assert index.check() == 2  # merged back into one edge
    assert index.candidates(np.arange(10, dtype=np.int32)) == {"a"}
    with pytest.raises(ValueError, match=r"depths \[0\] must ascend"):
        index.insert("a", 7, np.zeros(0, np.int32))
    with pytest.raises(ValueError, match="must ascend"):
        index.insert_path("a", np.arange(9, dtype=np.int32), [(5, 8), (3, 9)])
    assert ("a", 8) not in index  # nothing changed


@pytest.mark.parametrize("seed", range(3))
def test_lease_heap_matches_a_scan(seed: int) -> None:
    """Grants, renewals (some with a clock that stepped back), releases, drops and
    restarts in random order: `expired` always equals the scan, and keeps returning a
    lease until it is released."""
    rng = np.random.default_rng(seed)
    table, now, next_request = LeaseTable(), 1000.0, 0
    for _ in range(1500):
        roll = rng.random()
        now += float(rng.exponential(0.4))
        live = [r for r, _ in table.scan_expired(-np.inf, 0.0)]
        if roll < 0.4:
            table.grant(next_request, f"r{rng.integers(3)}", now + float(rng.uniform(1, 6)))
            next_request += 1
        elif roll < 0.6 and live:
            picked = [int(x) for x in rng.choice(live, size=min(3, len(live)), replace=False)]
            step_back = float(rng.uniform(-3, 4))
            table.renew(f"r{rng.integers(3)}", picked, now + step_back)
        elif roll < 0.85 and live:
            table.release(int(rng.choice(live)))
        elif roll < 0.9:
            table.drop_replica(f"r{rng.integers(3)}")
        elif roll < 0.92:
            table.renew_all(now + 2.0)
        grace = float(rng.uniform(0, 1))
        assert table.expired(now, grace) == table.scan_expired(now, grace)
        assert table.expired(now, grace) == table.scan_expired(now, grace)  # still there
        assert len(table._heap) <= 2 * len(table) + 1024 + 1


def test_replica_table_slots_follow_registration_order() -> None:
    t = ReplicaTable()
    for i in range(20):
        t.add(f"r{i}", confirmed=i % 3 != 0, open_requests=i % 5)
    for i in range(0, 20, 2):
        t.remove(f"r{i}")  # compacts on the way
    t.add("r0", confirmed=True)  # back, at the end
    t.add("r1", confirmed=False, open_requests=9)  # present: keeps its slot
    rows = list(t.rows())
    assert [r for r, _, _ in rows] == [f"r{i}" for i in range(1, 20, 2)] + ["r0"]
    assert rows[0] == ("r1", 9, False)
    mask = t.eligible(4)
    slots = np.flatnonzero(mask)
    want = [r for r, n, ok in rows if ok and n < 4]
    assert [t.id_at(int(s)) for s in slots] == want
    load = {r: n for r, n, _ in rows}
    least = t.least_loaded(mask)
    assert least is not None and t.id_at(least) == min(want, key=lambda r: (load[r], want.index(r)))
    assert t.least_loaded(np.zeros_like(mask)) is None
    assert t.confirmed_count() == sum(ok for _, _, ok in rows)
