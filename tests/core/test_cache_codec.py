"""The pickle-free cache codec: a round trip preserves everything observable, and a
restored cache (open plans included) behaves exactly as the original under the same
later plan/commit/abort operations; snapshots drop open plans; malformed input is a
ValueError."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import pytest
from core_helpers import SMALL_COST, cache, toks
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marconi_ray.core import wire
from marconi_ray.core.cache import cache_codec
from marconi_ray.core.cache.host_tier import HostTier
from marconi_ray.core.cache.invariants import check_tree
from marconi_ray.core.cache.prefix_cache import CacheConfig, Plan, PrefixCache
from marconi_ray.core.cache.tuner import TuneJob, run_grid
from marconi_ray.core.tree.tree_types import Reclaimed
from marconi_ray.traces.registry import load_sample

SAMPLE = [(r.input_tokens, r.output_tokens) for r in load_sample()]  # real ShareGPT turns

Op = tuple[Any, ...]


def make_ops(n_requests: int, seed: int, max_open: int = 6) -> list[Op]:
    """A fixed interleaving: ("plan", request, max_output|None), ("commit", open index,
    output tokens kept) or ("abort", open index); indices refer to the open-plan list."""
    rng = np.random.default_rng(seed)
    ops: list[Op] = []
    n_open = 0
    nxt = 0
    while nxt < n_requests or n_open:
        if nxt < n_requests and (n_open == 0 or (n_open < max_open and rng.random() < 0.55)):
            max_out = None if rng.random() < 0.2 else int(rng.integers(1, 200))
            ops.append(("plan", nxt, max_out))
            nxt += 1
            n_open += 1
        else:
            pos = int(rng.integers(n_open))
            if rng.random() < 0.15:
                ops.append(("abort", pos))
            else:
                ops.append(("commit", pos, int(rng.integers(0, 200))))
            n_open -= 1
    return ops


def cut_point(ops: list[Op], min_open: int = 3) -> int:
    """The first op index past the middle with at least `min_open` plans open before it."""
    n_open = 0
    for i, op in enumerate(ops):
        if i >= len(ops) // 2 and n_open >= min_open:
            return i
        n_open += 1 if op[0] == "plan" else -1
    raise AssertionError("no cut point")


def _kv_bytes(handles: Any) -> tuple[Any, ...]:
    return tuple(None if h is None else np.asarray(h, np.int64).tobytes() for h in handles)


def freed_view(freed: Reclaimed) -> tuple[Any, ...]:
    moves = tuple((m.to_host, m.states, _kv_bytes(m.kv), m.n_bytes) for m in freed.moves)
    return tuple(freed.states), _kv_bytes(freed.kv), freed.n_tokens, moves


def plan_view(plan: Plan) -> tuple[Any, ...]:
    return (
        plan.plan_id,
        plan.tokens.tobytes(),
        plan.hit_len,
        plan.hit_node.slot,
        plan.checkpoints,
        plan.reserved,
        plan.host_tokens,
        plan.host_bytes,
    )


@dataclass
class Driver:
    """Applies ops to one cache; kv mode commits KV slot ids and state ids like the
    engine does, else the cache numbers states (simulation)."""

    cache: PrefixCache
    requests: list[tuple[np.ndarray, np.ndarray]]
    kv_mode: bool
    open: list[tuple[Plan, int]] = field(default_factory=list)  # (plan, request index)
    next_kv: int = 0
    next_state: int = 10_000

    def rebind(self, other: PrefixCache) -> Driver:
        """The same driver over a restored copy: its open plans are the copy's."""
        plans = [(other.get_plan(p.plan_id), i) for p, i in self.open]
        return Driver(other, self.requests, self.kv_mode, plans, self.next_kv, self.next_state)

    def apply(self, op: Op) -> tuple[Any, ...]:
        c = self.cache
        if op[0] == "plan":
            inp, _ = self.requests[op[1]]
            plan = c.plan(inp, max_output=op[2])
            self.open.append((plan, op[1]))
            return ("plan", plan_view(plan), freed_view(plan.freed))
        plan, request = self.open.pop(op[1])
        if op[0] == "abort":
            return ("abort", plan.plan_id, freed_view(c.abort(plan)))
        inp, out = self.requests[request]
        full = np.concatenate([inp, out[: op[2]]])
        if self.kv_mode:
            depths = [d for d, _ in c.checkpoints(plan, len(full))]
            ids = {d: self.next_state + i for i, d in enumerate(depths)}
            self.next_state += len(depths)
            n_kv = len(full) - plan.hit_len
            kv = np.arange(self.next_kv, self.next_kv + n_kv, dtype=np.int64)
            self.next_kv += n_kv
            result = c.commit(plan, full, ids, kv=kv, kv_start=plan.hit_len)
        else:
            result = c.commit(plan, full)
        return (
            "commit",
            plan.plan_id,
            result.admitted,
            result.rejected_states,
            freed_view(result.freed),
            result.dropped,
        )


def observe(c: PrefixCache) -> dict[str, Any]:
    """Everything observable about a cache, as comparable values."""
    table = c.tree.table
    nodes = [
        (
            n.slot,
            -1 if n.parent is None else n.parent.slot,
            n.depth,
            n.edge.tobytes(),
            None if n.kv is None else np.asarray(n.kv, np.int64).tobytes(),
            n.state,
            n.lock,
            float(table.last_access[n.slot]),
            None if n.host is None else n.host.tobytes(),
            n.state_host,
        )
        for n in c.tree.iter_nodes()
    ]
    return {
        "nodes": nodes,
        "n_slots": table.n_slots,
        "free": list(table._free),
        "bytes_used": c.bytes_used,
        "bytes_by_tier": c.bytes_by_tier(),
        "bytes_by_kind": c.bytes_by_kind(),
        "reserved": c.reserved,
        "clock": c.clock,
        "stats": c.stats.to_dict(),
        "alpha": c.alpha,
        "config": c.config,
        "cost": c.cost,
        "open": {pid: plan_view(c.get_plan(pid)) for pid in sorted(c._open)},
        "next": (c._next_plan, c._next_state),
        "reasons": dict(c.reasons),
        "hit_once": set(c.hit_once),
        "admission_state": c.admission.state(),
    }


POLICIES = [
    dict(admission="marconi", eviction="flop_aware", alpha=1.5),
    dict(admission="marconi", eviction="lru"),
    dict(admission="fine_grained:64", eviction="flop_aware", recency="inverse_age", alpha=0.5),
    dict(admission="marconi+:32", eviction="flop_aware", alpha=1.0),
    dict(admission="fine_grained_refill:48", eviction="lru"),
    dict(
        admission="marconi",
        eviction="flop_aware",
        alpha=1.0,
        host=HostTier(40_000, prefill_tflops=2.5),
    ),
    dict(admission="marconi+:32", eviction="lru", host=HostTier(25_000, placement="lru")),
]


@pytest.mark.parametrize("kv_mode", [False, True])
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: f"{p['admission']}-{p['eviction']}")
def test_restored_cache_behaves_exactly_like_the_original(policy: dict[str, Any], kv_mode: bool):
    """The key property: snapshot mid-run (plans open), then the same later operations,
    including commits and aborts of the plans open at snapshot time, give identical
    plans, commit results, evictions and stats."""
    ops = make_ops(120, seed=7)
    cut = cut_point(ops)
    original = Driver(cache(capacity=60_000, **policy), SAMPLE, kv_mode)
    for op in ops[:cut]:
        original.apply(op)
    assert len(original.open) >= 3
    data = cache_codec.dumps(original.cache)
    restored_cache = cache_codec.loads(data)
    check_tree(restored_cache.tree)
    assert observe(restored_cache) == observe(original.cache)
    assert cache_codec.dumps(restored_cache) == data  # the round trip is exact
    restored = original.rebind(restored_cache)
    open_at_cut = {p.plan_id for p, _ in original.open}
    evictions_at_cut = original.cache.stats.evictions
    closed = set()
    for op in ops[cut:]:
        if op[0] != "plan":
            closed.add(original.open[op[1]][0].plan_id)
        assert restored.apply(op) == original.apply(op), op
    assert open_at_cut <= closed
    assert original.cache.stats.evictions > evictions_at_cut
    assert observe(restored.cache) == observe(original.cache)
    check_tree(restored.cache.tree)


def test_snapshot_is_the_cache_with_its_open_plans_aborted():
    driver = Driver(cache(capacity=60_000, alpha=1.0), SAMPLE, kv_mode=True)
    ops = make_ops(60, seed=3)
    for op in ops[: cut_point(ops)]:
        driver.apply(op)
    c = driver.cache
    assert c.open_plans >= 2 and c.reserved > 0
    snap = cache_codec.restore(cache_codec.snapshot(c))
    assert snap.open_plans == 0 and snap.reserved == 0
    assert all(n.lock == 0 for n in snap.tree.iter_nodes())
    check_tree(snap.tree)
    aborted = cache_codec.loads(cache_codec.dumps(c))
    for pid in list(aborted._open):
        aborted.abort(aborted.get_plan(pid))
    assert observe(snap) == observe(aborted)
    assert cache_codec.snapshot(aborted) == cache_codec.snapshot(c)
    assert c.open_plans >= 2  # taking a snapshot changes nothing
    assert any(n.lock for n in c.tree.iter_nodes())


def test_a_snapshot_copy_does_not_pin_what_open_plans_hold():
    """The tuner replays other requests on a snapshot: a node locked by a plan that was
    open when it was taken must be evictable there."""
    c = cache(capacity=1_700, eviction="lru")
    c.serve(toks(1, 2, 3, 4, 5), toks(6))  # 6 KV tokens + a state: 160 bytes
    plan = c.plan(toks(1, 2, 3, 4, 5, 6, 7))
    assert plan.hit_len == 6
    copy_ = cache_codec.restore(cache_codec.snapshot(c))
    hit = copy_.tree.match(toks(1, 2, 3, 4, 5, 6)).hit_node
    assert hit.lock == 0 and copy_.tree.table.evictable[hit.slot]
    assert not c.tree.table.evictable[plan.hit_node.slot]
    big = np.arange(100, 250, dtype=np.int32)  # 151 KV tokens + a state: 1610 bytes
    copy_.serve(big, toks(1))
    assert copy_.lookup(toks(1, 2, 3, 4, 5, 6, 7)) == 0
    c.serve(big, toks(1))
    assert c.lookup(toks(1, 2, 3, 4, 5, 6, 7)) == 6  # still pinned by the open plan


def test_simulated_and_kv_handles_round_trip():
    c = cache()
    c.serve(toks(1, 2, 3, 4), toks(5))  # kv None
    plan = c.plan(toks(1, 2, 3, 9, 9))
    c.commit(plan, toks(1, 2, 3, 9, 9, 8), {3: 50, 6: 51}, kv=np.arange(6), kv_start=0)
    restored = cache_codec.loads(cache_codec.dumps(c))
    assert observe(restored) == observe(c)
    kinds = {n.kv is None for n in restored.tree.iter_nodes() if n is not restored.tree.root}
    assert kinds == {True, False}
    check_tree(restored.tree)


def test_state_is_plain_data():
    c = cache()
    c.serve(toks(1, 2, 3), toks(4))
    c.plan(toks(1, 2, 3, 4, 5), max_output=3)
    state = cache_codec.to_record(c)

    def walk(x: object) -> None:
        if isinstance(x, dict):
            assert all(isinstance(k, str) for k in x)
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
        else:
            assert x is None or type(x) in (int, float, str, bytes, bool), type(x)

    walk(state)
    assert state["version"] == wire.SCHEMA_VERSION
    assert state["tree"]["edges"]["dtype"] == "<i4"
    assert cache_codec.from_record(copy.deepcopy(state)).open_plans == 1


def test_a_deep_chain_round_trips_without_recursion():
    c = cache(admission="fine_grained:1", eviction="lru")
    seq = np.arange(50_000, dtype=np.int32) % 7 + 1
    c.serve(seq, toks(3))
    plan = c.plan(np.concatenate([seq[:40_000], toks(9)]))  # an open plan deep down
    assert len(c.tree.nodes) > 50_000 and plan.hit_len == 40_000
    restored = cache_codec.loads(cache_codec.dumps(c))
    check_tree(restored.tree)
    assert observe(restored) == observe(c)
    restored.abort(restored.get_plan(plan.plan_id))
    assert restored.lookup(seq[:45_000]) == 45_000


def test_restored_cache_can_tune():
    """Tuner jobs replay msgpack snapshots (no pickle)."""
    c = cache(capacity=30_000)
    for inp, out in SAMPLE[:10]:
        c.serve(inp[:300], out[:20])
    window = tuple((inp[:300], out[:20]) for inp, out in SAMPLE[10:30])
    result = run_grid(TuneJob(cache_codec.snapshot(c), window, (0.0, 1.0), "token_hit_rate", 0))
    assert result.best_alpha in (0.0, 1.0) and c.stats.requests == 10


# ----------------------------------------------------------------- bad input
@pytest.fixture(scope="module")
def small() -> PrefixCache:
    c = cache(capacity=5_000)
    for inp, out in SAMPLE[:4]:
        c.serve(inp[:60], out[:5])
    c.plan(SAMPLE[4][0][:70], max_output=5)
    c.plan(SAMPLE[0][0][:50])
    return c


def test_truncated_or_padded_bytes(small: PrefixCache):
    data = cache_codec.dumps(small)
    for cut in (0, 1, 7, len(data) // 3, len(data) // 2, len(data) - 1):
        with pytest.raises(ValueError, match="malformed"):
            cache_codec.loads(data[:cut])
    with pytest.raises(ValueError, match="trailing"):
        cache_codec.loads(data + b"\x00")
    with pytest.raises(ValueError, match="expected bytes"):
        cache_codec.loads("not bytes")  # type: ignore[arg-type]


def test_limits(small: PrefixCache):
    data = cache_codec.dumps(small)
    with pytest.raises(ValueError, match="over the limit"):
        cache_codec.loads(data, max_bytes=len(data) - 1)
    assert cache_codec.loads(data, max_bytes=len(data)).open_plans == 2
    huge_bin = b"\xc6" + (1 << 31).to_bytes(4, "big") + b"x" * 16  # declares 2 GiB
    with pytest.raises(ValueError, match="malformed"):
        cache_codec.loads(huge_bin, max_bytes=1_000)
    huge_array = b"\xdd" + (1 << 31).to_bytes(4, "big")
    with pytest.raises(ValueError, match="max_array_len"):
        cache_codec.loads(huge_array, max_bytes=1_000)
    with pytest.raises(ValueError, match="max_ext_len"):
        cache_codec.loads(msgpack.packb(msgpack.ExtType(1, b"pickle")))
    with pytest.raises(ValueError, match="map key"):
        cache_codec.loads(msgpack.packb({1: 2}))
    with pytest.raises(ValueError, match="expected a map"):
        cache_codec.loads(msgpack.packb([1, 2]))


def _edited(c: PrefixCache, edit: Any) -> dict[str, Any]:
    state = cache_codec.to_record(c)
    edit(state)
    return state


def _set_column(state: dict[str, Any], name: str, fn: Any) -> None:
    col = state["tree"][name]
    arr = np.frombuffer(col["data"], dtype=col["dtype"]).copy()
    fn(arr)
    col["data"] = arr.tobytes()


def _set_key(path: tuple[Any, ...], value: Any) -> Any:
    def edit(state: dict[str, Any]) -> None:
        target = state
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit


def _del_key(key: str) -> Any:
    return lambda state: state.pop(key)


BAD_EDITS = {
    "version": (_set_key(("version",), 2), "version"),
    "kind": (_set_key(("kind",), "planner"), "kind"),
    "missing": (_del_key("clock"), "missing key"),
    "unknown": (_set_key(("extra",), 1), "unknown key"),
    "clock type": (_set_key(("clock",), "now"), r"cache\.clock: expected a number"),
    "bool as int": (_set_key(("next_plan",), True), r"cache\.next_plan: expected int"),
    "nan": (_set_key(("clock",), float("nan")), "finite"),
    "negative stat": (_set_key(("stats", "requests"), -1), r"stats\.requests"),
    "reasons": (_set_key(("stats", "states_admitted", "weird"), 1), "unknown key"),
    "policy": (_set_key(("config", "eviction"), "fifo"), "unknown eviction"),
    "capacity": (_set_key(("config", "capacity_bytes"), 0), "capacity_bytes"),
    "dtype": (_set_key(("tree", "parent", "dtype"), "<i4"), r"tree\.parent: expected dtype"),
    "ragged": (_set_key(("tree", "state", "data"), b"\x00" * 7), "whole number"),
    "array type": (_set_key(("tree", "slot"), [1, 2]), r"tree\.slot: expected a map"),
    "parent self": (lambda s: _set_column(s, "parent", _put(3, 3)), "parent index"),
    "parent forward": (lambda s: _set_column(s, "parent", _put(2, 9)), "parent index"),
    "parent none": (lambda s: _set_column(s, "parent", _put(4, -1)), "parent index"),
    "root parent": (lambda s: _set_column(s, "parent", _put(0, 0)), "root"),
    "slot twice": (lambda s: _set_column(s, "slot", _put(2, 1, src=1)), "slots"),
    "n_slots": (_set_key(("tree", "n_slots"), 10**12), "n_slots"),
    "extra lock": (lambda s: _set_column(s, "lock", _add(1)), "lock"),
    "state twice": (lambda s: _set_column(s, "state", _dup_state), "state id"),
    "edge len": (lambda s: _set_column(s, "edge_len", _add(1)), "edge"),
    "has_kv": (lambda s: _set_column(s, "has_kv", _put(1, 2)), "has_kv"),
    "plan dropped": (lambda s: s["plans"].pop(), "lock"),
    "plan hit index": (_set_key(("plans", 0, "hit_node"), 10**6), "hit_node"),
    "plan hit_len": (_set_key(("plans", 0, "hit_len"), 1), "hit_len"),
    "plan reason": (_set_key(("plans", 0, "checkpoints"), [[999, "why"]]), "checkpoints"),
    "plan tokens": (_set_key(("plans", 0, "tokens", "data"), b""), "tokens"),
    "plan id": (_set_key(("plans", 1, "plan_id"), 99), "next_plan"),
    "reserved": (_set_key(("reserved",), 1), "reserved"),
}


def _put(i: int, value: int, src: int | None = None) -> Any:
    def fn(arr: np.ndarray) -> None:
        arr[i] = arr[src] if src is not None else value

    return fn


def _add(i: int) -> Any:
    def fn(arr: np.ndarray) -> None:
        arr[i] += 1

    return fn


def _dup_state(arr: np.ndarray) -> None:
    held = np.flatnonzero(arr >= 0)
    arr[held[1]] = arr[held[0]]


@pytest.mark.parametrize("name", list(BAD_EDITS))
def test_malformed_state_is_a_value_error(small: PrefixCache, name: str):
    edit, message = BAD_EDITS[name]
    state = _edited(small, edit)
    with pytest.raises(ValueError, match=message):
        cache_codec.from_record(state)
    with pytest.raises(ValueError, match=message):
        cache_codec.loads(wire.pack(state))


def test_sibling_collision_is_named():
    c = cache()
    c.serve(toks(1, 2, 3), toks(4))
    c.serve(toks(1, 2, 5), toks(6))  # root -> [1 2] -> {[3 4], [5 6]}
    state = cache_codec.to_record(c)
    _set_column(state, "edges", lambda a: a.__setitem__(slice(None), np.where(a == 5, 3, a)))
    with pytest.raises(ValueError, match="two children keyed 3"):
        cache_codec.from_record(state)


def test_invariant_two_is_checked():
    c = cache()
    c.serve(toks(1, 2, 3), toks(4))
    c.serve(toks(1, 2, 5), toks(6))
    state = cache_codec.to_record(c)
    # drop the leaf [5 6] and the state of [1 2]: a state-less node with one child
    _set_column(state, "state", _put(1, -1))
    keep = np.array([0, 1, 2])
    tree = state["tree"]
    cols = {k: np.frombuffer(v["data"], v["dtype"]) for k, v in tree.items() if k != "n_slots"}
    for name in ("parent", "slot", "edge_len", "has_kv", "state", "lock", "last_access"):
        tree[name]["data"] = cols[name][keep].tobytes()
    tree["edges"]["data"] = cols["edges"][: int(cols["edge_len"][keep].sum())].tobytes()
    tree["free"]["data"] = np.append(cols["free"], cols["slot"][3]).tobytes()
    with pytest.raises(ValueError, match="< 2 children"):
        cache_codec.from_record(state)


def _leaves(x: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(x, dict):
        return [p for k, v in x.items() for p in _leaves(v, (*path, k))]
    if isinstance(x, list):
        return [p for i, v in enumerate(x) for p in _leaves(v, (*path, i))] or [path]
    return [path]


JUNK = [None, -1, 0, 1, 2**40, -(2**63), 1.5, float("inf"), "x", b"\x01\x02", [], {}, True]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_edit_is_a_value_error_or_a_valid_cache(small: PrefixCache, data: st.DataObject):
    """Fuzz: replace any leaf of the form by junk, or flip bytes of the encoding."""
    state = cache_codec.to_record(small)
    if data.draw(st.booleans()):
        paths = _leaves(state)
        path = paths[data.draw(st.integers(0, len(paths) - 1))]
        _set_key(path, data.draw(st.sampled_from(JUNK)))(state)
        encoded = wire.pack(state)
    else:
        encoded = bytearray(wire.pack(state))
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(0, len(encoded) - 1))
            encoded[i] = data.draw(st.integers(0, 255))
        encoded = bytes(encoded)
    try:
        restored = cache_codec.loads(encoded)
    except ValueError:
        return
    check_tree(restored.tree)
    assert restored.bytes_used == restored.tree.bytes_used


def test_cost_and_config_travel_with_the_cache():
    c = cache(capacity=1234, admission="fine_grained:8", eviction="flop_aware", alpha=0.3)
    c.set_alpha(0.7)
    restored = cache_codec.loads(cache_codec.snapshot(c))
    assert restored.cost == SMALL_COST and restored.config == c.config
    assert restored.alpha == 0.7 and restored.capacity == 1234


def test_numpy_scalars_become_plain_values():
    c = PrefixCache(SMALL_COST, CacheConfig(np.int64(10_000), alpha=np.float64(0.25)))
    plan = c.plan(toks(1, 2, 3), max_output=np.int64(2))
    c.commit(plan, toks(1, 2, 3, 4), {np.int64(4): np.int64(7)}, kv=np.arange(4, dtype=np.int32))
    c.plan(toks(1, 2, 3, 4, 5))
    data = cache_codec.dumps(c)
    assert cache_codec.dumps(cache_codec.loads(data)) == data
    assert observe(cache_codec.loads(data)) == observe(c)


@pytest.mark.parametrize("formula", ["freed", "paper", "artifact", "uniform"])
def test_the_efficiency_formula_round_trips_and_keeps_evicting_alike(formula: str):
    config = CacheConfig(20_000, "marconi", "flop_aware", 0.8, "timestamp", formula)
    c = PrefixCache(SMALL_COST, config)
    for inp, out in SAMPLE[:15]:
        c.serve(inp, out)
    copy_ = cache_codec.restore(cache_codec.snapshot(c))
    assert copy_.config == config and copy_.config.efficiency == formula
    assert copy_.eviction.efficiency == formula  # type: ignore[attr-defined]
    later = [c.serve(inp, out) for inp, out in SAMPLE[15:45]]
    assert [copy_.serve(inp, out) for inp, out in SAMPLE[15:45]] == later
    assert c.stats.evictions > 0 and copy_.stats.evictions == c.stats.evictions


def test_a_snapshot_from_before_the_efficiency_option_restores_as_freed():
    c = cache(capacity=5000, alpha=0.5)
    for inp, out in SAMPLE[:5]:
        c.serve(inp, out)
    record = cache_codec.to_record(c, open_plans=False)
    del record["config"]["efficiency"]  # type: ignore[index, union-attr]
    del record["stats"]["states_superseded"]  # type: ignore[index, union-attr]
    old = cache_codec.loads(wire.pack(record))
    assert old.config.efficiency == "freed" and old.stats.states_superseded == 0
    assert cache_codec.snapshot(old) == cache_codec.snapshot(c)


def test_an_unknown_efficiency_formula_in_a_snapshot_is_a_value_error():
    record = cache_codec.to_record(cache(capacity=5000))
    record["config"]["efficiency"] = "flops"  # type: ignore[index]
    with pytest.raises(ValueError, match="'flops'"):
        cache_codec.loads(wire.pack(record))
