"""`CacheCoordinator`: the named Ray actor that owns every replica's prefix cache.

It is the only writer of tree metadata. Ray runs one method at a time on it (a plain,
synchronous actor), so concurrent requests for the same prefix are serialised: two plans
can never both admit the same node or corrupt one. Tensors never come here: replicas
report what they stored (state ids, KV slot ids) and receive what to free.

Durability (`serve.coordinator.journal`): every operation that changes a planner (a typed
`protocol.ops` record: register, plan, commit, abort, adopt, unregister) is applied to the
`CacheState` (`serve.coordinator.cache_state`), then appended to the journal; every
`settings.snapshot_every` records a compact snapshot replaces them. The actor is created
with `max_restarts`, and its constructor replays snapshot + records through the same
`CacheState.apply` (`serve.coordinator.recovery`), so a restarted coordinator has the same trees,
locks, open plans and alphas as before the crash; a hole in the journal's seqs is named
and every restored tree reset (`serve.coordinator.recovery`), then a snapshot replaces the journal.
`journal_health()` reports the journal's state, backlog and snapshot age.
Restored replicas are *unconfirmed* (not routed to) until their next heartbeat, which
asks them to `reconcile`: the replica reports what its store holds; a tree that refers to
anything the store lacks is reset (with a new generation), and anything the store holds
that no tree refers to is freed (less what is already due to be freed once: see
`reconcile`).

Exactly once: every state id and KV slot the cache lets go of is freed once, and every
tier move applied once, in the order the cache decided. Each journalled operation's
release goes to its replica's release log (`protocol.release_log`); every answer to the
replica (a dispatch, a commit, an abort, a drain, a reconcile) carries the entries the
replica has not acknowledged, and the replica applies each once, in seq order. A plan's
evictions are in the log whatever becomes of its dispatch, so an abandon, a lease
expiry or an abort never has to know whether the replica started the order. The tuner
hand-off never touches the commit it follows: a job that could not be sent, or whose
result has not come back within `tuner.retry_s`, is sent again (`resend_jobs`), and a
result is adopted once.

Commits come two ways: a replica's own `commit_many` (one per step that finished
requests), or relayed through the ingress that runs the request (`step_many`, with that
ingress's plans; `settings.commit_relay`). A relayed commit is applied only while its
plan is open, and never frees anything directly; every plan's end is named in the
replica's log (`Release.settled`), from which the replica frees what the cache did not
take (`serve.replica.relayed`).

Leases: a plan holds its hit until `deadline = now + lease_s`. Heartbeats renew the
leases of the requests a replica runs; a lease past its deadline (plus a grace for clock
skew) is aborted, so a request whose replica or ingress died never pins states forever.
Replicas refuse dispatches past their deadline or of an old generation
(`MisroutedDispatch`), so a request is never started on a hit that was released.
A replica silent for `lease_s` is unregistered with its cache. Silence and leases are
judged by what the coordinator could have heard: after a stall of its own process (a
pause, a frozen VM: `serve.coordinator.stall_watch`), every replica counts as heard from
and every lease as renewed at the moment it resumed, so heartbeats that waited in its
queue are not taken for silence.

Routing (`route`): among confirmed replicas, the deployment's strategy
(`serve.coordinator.routing.routers`, `settings.routing`) picks one from each replica's
usable hit, the FLOPs it saves and its queue; `cache_aware` keeps a session on the
replica holding its last state. Its cost does not grow with the replicas
(`serve.coordinator.routing.choose`): one walk of a routing index of every replica's
states names those that may hold a hit, and only their trees are walked.
Expired leases and silent replicas come off deadline heaps, not a scan of all of them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import ray

from marconi_ray.core.cache.findings import Finding, find
from marconi_ray.core.cache.systems import get_system
from marconi_ray.core.cache.tuner import TuneJob, TuneResult
from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.core.model.hf.parse import parse_hf_config, spec_from_architecture
from marconi_ray.protocol.model_files import DTYPE_BYTES, read_config_json
from marconi_ray.protocol.ops import Abort, Adopt, Commit, Op, Plan, Register, Unregister
from marconi_ray.protocol.orders import Finished, Release
from marconi_ray.protocol.planner import Planner
from marconi_ray.protocol.release_log import Releases
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.coordinator.cache_state import CacheState, Planned, ReplicaInfo
from marconi_ray.serve.coordinator.journal import (
    Journal,
    encode_record,
    encode_snapshot,
    open_journal,
)
from marconi_ray.serve.coordinator.leases import LEASE_GRACE, LeaseTable
from marconi_ray.serve.coordinator.recovery import recover
from marconi_ray.serve.coordinator.routing.choose import choose_replica, max_open
from marconi_ray.serve.coordinator.routing.routers import make_router
from marconi_ray.serve.coordinator.stall_watch import StallWatch
from marconi_ray.serve.coordinator.tier_check import tier_mismatch
from marconi_ray.serve.coordinator.transfers import TransferPlanning
from marconi_ray.serve.messages import (
    Dispatch,
    NoReplicaAvailable,
    Overloaded,
    RelayedCommit,
    ReplicaStats,
)
from marconi_ray.serve.settings import NAMESPACE, ServeSettings
from marconi_ray.serve.transfer_messages import Handoff, Staged

log = logging.getLogger(__name__)


class CacheCoordinator(TransferPlanning):
    """The actor: a journalled `CacheState` (one planner per replica), routing, leases
    and the hand-off to the tuner actor.

    Args:
        settings: the deployment's settings (`redis_url`, `lease_s`, `snapshot_every`...).
        journal: where records go; default `open_journal(settings.redis_url, ...)`.
        clock: wall-clock seconds (deadlines are compared on replicas too).
        stall_watch: notices stalls of this process; default: one whose thread ticks
            every quarter heartbeat and takes a gap of a heartbeat interval for a stall.
    """

    def __init__(
        self,
        settings: ServeSettings,
        journal: Journal | None = None,
        clock: Callable[[], float] = time.time,
        stall_watch: StallWatch | None = None,
    ) -> None:
        self.settings = settings
        beat = settings.heartbeat_s
        self.stall_watch = stall_watch or StallWatch(beat, beat / 4)
        arch = parse_hf_config(read_config_json(settings.local_model_dir()))
        spec = spec_from_architecture(arch, DTYPE_BYTES[settings.dtype])
        self.clock = clock
        self.state = CacheState(
            settings,
            spec.flops_coeffs(),
            arch.context_limit,
            clock,
            self._send_job,
            spec.window_terms(),
        )
        self._tuner: Any = None
        self._jobs: dict[str, float] = {}
        """Replica -> when its pending tuning job was last sent to the tuner actor (0.0:
        not sent yet, or the send failed); see `resend_jobs`."""
        self.refusals: dict[str, int] = {}
        """Replica -> releases its store refused (reported when it reconciles)."""
        self._store_figures: dict[str, dict[str, float]] = {}
        """Replica -> its store's tier figures from its last heartbeat that carried them
        (for `/metrics`; not journalled: the next heartbeat brings them again)."""
        self._router = make_router(settings.routing, settings)
        self._context_limit = arch.context_limit
        self.findings: dict[str, Finding] = {}
        """What the cache's setting makes it not do for this model, by code
        (`core.cache.findings`), found as replicas register; logged once each."""
        self._since_snapshot = 0
        self.journal = journal or open_journal(
            settings.redis_url, settings.journal_prefix, settings.journal_max_backlog_bytes
        )
        self._seq, self.recovery = recover(self.state, self.journal, clock())
        if self.journal.needs_snapshot:  # what it holds is untrusted: replace it now
            self.snapshot()
        # request ids stay unique across restarts even if the last records were lost
        self.state.next_request = max(self.state.next_request, int(clock() * 1e6))
        for rid in self.planners:  # restored replicas: their findings are said again
            self._find(rid)
        # a window restored while waiting for its result: its job died with the old actor
        for rid, planner in self.planners.items():
            if planner.tuner is not None and planner.tuner.pending:
                self._jobs[rid] = 0.0

    # ------------------------------------------------------------------ views of the state
    @property
    def planners(self) -> dict[str, Planner]:
        return self.state.planners

    @property
    def replica_info(self) -> dict[str, ReplicaInfo]:
        return self.state.replicas

    @property
    def leases(self) -> LeaseTable:
        return self.state.leases

    # ------------------------------------------------------------------ journal
    def _do(self, op: Op) -> Any:
        """Apply `op` to the state, then journal it. When the journal lost records (even
        while appending this one: a hole found after an outage), a snapshot (which covers
        this operation) replaces them."""
        result = self.state.apply(op)
        self._seq += 1
        if self.journal.needs_snapshot and self.snapshot():
            return result
        self.journal.append(encode_record(self._seq, op))
        self._since_snapshot += 1
        if self.journal.needs_snapshot or self._since_snapshot >= self.settings.snapshot_every:
            self.snapshot()
        return result

    def snapshot(self) -> bool:
        """Write a compact snapshot of every planner now; False if the store refused."""
        done = self.journal.snapshot(encode_snapshot(self._seq, self.state.to_record()))
        if done:
            self._since_snapshot = 0
        return done

    # ------------------------------------------------------------------ replicas
    def register_replica(self, replica_id: str, kv_bytes_per_token: int, state_bytes: int) -> int:
        """Give a replica its own empty cache; returns its generation (every dispatch
        for it carries it). Registering a known replica keeps its cache and generation.
        Its bytes are priced as its rank-0 shard's store holds them."""
        info = self.replica_info.get(replica_id)
        if info is not None:
            self._confirm(replica_id)
            return info.generation
        generation = time.time_ns()
        self._do(Register(replica_id, kv_bytes_per_token, state_bytes, generation))
        self._find(replica_id)
        return generation

    def _find(self, replica_id: str) -> None:
        """Check the cache's setting against a new replica's prices (`core.cache.findings`)
        and log each finding the first time it is found."""
        s = self.settings
        found = find(
            self.state.cost(replica_id),
            get_system(s.system),
            s.cache_bytes,
            s.host_settings,
            self._context_limit,
            s.alpha,
            s.tuner_set,
        )
        for finding in found:
            if finding.code not in self.findings:
                log.warning("the prefix cache (%s): %s", finding.code, finding.message)
                self.findings[finding.code] = finding

    def unregister_replica(self, replica_id: str) -> None:
        """Forget a replica and its cache (its tensors died with it, or are reset)."""
        if replica_id in self.planners:
            self._store_figures.pop(replica_id, None)
            self._do(Unregister(replica_id))

    def replicas(self) -> list[str]:
        return list(self.planners)

    def heartbeat(
        self,
        replica_id: str,
        live: list[int],
        applied: int = 0,
        store: dict[str, float] | None = None,
        generation: int | None = None,
    ) -> tuple[str, int]:
        """A replica is alive and runs (or queues) the requests `live`: renew their
        leases. `applied`: the last entry of its release log it applied (of its
        `generation`; None: the current one, see `ReleaseLog.ack`). `store`: its
        store's tier figures (`ReplicaStats.store`), kept for `stats`. Returns (`"ok"` |
        `"reconcile"` | `"register"`, generation): `register` when this coordinator does
        not know the replica, `reconcile` when it restored the replica from the journal and
        needs its holdings (see `reconcile`). Also sends tuning jobs that are due again."""
        info = self.replica_info.get(replica_id)
        now = self.clock()
        if info is not None:
            info.last_seen = now
            self.state.log_of(replica_id).ack(applied, generation)
            if store is not None:
                self._store_figures[replica_id] = dict(store)
        self._expire()
        self.resend_jobs()
        if info is None:
            return "register", 0
        self.leases.renew(replica_id, live, now + self.settings.lease_s)
        return ("ok" if info.confirmed else "reconcile"), info.generation

    def reconcile(
        self,
        replica_id: str,
        held_states: list[int],
        held_slots: npt.NDArray[np.int64],
        host_states: list[int] | None = None,
        host_slots: npt.NDArray[np.int64] | None = None,
        applied: int = 0,
        generation: int | None = None,
        refused: int = 0,
        owned_states: list[int] | None = None,
        owned_slots: npt.NDArray[np.int64] | None = None,
    ) -> tuple[int, Releases]:
        """Match a replica's tree with what its store holds (not counting what its running
        requests own), after the store applied its release log up to `applied` (of its
        `generation`; None: the current one). A tree that refers to a state or KV slot the
        store lacks is reset (empty cache, new generation); so is one whose tiers differ
        from the store's (`host_states` / `host_slots`: which of the held ids the store
        keeps in host memory; ids that log entries after `applied` still move are not
        compared), and one whose log is behind the store (the store applied entries this
        coordinator does not have: records were lost). What the store holds that no tree
        node refers to is freed (directly), less what log entries after `applied` free.
        `refused`: releases the store refused since it last reconciled (counted for
        `/metrics`). `owned_states` / `owned_slots`: held ids that belong to requests
        whose relayed commits are not settled yet (`serve.replica.relayed`): never freed
        here (their request's commit, or the replica on their plan's end, does it).
        Returns (generation, what the store must do)."""
        info = self.replica_info.get(replica_id)
        if info is None:
            raise NoReplicaAvailable(f"replica {replica_id!r} is not registered")
        if refused:
            self.refusals[replica_id] = self.refusals.get(replica_id, 0) + int(refused)
        release_log = self.state.log_of(replica_id)
        same = generation is None or generation == release_log.generation
        applied = int(applied) if same else 0
        states = {int(s) for s in held_states}
        slots = {int(s) for s in np.asarray(held_slots, dtype=np.int64)}
        cache = self.planners[replica_id].cache
        tree_states, tree_slots = cache.referenced()
        pending = release_log.pending(applied)
        lacks = not (tree_states <= states and tree_slots <= slots)
        moved = tier_mismatch(cache, (tree_states, tree_slots), pending, host_states, host_slots)
        ahead = applied > release_log.last or applied < release_log.acked or not same
        if lacks or moved or ahead:
            log.warning(
                "replica %s lacks %d states / %d KV slots its tree refers to, holds %d ids "
                "in another tier than the tree says, applied log entry %d of generation %s "
                "(the log runs %d..%d of generation %d): reset",
                replica_id,
                len(tree_states - states),
                len(tree_slots - slots),
                moved,
                applied,
                generation,
                release_log.acked,
                release_log.last,
                release_log.generation,
            )
            kvb, sb = info.kv_bytes_per_token, info.state_bytes
            self.unregister_replica(replica_id)
            self.register_replica(replica_id, kvb, sb)
            tree_states, tree_slots = set(), set()
            release_log = self.state.log_of(replica_id)
            pending = Release()
        else:
            release_log.ack(applied, generation)
        self._confirm(replica_id)
        keep_states = tree_states | set(pending.states) | {int(s) for s in owned_states or ()}
        keep_slots = tree_slots | {int(s) for s in pending.slots}
        if owned_slots is not None:
            keep_slots |= {int(s) for s in np.asarray(owned_slots, dtype=np.int64)}
        held = Release(tuple(sorted(states)), np.asarray(sorted(slots), dtype=np.int64))
        return release_log.generation, release_log.since(held.without(keep_states, keep_slots))

    def report_unreachable(self, replica_id: str) -> bool:
        """Someone could not reach a replica (a dispatch for it landed elsewhere because
        Serve no longer lists it). Drop it at once if its heartbeats have stopped too
        (none for two intervals), instead of waiting `lease_s`; True if dropped."""
        self._after_stall(self.clock())
        info = self.replica_info.get(replica_id)
        if info is None or self.clock() - info.last_seen <= 2 * self.settings.heartbeat_s:
            return False
        log.warning("replica %s unreachable and silent: dropped", replica_id)
        self.unregister_replica(replica_id)
        return True

    def _confirm(self, replica_id: str) -> None:
        self.state.set_confirmed(replica_id, True)
        self.replica_info[replica_id].last_seen = self.clock()

    def _expire(self) -> None:
        """Abort plans whose lease ran out; drop replicas silent for `lease_s`. After a
        stall of the coordinator's own (see the module docstring), first count every
        replica as heard from and every lease as renewed now."""
        now = self.clock()
        self._after_stall(now)
        grace = self.settings.lease_s * LEASE_GRACE
        for request, rid in self.leases.expired(now, grace):
            log.warning("lease of request %d on replica %s expired", request, rid)
            self._end_plan(rid, request, None, "lease")
        for rid in self.state.routing.silent(self.replica_info, now, self.settings.lease_s):
            silent = now - self.replica_info[rid].last_seen
            log.warning("replica %s silent for %.0f s: dropped", rid, silent)
            self.unregister_replica(rid)

    def _after_stall(self, now: float) -> None:
        """If this process stood still since the last look (`stall_watch.take`), count
        every replica as heard from and every lease as renewed at `now`."""
        if not self.stall_watch.take():
            return
        log.warning(
            "the coordinator's process stood still (up to %.1f s): silence and leases "
            "are judged from now on",
            self.stall_watch.longest_s,
        )
        for info in self.replica_info.values():
            info.last_seen = max(info.last_seen, now)
        self.leases.renew_all(now + self.settings.lease_s)

    # ------------------------------------------------------------------ requests
    def route(self, prompt: npt.NDArray[np.int32]) -> str:
        """The confirmed replica the deployment's routing strategy (`settings.routing`, see
        `serve.coordinator.routing.routers`) picks from each one's usable hit, the FLOPs it
        saves, its queue (`routing.choose.choose_replica`: NoReplicaAvailable, Overloaded)."""
        return choose_replica(self.state, self._router, self.settings, prompt)

    def plan(
        self,
        prompt: npt.NDArray[np.int32],
        params: SamplingParams,
        submitted: float = 0.0,
        route: tuple[str, str | None] | None = None,
        moves: bool = True,
        handoff: bool = True,
    ) -> Dispatch | Staged:
        """Route and plan one validated request (match, checkpoints, reservation, lease).

        With moves between replicas (`settings.disagg`), where it runs is `stage`'s
        choice: when an entry must move first (a pull), the answer is `Staged` (its move
        begun) instead, and the caller plans again with `route` = (the replica, its
        hand-off or None) once the move is over; a `route` whose replica can no longer
        take the request is staged anew. `moves=False`: never `Staged` (a pull is
        skipped). A P/D dispatch (`Dispatch.handoff`) is planned for one token;
        `handoff=False`: the request runs whole where it is planned (a re-plan after a
        fault)."""
        self._expire()
        prompt = np.asarray(prompt, dtype=np.int32)
        if route is not None and self._can_take(route[0]):
            replica_id, handoff_to = route
        else:
            staging = self.stage(prompt)
            pull = staging.pull
            if pull is not None and moves:
                kind = "remote_hit" if staging.way == "remote_hit" else "pd"
                ticket = self.begin_move(pull.source, staging.replica, prompt[: pull.depth], kind)
                if ticket is not None:
                    return Staged(ticket, staging.replica, staging.handoff)
            replica_id, handoff_to = staging.replica, staging.handoff
        handoff_of = None
        if handoff and handoff_to in self.planners and params.max_tokens > 1:
            handoff_of = Handoff(handoff_to, params.max_tokens)
            params = replace(params, max_tokens=1)
        request = self.state.next_request
        planned: Planned = self._do(Plan(replica_id, request, prompt, params, float(submitted)))
        release_log = self.state.log_of(replica_id)
        return Dispatch(
            replica_id,
            planned.order,
            release_log.since(),
            release_log.generation,
            planned.deadline,
            planned.needs,
            self.settings.coordinator_index,
            handoff_of,
        )

    def _can_take(self, replica_id: str) -> bool:
        """Whether `replica_id` is confirmed and has room for one more request."""
        table = self.state.routing.table
        if replica_id not in table:
            return False
        limit = max_open(self.settings)
        return bool(table.eligible(limit)[table.slot(replica_id)])

    def plan_many(
        self, requests: list[tuple[npt.NDArray[np.int32], SamplingParams, float]]
    ) -> list[Dispatch | Staged | Exception]:
        """`plan` for requests that arrived together (one call instead of one each); a
        request that cannot be planned gets its exception in its place (ValueError,
        NoReplicaAvailable, Overloaded; any other is logged) and the others are planned
        all the same, so no plan made in the batch is lost with a later one's error."""
        out: list[Dispatch | Staged | Exception] = []
        for prompt, params, submitted in requests:
            try:
                out.append(self.plan(prompt, params, submitted))
            except (ValueError, NoReplicaAvailable, Overloaded) as exc:
                out.append(exc)
            except Exception as exc:
                log.exception("planning one request of a batch failed")
                out.append(exc)
        return out

    def commit(
        self, replica_id: str, done: Finished, applied: int = 0, generation: int | None = None
    ) -> Releases:
        """Admit what the cache keeps of a finished request; returns what the replica's
        store must do (`applied`: the last log entry it applied, of its `generation`;
        None: the current one). A commit that cannot be
        applied aborts the request instead (nothing is cached). A commit for a request
        this coordinator no longer plans (its lease expired, the replica was reset, or it
        is a retry of an applied commit) frees, directly, what the request stored unless
        a tree node refers to it."""
        return self.commit_many(replica_id, [done], applied, generation)

    def commit_many(
        self,
        replica_id: str,
        finished: list[Finished],
        applied: int = 0,
        generation: int | None = None,
        relayed: bool = False,
    ) -> Releases:
        """`commit` of every request one replica step finished, in one call.

        `relayed`: these are the replica's own commits of requests it first relayed
        through their ingress (`ModelReplica._commit_overdue`). One whose plan's end is
        still in the log (the relay came first, or an abort) is dropped: the replica
        learns that end from the log and frees itself what the cache did not take, so
        freeing it here as an orphan would free it twice."""
        direct = Release()
        release_log = self.state.logs.get(replica_id)
        for done in finished:
            if self.state.is_planned(replica_id, done.request_id):
                self._do(Commit(replica_id, done))
            elif not (relayed and release_log is not None and release_log.settles(done.request_id)):
                direct = direct + self.state.orphan_release(replica_id, done)
        return self._releases(replica_id, applied, generation, direct)

    def step_many(
        self,
        commits: list[RelayedCommit],
        requests: list[tuple[npt.NDArray[np.int32], SamplingParams, float]],
    ) -> tuple[list[bool], list[Dispatch | Staged | Exception]]:
        """What an ingress has for the coordinator, in one call: the commits replicas
        relayed through it (`settings.commit_relay`), applied first, so a plan in the same
        call already finds them, then `plan_many(requests)`. Returns (per commit: whether
        it was applied; per request: its `Dispatch` or exception)."""
        applied = []
        for commit in commits:
            try:
                applied.append(self.relayed_commit(commit))
            except Exception:  # never lose the plans of the call: the replica commits it
                log.exception("relayed commit of request %d failed", commit.done.request_id)
                applied.append(False)
        return applied, self.plan_many(requests) if requests else []

    def relayed_commit(self, commit: RelayedCommit) -> bool:
        """Apply a relayed commit if its plan is still open on that replica generation
        (True); otherwise drop it (False): the plan already ended (the replica's own
        commit came first, a retry, an abort, a lease expiry or a reset) and its end is
        the replica's to learn from the log. Never frees anything directly, so a late or
        repeated relay can never free twice."""
        rid, done = commit.replica_id, commit.done
        release_log = self.state.logs.get(rid)
        if release_log is None or release_log.generation != commit.generation:
            return False
        release_log.ack(commit.applied, commit.generation)
        if not self.state.is_planned(rid, done.request_id):
            return False
        self._do(Commit(rid, done))
        return True

    def abort(
        self,
        replica_id: str,
        request_id: int,
        done: Finished | None = None,
        reason: str = "client",
        applied: int = 0,
        generation: int | None = None,
    ) -> Releases:
        """Release a request's plan (and what it stored, if it finished); returns what
        the replica's store must do (`applied`: the last log entry it applied, of its
        `generation`; None: the current one)."""
        direct = self._end_plan(replica_id, request_id, done, reason)
        return self._releases(replica_id, applied, generation, direct)

    def _end_plan(
        self, replica_id: str, request_id: int, done: Finished | None, reason: str
    ) -> Release:
        """Abort a request's plan (its release goes to the log); what a request that holds
        no plan stored is returned instead, to be freed directly."""
        if replica_id not in self.planners:
            self.leases.release(request_id)
            return Release() if done is None else done.stored()
        op = Abort(replica_id, request_id, reason, done)
        if self.state.is_planned(replica_id, request_id):
            self._do(op)
            return Release()
        tidied: Release = self.state.apply(op)  # nothing planned: no record, no log entry
        return tidied

    def abandon(self, dispatch: Dispatch) -> None:
        """A dispatch will never start: its replica said so (it refused it, or it never
        arrived there and is refused from now on), or it was never sent. Release its
        plan; the replica gets the release with its log. A plan that already ended
        (committed, aborted, expired) is left alone."""
        rid = dispatch.replica_id
        if rid in self.planners and dispatch.generation == self.state.log_of(rid).generation:
            self._end_plan(rid, dispatch.order.request_id, None, "abandoned")

    def drain(self, replica_id: str, applied: int = 0, generation: int | None = None) -> Releases:
        """What the replica's store must still do (log entries after `applied`, of its
        `generation`; None: the current one)."""
        return self._releases(replica_id, applied, generation)

    def _releases(
        self,
        replica_id: str,
        applied: int,
        generation: int | None,
        direct: Release | None = None,
    ) -> Releases:
        """Acknowledge `applied` (`ReleaseLog.ack`) and return the log entries after it,
        with `direct`."""
        release_log = self.state.logs.get(replica_id)
        if release_log is None:  # unregistered: its store was reset or is gone
            return Releases(0, (), direct or Release())
        release_log.ack(applied, generation)
        return release_log.since(direct)

    # ------------------------------------------------------------------ tuning
    def _send_job(self, replica_id: str, job: TuneJob) -> None:
        """A replica's window is complete: send its job now (`resend_jobs` sends it again
        if this fails or no result comes back). Never raises."""
        self._jobs[replica_id] = 0.0
        self._try_send(replica_id, job)

    def _try_send(self, replica_id: str, job: TuneJob) -> None:
        try:
            if self._tuner is None:
                self._tuner = ray.get_actor(self.settings.tuner_name, namespace=NAMESPACE)
            self._tuner.tune.remote(replica_id, job)
        except Exception as exc:  # no tuner actor (yet, or any more), Ray shutting down
            self._tuner = None
            log.warning("tuning job of replica %s not sent (%s): sent again later", replica_id, exc)
            return
        self._jobs[replica_id] = self.clock()

    def resend_jobs(self) -> int:
        """Send again every pending tuning job that was never sent, or whose result has
        not come back within `settings.tuner.retry_s` (the tuner actor died mid-search).
        A result that arrives twice is adopted once (`BootstrapTuner.expects`). Returns
        the number of jobs sent."""
        now, sent = self.clock(), 0
        for rid, at in list(self._jobs.items()):
            planner = self.planners.get(rid)
            job = None
            if planner is not None and planner.tuner is not None:
                job = planner.tuner.pending_job(planner.cache)
            if job is None:
                del self._jobs[rid]
            elif at == 0.0 or now - at >= self.settings.tuner.retry_s:
                self._try_send(rid, job)
                sent += 1
        return sent

    def adopt(self, replica_id: str, result: TuneResult) -> None:
        """Apply the tuner actor's winning alpha to a replica's cache (once: a result
        for a window that no longer waits is ignored)."""
        planner = self.planners.get(replica_id)
        if planner is not None and planner.tuner is not None and planner.tuner.expects(result):
            self._do(Adopt(replica_id, result))
            self._jobs.pop(replica_id, None)

    def tuner_runs(self) -> int:
        return sum(len(p.tuner.history) for p in self.planners.values() if p.tuner is not None)

    # ------------------------------------------------------------------ views
    def stats(self) -> list[ReplicaStats]:
        out = []
        for rid, planner in self.planners.items():
            runs = 0 if planner.tuner is None else len(planner.tuner.history)
            store = self._store_figures.get(rid)
            refused = self.refusals.get(rid, 0)
            role = self.replica_info[rid].role
            out.append(
                ReplicaStats.of(
                    rid, planner.cache, planner.open_requests, runs, store, refused, role
                )
            )
        return out

    def health(self) -> dict[str, Any]:
        """For `/health`: `replicas`, those that can serve now (confirmed, and heard from
        within a lease: a replica restored from the journal counts once it reconciles),
        `registered`, every replica the coordinator holds a cache for, `journal`
        (`journal_health`), `findings` (what the cache's setting makes it not do for
        this model: `core.cache.findings`, as {code, message}) and `roles` (replica id ->
        `mixed`, `prefill` or `decode`)."""
        now, lease = self.clock(), self.settings.lease_s
        live = [i for i in self.replica_info.values() if i.confirmed and now - i.last_seen <= lease]
        return {
            "replicas": len(live),
            "registered": len(self.planners),
            "journal": self.journal_health(),
            "findings": [asdict(f) for f in self.findings.values()],
            "roles": {rid: info.role for rid, info in self.replica_info.items()},
        }

    def journal_status(self) -> dict[str, Any]:
        """The journal's health and counters, and what the last start restored."""
        return {**self.journal.status(), "seq": self._seq, "recovery": self.recovery}

    def journal_health(self) -> dict[str, Any]:
        """The journal's health as a plain dict (for `/health` and `/metrics`): `state`
        (`ok` / `degraded` / `lost`), `persistent`, `backlog_records`, `backlog_bytes`,
        `max_backlog_bytes`, `lost_records`, `last_snapshot_age_s` (None before the
        first snapshot), `last_error` (see `serve.coordinator.journal.JournalHealth`)."""
        return self.journal.health().to_dict()

    def cost(self, replica_id: str) -> CostModel:
        """The cost model a replica's cache prices FLOPs and bytes with."""
        return self.state.cost(replica_id)

    def check_invariants(self) -> int:
        """Full-scan check of every replica's tree (radix shape, byte totals, locks) and
        of the lease table (one lease per open plan); raises AssertionError on a
        violation. Returns the number of nodes checked."""
        return self.state.check_invariants()

    def locked_nodes(self, replica_id: str) -> int:
        """Nodes of a replica's tree held by a lock (0 when no request is in flight)."""
        return self.planners[replica_id].cache.locked_nodes()
