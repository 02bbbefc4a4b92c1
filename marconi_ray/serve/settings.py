"""Frozen settings of a deployment (built once from the pydantic `ServeConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from marconi_ray.core.cache.host_tier import DEFAULT_HOST_GBPS, DEFAULT_PREFILL_TFLOPS, HostTier
from marconi_ray.core.cache.tuner import TunerConfig
from marconi_ray.protocol.kv_memory import KVMemory
from marconi_ray.protocol.orders import DEFAULT_MAX_BATCH_TOKENS
from marconi_ray.protocol.speculative import SpeculativeConfig
from marconi_ray.serve.disagg import DisaggSettings
from marconi_ray.serve.hub_model import HubModel
from marconi_ray.serve.placement import check_placement

TOOL_CALL_PARSERS = ("auto", "hermes", "qwen3_coder", "json_list")
"""Values of `tool_call_parser` (the ingress's `tools.registry.SETTINGS`; the control
plane's settings name them without importing the ingress)."""

COORDINATOR_NAME = "marconi-coordinator"
TUNER_NAME = "marconi-tuner"
GROUP_REPLICAS_BY = ("rank", "node")
"""How replicas are given to the coordinators of a group (`ServeSettings.group_replicas_by`)."""
NAMESPACE = "marconi"


@dataclass(frozen=True)
class TunerSettings(TunerConfig):
    """Bootstrap alpha tuning (the `core.cache.tuner.TunerConfig` every replica's planner
    uses) and how the tuner actor runs its grid.

    Attributes:
        workers: Ray tasks (one CPU each) the alpha grid is split across.
        retry_s: seconds the coordinator waits for a job's result before sending the job
            again (a job it could not send at all goes again at the next heartbeat).
    """

    workers: int = 2
    retry_s: float = 300.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if not self.retry_s > 0 or self.retry_s == float("inf"):
            raise ValueError(f"tuner retry_s must be a positive number, got {self.retry_s}")


@dataclass(frozen=True)
class ServeSettings:
    """One deployment.

    Attributes:
        model_dir: resolved model folder (config.json, safetensors, tokenizer) on the node
            that validated the config.
        hub_model: the Hugging Face model (pinned to a commit) when the model was given by
            its id, else None; every node then reads its own cache's snapshot
            (`local_model_dir`), not `model_dir`.
        model_name: the name clients pass as `model` (and `/v1/models` lists).
        tp: tensor-parallel ranks per replica; replicas: model replicas.
        cache_bytes: prefix cache budget per replica, per device (KV + SSM bytes).
        host_cache_bytes: budget of the cache's host tier per replica, per device rank
            (each shard process holds its shard's host copies, so one replica needs
            `tp` times this in its node's memory); 0: no host tier.
        host_placement, host_gbps, prefill_tflops: the host tier's placement (`flop_aware`
            or `lru`), copy bandwidth and prefill clock (`core.cache.host_tier.HostTier`).
        stream_interval: tokens a streamed chunk carries at least (the last: the rest).
        tool_call_parser: how tool calls are read from replies (`auto`: by the chat
            template; `hermes`, `qwen3_coder`, `json_list`; see `ingress.tools.registry`).
        system: `marconi`, `marconi+`, `sglang+`, `vllm+`, `vllm+refill` or `vanilla`.
        alpha: fixed eviction alpha, or None to tune it (`auto`).
        device: `cpu` or `cuda` (shards get one GPU each on `cuda`).
        kernels: SSM kernel set, `auto`, `ref` or `triton` (see `marconi_kernels`).
        max_batch: most requests one replica decodes together.
        max_batch_tokens: tokens one replica step processes at most (chunked prefill).
        max_running_tokens: KV rows a replica's running requests may hold together
            (`Worker`'s admission bound); None: no bound.
        kv_memory_bytes, kv_memory_fraction: size each shard's device KV pool once from a
            byte budget or a fraction of its GPU's free memory (`engine.kv_memory`; at
            most one of these and `max_running_tokens`).
        cuda_graphs: `auto` (the shards' decode steps replayed as CUDA graphs on CUDA,
            eager on CPU), `on` (CUDA only) or `off`.
        speculative: speculative decoding in every shard (None: off; see
            `protocol.speculative.SpeculativeConfig`).
        max_queued_requests: requests a replica may hold planned beyond `max_batch` (its
            queue); when every replica's is full, new requests get 429. -1: no limit.
        step_graph: how a tp > 1 replica fans a step out to its shards: `compiled` (a Ray
            Compiled Graph: ~3x less fan-out time, but its channels busy-wait, about a
            core per replica and half a core per shard even when idle), `plain` (actor
            calls), `auto` (compiled on CUDA, plain on CPU).
        app_name: the Serve application's name; the coordinator and tuner actors are
            named after it, so several applications can share one Ray cluster.
        routing: routing strategy across replicas (`serve.coordinator.routing.routers.ROUTERS`):
            `cache_aware` (default), `round_robin` or `least_loaded`.
        route_load_weight: `cache_aware` routing charges each open request of a replica
            the prefill FLOPs of this many tokens, weighed against the FLOPs its cached
            prefix saves (higher spreads load, lower follows the cache).
        route_max_imbalance: `cache_aware` routing never picks a replica with more than
            this many open requests above the least loaded one; below that bound a
            session stays on the replica that holds its last state.
        api_key: when set, every request but `GET /health` (the `/v1/*` API and
            `/metrics`) must send `Authorization: Bearer <api_key>` (401 otherwise).
            Secret: left out of `repr`, never logged.
        max_body_bytes: largest request body accepted (413 beyond it), checked on
            Content-Length and while reading chunked bodies.
        redis_url: Redis of the coordinator's journal (`redis://` / `rediss://`), or None
            for the in-memory one. Left out of `repr` (it may carry a password).
        lease_s: lease of a planned request on its hit; also how long a replica may stay
            silent before the coordinator drops it and its cache.
        heartbeat_s: seconds between a replica's heartbeats (lease renewals).
        coordinators: coordinator actors in the group (1: one coordinator, as before).
            Each owns a partition of the replicas (their trees, leases, release logs,
            journal and tuner); an ingress plans each request at the coordinator its
            group key picks (`serve.ingress.group_key`).
        coordinator_index: which coordinator of the group these settings are for (its
            actor, journal and tuner names; see `for_coordinator`).
        group_key_tokens: prompt tokens the group key hashes (a shared leading block and
            a session's turns go to one coordinator).
        group_replicas_by: how replicas are given to coordinators: `rank` (Serve's
            replica rank modulo `coordinators`: balanced) or `node` (the replica's node
            rank: a lost node touches one coordinator's replicas).
        commit_relay: a replica relays the commits of requests it runs for an ingress's
            channel through that ingress (`Completed.commit`), which sends them with its
            next coordinator call; False: the replica's step commits them itself.
        commit_relay_s: how long a relayed commit may take before the replica commits
            the request itself (`ModelReplica._commit_overdue`).
        snapshot_every: journal records between two compact snapshots.
        journal_max_backlog_bytes: encoded bytes of journal records the coordinator
            queues in memory while Redis is unreachable; past it they are dropped and a
            snapshot replaces them once Redis answers.
        control_resource: where the coordinator, the tuner actor and the ingress run:
            `auto` (the head node, through Ray's `node:__internal_head__` resource, when
            the cluster has it), `none` (anywhere), or a custom resource that the control
            nodes advertise (see `serve.placement`).
        model_resource: a custom resource that model nodes advertise, one unit per
            replica they may hold (every replica takes one), or None: replicas go
            wherever their CPUs / GPUs fit.
        disagg: prefill / decode roles, transfers between replicas and remote hits
            (`serve.disagg.DisaggSettings`); the default: mixed replicas, no transfers.
    """

    model_dir: str
    model_name: str
    hub_model: HubModel | None = None
    tp: int = 1
    replicas: int = 1
    cache_bytes: int = 1 << 30
    host_cache_bytes: int = 0
    host_placement: str = "flop_aware"
    host_gbps: float = DEFAULT_HOST_GBPS
    prefill_tflops: float = DEFAULT_PREFILL_TFLOPS
    system: str = "marconi"
    alpha: float | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    dtype: str = "float32"
    device: str = "cpu"
    kernels: str = "auto"
    max_batch: int = 8
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    max_running_tokens: int | None = None
    kv_memory_bytes: int | None = None
    kv_memory_fraction: float | None = None
    cuda_graphs: str = "auto"
    speculative: SpeculativeConfig | None = None
    max_queued_requests: int = 256
    step_graph: str = "auto"
    routing: str = "cache_aware"
    route_load_weight: float = 256.0
    route_max_imbalance: int = 4
    tuner: TunerSettings = field(default_factory=TunerSettings)
    app_name: str = "marconi"
    api_key: str | None = field(default=None, repr=False)
    max_body_bytes: int = 1_048_576
    stream_interval: int = 1
    tool_call_parser: str = "auto"
    redis_url: str | None = field(default=None, repr=False)
    lease_s: float = 30.0
    heartbeat_s: float = 1.0
    coordinators: int = 1
    coordinator_index: int = 0
    group_key_tokens: int = 256
    group_replicas_by: str = "rank"
    commit_relay: bool = True
    commit_relay_s: float = 2.0
    snapshot_every: int = 5_000
    journal_max_backlog_bytes: int = 64 << 20
    control_resource: str = "auto"
    model_resource: str | None = None
    disagg: DisaggSettings = field(default_factory=DisaggSettings)

    def __post_init__(self) -> None:
        check_placement(self.control_resource, self.model_resource)
        self._check_disagg()
        if not 0 <= self.coordinator_index < self.coordinators:
            raise ValueError(
                f"coordinator_index must be in [0, {self.coordinators}), "
                f"got {self.coordinator_index}"
            )
        if self.group_replicas_by not in GROUP_REPLICAS_BY:
            raise ValueError(
                f"group_replicas_by must be one of {', '.join(GROUP_REPLICAS_BY)}; "
                f"got {self.group_replicas_by!r}"
            )
        host = self.host_cache_bytes
        if isinstance(host, bool) or not isinstance(host, int) or host < 0:
            raise ValueError(f"host_cache_bytes must be an integer >= 0, got {host!r}")
        HostTier(host, self.host_gbps, self.prefill_tflops, self.host_placement)
        self._check_kv_memory()
        if self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise ValueError(
                f"tool_call_parser must be one of {', '.join(TOOL_CALL_PARSERS)}; "
                f"got {self.tool_call_parser!r}"
            )

    def _check_disagg(self) -> None:
        d = self.disagg
        if d.roles and d.replicas != self.replicas:
            raise ValueError(
                f"prefill_replicas + decode_replicas ({d.prefill_replicas} + "
                f"{d.decode_replicas}) must equal replicas ({self.replicas})"
            )
        if d.moves and self.tp > 1 and d.transfer in ("gloo", "nccl"):
            raise ValueError(
                f"transfer {d.transfer!r} cannot run at tp {self.tp}: Ray's torch collective "
                "groups take over each shard process's default process group, which tensor "
                "parallelism already holds; use nixl or object_store (auto picks one)"
            )
        if d.moves and self.coordinators != 1:
            raise ValueError(
                "prefill / decode roles and remote hits move entries between the replicas "
                f"of one coordinator: set coordinators to 1 (got {self.coordinators})"
            )

    @property
    def shard_actors(self) -> bool:
        """Replicas host their shards in `ShardActor`s: with tp > 1, and whenever entries
        move between replicas (Ray Direct Transport sends from actor to actor, so even a
        tp 1 replica's store lives in a shard actor then)."""
        return self.tp > 1 or self.disagg.moves

    @property
    def kv_memory(self) -> KVMemory | None:
        """The shards' KV memory budget, or None (the pool grows as needed)."""
        return self._check_kv_memory()

    def _check_kv_memory(self) -> KVMemory | None:
        if self.kv_memory_bytes is None and self.kv_memory_fraction is None:
            return None
        if self.max_running_tokens is not None:
            raise ValueError(
                f"set max_running_tokens ({self.max_running_tokens}) or a kv memory budget, "
                "not both"
            )
        return KVMemory(self.kv_memory_bytes, self.kv_memory_fraction)

    @property
    def host_settings(self) -> HostTier:
        """The host tier as set, budget 0 included (what `host_tier` turns into None), so
        settings that a missing tier ignores can be named (`core.cache.findings`)."""
        return HostTier(
            self.host_cache_bytes, self.host_gbps, self.prefill_tflops, self.host_placement
        )

    @property
    def tuner_set(self) -> tuple[str, ...]:
        """The tuner options set away from their defaults, by name."""
        default = TunerSettings()
        return tuple(
            f.name
            for f in fields(self.tuner)
            if getattr(self.tuner, f.name) != getattr(default, f.name)
        )

    @property
    def host_tier(self) -> HostTier | None:
        """The caches' host tier, or None without one (`host_cache_bytes` 0)."""
        return self.host_settings if self.host_cache_bytes else None

    def local_model_dir(self) -> str:
        """The model folder on this node: `model_dir`, or for a Hugging Face model its
        snapshot in this node's cache (downloaded first where allowed; ValueError naming
        the model when it cannot be)."""
        return self.model_dir if self.hub_model is None else str(self.hub_model.local_dir())

    def for_coordinator(self, index: int) -> ServeSettings:
        """These settings for coordinator `index` of the group (its names)."""
        return replace(self, coordinator_index=index)

    def group(self) -> list[ServeSettings]:
        """The settings of every coordinator of the group, by index."""
        return [self.for_coordinator(i) for i in range(self.coordinators)]

    @property
    def _member(self) -> str:
        """The name suffix of this coordinator of the group ('' for the first, so one
        coordinator keeps the names it always had)."""
        return f"-{self.coordinator_index}" if self.coordinator_index else ""

    @property
    def coordinator_name(self) -> str:
        """The coordinator actor's name (one per application and group member)."""
        return f"{COORDINATOR_NAME}-{self.app_name}{self._member}"

    @property
    def journal_prefix(self) -> str:
        """Redis key prefix of the coordinator's journal (one per group member)."""
        return f"{NAMESPACE}:{self.app_name}{self._member}"

    @property
    def tuner_name(self) -> str:
        """The tuner actor's name (one per application and group member)."""
        return f"{TUNER_NAME}-{self.app_name}{self._member}"
