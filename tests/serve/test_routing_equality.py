"""The coordinator's indexed routing (`routing.choose.choose_replica`) against the
reference (`choose_replica_reference`: a view of every replica, `Router.route`), for
every strategy, on random coordinator states: several replicas with fake stores, random
sessions and turns, prompts cutting them anywhere, evictions (a small cache), plans left
open (queues, a room limit), unconfirmed replicas, unregister and re-register, snapshot
restores and journal recoveries, expired leases and silent replicas. After every step
the state's full-scan invariants hold (the routing index is exactly the trees' states,
the table exactly the replicas), and expiry finds what a scan finds."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
from coordinator_helpers import Clock

from marconi_ray.engine.presets.factory import make_model
from marconi_ray.protocol.orders import Finished, PrefillOrder
from marconi_ray.protocol.results import Timings
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.coordinator.actor import CacheCoordinator
from marconi_ray.serve.coordinator.journal import MemoryJournal
from marconi_ray.serve.coordinator.leases import LEASE_GRACE
from marconi_ray.serve.coordinator.routing.choose import choose_replica, choose_replica_reference
from marconi_ray.serve.coordinator.routing.routers import ROUTERS, make_router
from marconi_ray.serve.messages import Dispatch, NoReplicaAvailable, Overloaded
from marconi_ray.serve.settings import ServeSettings

PARAMS = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
LEASE_S = 40.0
SYSTEMS = ("marconi", "marconi+:8", "vllm+", "vllm+refill", "sglang+")
ALPHABET = (7, 12)  # few token ids: prompts share prefixes by chance, the trie splits


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("equality") / "tiny")


def finish(order: PrefillOrder, rng: np.random.Generator, ids: list[int]) -> Finished:
    """What a worker reports for `order`: fresh state ids (never reused) at every depth
    it was asked to keep, KV slots for [hit_len, deepest state)."""
    n, h = len(order.prompt), order.hit_len
    out = rng.integers(*ALPHABET, order.max_new).astype(np.int32)
    total = n + len(out)
    depths = [d for d in order.checkpoints if h < d <= n]
    depths += [d for d in order.capture if n < d <= total]
    depths += [total] if order.keep_final else []
    states = {}
    for d in depths:
        states[d] = ids[0]
        ids[0] += 1
    count = max(0, max(states, default=h) - h)
    slots = np.arange(ids[0], ids[0] + count, dtype=np.int64)
    ids[0] += count
    timings = Timings(0.0, 0.0, 0.0, 0.0)
    return Finished(order.request_id, tuple(out.tolist()), "length", states, slots, timings)


class World:
    """A coordinator, its replicas' sessions, open plans and a random driver."""

    def __init__(self, model_dir: Path, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.clock = Clock()
        self.settings = ServeSettings(
            model_dir=str(model_dir),
            model_name="tiny",
            cache_bytes=25_000,  # ~400 tokens of KV at 64 bytes: evictions
            alpha=1.0,
            # admission kinds that keep states differently: branch points and last
            # tokens, speculative ones, every block, blocks refilled in place
            system=SYSTEMS[seed % len(SYSTEMS)],
            lease_s=LEASE_S,
            max_batch=2,
            max_queued_requests=int(self.rng.choice([-1, 1, 3])),
            route_max_imbalance=int(self.rng.integers(0, 3)),
            route_load_weight=float(self.rng.choice([0.0, 8.0, 256.0])),
        )
        self.journal = MemoryJournal()
        self.coord = CacheCoordinator(self.settings, self.journal, clock=self.clock)
        self.histories: list[np.ndarray] = []
        self.open: list[Dispatch] = []
        self.ids = [0]
        self.names = [f"r{i}" for i in range(6)]
        for rid in self.names[:4]:
            self.coord.register_replica(rid, 64, 1024)

    def prompt(self) -> np.ndarray:
        r = self.rng
        fresh = r.integers(*ALPHABET, int(r.integers(1, 24))).astype(np.int32)
        if not self.histories or r.random() < 0.2:
            return fresh
        h = self.histories[int(r.integers(len(self.histories)))]
        kind = r.random()
        if kind < 0.4:
            return np.concatenate([h, fresh])  # the next turn
        cut = int(r.integers(1, len(h) + 1))
        return h[:cut] if kind < 0.7 else np.concatenate([h[:cut], fresh])

    def commit(self, d: Dispatch) -> None:
        done = finish(d.order, self.rng, self.ids)
        self.coord.commit(d.replica_id, done)
        self.histories.append(np.concatenate([d.order.prompt, np.asarray(done.tokens, np.int32)]))

    def step(self) -> str:
        c, r = self.coord, self.rng
        roll = r.random()
        if roll < 0.55:
            try:
                d = c.plan(self.prompt(), PARAMS)
            except (NoReplicaAvailable, Overloaded):
                return "refused"
            if r.random() < 0.6:
                self.commit(d)
            else:
                self.open.append(d)
            return "plan"
        if roll < 0.7 and self.open:
            d = self.open.pop(int(r.integers(len(self.open))))
            if r.random() < 0.8:
                self.commit(d)
            else:
                c.abandon(d)
            return "close"
        rid = self.names[int(r.integers(len(self.names)))]
        if roll < 0.76:
            c.unregister_replica(rid)
            return "unregister"
        if roll < 0.84:
            c.register_replica(rid, 64, 1024)  # new, or known: confirmed again
            return "register"
        if roll < 0.88 and rid in c.replica_info:
            c.state.set_confirmed(rid, False)
            return "unconfirm"
        if roll < 0.93:
            if roll < 0.91:  # as `recover` restores a snapshot: unconfirmed, seen now
                c.state.restore(c.state.to_record())
                for info in c.replica_info.values():
                    info.last_seen = self.clock.now
                kind = "restore"
            else:
                self.coord = CacheCoordinator(self.settings, self.journal, clock=self.clock)
                kind = "recover"
            for rid in list(self.coord.replica_info):
                if r.random() < 0.7:
                    self.coord.register_replica(rid, 64, 1024)  # confirms it
            return kind
        self.clock.now += float(r.uniform(0, LEASE_S))
        for rid in list(c.replica_info):
            if r.random() < 0.7:
                live = [d.order.request_id for d in self.open if d.replica_id == rid]
                c.heartbeat(rid, live)
        return "time"

    def check_expiry(self) -> None:
        c, now = self.coord, self.clock.now
        grace = self.settings.lease_s * LEASE_GRACE
        assert c.leases.expired(now, grace) == c.leases.scan_expired(now, grace)
        scan = [r for r, i in c.replica_info.items() if now - i.last_seen > LEASE_S]
        assert c.state.routing.silent(c.replica_info, now, LEASE_S) == scan

    def check_routing(self, prompts: int) -> None:
        state, s = self.coord.state, self.settings
        for name in ROUTERS:
            router = make_router(name, s)
            if name == "round_robin":
                router.calls = int(self.rng.integers(0, 50))  # type: ignore[attr-defined]
            for _ in range(prompts):
                p = self.prompt()
                ref = copy.deepcopy(router)
                try:
                    want: object = choose_replica_reference(state, ref, s, p)
                except (NoReplicaAvailable, Overloaded) as exc:
                    want = type(exc)
                try:
                    got: object = choose_replica(state, router, s, p)
                except (NoReplicaAvailable, Overloaded) as exc:
                    got = type(exc)
                assert got == want, (name, p.tolist())


@pytest.mark.parametrize("seed", range(5))
def test_indexed_routing_equals_the_reference(model_dir: Path, seed: int) -> None:
    world = World(model_dir, seed)
    seen: set[str] = set()
    for i in range(260):
        seen.add(world.step())
        world.coord.check_invariants()
        world.check_expiry()
        if i % 4 == 0:
            world.check_routing(prompts=6)
    assert {"plan", "close", "restore", "recover", "unregister", "time"} <= seen


def test_states_reach_the_index_and_leave_with_their_release(model_dir: Path) -> None:
    """Sessions spread over replicas, a small cache evicts: every state the trees hold
    is indexed and nothing else, and a continued session is routed to its holder."""
    world = World(model_dir, 11)
    for _ in range(120):
        d = world.coord.plan(world.prompt(), PARAMS)
        world.commit(d)
        world.coord.check_invariants()
    index = world.coord.state.routing.index
    assert len(index) == sum(len(p.cache.referenced()[0]) for p in world.coord.planners.values())
    assert sum(p.cache.stats.evictions for p in world.coord.planners.values()) > 0
