"""Moves between replicas, the coordinator's side (`serve.coordinator.transfers`): the
journalled pin and import, their ends, and where requests run with roles or remote hits.
No Ray: a real `CacheCoordinator` over two real tiny-model `Worker`s, the entry moved
between their stores with the shards' own code (`replica.ticket_io`).

Every test ends with each store holding exactly what its tree refers to."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from coordinator_helpers import (
    GREEDY,
    LEASE,
    Clock,
    applied,
    apply,
    make_settings,
    make_worker,
    register,
    run_dispatch,
    tree_of,
)
from replica_harness import in_step

from marconi_ray.engine.presets.factory import make_model
from marconi_ray.engine.worker import Worker
from marconi_ray.protocol.orders import PrefillOrder
from marconi_ray.serve.coordinator.actor import CacheCoordinator
from marconi_ray.serve.coordinator.journal import MemoryJournal
from marconi_ray.serve.coordinator.leases import LEASE_GRACE
from marconi_ray.serve.coordinator.stall_watch import StallWatch
from marconi_ray.serve.disagg import DisaggSettings
from marconi_ray.serve.messages import Dispatch
from marconi_ray.serve.replica.ticket_io import export_ticket, import_ticket
from marconi_ray.serve.transfer_messages import ImportResult, MoveTicket, Staged


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("moves") / "tiny")


def _setup(
    model_dir: Path, journal: MemoryJournal | None = None, tflops: float = 400.0, **disagg: Any
) -> tuple[CacheCoordinator, dict[str, Worker], Clock]:
    """A coordinator of two replicas (`r0`, `r1`) whose prefill runs at `tflops`."""
    clock = Clock()
    clock.now = time.time()
    settings = make_settings(
        model_dir,
        replicas=2,
        disagg=DisaggSettings(**disagg),
        cache_bytes=3_000_000,
        prefill_tflops=tflops,
    )
    watch = StallWatch(1.0, 0.25, start=False)
    coord = CacheCoordinator(
        settings, journal=journal or MemoryJournal(), clock=clock, stall_watch=watch
    )
    workers = {rid: make_worker(model_dir) for rid in ("r0", "r1")}
    for rid, worker in workers.items():
        register(coord, worker, rid)
    return coord, workers, clock


def _run(coord: CacheCoordinator, workers: dict[str, Worker], dispatch: Dispatch) -> list[int]:
    worker = workers[dispatch.replica_id]
    (done,) = run_dispatch(worker, dispatch)
    apply(worker, coord.commit(dispatch.replica_id, done, applied(worker)))
    return list(done.tokens)


def _move(
    coord: CacheCoordinator, workers: dict[str, Worker], ticket: MoveTicket, corrupt: bool = False
) -> ImportResult:
    """Run `ticket`'s move with the shards' code and end it at the coordinator."""
    payload = export_ticket(workers[ticket.source].store, ticket)
    if corrupt:
        key = next(iter(payload.tensors))
        payload.tensors[key][0] += 1.0
    result = import_ticket(workers[ticket.receiver].store, payload, ticket)
    direct = coord.finish_move(ticket, result)
    apply(workers[ticket.receiver], direct)
    return result


def _settle(coord: CacheCoordinator, workers: dict[str, Worker]) -> None:
    for rid, worker in workers.items():
        apply(worker, coord.drain(rid, applied(worker)))
        in_step(coord, worker, rid)


def _uncached(model_dir: Path, prompt: np.ndarray, n: int) -> list[int]:
    worker = make_worker(model_dir)
    worker.start(PrefillOrder(1, prompt, replace(GREEDY, max_tokens=n), n))
    while worker.num_running:
        worker.step()
    (done,) = worker.take_finished()
    return list(done.tokens)


def _history(coord: CacheCoordinator, workers: dict[str, Worker], rid: str) -> np.ndarray:
    """One served turn on `rid`; its prompt plus output."""
    prompt = np.random.default_rng(5).integers(7, 263, 48).astype(np.int32)
    out = _run(coord, workers, coord.plan(prompt, GREEDY, route=(rid, None)))
    return np.concatenate([prompt, np.asarray(out, np.int32)])


def _busy(coord: CacheCoordinator, rid: str, n: int) -> list[Dispatch]:
    """`n` short requests planned on `rid` (not run yet): its queue."""
    return [
        coord.plan(np.asarray([3, 4, 5 + i], np.int32), GREEDY, route=(rid, None)) for i in range(n)
    ]


def test_a_moved_entry_is_a_hit_on_the_receiver_with_exact_tokens(model_dir: Path) -> None:
    coord, workers, _ = _setup(model_dir)
    history = _history(coord, workers, "r0")
    ticket = coord.begin_move("r0", "r1", history, "remote_hit")
    assert ticket is not None and ticket.kv_from == 0 and ticket.depth >= 48
    assert coord.locked_nodes("r0") > 0  # the source's entry is pinned while it moves
    result = _move(coord, workers, ticket)
    assert result.ok and len(result.slots) == ticket.depth
    assert coord.locked_nodes("r0") == 0 and coord.locked_nodes("r1") == 0
    stats = coord.planners["r1"].cache.stats
    assert stats.requests == 0 and stats.states_admitted["transfer"] == 1
    nxt = np.concatenate([history, np.asarray([9, 10, 11], np.int32)])
    dispatch = coord.plan(nxt, GREEDY, route=("r1", None))
    assert dispatch.replica_id == "r1" and dispatch.order.hit_len == ticket.depth
    assert _run(coord, workers, dispatch) == _uncached(model_dir, nxt, GREEDY.max_tokens)
    _settle(coord, workers)


def test_a_move_is_journalled_and_replays_to_the_same_trees(model_dir: Path) -> None:
    journal = MemoryJournal()
    coord, workers, clock = _setup(model_dir, journal)
    history = _history(coord, workers, "r0")
    ticket = coord.begin_move("r0", "r1", history, "remote_hit")
    assert ticket is not None
    _move(coord, workers, ticket)
    watch = StallWatch(1.0, 0.25, start=False)
    again = CacheCoordinator(coord.settings, journal=journal, clock=clock, stall_watch=watch)
    for rid in ("r0", "r1"):
        assert tree_of(again, rid) == tree_of(coord, rid)
    assert again.planners["r1"].cache.stats.states_admitted == {
        **coord.planners["r1"].cache.stats.states_admitted
    }


def test_a_corrupt_payload_is_refused_and_nothing_is_held(model_dir: Path) -> None:
    coord, workers, _ = _setup(model_dir)
    history = _history(coord, workers, "r0")
    before = tree_of(coord, "r1")
    ticket = coord.begin_move("r0", "r1", history, "remote_hit")
    assert ticket is not None
    result = _move(coord, workers, ticket, corrupt=True)
    assert not result.ok and "checksum" in result.refused
    assert tree_of(coord, "r1") == before
    assert coord.planners["r1"].cache.reserved == 0 and coord.locked_nodes("r0") == 0
    _settle(coord, workers)


def _stored_unfinished(
    coord: CacheCoordinator, workers: dict[str, Worker]
) -> tuple[MoveTicket, ImportResult]:
    """A move of r0's first turn that r1 stored and has not reported yet."""
    history = _history(coord, workers, "r0")
    ticket = coord.begin_move("r0", "r1", history, "remote_hit")
    assert ticket is not None
    payload = export_ticket(workers["r0"].store, ticket)
    return ticket, import_ticket(workers["r1"].store, payload, ticket)


def test_a_lapsed_import_frees_what_the_receiver_stored_once(model_dir: Path) -> None:
    coord, workers, clock = _setup(model_dir)
    ticket, result = _stored_unfinished(coord, workers)
    for _ in range(int(2 * (1 + LEASE_GRACE)) + 1):  # replicas heard, the leases run out
        clock.now += LEASE / 2
        for rid in ("r0", "r1"):
            coord.heartbeat(rid, [], applied(workers[rid]))
    assert not coord.state.is_planned("r1", ticket.import_request)
    direct = coord.finish_move(ticket, result)
    assert set(direct.states) == {result.state_id} and len(direct.slots) == ticket.depth
    apply(workers["r1"], direct)
    assert coord.planners["r1"].cache.stats.states_admitted.get("transfer", 0) == 0
    _settle(coord, workers)


def test_a_reset_mid_move_frees_the_late_copy_once(model_dir: Path) -> None:
    """The receiver's cache is reset (and reconciled) after the move began and before
    its import: the copy it then stores is no tree's, so finishing the move frees it."""
    coord, workers, _ = _setup(model_dir)
    history = _history(coord, workers, "r0")
    ticket = coord.begin_move("r0", "r1", history, "remote_hit")
    assert ticket is not None
    payload = export_ticket(workers["r0"].store, ticket)
    coord.unregister_replica("r1")
    register(coord, workers["r1"], "r1")
    states, slots = workers["r1"].holdings()
    _, answer = coord.reconcile("r1", states, slots, applied=applied(workers["r1"]))
    apply(workers["r1"], answer)
    result = import_ticket(workers["r1"].store, payload, ticket)  # then the move arrives
    direct = coord.finish_move(ticket, result)
    assert set(direct.states) == {result.state_id} and len(direct.slots) == ticket.depth
    apply(workers["r1"], direct)
    _settle(coord, workers)


def test_nothing_moves_when_the_receiver_holds_the_entry(model_dir: Path) -> None:
    coord, workers, _ = _setup(model_dir)
    history = _history(coord, workers, "r0")
    ticket = coord.begin_move("r0", "r1", history, "remote_hit")
    assert ticket is not None
    _move(coord, workers, ticket)
    assert coord.begin_move("r0", "r1", history, "remote_hit") is None
    assert coord.begin_move("r1", "r1", history, "remote_hit") is None
    assert coord.locked_nodes("r0") == 0 and len(coord.leases) == 0
    _settle(coord, workers)


def test_remote_hits_pull_a_hit_the_router_did_not_pick(model_dir: Path) -> None:
    coord, workers, _ = _setup(model_dir, tflops=1e-3, remote_hits=True, transfer_gbps=10.0)
    history = _history(coord, workers, "r0")
    busy = _busy(coord, "r0", 6)
    nxt = np.concatenate([history, np.asarray([9, 10], np.int32)])
    staged = coord.plan(nxt, GREEDY)  # the router sends it to the idle r1, r0 holds its hit
    assert isinstance(staged, Staged) and staged.replica == "r1"
    assert staged.ticket.source == "r0" and staged.ticket.kind == "remote_hit"
    _move(coord, workers, staged.ticket)
    dispatch = coord.plan(nxt, GREEDY, route=(staged.replica, staged.handoff))
    assert isinstance(dispatch, Dispatch) and dispatch.order.hit_len == staged.ticket.depth
    assert _run(coord, workers, dispatch) == _uncached(model_dir, nxt, GREEDY.max_tokens)
    for d in busy:
        _run(coord, workers, d)
    _settle(coord, workers)


def test_a_slow_link_recomputes_instead_of_pulling(model_dir: Path) -> None:
    coord, workers, _ = _setup(model_dir, tflops=1e-3, remote_hits=True, transfer_gbps=1e-6)
    history = _history(coord, workers, "r0")
    busy = _busy(coord, "r0", 6)
    nxt = np.concatenate([history, np.asarray([9, 10], np.int32)])
    dispatch = coord.plan(nxt, GREEDY)
    assert isinstance(dispatch, Dispatch) and dispatch.replica_id == "r1"
    assert dispatch.order.hit_len == 0
    for d in [dispatch, *busy]:
        _run(coord, workers, d)
    _settle(coord, workers)


def test_roles_hand_a_first_turn_off_and_run_the_next_where_its_hit_is(model_dir: Path) -> None:
    coord, workers, _ = _setup(model_dir, prefill_replicas=1, decode_replicas=1)
    assert coord.health()["roles"] == {"r0": "prefill", "r1": "decode"}
    prompt = np.random.default_rng(8).integers(7, 263, 40).astype(np.int32)
    first = coord.plan(prompt, GREEDY)
    assert isinstance(first, Dispatch) and first.replica_id == "r0"
    assert first.handoff is not None and first.handoff.replica_id == "r1"
    assert first.order.max_new == 1 and first.handoff.max_tokens == GREEDY.max_tokens
    (t1,) = _run(coord, workers, first)
    rest = np.concatenate([prompt, np.asarray([t1], np.int32)])
    ticket = coord.begin_move("r0", "r1", rest, "pd")
    assert ticket is not None and ticket.depth == len(rest)  # the state after the first token
    _move(coord, workers, ticket)
    params = replace(GREEDY, max_tokens=GREEDY.max_tokens - 1)
    second = coord.plan(rest, params, route=("r1", None))
    assert second.replica_id == "r1" and second.order.hit_len == len(rest)
    tokens = [t1, *_run(coord, workers, second)]
    assert tokens == _uncached(model_dir, prompt, GREEDY.max_tokens)
    turn2 = np.concatenate([prompt, np.asarray(tokens, np.int32), np.asarray([5, 6, 7], np.int32)])
    local = coord.plan(turn2, GREEDY)  # the decode replica holds the turn: a short suffix
    assert isinstance(local, Dispatch) and local.replica_id == "r1" and local.handoff is None
    assert local.order.hit_len >= len(prompt) + len(tokens) - 1
    _run(coord, workers, local)
    _settle(coord, workers)


def test_a_replacement_registered_before_the_lost_replica_left_takes_its_role(model_dir: Path):
    coord, _, _ = _setup(model_dir, prefill_replicas=1, decode_replicas=1)
    register(coord, make_worker(model_dir), "r2")  # r0 (prefill) hung; Serve replaced it
    assert coord.health()["roles"] == {"r0": "prefill", "r1": "decode", "r2": "decode"}
    coord.unregister_replica("r0")  # dropped for silence at last
    assert coord.health()["roles"] == {"r1": "decode", "r2": "prefill"}
