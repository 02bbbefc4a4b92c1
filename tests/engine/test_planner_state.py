"""Planner (and bootstrap tuner) state: a planner rebuilt from `to_record` mid-run, with
requests in flight, plans, commits, aborts and tunes exactly as the original does."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pytest

from marconi_ray.core import wire
from marconi_ray.core.cache.invariants import check_tree
from marconi_ray.core.cache.tuner import BootstrapTuner, TuneJob, TunerConfig, TuneResult
from marconi_ray.protocol.orders import Finished, PrefillOrder, Release
from marconi_ray.protocol.planner import Planner
from marconi_ray.protocol.results import Timings
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.traces.registry import load_sample

SAMPLE = [(r.input_tokens, r.output_tokens) for r in load_sample()]  # real ShareGPT turns
NO_TIME = Timings(0.0, 0.0, 0.0, 0.0)
TUNING = TunerConfig(multiplier=2, grid=(0.0, 0.5, 1.0, 2.0), retune_every=12)

Op = tuple[Any, ...]


def planner_for(system: str, capacity: int = 60_000, **kw: Any) -> Planner:
    return Planner.for_system(
        system, (1000.0, 1.0), 10, 100, capacity, max_position=4096, tuner=TUNING, **kw
    )


def make_ops(n_requests: int, seed: int, max_open: int = 6) -> list[Op]:
    """("order", request, max_tokens), ("commit", open index, output tokens) or
    ("abort", open index, whether the worker had finished it)."""
    rng = np.random.default_rng(seed)
    ops: list[Op] = []
    n_open = nxt = 0
    while nxt < n_requests or n_open:
        if nxt < n_requests and (n_open == 0 or (n_open < max_open and rng.random() < 0.6)):
            ops.append(("order", nxt, int(rng.integers(1, 300))))
            nxt += 1
            n_open += 1
        else:
            pos = int(rng.integers(n_open))
            if rng.random() < 0.15:
                ops.append(("abort", pos, bool(rng.random() < 0.5)))
            else:
                ops.append(("commit", pos, int(rng.integers(1, 300))))
            n_open -= 1
    return ops


def cut_point(ops: list[Op], min_open: int = 3) -> int:
    n_open = 0
    for i, op in enumerate(ops):
        if i >= len(ops) // 2 and n_open >= min_open:
            return i
        n_open += 1 if op[0] == "order" else -1
    raise AssertionError("no cut point")


def release_view(release: Release) -> tuple[Any, ...]:
    return release.states, release.slots.tobytes()


def order_view(order: PrefillOrder) -> tuple[Any, ...]:
    return (
        order.request_id,
        order.prompt.tobytes(),
        order.max_new,
        order.hit_len,
        order.hit_state,
        order.hit_slots.tobytes(),
        order.checkpoints,
        order.capture,
        order.keep_final,
    )


@dataclass
class Driver:
    """A planner plus a deterministic stand-in for the worker (state and KV slot ids)."""

    planner: Planner
    open: list[tuple[PrefillOrder, int]] = field(default_factory=list)
    next_rid: int = 100
    next_state: int = 0
    next_kv: int = 0

    def rebind(self, planner: Planner) -> Driver:
        return replace(self, planner=planner, open=list(self.open))

    def finish(self, order: PrefillOrder, request: int, n_out: int) -> Finished:
        output = SAMPLE[request][1][: min(n_out, order.max_new)]
        tokens = tuple(int(t) for t in output) or (7,)
        total = len(order.prompt) + len(tokens)
        depths = [*order.checkpoints, *(d for d in order.capture if d <= total)]
        depths += [total] if order.keep_final else []
        state_ids = {d: self.next_state + i for i, d in enumerate(depths)}
        self.next_state += len(depths)
        n_kv = total - order.hit_len
        kv = np.arange(self.next_kv, self.next_kv + n_kv, dtype=np.int64)
        self.next_kv += n_kv
        return Finished(order.request_id, tokens, "length", state_ids, kv, NO_TIME)

    def apply(self, op: Op) -> tuple[Any, ...]:
        if op[0] == "order":
            prompt = SAMPLE[op[1]][0]
            order, release = self.planner.order(
                self.next_rid, prompt, SamplingParams(max_tokens=op[2])
            )
            self.next_rid += 1
            self.open.append((order, op[1]))
            return "order", order_view(order), release_view(release)
        order, request = self.open.pop(op[1])
        if op[0] == "abort":
            done = self.finish(order, request, 5) if op[2] else None
            return "abort", release_view(self.planner.abort(order.request_id, done))
        return "commit", release_view(self.planner.commit(self.finish(order, request, op[2])))


def state_view(planner: Planner) -> dict[str, Any]:
    """The planner's full state, less the tuner's wall-clock times."""
    state = planner.to_record()
    if state["tuner"] is not None:
        for result in state["tuner"]["history"]:
            result["wall_s"] = 0.0
    return state


@pytest.mark.parametrize("system", ["marconi", "sglang+", "vllm+", "vanilla"])
def test_restored_planner_behaves_exactly_like_the_original(system: str):
    ops = make_ops(120, seed=11)
    cut = cut_point(ops)
    original = Driver(planner_for(system))
    for op in ops[:cut]:
        original.apply(op)
    assert original.planner.open_requests >= 3
    data = wire.pack(original.planner.to_record())
    planner = Planner.from_record(wire.unpack(data))
    check_tree(planner.cache.tree)
    assert wire.pack(planner.to_record()) == data
    assert planner.open_requests == original.planner.open_requests
    assert planner.caching == original.planner.caching and planner.max_position == 4096
    restored = original.rebind(planner)
    tunes_at_cut = 0 if planner.tuner is None else len(planner.tuner.history)
    for op in ops[cut:]:
        assert restored.apply(op) == original.apply(op), op
    assert state_view(restored.planner) == state_view(original.planner)
    assert restored.planner.open_requests == 0
    if system != "vanilla":
        assert original.planner.cache.stats.evictions > 0
    if system == "marconi":
        assert original.planner.tuner is not None
        assert len(original.planner.tuner.history) > tunes_at_cut
        assert restored.planner.cache.alpha == original.planner.cache.alpha


def test_tune_jobs_of_a_restored_planner_match():
    """With the serve layer's hand-off (jobs go out, results come back later): the same
    jobs come out at the same time, and adopting the same results keeps both in step."""
    jobs: list[TuneJob] = []
    copies: list[TuneJob] = []

    def step(driver: Driver, op: Op, handed: list[TuneJob], seen: int) -> tuple[Any, ...]:
        out = driver.apply(op)
        tuner = driver.planner.tuner
        if len(handed) > seen and tuner is not None:  # the tuner actor answers
            alpha = 0.5 * (len(tuner.history) % 3)
            driver.planner.adopt(TuneResult(alpha, ((alpha, 0.1),), 3, 4, 0.5))
        return out

    ops = make_ops(120, seed=5)
    cut = cut_point(ops)
    original = Driver(planner_for("marconi", capacity=20_000, on_tune_job=jobs.append))
    for op in ops[:cut]:
        step(original, op, jobs, len(jobs))
    state = wire.unpack(wire.pack(original.planner.to_record()))
    restored = original.rebind(Planner.from_record(state, on_tune_job=copies.append))
    n_before = len(jobs)
    for op in ops[cut:]:
        theirs = step(restored, op, copies, len(copies))
        assert theirs == step(original, op, jobs, len(jobs))
        assert len(copies) == len(jobs) - n_before  # handed out at the same time
    assert n_before and copies, "no tuning job in one of the halves"
    for a, b in zip(jobs[n_before:], copies, strict=True):
        assert a.snapshot == b.snapshot and a.start_request == b.start_request
        assert a.grid == b.grid and len(a.window) == len(b.window)
        for (x_in, x_out), (y_in, y_out) in zip(a.window, b.window, strict=True):
            assert np.array_equal(x_in, y_in) and np.array_equal(x_out, y_out)
    assert state_view(restored.planner) == state_view(original.planner)


def test_a_pending_tuner_waits_for_adopt_after_restore():
    tuner = BootstrapTuner(TunerConfig(multiplier=1, grid=(0.0, 1.0)))
    planner = planner_for("marconi", capacity=20_000, on_tune_job=lambda job: None)
    planner.tuner = tuner
    driver = Driver(planner)
    for op in make_ops(40, seed=2):
        driver.apply(op)
        if tuner.pending:
            break
    assert tuner.pending
    restored = Planner.from_record(planner.to_record())
    assert restored.tuner is not None and restored.tuner.phase == "tuning"
    restored.adopt(TuneResult(2.0, ((2.0, 1.0),), 1, 1, 0.0))
    assert restored.cache.alpha == 2.0 and restored.tuner.phase == "done"


@pytest.fixture(scope="module")
def recording() -> Planner:
    """A marconi planner with requests in flight and a tuner recording a window."""
    driver = Driver(planner_for("marconi", capacity=20_000))
    tuner = driver.planner.tuner
    assert tuner is not None
    for op in make_ops(60, seed=4):
        driver.apply(op)
        if driver.planner.open_requests >= 2 and len(tuner.window) >= 2:
            break
    assert driver.planner.open_requests >= 2 and tuner.phase == "recording"
    return driver.planner


BAD_EDITS: dict[str, tuple[Any, str]] = {
    "kind": (lambda s: s.update(kind="cache"), "kind"),
    "dropped request": (lambda s: s["requests"].pop(), "one to one"),
    "request twice": (lambda s: s["requests"].append(list(s["requests"][0])), "twice"),
    "plan not open": (lambda s: s["requests"][0].__setitem__(1, 10**6), "not open"),
    "same plan": (lambda s: s["requests"][1].__setitem__(1, s["requests"][0][1]), "one to one"),
    "pair": (lambda s: s["requests"].append(7), "pair"),
    "max_position": (lambda s: s.update(max_position=0), "max_position"),
    "cache": (lambda s: s["cache"].update(version=9), "version"),
    "tuner version": (lambda s: s["tuner"].update(version="1"), "version"),
    "grid": (lambda s: s["tuner"]["config"].update(grid=[]), "grid"),
    "objective": (lambda s: s["tuner"]["config"].update(objective="x"), "objective"),
    "snapshot type": (lambda s: s["tuner"].update(snapshot="x"), "snapshot"),
    "no snapshot": (lambda s: s["tuner"].update(snapshot=None), "without its snapshot"),
    "window item": (lambda s: s["tuner"].update(window=[[1, 2]]), r"window\[0\]\[0\]"),
    "window dtype": (
        lambda s: s["tuner"]["window"][0][1].update(dtype="<i8"),
        r"window\[0\]\[1\]: expected dtype",
    ),
    "pending": (lambda s: s["tuner"].update(pending=True), "pending"),
    "history": (lambda s: s["tuner"].update(history=[{"best_alpha": 1.0}]), "missing"),
}


@pytest.mark.parametrize("name", list(BAD_EDITS))
def test_malformed_planner_state_is_a_value_error(recording: Planner, name: str):
    edit, message = BAD_EDITS[name]
    state = recording.to_record()
    edit(state)
    with pytest.raises(ValueError, match=message):
        Planner.from_record(state)
    with pytest.raises(ValueError, match=message):
        Planner.from_record(wire.unpack(wire.pack(state)))
    assert Planner.from_record(recording.to_record()).open_requests == recording.open_requests


def test_tuner_state_round_trip():
    tuner = BootstrapTuner(TUNING)
    planner = planner_for("marconi", capacity=20_000)
    planner.tuner = tuner
    driver = Driver(planner)
    for op in make_ops(60, seed=9):
        driver.apply(op)
    assert tuner.history and tuner.window and tuner.snapshot is not None
    copy = BootstrapTuner.from_record(wire.unpack(wire.pack(tuner.to_record())))
    assert copy.to_record() == tuner.to_record()
    assert copy.history == tuner.history and copy.config == tuner.config
    assert all(
        np.array_equal(a, c) and np.array_equal(b, d)
        for (a, b), (c, d) in zip(copy.window, tuner.window, strict=True)
    )


def test_a_commit_that_fails_midway_returns_exactly_what_the_tree_did_not_keep() -> None:
    """A failure inside the cache's commit (here: setting the second state, after the
    tree took the first and added a node for the second) must not leak or double-free:
    the release holds what planning and the failed commit evicted plus the request's
    states and slots the tree did not keep."""
    planner = planner_for("marconi", capacity=10**9)
    planner.cache.serve(np.arange(1, 41, dtype=np.int32), np.zeros(0, np.int32))
    prompt = np.asarray([*range(1, 21), *range(100, 120)], dtype=np.int32)
    order, _ = planner.order(0, prompt, SamplingParams(max_tokens=4))
    assert order.hit_len == 0 and order.checkpoints == (20,)
    cache = planner.cache
    real_set = cache.tree._set_state
    calls = [0]

    def set_then_fail(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 2:
            raise MemoryError("injected")
        return real_set(*args, **kwargs)

    cache.tree._set_state = set_then_fail  # type: ignore[method-assign]
    slots = np.arange(43, dtype=np.int64) + 900
    done = Finished(0, (7, 8, 9), "stop", {20: 500, 43: 501}, slots, NO_TIME)
    before = {int(n.state) for n in cache.tree.iter_nodes() if n.state >= 0}
    release = planner.commit(done)
    assert calls[0] == 2
    held = {int(n.state) for n in cache.tree.iter_nodes() if n.state >= 0}
    kept_slots = {int(s) for n in cache.tree.iter_nodes() if n.kv is not None for s in n.kv}
    assert held == before | {500}
    assert set(release.states) == {501}
    assert set(release.slots.tolist()) | kept_slots == set(range(900, 943))
    assert not set(release.slots.tolist()) & kept_slots
    assert cache.open_plans == 0 and cache.locked_nodes() == 0 and cache.stats.requests == 1
    check_tree(cache.tree)
