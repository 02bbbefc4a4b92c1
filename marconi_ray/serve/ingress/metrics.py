"""Prometheus metrics of the OpenAI ingress: its own latency histograms and request counter
(in a per-ingress `CollectorRegistry`, never the global one), plus the replicas' cache
figures, rendered at scrape time from the `ReplicaStats` the coordinator reports.

Cache metrics (label `replica`; `kind` and `reason` where noted):
`marconi_cache_token_hit_rate`, `marconi_cache_request_hit_rate`,
`marconi_cache_requests_total`, `marconi_cache_hit_requests_total`,
`marconi_cache_input_tokens_total`, `marconi_cache_hit_tokens_total`,
`marconi_cache_flops_total`, `marconi_cache_flops_saved_total`,
`marconi_cache_bytes{kind}`, `marconi_cache_used_bytes`, `marconi_cache_capacity_bytes`,
`marconi_cache_reserved_bytes`, `marconi_cache_peak_bytes`,
`marconi_cache_states_admitted_total{reason}`, `marconi_cache_states_dropped_total`,
`marconi_cache_evictions_total`, `marconi_cache_alpha`, `marconi_replica_in_flight`,
`marconi_replica_tuner_runs_total`, `marconi_replica_refused_releases_total` (releases the
replica's store refused, each followed by a reconcile); and `marconi_tuner_runs_total`
(all replicas); `marconi_replica_info{replica, role}` (1, with the replica's role: join
on `replica` to break any figure down by `mixed` / `prefill` / `decode`). The ingress's
own: `marconi_replans_total{cause}` (requests planned again after a fault), and moves
between replicas (`serve.disagg`; `kind` is `pd` or `remote_hit`):
`marconi_transfer_bytes_total{kind}`, `marconi_transfers_total{kind, outcome, mode}`,
`marconi_transfer_seconds{kind}` and `marconi_remote_hit_tokens_total`.

The two tiers (label `replica`; `tier` is `device` or `host`, `direction` is `to_host`
or `to_device`): from the coordinator's caches `marconi_cache_tier_bytes{tier}`,
`marconi_cache_tier_capacity_bytes{tier}`, `marconi_cache_tier_hit_tokens_total{tier}`
(hit tokens read from each tier), `marconi_cache_{promotions,promoted_bytes,demotions,
demoted_bytes,host_evictions,host_hit_bytes}_total`, `marconi_cache_host_peak_bytes`;
from each replica's store, as its heartbeats last reported it (replicas with a host tier
only): `marconi_store_tier_copied_bytes_total{direction}`,
`marconi_store_tier_copy_seconds_total{direction}`,
`marconi_store_tier_moves_total{direction}`, `marconi_store_host_bytes`.

Journal metrics (from the coordinator's `journal_health()`, when the caller passes it):
`marconi_journal_state{state}` (1 for the current one of `ok` / `degraded` / `lost`, 0 for
the others), `marconi_journal_backlog_bytes`, `marconi_journal_backlog_records`,
`marconi_journal_max_backlog_bytes`, `marconi_journal_lost_records`,
`marconi_journal_last_snapshot_age_seconds` (absent before the first snapshot).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from marconi_ray.core.cache.findings import FINDING_CODES
from marconi_ray.protocol.results import SpecCounts
from marconi_ray.serve.coordinator.journal import JOURNAL_STATES
from marconi_ray.serve.messages import ReplicaStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

# (metric name without _total, key in CacheStats.to_dict(), help)
_COUNTERS = (
    ("marconi_cache_requests", "requests", "Requests committed to the cache."),
    ("marconi_cache_hit_requests", "hit_requests", "Committed requests with a cache hit."),
    ("marconi_cache_input_tokens", "input_tokens", "Input (prompt) tokens committed."),
    ("marconi_cache_hit_tokens", "hit_tokens", "Input tokens served from the cache."),
    ("marconi_cache_flops", "flops_total", "Prefill FLOPs of the committed inputs."),
    ("marconi_cache_flops_saved", "flops_saved", "Prefill FLOPs the cache hits saved."),
    ("marconi_cache_evictions", "evictions", "Cache nodes evicted."),
    ("marconi_cache_states_dropped", "states_dropped", "States that did not fit and were dropped."),
    ("marconi_cache_promotions", "promotions", "Nodes promoted from the host tier to the device."),
    ("marconi_cache_promoted_bytes", "promoted_bytes", "Bytes promoted from host to device."),
    ("marconi_cache_demotions", "demotions", "Nodes demoted from the device to the host tier."),
    ("marconi_cache_demoted_bytes", "demoted_bytes", "Bytes demoted from device to host."),
    ("marconi_cache_host_evictions", "host_evictions", "Nodes dropped from the host tier."),
    ("marconi_cache_host_hit_bytes", "host_hit_bytes", "Host bytes that cache hits read."),
    (
        "marconi_cache_stateless_misses",
        "stateless_misses",
        "Requests whose hit was 0 although the cache held 32+ tokens of their prefix: no "
        "state stood at its end (recurrent layers resume only from an exact state).",
    ),
    (
        "marconi_cache_stateless_miss_tokens",
        "stateless_miss_tokens",
        "Input tokens those requests found cached and could not reuse.",
    ),
)
_GAUGES = (
    ("marconi_cache_token_hit_rate", "token_hit_rate", "Hit tokens / input tokens."),
    ("marconi_cache_request_hit_rate", "request_hit_rate", "Hit requests / requests."),
    (
        "marconi_cache_stateless_miss_share",
        "stateless_miss_share",
        "Share of the requests that missed for want of a state (stateless misses / requests).",
    ),
    ("marconi_cache_peak_bytes", "peak_bytes", "Most bytes the cache has held."),
    ("marconi_cache_host_peak_bytes", "host_peak_bytes", "Most bytes the host tier has held."),
)
TIERS = ("device", "host")
DIRECTIONS = ("to_host", "to_device")
# (metric name without _total, key prefix in StateStore.tier_stats() + direction, help)
_STORE_COUNTERS = (
    ("marconi_store_tier_copied_bytes", "bytes_", "Bytes the store copied between the tiers."),
    ("marconi_store_tier_copy_seconds", "seconds_", "Seconds the store spent copying them."),
    ("marconi_store_tier_moves", "moves_", "Tier moves the store applied."),
)


# (metric name, key in the coordinator's journal_health(), help)
_JOURNAL_GAUGES = (
    ("marconi_journal_backlog_bytes", "backlog_bytes", "Encoded bytes of records queued."),
    ("marconi_journal_backlog_records", "backlog_records", "Records queued in memory."),
    ("marconi_journal_max_backlog_bytes", "max_backlog_bytes", "Bound on the queued bytes."),
    ("marconi_journal_lost_records", "lost_records", "Records dropped, until a snapshot."),
)


def _number(stats: Mapping[str, object], key: str, what: str = "replica stats") -> float:
    value = stats.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} field {key!r} must be a number, got {value!r}")
    return float(value)


class FindingsCollector(Collector):
    """`marconi_cache_finding{code}`: 1 for each thing the cache's setting makes it not
    do for the served model (`core.cache.findings`; the message is in the coordinator's
    log and in `/health`), 0 for the others."""

    def __init__(self, codes: Sequence[str]) -> None:
        self.codes = set(codes)

    def collect(self) -> Iterable[Metric]:
        found = GaugeMetricFamily(
            "marconi_cache_finding",
            "1 when the cache's setting makes it not do something for this model (caches "
            "nothing, a budget below one state with its KV, a host tier placement never "
            "uses, an ignored alpha): see the coordinator's log or /health.",
            labels=["code"],
        )
        for code in FINDING_CODES:
            found.add_metric([code], 1.0 if code in self.codes else 0.0)
        return [found]


class JournalCollector(Collector):
    """The journal's health of one scrape (a `JournalHealth.to_dict()`); ValueError
    naming the field when it is malformed."""

    def __init__(self, health: Mapping[str, object]) -> None:
        state = health.get("state")
        if state not in JOURNAL_STATES:
            raise ValueError(f"journal health state must be one of {JOURNAL_STATES}, got {state!r}")
        self.health = dict(health)
        self.state = str(state)

    def collect(self) -> Iterable[Metric]:
        state = GaugeMetricFamily(
            "marconi_journal_state",
            "1 for the journal's current state (ok, degraded, lost), 0 for the others.",
            labels=["state"],
        )
        for each in JOURNAL_STATES:
            state.add_metric([each], 1.0 if each == self.state else 0.0)
        out: list[Metric] = [state]
        for name, key, doc in _JOURNAL_GAUGES:
            out.append(GaugeMetricFamily(name, doc, value=_number(self.health, key, "journal")))
        if self.health.get("last_snapshot_age_s") is not None:
            age = _number(self.health, "last_snapshot_age_s", "journal")
            out.append(
                GaugeMetricFamily(
                    "marconi_journal_last_snapshot_age_seconds",
                    "Seconds since the coordinator last wrote a journal snapshot.",
                    value=age,
                )
            )
        return out


class CacheCollector(Collector):
    """The cache figures of one scrape (a snapshot: built per scrape, never mutated)."""

    def __init__(self, stats: Sequence[ReplicaStats], tuner_runs: int) -> None:
        self.stats = tuple(stats)
        self.tuner_runs = tuner_runs

    def collect(self) -> Iterable[Metric]:
        return list(self._families())

    def _families(self) -> Iterator[Metric]:
        label = ["replica"]
        for name, key, doc in _COUNTERS:
            fam = CounterMetricFamily(name, doc, labels=label)
            for r in self.stats:
                fam.add_metric([r.replica_id], _number(r.stats, key))
            yield fam
        for name, key, doc in _GAUGES:
            gauge = GaugeMetricFamily(name, doc, labels=label)
            for r in self.stats:
                gauge.add_metric([r.replica_id], _number(r.stats, key))
            yield gauge
        plain = (
            ("marconi_cache_used_bytes", "Bytes the cache holds now.", "bytes_used"),
            ("marconi_cache_capacity_bytes", "The cache's byte budget.", "capacity"),
            ("marconi_cache_reserved_bytes", "Bytes reserved by requests in flight.", "reserved"),
            ("marconi_cache_alpha", "Current FLOP-aware eviction alpha.", "alpha"),
            ("marconi_replica_in_flight", "Requests planned and not yet committed.", "in_flight"),
        )
        for name, doc, attr in plain:
            gauge = GaugeMetricFamily(name, doc, labels=label)
            for r in self.stats:
                gauge.add_metric([r.replica_id], float(getattr(r, attr)))
            yield gauge
        by_kind = GaugeMetricFamily(
            "marconi_cache_bytes", "Bytes the cache holds now, by kind.", labels=["replica", "kind"]
        )
        for r in self.stats:
            for kind, value in sorted(r.bytes_by_kind.items()):
                by_kind.add_metric([r.replica_id, kind], float(value))
        yield by_kind
        admitted = CounterMetricFamily(
            "marconi_cache_states_admitted",
            "SSM states admitted, by admission reason.",
            labels=["replica", "reason"],
        )
        for r in self.stats:
            reasons = r.stats.get("states_admitted", {})
            if not isinstance(reasons, Mapping):
                raise ValueError(f"states_admitted must be a mapping, got {reasons!r}")
            for reason in sorted(reasons):
                admitted.add_metric([r.replica_id, str(reason)], _number(reasons, reason))
        yield admitted
        yield from self._tier_families()
        refused = CounterMetricFamily(
            "marconi_replica_refused_releases",
            "Releases the replica's store refused (it reconciled after each).",
            labels=label,
        )
        for r in self.stats:
            refused.add_metric([r.replica_id], float(r.refused_releases))
        yield refused
        info = GaugeMetricFamily(
            "marconi_replica_info",
            "1 per replica, labelled with its role (mixed, prefill, decode): join it on "
            "`replica` to break any replica figure down by role.",
            labels=["replica", "role"],
        )
        for r in self.stats:
            info.add_metric([r.replica_id, r.role], 1.0)
        yield info
        runs = CounterMetricFamily(
            "marconi_replica_tuner_runs", "Alpha searches adopted, by replica.", labels=label
        )
        for r in self.stats:
            runs.add_metric([r.replica_id], float(r.tuner_runs))
        yield runs
        yield CounterMetricFamily(
            "marconi_tuner_runs", "Alpha searches adopted, all replicas.", value=self.tuner_runs
        )

    def _tier_families(self) -> Iterator[Metric]:
        """The two tiers: the caches' bytes, budgets and hit tokens per tier, and what
        each replica's store reported of its copies per direction."""
        tier = ["replica", "tier"]
        held = GaugeMetricFamily(
            "marconi_cache_tier_bytes", "Bytes the cache holds now, by tier.", labels=tier
        )
        budget = GaugeMetricFamily(
            "marconi_cache_tier_capacity_bytes", "The cache's byte budget, by tier.", labels=tier
        )
        hits = CounterMetricFamily(
            "marconi_cache_tier_hit_tokens",
            "Input tokens served from the cache, by the tier they were read from.",
            labels=tier,
        )
        for r in self.stats:
            by_tier = {name: r.bytes_by_tier.get(name, 0) for name in TIERS}
            host_hits = _number(r.stats, "host_hit_tokens")
            hit_tokens = {"device": _number(r.stats, "hit_tokens") - host_hits, "host": host_hits}
            capacity = {"device": r.capacity, "host": r.host_capacity}
            for name in TIERS:
                held.add_metric([r.replica_id, name], float(by_tier[name]))
                budget.add_metric([r.replica_id, name], float(capacity[name]))
                hits.add_metric([r.replica_id, name], hit_tokens[name])
        yield from (held, budget, hits)
        direction = ["replica", "direction"]
        reporting = [r for r in self.stats if r.store]
        for name, prefix, doc in _STORE_COUNTERS:
            fam = CounterMetricFamily(name, doc, labels=direction)
            for r in reporting:
                for way in DIRECTIONS:
                    fam.add_metric([r.replica_id, way], _number(r.store, prefix + way, "store"))
            yield fam
        host = GaugeMetricFamily(
            "marconi_store_host_bytes", "Bytes the store holds in host memory.", labels=["replica"]
        )
        for r in reporting:
            host.add_metric([r.replica_id], _number(r.store, "host_bytes", "store"))
        yield host


class IngressMetrics:
    """One ingress's own metrics, in its own registry.

    Attributes:
        ttft: seconds from a request's arrival at the ingress to its first token.
        e2e: seconds from arrival to the last byte of the answer.
        requests: completion requests by final HTTP status (`status` label, e.g. "200").
        output_tokens: completion tokens handed to clients.
        pieces: pieces of output they went out in (one SSE chunk each when streamed:
            `pieces / output_tokens` is the chunks per token).
        replica_messages: messages read from the replicas' multiplexed streams (one per
            replica step at most, for all of this ingress's requests there).
        spec_drafted, spec_accepted: speculative tokens drafted and kept for the
            requests this ingress completed; spec_by_position: the same by draft position
            (`position` 0 is a step's first draft; `outcome` drafted or kept), so
            acceptance by position is kept / drafted.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.ttft = Histogram(
            "marconi_ttft_seconds",
            "Time to first token, from arrival at the ingress.",
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            "marconi_e2e_latency_seconds",
            "End-to-end request latency at the ingress.",
            buckets=E2E_BUCKETS,
            registry=self.registry,
        )
        self.requests = Counter(
            "marconi_requests",
            "Completion requests by final HTTP status.",
            ["status"],
            registry=self.registry,
        )
        self.output_tokens = Counter(
            "marconi_output_tokens", "Completion tokens sent to clients.", registry=self.registry
        )
        self.pieces = Counter(
            "marconi_output_pieces",
            "Pieces of output sent to clients (one SSE chunk each when streamed).",
            registry=self.registry,
        )
        self.replica_messages = Counter(
            "marconi_replica_messages",
            "Messages read from the replicas' multiplexed streams.",
            registry=self.registry,
        )
        self.spec_drafted = Counter(
            "marconi_spec_draft_tokens",
            "Speculative tokens drafted for completed requests.",
            registry=self.registry,
        )
        self.spec_accepted = Counter(
            "marconi_spec_accepted_tokens",
            "Speculative tokens kept (verified) for completed requests.",
            registry=self.registry,
        )
        self.spec_by_position = Counter(
            "marconi_spec_position_tokens",
            "Speculative tokens by draft position (0: a step's first) and outcome (drafted, "
            "kept): acceptance by position is kept / drafted.",
            ["position", "outcome"],
            registry=self.registry,
        )
        self.replans = Counter(
            "marconi_replans",
            "Requests planned again after a fault, by cause (misrouted: a call for a "
            "replica that had gone reached another; refused: the replica refused the "
            "dispatch; lost: the replica or its channel failed).",
            ["cause"],
            registry=self.registry,
        )
        self.transfer_bytes = Counter(
            "marconi_transfer_bytes",
            "Bytes of cache entries moved between replicas, by kind (pd: a prefill/decode "
            "hand-off or a decode-side hit pulled to a prefill replica; remote_hit: a "
            "mixed replica pulled a hit another one held).",
            ["kind"],
            registry=self.registry,
        )
        self.remote_hit_tokens = Counter(
            "marconi_remote_hit_tokens",
            "Prompt tokens a mixed replica reused from a hit it pulled from another replica "
            "(beyond its own hit).",
            registry=self.registry,
        )
        self.transfers = Counter(
            "marconi_transfers",
            "Moves between replicas, by kind, outcome (ok; failed: the receiver "
            "recomputes) and the transfer mode that carried them.",
            ["kind", "outcome", "mode"],
            registry=self.registry,
        )
        self.transfer_seconds = Histogram(
            "marconi_transfer_seconds",
            "Seconds one move between replicas took, from the ingress's order to the "
            "receiver's answer, by kind.",
            ["kind"],
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.spills = Counter(
            "marconi_coordinator_spills",
            "Requests a coordinator group planned at another coordinator than the one "
            "their group key picks (that one had no replica free: load-aware spill).",
            registry=self.registry,
        )

    def count(self, status: int) -> None:
        """Count one finished completion request with HTTP `status`."""
        self.requests.labels(status=str(status)).inc()

    def count_spec(self, spec: SpecCounts) -> None:
        """Count one completed request's speculative decoding."""
        if not spec.drafted:
            return
        self.spec_drafted.inc(spec.drafted)
        self.spec_accepted.inc(spec.accepted)
        for j, (drafted, kept) in enumerate(zip(spec.drafted_at, spec.kept_at, strict=True)):
            self.spec_by_position.labels(position=str(j), outcome="drafted").inc(drafted)
            self.spec_by_position.labels(position=str(j), outcome="kept").inc(kept)


def render_metrics(
    metrics: IngressMetrics,
    stats: Sequence[ReplicaStats] | None,
    tuner_runs: int = 0,
    journal: Mapping[str, object] | None = None,
    findings: Sequence[str] | None = None,
) -> bytes:
    """Prometheus text exposition: the ingress's metrics, then the cache figures of
    `stats`, the journal's health `journal` (the coordinator's `journal_health()`) and
    the codes of the cache's `findings` (`core.cache.findings`), one scrape's snapshot
    fetched by the caller from the coordinator; None when the coordinator could not be
    reached: those figures are then left out."""
    snapshot = CollectorRegistry(auto_describe=True)
    if stats is not None:
        snapshot.register(CacheCollector(stats, tuner_runs))
    if journal is not None:
        snapshot.register(JournalCollector(journal))
    if findings is not None:
        snapshot.register(FindingsCollector(findings))
    return generate_latest(metrics.registry) + generate_latest(snapshot)
