"""Messages between the ingress, the coordinator and the replicas (picklable dataclasses,
no tensors)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from marconi_ray.core.cache.prefix_cache import PrefixCache
from marconi_ray.protocol.orders import Finished, PrefillOrder, TokenEvent
from marconi_ray.protocol.release_log import Releases
from marconi_ray.protocol.results import SpecCounts, Timings, Usage
from marconi_ray.serve.transfer_messages import Handoff, ReceiveOrder, ShardsQuery


@dataclass(frozen=True)
class Dispatch:
    """The coordinator's decision for one request: which replica runs it, its prefill
    order, and the replica's release log entries it has not acknowledged (`releases`:
    with them, what this plan evicted or moved; see `protocol.release_log`).

    `generation` is the replica's registration generation the plan was made against,
    `deadline` (wall-clock seconds) the end of its lease: the replica refuses a dispatch
    of another generation or past its deadline (`MisroutedDispatch`), so a request is
    never started on a hit the coordinator may have released. `needs`: the log seq the
    replica's store must have applied before the order starts (its hit is where the
    tree said when it was planned). `coordinator`: the index, in the coordinator group,
    of the coordinator that planned it and owns the replica (`settings.coordinators`):
    its relayed commit, abandon or report goes there.
    """

    replica_id: str
    order: PrefillOrder
    releases: Releases = field(default_factory=Releases)
    generation: int = 0
    deadline: float = math.inf
    needs: int = 0
    coordinator: int = 0
    handoff: Handoff | None = None
    """P/D: this replica prefills and emits the first token, then hands off (see
    `Handoff`); None: it runs the whole request."""


@dataclass(frozen=True)
class Subscription:
    """An ingress's request for its multiplexed stream from one replica (`channel`: the
    ingress's id for that stream, unique per stream it opens).

    The replica answers with one `StepMessage` per loop step that produced something for
    the channel's requests (several steps' worth when the ingress reads late)."""

    replica_id: str
    channel: str


@dataclass(frozen=True)
class Submissions:
    """Dispatches an ingress starts on one replica in one call, their events to come
    through the stream of `channel`. `streamed[i]` False: dispatch i's client wants the
    whole answer, so its tokens come in one message with its end."""

    replica_id: str
    channel: str
    dispatches: tuple[Dispatch, ...]
    streamed: tuple[bool, ...]


@dataclass(frozen=True)
class Settlements:
    """Dispatches whose clients left (or no longer listen): each is stopped where it runs,
    or refused and abandoned if it never arrived (see `ModelReplica.settle`)."""

    replica_id: str
    dispatches: tuple[Dispatch, ...]


class MisroutedDispatch(RuntimeError):
    """A replica refused a dispatch: planned for another replica (which has gone), for an
    earlier generation of this one (its cache was reset since), or past its lease's
    deadline (the coordinator may have released its hit). Safe to plan again. The
    replica that refused a dispatch planned for it released the plan itself."""


class WrongReplica(MisroutedDispatch):
    """A call pinned to one replica reached another (Serve no longer lists the first):
    the replica it was planned for never received it, so its plan can be abandoned."""


class ReplicaFailed(RuntimeError):
    """A replica lost a shard while running the request (its TP group is being rebuilt,
    its cache dropped). The tokens streamed so far are valid; the rest can be generated
    elsewhere."""


class NoReplicaAvailable(RuntimeError):
    """No replica is registered and confirmed alive at the coordinator (HTTP 503)."""


class ReplicasUnconfirmed(NoReplicaAvailable):
    """The coordinator holds replicas but none is confirmed yet (restored from its
    journal, they have not reconciled): a wait of a heartbeat or two, not a reason to
    plan elsewhere (a coordinator group does not spill it: the caches are here)."""


class Overloaded(RuntimeError):
    """Every live replica's queue is full (`max_queued_requests`): the request is shed
    before anything is planned (HTTP 429 with Retry-After)."""


@dataclass(frozen=True)
class Completed:
    """The last event of a request's stream: its usage, finish reason and timings, and
    its speculative decoding counts.

    `commit`: set when the replica relays the request's commit through the ingress
    (`settings.commit_relay`, a multiplexed channel): what it finished with, for the
    ingress to send to the coordinator with its next call (`RelayedCommit`) before it
    answers the client. None when the replica committed it itself. `applied`: with a
    relayed commit, the last entry of its release log the replica had taken then (the
    relay acknowledges it, so the log does not wait for a heartbeat to shrink)."""

    request_id: int
    finish_reason: str
    usage: Usage
    timings: Timings
    spec: SpecCounts = field(default_factory=SpecCounts)
    commit: Finished | None = None
    applied: int = 0


@dataclass(frozen=True)
class RelayedCommit:
    """A replica's commit carried by the ingress (`CacheCoordinator.step_many`): applied
    only while the request's plan is open on that replica of that `generation`; any
    other is dropped, never freed from (the replica learns every plan's end from its
    release log, `Release.settled`, and frees what the cache did not take). `applied`:
    the replica's acknowledgement of its log of `generation` (`Completed.applied`)."""

    replica_id: str
    generation: int
    done: Finished
    applied: int = 0


@dataclass(frozen=True)
class ReplicaStats:
    """One replica's cache figures, as the coordinator sees them (for `/metrics`).

    Attributes:
        capacity, bytes_used: the device tier's budget and the bytes it holds now.
        stats: `core.cache.stats.CacheStats.to_dict()` (requests, hit tokens, FLOPs saved,
            states admitted by reason, evictions, promotions and demotions, ...).
        bytes_by_kind: bytes held now, {"kv": ..., "ssm": ...}.
        in_flight: requests planned on this replica and not yet committed or aborted.
        tuner_runs: alpha searches adopted so far.
        bytes_by_tier: bytes held now, {"device": ..., "host": ...}.
        host_capacity: the host tier's budget (0: no host tier).
        store: the replica's last reported store figures between the tiers
            (`StateStore.tier_stats()` of its rank 0: host bytes, bytes and seconds
            copied and moves per direction); empty until it reports (it does only with
            a host tier).
        refused_releases: releases the replica's store refused (each made it reconcile).
        role: `mixed`, `prefill` or `decode` (`serve.disagg`).
    """

    replica_id: str
    capacity: int
    bytes_used: int
    reserved: int
    bytes_by_kind: dict[str, int]
    alpha: float
    in_flight: int
    tuner_runs: int
    stats: dict[str, object]
    bytes_by_tier: dict[str, int] = field(default_factory=dict)
    host_capacity: int = 0
    store: dict[str, float] = field(default_factory=dict)
    refused_releases: int = 0
    role: str = "mixed"

    @classmethod
    def of(
        cls,
        replica_id: str,
        cache: PrefixCache,
        in_flight: int,
        tuner_runs: int,
        store: dict[str, float] | None = None,
        refused_releases: int = 0,
        role: str = "mixed",
    ) -> ReplicaStats:
        """A snapshot of `cache`'s figures, with the replica's `store` figures, the
        releases its store refused and its role."""
        return cls(
            replica_id=replica_id,
            capacity=cache.capacity,
            bytes_used=cache.bytes_used,
            reserved=cache.reserved,
            bytes_by_kind=cache.bytes_by_kind(),
            alpha=cache.alpha,
            in_flight=in_flight,
            tuner_runs=tuner_runs,
            stats=cache.stats.to_dict(),
            bytes_by_tier=cache.bytes_by_tier(),
            host_capacity=cache.host_capacity,
            store=dict(store or {}),
            refused_releases=refused_releases,
            role=role,
        )


StreamItem = TokenEvent | Completed | BaseException
"""What a channel carries for one request: its tokens in order, then exactly one end (its
`Completed`, or the exception that ended it there: `MisroutedDispatch`, `ReplicaFailed`,
a failure)."""

StepMessage = dict[int, list[StreamItem]]
"""One message of a channel: request id -> its items since the last message."""

PINNED = (Dispatch, Subscription, Submissions, Settlements, ShardsQuery, ReceiveOrder)
"""Calls whose first `replica_id`-bearing argument pins them to one replica (see
`ingress.pinned_router`)."""
