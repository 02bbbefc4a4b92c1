"""`CacheCoordinator`: the named Ray actor that owns every replica's prefix cache.

It is the only writer of tree metadata. Ray runs one method at a time on it (a plain,
synchronous actor), so concurrent requests for the same prefix are serialised: two plans
can never both admit the same node or corrupt one. Tensors never come here: replicas
report what they stored (state ids, KV slot ids) and receive what to free.

Durability (`serve.journal`): every operation that changes a planner (register, plan,
commit, abort, adopt, unregister) is applied, then appended to the journal; every
`settings.snapshot_every` records a compact snapshot replaces them. The actor is created
with `max_restarts`, and its constructor replays snapshot + records, so a restarted
coordinator has the same trees, locks, open plans and alphas as before the crash.
Restored replicas are *unconfirmed* (not routed to) until their next heartbeat, which
asks them to `reconcile`: the replica reports what its store holds; a tree that refers to
anything the store lacks is reset (with a new generation), and anything the store holds
that no tree refers to is freed.

Leases: a plan holds its hit until `deadline = now + lease_s`. Heartbeats renew the
leases of the requests a replica runs; a lease past its deadline (plus a grace for clock
skew) is aborted, so a request whose replica or ingress died never pins states forever.
Replicas refuse dispatches past their deadline or of an old generation
(`MisroutedDispatch`), so a request is never started on a hit that was released.
A replica silent for `lease_s` is unregistered with its cache.

Routing (`route`): among confirmed replicas, the deployment's strategy (`serve.routing`,
`settings.routing`) picks one from each replica's usable hit, the FLOPs it saves and its
queue; `cache_aware` keeps a session on the replica holding its last state.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import ray

from marconi_ray.core.cost_model import CostModel
from marconi_ray.core.hf_config import spec_from_hf_config
from marconi_ray.core.invariants import check_tree
from marconi_ray.core.tree_types import NO_STATE
from marconi_ray.core.tuner import TuneJob, TunerConfig, TuneResult
from marconi_ray.core.wire import encode_array
from marconi_ray.engine.engine import torch_dtype
from marconi_ray.engine.loader import read_config
from marconi_ray.protocol.orders import Finished, Release
from marconi_ray.protocol.planner import Planner
from marconi_ray.protocol.results import Timings
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.journal import (
    Journal,
    JournalError,
    decode_record,
    decode_snapshot,
    encode_record,
    encode_snapshot,
    open_journal,
    record_array,
)
from marconi_ray.serve.leases import LeaseTable
from marconi_ray.serve.messages import Dispatch, NoReplicaAvailable, ReplicaStats
from marconi_ray.serve.routing import make_router
from marconi_ray.serve.settings import NAMESPACE, ServeSettings

log = logging.getLogger(__name__)

LEASE_GRACE: Final = 0.5
"""Fraction of `lease_s` a lease outlives its deadline at the coordinator (clock skew
between the coordinator and the replica that checks the deadline)."""

NO_TIMINGS: Final = Timings(0.0, 0.0, 0.0, 0.0)

LOAD_ATTEMPTS: Final = 3
"""Reads of the journal at start before starting empty."""

LOAD_RETRY_S: Final = 1.0


@dataclasses.dataclass
class _Replica:
    """What the coordinator knows of one registered replica besides its planner."""

    kv_bytes_per_token: int
    state_bytes: int
    generation: int
    confirmed: bool
    last_seen: float


class CacheCoordinator:
    """One `Planner` (prefix cache + bootstrap tuner) per registered replica.

    Args:
        settings: the deployment's settings (`redis_url`, `lease_s`, `snapshot_every`...).
        journal: where records go; default `open_journal(settings.redis_url, ...)`.
        clock: wall-clock seconds (deadlines are compared on replicas too).
    """

    def __init__(
        self,
        settings: ServeSettings,
        journal: Journal | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        cfg, raw = read_config(settings.model_dir)
        self.max_position = cfg.max_position
        spec = spec_from_hf_config(raw, dtype_bytes=torch_dtype(settings.dtype).itemsize)
        self.flops = spec.flops_coeffs()
        self.clock = clock
        self.planners: dict[str, Planner] = {}
        self.replica_info: dict[str, _Replica] = {}
        self.leases = LeaseTable()
        self._next_request = 0
        self._tuner: Any = None
        self._queued: dict[str, Release] = {}
        self._router = make_router(settings.routing, settings)
        self._seq = 0
        self._since_snapshot = 0
        self._replaying = False
        self.journal = journal or open_journal(settings.redis_url, settings.journal_prefix)
        self.recovery = self._recover()
        # request ids stay unique across restarts even if the last records were lost
        self._next_request = max(self._next_request, int(clock() * 1e6))

    # ------------------------------------------------------------------ journal
    def _load(self) -> tuple[bytes | None, list[bytes]]:
        """The journal's contents, retried `LOAD_ATTEMPTS` times."""
        for attempt in range(1, LOAD_ATTEMPTS + 1):
            try:
                return self.journal.load()
            except Exception as exc:
                if attempt == LOAD_ATTEMPTS:
                    raise
                log.warning("reading the coordinator journal failed (%s); retrying", exc)
                time.sleep(LOAD_RETRY_S * attempt)
        raise AssertionError("unreachable")

    def _start_empty(self, start: float, error: str) -> dict[str, Any]:
        """Recovery failed: no trees (replicas re-register and free what they hold), and
        the stale journal is replaced by a snapshot before anything is appended to it."""
        log.error("coordinator journal unusable (%s); starting empty", error)
        self.planners, self.replica_info = {}, {}
        self.leases.clear()
        self._seq = 0
        self.journal.mark_lost()
        return {
            "ok": False,
            "error": error,
            "snapshot": False,
            "records": 0,
            "replicas": 0,
            "nodes": 0,
            "open_plans": 0,
            "seconds": time.perf_counter() - start,
        }

    def _recover(self) -> dict[str, Any]:
        """Rebuild from the journal's snapshot and records; returns what was restored."""
        start = time.perf_counter()
        try:
            snapshot, records = self._load()
        except Exception as exc:  # the store is unreachable
            return self._start_empty(start, f"unreadable: {exc}")
        self._replaying = True
        try:
            if snapshot is not None:
                seq, state = decode_snapshot(snapshot)
                self._restore(state)
                self._seq = seq
            applied = 0
            for data in records:
                record = decode_record(data)
                if record["seq"] <= self._seq:
                    continue
                self._apply(record)
                self._seq = record["seq"]
                applied += 1
        except (JournalError, ValueError, KeyError, RuntimeError) as exc:
            return self._start_empty(start, f"corrupt: {exc}")
        finally:
            self._replaying = False
        now = self.clock()
        for info in self.replica_info.values():
            info.confirmed, info.last_seen = False, now
        self.leases.renew_all(now + self.settings.lease_s)
        nodes = sum(len(p.cache.tree.iter_nodes()) for p in self.planners.values())
        summary = {
            "ok": True,
            "snapshot": snapshot is not None,
            "records": applied,
            "replicas": len(self.planners),
            "nodes": nodes,
            "open_plans": len(self.leases),
            "seconds": time.perf_counter() - start,
        }
        if self.planners:
            log.warning("coordinator restored from its journal: %s", summary)
        return summary

    def _log(self, op: str, **fields: Any) -> None:
        """Journal one applied operation (nothing while replaying). When the journal lost
        records, a snapshot (which covers this operation) replaces them instead."""
        if self._replaying:
            return
        self._seq += 1
        if self.journal.needs_snapshot and self.snapshot():
            return
        self.journal.append(encode_record(self._seq, op, fields))
        self._since_snapshot += 1
        if self._since_snapshot >= self.settings.snapshot_every:
            self.snapshot()

    def snapshot(self) -> bool:
        """Write a compact snapshot of every planner now; False if the store refused."""
        data = encode_snapshot(self._seq, self._state())
        done = self.journal.snapshot(data)
        if done:
            self._since_snapshot = 0
        return done

    def _state(self) -> dict[str, Any]:
        return {
            "next_request": self._next_request,
            "replicas": [
                {
                    "id": rid,
                    "kv_bytes_per_token": info.kv_bytes_per_token,
                    "state_bytes": info.state_bytes,
                    "generation": info.generation,
                    "planner": self.planners[rid].to_record(),
                    "leases": self.leases.of_replica(rid),
                }
                for rid, info in self.replica_info.items()
            ],
        }

    def _restore(self, state: Mapping[str, Any]) -> None:
        self._next_request = int(state["next_request"])
        for entry in state["replicas"]:
            rid = str(entry["id"])
            self.planners[rid] = Planner.from_record(
                entry["planner"], on_tune_job=functools.partial(self._send_job, rid)
            )
            self.replica_info[rid] = _Replica(
                int(entry["kv_bytes_per_token"]),
                int(entry["state_bytes"]),
                int(entry["generation"]),
                False,
                0.0,
            )
            for request, deadline in entry["leases"]:
                self.leases.grant(int(request), rid, float(deadline))

    def _apply(self, record: Mapping[str, Any]) -> None:
        """Replay one journal record."""
        op, rid = record["op"], record["replica"]
        if op == "register":
            self._register(
                rid, record["kv_bytes_per_token"], record["state_bytes"], record["generation"]
            )
        elif op == "unregister":
            self._unregister(rid)
        elif op == "plan":
            prompt = record_array(record, "prompt", "<i4")
            params = SamplingParams(
                **{**record["params"], "stop_token_ids": tuple(record["params"]["stop_token_ids"])}
            )
            self._plan_on(rid, record["request"], prompt, params, record["submitted"])
            self._next_request = max(self._next_request, record["request"] + 1)
        elif op == "commit":
            done = Finished(
                request_id=record["request"],
                tokens=tuple(int(t) for t in record_array(record, "tokens", "<i4")),
                finish_reason=record["finish_reason"],
                state_ids={int(d): int(s) for d, s in record["state_ids"]},
                kv_slots=record_array(record, "kv_slots", "<i8"),
                timings=NO_TIMINGS,
            )
            self._commit_on(rid, done)
        elif op == "abort":
            self._abort_on(rid, record["request"])
        elif op == "adopt":
            result = record["result"]
            scores = tuple((float(a), float(b)) for a, b in result["scores"])
            self._adopt_on(rid, TuneResult(**{**result, "scores": scores}))

    # ------------------------------------------------------------------ replicas
    def register_replica(self, replica_id: str, kv_bytes_per_token: int, state_bytes: int) -> int:
        """Give a replica its own empty cache; returns its generation (every dispatch
        for it carries it). Registering a known replica keeps its cache and generation.
        Its bytes are priced as its rank-0 shard's store holds them."""
        if replica_id in self.planners:
            self._confirm(replica_id)
            return self.replica_info[replica_id].generation
        generation = time.time_ns()
        self._register(replica_id, kv_bytes_per_token, state_bytes, generation)
        self._log(
            "register",
            replica=replica_id,
            kv_bytes_per_token=kv_bytes_per_token,
            state_bytes=state_bytes,
            generation=generation,
        )
        return generation

    def _register(
        self, replica_id: str, kv_bytes_per_token: int, state_bytes: int, generation: int
    ) -> None:
        s = self.settings
        t = s.tuner
        self.planners[replica_id] = Planner.for_system(
            s.system,
            self.flops,
            kv_bytes_per_token,
            state_bytes,
            s.cache_bytes,
            self.max_position,
            s.alpha,
            TunerConfig(t.multiplier, t.grid, retune_every=t.retune_every),
            on_tune_job=functools.partial(self._send_job, replica_id),
        )
        self.replica_info[replica_id] = _Replica(
            kv_bytes_per_token, state_bytes, generation, True, self.clock()
        )

    def unregister_replica(self, replica_id: str) -> None:
        """Forget a replica and its cache (its tensors died with it, or are reset)."""
        if replica_id not in self.planners:
            return
        self._unregister(replica_id)
        self._log("unregister", replica=replica_id)

    def _unregister(self, replica_id: str) -> None:
        self.planners.pop(replica_id, None)
        self.replica_info.pop(replica_id, None)
        self._queued.pop(replica_id, None)
        self.leases.drop_replica(replica_id)

    def replicas(self) -> list[str]:
        return list(self.planners)

    def heartbeat(self, replica_id: str, live: list[int]) -> tuple[str, int]:
        """A replica is alive and runs (or queues) the requests `live`: renew their
        leases. Returns (`"ok"` | `"reconcile"` | `"register"`, generation): `register`
        when this coordinator does not know the replica, `reconcile` when it restored the
        replica from the journal and needs its holdings (see `reconcile`)."""
        info = self.replica_info.get(replica_id)
        now = self.clock()
        if info is not None:
            info.last_seen = now
        self._expire()
        if info is None:
            return "register", 0
        self.leases.renew(replica_id, live, now + self.settings.lease_s)
        return ("ok" if info.confirmed else "reconcile"), info.generation

    def reconcile(
        self, replica_id: str, held_states: list[int], held_slots: npt.NDArray[np.int64]
    ) -> tuple[int, Release]:
        """Match a restored tree with what the replica's store holds (not counting what its
        running requests own). A tree that refers to a state or KV slot the store lacks is
        reset (empty cache, new generation); what the store holds that no tree node refers
        to is returned to be freed. Returns (generation, release)."""
        info = self.replica_info.get(replica_id)
        if info is None:
            raise NoReplicaAvailable(f"replica {replica_id!r} is not registered")
        states = set(int(s) for s in held_states)
        slots = set(int(s) for s in np.asarray(held_slots, dtype=np.int64))
        tree_states, tree_slots = self._referenced(replica_id)
        if not (tree_states <= states and tree_slots <= slots):
            log.warning(
                "replica %s lacks %d states / %d KV slots its restored tree refers to: reset",
                replica_id,
                len(tree_states - states),
                len(tree_slots - slots),
            )
            kvb, sb = info.kv_bytes_per_token, info.state_bytes
            self.unregister_replica(replica_id)
            self.register_replica(replica_id, kvb, sb)
            tree_states, tree_slots = set(), set()
        self._confirm(replica_id)
        release = Release(
            tuple(sorted(states - tree_states)),
            np.asarray(sorted(slots - tree_slots), dtype=np.int64),
        )
        return self.replica_info[replica_id].generation, release

    def report_unreachable(self, replica_id: str) -> bool:
        """Someone could not reach a replica (a dispatch for it landed elsewhere because
        Serve no longer lists it). Drop it at once if its heartbeats have stopped too
        (none for two intervals), instead of waiting `lease_s`; True if dropped."""
        info = self.replica_info.get(replica_id)
        if info is None or self.clock() - info.last_seen <= 2 * self.settings.heartbeat_s:
            return False
        log.warning("replica %s unreachable and silent: dropped", replica_id)
        self.unregister_replica(replica_id)
        return True

    def _confirm(self, replica_id: str) -> None:
        info = self.replica_info[replica_id]
        info.confirmed, info.last_seen = True, self.clock()

    def _referenced(self, replica_id: str) -> tuple[set[int], set[int]]:
        """State ids and KV slots the replica's tree refers to."""
        states: set[int] = set()
        slots: set[int] = set()
        for node in self.planners[replica_id].cache.tree.iter_nodes():
            if node.state != NO_STATE:
                states.add(int(node.state))
            if node.kv is not None and len(node.kv):
                slots.update(int(s) for s in node.kv)
        return states, slots

    def _expire(self) -> None:
        """Abort plans whose lease ran out; drop replicas silent for `lease_s`."""
        now = self.clock()
        grace = self.settings.lease_s * LEASE_GRACE
        for request, rid in self.leases.expired(now, grace):
            log.warning("lease of request %d on replica %s expired", request, rid)
            release = self.abort(rid, request, reason="lease")
            self._queued[rid] = self._queued.get(rid, Release()) + release
        for rid, info in list(self.replica_info.items()):
            if now - info.last_seen > self.settings.lease_s:
                log.warning("replica %s silent for %.0f s: dropped", rid, now - info.last_seen)
                self.unregister_replica(rid)

    # ------------------------------------------------------------------ requests
    def route(self, prompt: npt.NDArray[np.int32]) -> str:
        """The confirmed replica the deployment's routing strategy (`settings.routing`, see
        `serve.routing`) picks from each one's usable hit, the FLOPs it saves, its queue."""
        candidates = [
            (rid, planner.cache, planner.open_requests)
            for rid, planner in self.planners.items()
            if self.replica_info[rid].confirmed
        ]
        if not candidates:
            raise NoReplicaAvailable("no model replica is registered and alive")
        return self._router.route(prompt, candidates)

    def plan(
        self, prompt: npt.NDArray[np.int32], params: SamplingParams, submitted: float = 0.0
    ) -> Dispatch:
        """Route and plan one validated request (match, checkpoints, reservation, lease)."""
        self._expire()
        prompt = np.asarray(prompt, dtype=np.int32)
        replica_id = self.route(prompt)
        rid = self._next_request
        self._next_request += 1
        dispatch = self._plan_on(replica_id, rid, prompt, params, submitted)
        self._log(
            "plan",
            replica=replica_id,
            request=rid,
            prompt=encode_array(prompt, "<i4"),
            params=_params_record(params),
            submitted=float(submitted),
        )
        return dispatch

    def _plan_on(
        self,
        replica_id: str,
        request_id: int,
        prompt: npt.NDArray[np.int32],
        params: SamplingParams,
        submitted: float,
    ) -> Dispatch:
        order, release = self.planners[replica_id].order(request_id, prompt, params, submitted)
        deadline = self.clock() + self.settings.lease_s
        self.leases.grant(request_id, replica_id, deadline)
        generation = self.replica_info[replica_id].generation
        return Dispatch(replica_id, order, release, generation, deadline)

    def commit(self, replica_id: str, done: Finished) -> Release:
        """Admit what the cache keeps of a finished request; returns what to free. A
        commit that cannot be applied aborts the request instead (nothing is cached). A
        commit for a request this coordinator no longer plans (its lease expired, the
        replica was reset, or it is a retry of an applied commit) frees what the request
        stored unless a tree node refers to it."""
        planner = self.planners.get(replica_id)
        if planner is None or not planner.is_planned(done.request_id):
            return self._orphan_release(replica_id, done) + self.drain(replica_id)
        release = self._commit_on(replica_id, done)
        self._log(
            "commit",
            replica=replica_id,
            request=done.request_id,
            tokens=encode_array(done.tokens, "<i4"),
            finish_reason=done.finish_reason,
            state_ids=[[int(d), int(s)] for d, s in done.state_ids.items()],
            kv_slots=encode_array(done.kv_slots, "<i8"),
        )
        return release + self.drain(replica_id)

    def _commit_on(self, replica_id: str, done: Finished) -> Release:
        planner = self.planners[replica_id]
        self.leases.release(done.request_id)
        try:
            return planner.commit(done)
        except (RuntimeError, ValueError):
            return planner.abort(done.request_id, done)

    def _orphan_release(self, replica_id: str, done: Finished) -> Release:
        if replica_id not in self.planners:
            return Release(tuple(done.state_ids.values()), done.kv_slots)
        states, slots = self._referenced(replica_id)
        kv = np.asarray(done.kv_slots, dtype=np.int64)
        return Release(
            tuple(s for s in done.state_ids.values() if s not in states),
            kv[~np.isin(kv, np.fromiter(slots, dtype=np.int64, count=len(slots)))],
        )

    def abort(
        self, replica_id: str, request_id: int, done: Finished | None = None, reason: str = "client"
    ) -> Release:
        """Release a request's plan (and what it stored, if it finished)."""
        planner = self.planners.get(replica_id)
        if planner is None:
            self.leases.release(request_id)
            return (
                Release()
                if done is None
                else Release(tuple(done.state_ids.values()), done.kv_slots)
            )
        planned = planner.is_planned(request_id)
        release = self._abort_on(replica_id, request_id, done)
        if planned:
            self._log("abort", replica=replica_id, request=request_id, reason=reason)
        return release

    def _abort_on(self, replica_id: str, request_id: int, done: Finished | None = None) -> Release:
        self.leases.release(request_id)
        return self.planners[replica_id].abort(request_id, done)

    def abandon(self, dispatch: Dispatch) -> None:
        """A dispatch never reached its replica: release its plan, and queue what the
        replica must free (what planning evicted, what the abort tidied) for its next
        `commit` or `drain`."""
        rid = dispatch.replica_id
        if rid not in self.planners:
            return
        release = self.abort(rid, dispatch.order.request_id, reason="abandoned")
        if dispatch.generation == self.replica_info[rid].generation:
            release = release + dispatch.release
        self._queued[rid] = self._queued.get(rid, Release()) + release

    def drain(self, replica_id: str) -> Release:
        """What was released on a replica's behalf since its last commit or drain."""
        return self._queued.pop(replica_id, Release())

    # ------------------------------------------------------------------ tuning
    def _send_job(self, replica_id: str, job: TuneJob) -> None:
        if self._replaying:
            return
        if self._tuner is None:
            self._tuner = ray.get_actor(self.settings.tuner_name, namespace=NAMESPACE)
        self._tuner.tune.remote(replica_id, job)

    def adopt(self, replica_id: str, result: TuneResult) -> None:
        """Apply the tuner actor's winning alpha to a replica's cache."""
        if self._adopt_on(replica_id, result):
            self._log("adopt", replica=replica_id, result=dataclasses.asdict(result))

    def _adopt_on(self, replica_id: str, result: TuneResult) -> bool:
        planner = self.planners.get(replica_id)
        if planner is None or planner.tuner is None:
            return False
        planner.adopt(result)
        return True

    def tuner_runs(self) -> int:
        return sum(len(p.tuner.history) for p in self.planners.values() if p.tuner is not None)

    # ------------------------------------------------------------------ views
    def stats(self) -> list[ReplicaStats]:
        out = []
        for rid, planner in self.planners.items():
            runs = 0 if planner.tuner is None else len(planner.tuner.history)
            out.append(ReplicaStats.of(rid, planner.cache, planner.open_requests, runs))
        return out

    def journal_status(self) -> dict[str, Any]:
        """The journal's health and counters, and what the last start restored."""
        return {**self.journal.status(), "seq": self._seq, "recovery": self.recovery}

    def cost(self, replica_id: str) -> CostModel:
        """The cost model a replica's cache prices FLOPs and bytes with."""
        return self.planners[replica_id].cache.cost

    def check_invariants(self) -> int:
        """Full-scan check of every replica's tree (radix shape, byte totals, locks) and
        of the lease table (one lease per open plan); raises AssertionError on a
        violation. Returns the number of nodes checked."""
        total = 0
        assert len(self.leases) == sum(p.open_requests for p in self.planners.values())
        for planner in self.planners.values():
            check_tree(planner.cache.tree)
            assert planner.cache.bytes_used + planner.cache.reserved <= planner.cache.capacity
            total += len(planner.cache.tree.iter_nodes())
        return total

    def locked_nodes(self, replica_id: str) -> int:
        """Nodes of a replica's tree held by a lock (0 when no request is in flight)."""
        return sum(n.lock > 0 for n in self.planners[replica_id].cache.tree.iter_nodes())


def _params_record(params: SamplingParams) -> dict[str, Any]:
    record = dataclasses.asdict(params)
    record["stop_token_ids"] = list(params.stop_token_ids)
    return record
