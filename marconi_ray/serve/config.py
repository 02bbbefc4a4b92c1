"""The serve configuration users write (YAML / CLI flags): pydantic `ServeConfig`.

It is validated once at the boundary and converted to the frozen `ServeSettings` with
`ServeConfig.to_settings()`. Unknown keys are errors (`extra="forbid"`), at the top level
and under `tuner`. `load_serve_config` and `config_from_mapping` turn pydantic's errors
into one `ValueError` whose message names every bad key, e.g.
`invalid serve config (serve.yaml): tp: Input should be greater than or equal to 1 (got 0)`.

Secrets: `api_key` (and `redis_url`, which may carry a password) are left out of `repr` and
never echoed in error messages. When the config has no `api_key` (the key is absent or
null), it is read from the environment variable `MARCONI_API_KEY` (an empty value counts
as unset), so the key need not be written into a file.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal
from urllib.parse import quote, urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from marconi_ray.core.cache.host_tier import DEFAULT_HOST_GBPS, DEFAULT_PREFILL_TFLOPS
from marconi_ray.core.cache.systems import SYSTEMS, get_system
from marconi_ray.core.cache.tuner import default_grid
from marconi_ray.protocol.model_files import checkpoint_dtype
from marconi_ray.protocol.orders import DEFAULT_MAX_BATCH_TOKENS
from marconi_ray.protocol.speculative import MAX_SPECULATIVE_TOKENS, SpeculativeConfig
from marconi_ray.serve.coordinator.routing.routers import DEFAULT_ROUTING, ROUTERS, check_routing
from marconi_ray.serve.disagg import (
    DEFAULT_TRANSFER_GBPS,
    DEFAULT_TRANSFER_LATENCY_S,
    DisaggSettings,
)
from marconi_ray.serve.model_source import (
    default_model_name,
    hub_source,
    resolve_drafter,
    resolve_model,
)
from marconi_ray.serve.placement import check_placement, check_resource_name
from marconi_ray.serve.settings import ServeSettings, TunerSettings

AUTO: Final = "auto"
API_KEY_ENV: Final = "MARCONI_API_KEY"
"""Environment variable read for `api_key` when the config has none."""
REDIS_URL_ENV: Final = "MARCONI_REDIS_URL"
"""Environment variable read for `redis_url` when the config has none. Without it, a URL
is assembled from MARCONI_REDIS_HOST, MARCONI_REDIS_PORT (6379) and the password in
MARCONI_REDIS_PASSWORD or the file named by MARCONI_REDIS_PASSWORD_FILE (what the
cluster launchers and the KubeRay manifest set), when MARCONI_REDIS_HOST is set."""
SECRET_KEYS: Final = frozenset({"api_key", "redis_url"})
"""Keys whose values are never shown (repr, error messages)."""
REDIS_SCHEMES: Final = ("redis", "rediss")


class TunerOptions(BaseModel):
    """Bootstrap alpha tuning of the `marconi` system (see `core.cache.tuner`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    multiplier: int = Field(
        default=5,
        ge=1,
        description="Tuning window = multiplier x requests served before the first eviction.",
    )
    grid: list[float] = Field(
        default_factory=lambda: list(default_grid()),
        min_length=1,
        description="Candidate alphas (each finite and >= 0) replayed on the window.",
    )
    retune_every: int | None = Field(
        default=None,
        ge=1,
        description="Re-tune on every following window of this many requests (null: once).",
    )
    workers: int = Field(
        default=2,
        ge=1,
        description="Ray tasks (one CPU each) the alpha grid is split across.",
    )
    retry_s: float = Field(
        default=300.0,
        gt=0,
        allow_inf_nan=False,
        description="Seconds the coordinator waits for a tuning result before sending the "
        "job again (the tuner actor died mid-search); a job that could not be sent at all "
        "is sent again at the next heartbeat.",
    )

    @field_validator("grid")
    @classmethod
    def _grid_values(cls, grid: list[float]) -> list[float]:
        bad = [a for a in grid if not math.isfinite(a) or a < 0]
        if bad:
            raise ValueError(f"alphas must be finite and >= 0, got {bad}")
        return grid

    def to_settings(self) -> TunerSettings:
        """The frozen `TunerSettings` of this section."""
        return TunerSettings(
            multiplier=self.multiplier,
            grid=tuple(self.grid),
            retune_every=self.retune_every,
            workers=self.workers,
            retry_s=self.retry_s,
        )


class SpeculativeSection(BaseModel):
    """`speculative:` in the config file (see `protocol.speculative.SpeculativeConfig`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    method: str = Field(
        default="ngram",
        description="The drafter: ngram, or draft:MODEL (a small model with the target's "
        "tokenizer; MODEL as `model` takes it).",
    )
    num_speculative_tokens: int = Field(
        default=4, ge=1, le=MAX_SPECULATIVE_TOKENS, description="Tokens drafted per step."
    )
    prompt_lookup_min: int = Field(default=2, ge=1, description="Shortest n-gram matched.")
    prompt_lookup_max: int = Field(default=4, ge=1, description="Longest n-gram matched.")

    @model_validator(mode="after")
    def _lookup_range(self) -> SpeculativeSection:
        self.to_config()
        return self

    def to_config(self, resolve: bool = False) -> SpeculativeConfig:
        """The engine's settings (ValueError naming a bad value); with `resolve`, a
        `draft:MODEL` named as `model` is (built if a preset and) resolved to its folder."""
        method = resolve_drafter(self.method) if resolve else self.method
        return SpeculativeConfig(
            method, self.num_speculative_tokens, self.prompt_lookup_min, self.prompt_lookup_max
        )


class ServeConfig(BaseModel):
    """One deployment, as the user writes it; `to_settings()` resolves it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(
        default="tiny",
        min_length=1,
        description="A model folder (with config.json), the packaged trained model chat, "
        "a preset: tiny, small, "
        "optionally preset:family (e.g. tiny:bamba), built on first use, or a Hugging Face "
        "id ORG/NAME[@REVISION], read from the Hugging Face cache of each node that loads "
        "it (downloaded there unless HF_HUB_OFFLINE=1).",
    )
    model_name: str = Field(
        default="",
        description="The name clients pass as `model` (default: the preset spec or the "
        "Hugging Face id as written, or the model folder's name).",
    )
    tp: int = Field(default=1, ge=1, description="Tensor-parallel ranks per replica.")
    replicas: int = Field(default=1, ge=1, description="Model replicas.")
    cache_bytes: int = Field(
        default=10**9,
        gt=0,
        description="Prefix-cache budget per replica in bytes (KV + SSM states); an int, "
        "a float or a numeric string such as '1e9'.",
    )
    host_cache_bytes: int = Field(
        default=0,
        ge=0,
        description="Host-memory tier of the prefix cache, in bytes per replica and per "
        "tensor-parallel rank (each shard process holds its own host copies: a replica "
        "needs tp x this on its node); device evictions are demoted to it and promoted "
        "back on a hit. 0: no host tier. A start is refused when a node's free memory "
        "(MemAvailable) cannot hold a replica's share.",
    )
    host_placement: Literal["flop_aware", "lru"] = Field(
        default="flop_aware",
        description="What a device eviction does with a host tier: flop_aware demotes a "
        "victim only when a hit on it saves more prefill time than copying it back costs "
        "(at host_gbps and prefill_tflops), else drops it; lru demotes every victim.",
    )
    host_gbps: float = Field(
        default=DEFAULT_HOST_GBPS,
        gt=0,
        description="Host <-> device copy bandwidth in GB/s that flop_aware placement "
        "weighs (PCIe 5.0 x16: about 50).",
    )
    prefill_tflops: float = Field(
        default=DEFAULT_PREFILL_TFLOPS,
        gt=0,
        description="Prefill speed in TFLOP/s that flop_aware placement weighs against the "
        "copy (an H200 at about 40% of its dense bf16 peak: 400).",
    )
    prefill_replicas: int = Field(
        default=0,
        ge=0,
        description="Replicas that prefill (prompts and their caches) and hand the entry at "
        "the prompt's end to a decode replica; with decode_replicas. Both 0: mixed replicas. "
        "replicas defaults to their sum.",
    )
    decode_replicas: int = Field(
        default=0,
        ge=0,
        description="Replicas that decode, each with its own cache (the state after a "
        "turn's last decoded token lives here); a next turn with a short suffix is "
        "prefilled where its hit is.",
    )
    transfer: Literal["auto", "nixl", "nccl", "gloo", "object_store"] = Field(
        default="auto",
        description="How cache entries move between replicas (Ray Direct Transport): auto "
        "(NIXL where installed, else NCCL on CUDA, GLOO on CPU), nixl, nccl, gloo, or "
        "object_store (Ray's object store, any device).",
    )
    transfer_gbps: float = Field(
        default=DEFAULT_TRANSFER_GBPS,
        gt=0,
        allow_inf_nan=False,
        description="GB/s a move between replicas is priced at against recomputing its "
        "tokens at prefill_tflops (one 400 Gb/s link: 50).",
    )
    transfer_latency_s: float = Field(
        default=DEFAULT_TRANSFER_LATENCY_S,
        ge=0,
        allow_inf_nan=False,
        description="Seconds each move costs on top of its bytes.",
    )
    transfer_timeout_s: float = Field(
        default=30.0,
        gt=0,
        allow_inf_nan=False,
        description="Seconds one move may take; past it the receiver recomputes.",
    )
    remote_hits: bool = Field(
        default=False,
        description="Mixed replicas: when a request's deepest cached prefix is on another "
        "replica than the one it is routed to, pull it over when that beats recomputing.",
    )
    system: str = Field(
        default="marconi",
        description=f"Caching system, one of {sorted(SYSTEMS)}, or marconi+:B (marconi+ "
        "with speculative checkpoints at B * 2**k tokens; marconi+ is marconi+:512).",
    )
    alpha: Literal["auto"] | float = Field(
        default=AUTO,
        description="FLOP-aware eviction weight: 'auto' (bootstrap tuning) or a number >= 0.",
    )
    host: str = Field(default="127.0.0.1", min_length=1, description="HTTP bind address.")
    port: int = Field(default=8000, ge=1, le=65535, description="HTTP port.")
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field(
        default="float32",
        description="Weight and activation dtype; 'auto': the checkpoint's (config.json "
        "dtype / torch_dtype; float32 when it names none of the others).",
    )
    device: Literal["cpu", "cuda"] = Field(
        default="cpu", description="Where shards run (cuda: one GPU per shard)."
    )
    kernels: Literal["auto", "ref", "triton"] = Field(
        default="auto",
        description="Kernels (SSM scans, convs, decode attention): auto (Triton on CUDA "
        "when installed, else the torch "
        "references, logged), ref (pure torch), triton (mamba-ssm's and our Triton kernels; "
        "a shard that cannot run them fails its set-up with the reason).",
    )
    max_batch: int = Field(default=8, ge=1, description="Most requests a replica decodes together.")
    max_batch_tokens: int = Field(
        default=DEFAULT_MAX_BATCH_TOKENS,
        ge=16,
        description="Tokens one step of a replica processes at most (decode rows plus a "
        "prefill chunk): longer prompts are prefilled in chunks interleaved with the running "
        "decodes, so a long prefill never stalls them for its whole length.",
    )
    max_running_tokens: int | None = Field(
        default=None,
        ge=1,
        description="KV rows (tokens) a replica's running requests may hold together, on "
        "top of what its cache holds: each request reserves its uncached prompt plus its "
        "max_tokens when it starts, and a request that does not fit waits for running ones "
        "to end, so a burst of long prompts queues instead of running out of device memory. "
        "null: no bound (the KV pool grows as needed).",
    )
    kv_memory_bytes: int | None = Field(
        default=None,
        gt=0,
        description="Size each shard's device KV pool once at start from this many bytes "
        "(per tensor-parallel rank, like cache_bytes): cache_bytes inside it, the running "
        "requests' recurrent states set aside, the rest bounding their KV rows (it sets "
        "max_running_tokens, so not both). The setting to use on CPU; null: the pool grows "
        "as needed.",
    )
    kv_memory_fraction: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="As kv_memory_bytes, from this fraction of each GPU's free memory once "
        "the weights are loaded and the kernels warmed up (vLLM's gpu_memory_utilization, "
        "of what is left; 0.85 leaves room for activations). CUDA only.",
    )
    cuda_graphs: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="Replay each shard's decode step as CUDA graphs (one per batch-size "
        "bucket, padded; recorded at the first step of each): auto (on CUDA, eager on "
        "CPU), on (CUDA only), off.",
    )
    speculative: SpeculativeSection | None = Field(
        default=None,
        description="Speculative decoding: {method: ngram, num_speculative_tokens: K (1-16), "
        "prompt_lookup_min, prompt_lookup_max}; greedy output is unchanged, sampled output "
        "keeps its distribution. Null: off.",
    )
    max_queued_requests: int = Field(
        default=256,
        ge=-1,
        description="Requests a replica may hold planned beyond max_batch (its queue); when "
        "every replica's queue is full, new requests are shed with HTTP 429 and Retry-After "
        "instead of waiting without bound. -1: no limit.",
    )
    step_graph: Literal["auto", "compiled", "plain"] = Field(
        default="auto",
        description="How a tp > 1 replica fans each step out to its shards: compiled (a Ray "
        "Compiled Graph over shared-memory channels, ~3x less fan-out time than actor calls, "
        "but its readers busy-wait: about a core per replica and half a core per shard even "
        "when idle), plain (one actor call per shard), auto (compiled on CUDA, plain on CPU).",
    )
    routing: str = Field(
        default=DEFAULT_ROUTING,
        description=f"How requests are spread over replicas, one of {sorted(ROUTERS)}: "
        "cache_aware weighs the prefill FLOPs each replica's cached prefix saves against "
        "its queue and keeps a session on the replica holding its last state; "
        "round_robin cycles; least_loaded picks the fewest open requests.",
    )
    route_load_weight: float = Field(
        default=256.0,
        ge=0,
        allow_inf_nan=False,
        description="cache_aware routing charges each open request of a replica the "
        "prefill FLOPs of this many tokens, against the FLOPs its cached prefix saves "
        "(higher spreads load, lower follows the cache).",
    )
    route_max_imbalance: int = Field(
        default=4,
        ge=0,
        description="cache_aware routing never picks a replica with more than this many "
        "open requests above the least loaded one; within it, a session stays on the "
        "replica that holds its last state.",
    )
    tuner: TunerOptions = Field(
        default_factory=TunerOptions, description="Bootstrap alpha tuning settings."
    )
    api_key: str | None = Field(
        default=None,
        repr=False,
        description="Bearer token every request but GET /health must send "
        "(`Authorization: Bearer <key>`; 401 otherwise); null: no authentication. "
        f"Read from ${API_KEY_ENV} when absent or null. Visible ASCII, no spaces.",
    )
    max_body_bytes: int = Field(
        default=1_048_576,
        ge=1024,
        description="Largest request body in bytes (413 beyond it; checked on Content-Length "
        "and while reading chunked bodies).",
    )
    stream_interval: int = Field(
        default=1,
        ge=1,
        description="Tokens a streamed chunk carries at least (the last chunk: the rest), "
        "like vLLM's --stream-interval: fewer, larger SSE chunks cost less CPU per token.",
    )
    tool_call_parser: Literal["auto", "hermes", "qwen3_coder", "json_list"] = Field(
        default="auto",
        description="How tool calls are read from replies: auto (by the chat template: "
        "qwen3_coder when it writes <function=, else hermes), hermes (<tool_call> JSON), "
        "qwen3_coder (<tool_call> XML) or json_list.",
    )
    redis_url: str | None = Field(
        default=None,
        repr=False,
        description="Redis for the coordinator's journal (redis://[:password@]host:port/db "
        "or rediss://): cache metadata survives coordinator restarts. Null: taken from "
        f"${REDIS_URL_ENV} or MARCONI_REDIS_HOST/_PORT/_PASSWORD(_FILE) when set, else an "
        "in-memory journal (not persistent; logged).",
    )
    lease_s: float = Field(
        default=30.0,
        gt=0,
        allow_inf_nan=False,
        description="Seconds a planned request's lease on its cache hit lasts; replicas "
        "renew the leases of the requests they run with every heartbeat, and a replica "
        "silent for this long is dropped with its cache.",
    )
    heartbeat_s: float = Field(
        default=1.0,
        gt=0,
        allow_inf_nan=False,
        description="Seconds between a replica's heartbeats to the coordinator (must be "
        "well under lease_s).",
    )
    coordinators: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Coordinator actors in the group. Each owns a partition of the replicas "
        "(their trees, leases, journal and tuner); an ingress plans each request at the "
        "coordinator a hash of the prompt's leading tokens picks, and spills to another "
        "when that one has no replica free. 1: one coordinator.",
    )
    group_key_tokens: int = Field(
        default=256,
        ge=1,
        description="Prompt tokens the coordinator group key hashes (a shared leading "
        "block, and so a session's turns, stay with one coordinator).",
    )
    group_replicas_by: Literal["rank", "node"] = Field(
        default="rank",
        description="How replicas are given to the coordinators: rank (Serve's replica "
        "rank modulo coordinators: balanced) or node (by the replica's node: a lost node "
        "touches one coordinator's replicas).",
    )
    commit_relay: bool = Field(
        default=True,
        description="Replicas send a request's commit to the coordinator through the "
        "ingress that runs it, in the ingress's next coordinator call with its plans (one "
        "call carries many plans and commits); false: each replica step with finished "
        "requests makes a commit call of its own.",
    )
    commit_relay_s: float = Field(
        default=2.0,
        gt=0,
        allow_inf_nan=False,
        description="Seconds a replica waits for a relayed commit to be applied before it "
        "commits the request itself (an ingress that died or lost its channel).",
    )
    snapshot_every: int = Field(
        default=5_000,
        ge=1,
        description="Journal records between two compact snapshots of the coordinator "
        "(recovery replays at most this many; ~0.3 ms each on a 2-core CPU).",
    )
    journal_max_backlog_bytes: int = Field(
        default=64 << 20,
        ge=0,
        description="Bytes of journal records (encoded; 12-24 KB each for 3k-token prompts) the "
        "coordinator queues in memory while Redis is unreachable. Past it they are dropped "
        "and nothing more is queued: a snapshot replaces them once Redis answers (the "
        "cache keeps serving; a coordinator crash before then restarts from the last "
        "snapshot).",
    )
    control_resource: str = Field(
        default=AUTO,
        min_length=1,
        description="Where the cache coordinator, the tuner actor and the HTTP ingress run, "
        "so that losing a model node never takes them along: 'auto' (the head node, through "
        "Ray's node:__internal_head__ resource), 'none' (anywhere Ray likes), or the name of "
        "a custom resource the control nodes advertise (ray start --resources "
        "'{\"marconi_control\": 1}'; an error at start when no node has it).",
    )
    model_resource: str | None = Field(
        default=None,
        description="A custom resource the model nodes advertise, one unit per model replica "
        "a node may hold (ray start --resources '{\"marconi_model\": 2}'): every replica "
        "takes one, so replicas run only on those nodes and at most that many share one. "
        "Null: replicas go wherever their CPUs / GPUs fit.",
    )

    @model_validator(mode="before")
    @classmethod
    def _api_key_from_env(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and data.get("api_key") is None:
            key = os.environ.get(API_KEY_ENV)
            if key:
                return {**data, "api_key": key}
        return data

    @model_validator(mode="before")
    @classmethod
    def _redis_url_from_env(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and data.get("redis_url") is None:
            url = redis_url_from_env(os.environ)
            if url:
                return {**data, "redis_url": url}
        return data

    @model_validator(mode="before")
    @classmethod
    def _derive_model_name(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and not data.get("model_name"):
            model = data.get("model", "tiny")
            if isinstance(model, str) and model:
                return {**data, "model_name": default_model_name(model)}
        return data

    @field_validator(
        "cache_bytes",
        "host_cache_bytes",
        "kv_memory_bytes",
        "max_body_bytes",
        "journal_max_backlog_bytes",
        mode="before",
    )
    @classmethod
    def _bytes_number(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError(f"must be a number of bytes, got {value!r}")
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise ValueError(f"must be a number of bytes, got {value!r}") from None
        if isinstance(value, float):
            if not math.isfinite(value):
                raise ValueError(f"must be a finite number of bytes, got {value!r}")
            return round(value)
        return value

    @field_validator("api_key")
    @classmethod
    def _api_key_value(cls, key: str | None) -> str | None:
        # Never name the value: it is a secret.
        if key is None:
            return None
        if not key:
            raise ValueError("must be a non-empty string (null disables authentication)")
        if not all("!" <= c <= "~" for c in key):
            raise ValueError("must be visible ASCII characters only (no spaces)")
        return key

    @field_validator("redis_url")
    @classmethod
    def _redis_url_value(cls, url: str | None) -> str | None:
        # Never name the value: it may carry a password.
        if url is None:
            return None
        schemes = " or ".join(f"{s}://" for s in REDIS_SCHEMES)
        if any(c.isspace() for c in url):
            raise ValueError(f"must be a {schemes} URL without spaces")
        try:
            parts = urlsplit(url)
            _ = parts.port  # ValueError for a bad port
        except ValueError:
            raise ValueError(f"must be a valid {schemes} URL") from None
        if parts.scheme not in REDIS_SCHEMES:
            raise ValueError(f"must be a {schemes} URL, got scheme {parts.scheme!r}")
        if not parts.hostname:
            raise ValueError(f"must be a {schemes} URL with a host")
        return url

    @model_validator(mode="after")
    def _heartbeat_under_lease(self) -> ServeConfig:
        if self.heartbeat_s * 3 > self.lease_s:
            raise ValueError(
                f"heartbeat_s ({self.heartbeat_s}) must be at most a third of lease_s "
                f"({self.lease_s}), or live requests lose their leases"
            )
        if self.commit_relay_s * 2 > self.lease_s:
            raise ValueError(
                f"commit_relay_s ({self.commit_relay_s}) must be at most half of lease_s "
                f"({self.lease_s}), or a commit an ingress lost waits past its lease"
            )
        return self

    @field_validator("control_resource")
    @classmethod
    def _control_resource_value(cls, value: str) -> str:
        check_placement(value, None)
        return value

    @field_validator("model_resource")
    @classmethod
    def _model_resource_value(cls, value: str | None) -> str | None:
        return None if value is None else check_resource_name(value, "model_resource")

    @model_validator(mode="after")
    def _one_running_bound(self) -> ServeConfig:
        set_ = [
            f"{name}={getattr(self, name)}"
            for name in ("max_running_tokens", "kv_memory_bytes", "kv_memory_fraction")
            if getattr(self, name) is not None
        ]
        if len(set_) > 1:
            later = set_[1].split("=")[0]
            raise ValueError(
                f"{later}: set at most one of max_running_tokens, kv_memory_bytes and "
                f"kv_memory_fraction, got {', '.join(set_)}"
            )
        if self.cuda_graphs == "on" and self.device != "cuda":
            raise ValueError(f"cuda_graphs: 'on' needs device cuda, got {self.device!r}")
        if self.kv_memory_fraction is not None and self.device != "cuda":
            raise ValueError(
                f"kv_memory_fraction: {self.kv_memory_fraction} needs device cuda, got "
                f"{self.device!r} (set kv_memory_bytes instead)"
            )
        return self

    @model_validator(mode="after")
    def _placement(self) -> ServeConfig:
        check_placement(self.control_resource, self.model_resource)
        return self

    @model_validator(mode="after")
    def _disagg(self) -> ServeConfig:
        roles = self.disagg_settings()
        if roles.roles and "replicas" in self.model_fields_set and roles.replicas != self.replicas:
            raise ValueError(
                f"replicas ({self.replicas}) must equal prefill_replicas + decode_replicas "
                f"({roles.prefill_replicas} + {roles.decode_replicas}); leave replicas out "
                "to take their sum"
            )
        return self

    def disagg_settings(self) -> DisaggSettings:
        """The roles and transfer settings (ValueError naming a bad combination)."""
        return DisaggSettings(
            prefill_replicas=self.prefill_replicas,
            decode_replicas=self.decode_replicas,
            transfer=self.transfer,
            transfer_gbps=self.transfer_gbps,
            transfer_latency_s=self.transfer_latency_s,
            remote_hits=self.remote_hits,
            transfer_timeout_s=self.transfer_timeout_s,
        )

    @field_validator("system")
    @classmethod
    def _known_system(cls, value: str) -> str:
        return get_system(value).name

    @field_validator("routing")
    @classmethod
    def _known_routing(cls, value: str) -> str:
        return check_routing(value)

    @field_validator("alpha", mode="before")
    @classmethod
    def _alpha_value(cls, value: Any) -> Any:
        if value == AUTO:
            return value
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or value < 0:
            raise ValueError(f"must be 'auto' or a number >= 0, got {value!r}")
        return float(value)

    def to_settings(self, models_root: Path | None = None) -> ServeSettings:
        """Resolve the model (building a preset under `models_root` if needed, fetching a
        Hugging Face id into this node's cache; see `model_source.resolve_model`) and return
        the frozen `ServeSettings`; dtype 'auto' becomes the checkpoint's;
        alpha 'auto' becomes None (tune it)."""
        model_dir = resolve_model(self.model, models_root)
        return ServeSettings(
            model_dir=str(model_dir),
            hub_model=hub_source(self.model, model_dir),
            model_name=self.model_name,
            tp=self.tp,
            replicas=self.prefill_replicas + self.decode_replicas or self.replicas,
            cache_bytes=self.cache_bytes,
            host_cache_bytes=self.host_cache_bytes,
            host_placement=self.host_placement,
            host_gbps=self.host_gbps,
            prefill_tflops=self.prefill_tflops,
            system=self.system,
            alpha=None if self.alpha == AUTO else float(self.alpha),
            host=self.host,
            port=self.port,
            dtype=checkpoint_dtype(model_dir) if self.dtype == AUTO else self.dtype,
            device=self.device,
            kernels=self.kernels,
            max_batch=self.max_batch,
            max_batch_tokens=self.max_batch_tokens,
            max_running_tokens=self.max_running_tokens,
            kv_memory_bytes=self.kv_memory_bytes,
            kv_memory_fraction=self.kv_memory_fraction,
            cuda_graphs=self.cuda_graphs,
            speculative=None if self.speculative is None else self.speculative.to_config(True),
            max_queued_requests=self.max_queued_requests,
            step_graph=self.step_graph,
            routing=self.routing,
            route_load_weight=self.route_load_weight,
            route_max_imbalance=self.route_max_imbalance,
            tuner=self.tuner.to_settings(),
            api_key=self.api_key,
            max_body_bytes=self.max_body_bytes,
            stream_interval=self.stream_interval,
            tool_call_parser=self.tool_call_parser,
            redis_url=self.redis_url,
            lease_s=self.lease_s,
            heartbeat_s=self.heartbeat_s,
            coordinators=self.coordinators,
            group_key_tokens=self.group_key_tokens,
            group_replicas_by=self.group_replicas_by,
            commit_relay=self.commit_relay,
            commit_relay_s=self.commit_relay_s,
            snapshot_every=self.snapshot_every,
            journal_max_backlog_bytes=self.journal_max_backlog_bytes,
            control_resource=self.control_resource,
            model_resource=self.model_resource,
            disagg=self.disagg_settings(),
        )


def redis_url_from_env(env: Mapping[str, str]) -> str | None:
    """The journal's Redis URL from the environment (see `REDIS_URL_ENV`), or None."""
    if env.get(REDIS_URL_ENV):
        return env[REDIS_URL_ENV]
    host = env.get("MARCONI_REDIS_HOST")
    if not host:
        return None
    password = env.get("MARCONI_REDIS_PASSWORD")
    if not password and env.get("MARCONI_REDIS_PASSWORD_FILE"):
        password = Path(env["MARCONI_REDIS_PASSWORD_FILE"]).expanduser().read_text().strip()
    auth = f":{quote(password, safe='')}@" if password else ""
    return f"redis://{auth}{host}:{env.get('MARCONI_REDIS_PORT', '6379')}/0"


def default_config() -> ServeConfig:
    """Every setting at its default (what `marconi-ray serve` uses without a file)."""
    return ServeConfig()


def _valid_keys(loc: tuple[Any, ...]) -> list[str]:
    section: type[BaseModel] = TunerOptions if loc[:1] == ("tuner",) else ServeConfig
    return sorted(section.model_fields)


def _describe(error: Mapping[str, Any]) -> str:
    loc = tuple(error["loc"])
    key = ".".join(str(part) for part in loc) or "<config>"
    if error["type"] == "extra_forbidden":
        return f"unknown key {key!r} (valid keys: {', '.join(_valid_keys(loc))})"
    if error["type"] == "value_error":  # our validators name the value themselves
        return f"{key}: {str(error['msg']).removeprefix('Value error, ')}"
    if loc[:1] and loc[0] in SECRET_KEYS:  # never echo a secret
        return f"{key}: {error['msg']}"
    return f"{key}: {error['msg']} (got {error['input']!r})"


def config_from_mapping(
    data: Mapping[str, Any],
    source: str = "<mapping>",
    overrides: Mapping[str, Any] | None = None,
) -> ServeConfig:
    """Validate `data` with `overrides` (e.g. CLI flags) applied on top.

    Raises:
        ValueError: one line naming `source` and every bad or unknown key.
    """
    merged = {**data, **(overrides or {})}
    try:
        return ServeConfig.model_validate(merged)
    except ValidationError as exc:
        details = "; ".join(_describe(e) for e in exc.errors())
        raise ValueError(f"invalid serve config ({source}): {details}") from None


def load_serve_config(path: str | Path, overrides: Mapping[str, Any] | None = None) -> ServeConfig:
    """Read a YAML serve config (an empty file means all defaults), then apply `overrides`.

    Raises:
        FileNotFoundError: naming `path` when it is not a file.
        ValueError: naming `path` for malformed YAML or a document that is not a mapping,
            and naming every bad or unknown key (see `config_from_mapping`).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"serve config not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"serve config {path} is not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(
            f"serve config {path} must be a mapping of keys to values, got {type(data).__name__}"
        )
    return config_from_mapping(data, str(path), overrides)
