"""The server's cache figures from its Prometheus ``/metrics`` (marconi_* series).

``scrape`` returns a flat dict: counters summed over replicas (``hit_tokens``,
``input_tokens``, ``requests``, ``hit_requests``, ``flops_total``, ``flops_saved``,
``evictions``, ``states_dropped``, ``tuner_runs``; of the host tier ``promotions``,
``demotions``, ``host_evictions``, ``host_hit_tokens``; of moves between replicas
``transfer_bytes``, ``transfers``, ``transfer_seconds``, ``remote_hit_tokens``, summed
over their kinds) and per-replica gauges
(``alpha``, ``used_bytes``, ``capacity_bytes`` as ``{replica: value}``), plus
``replicas`` (sorted ids). ``delta`` turns a before/after pair into the run's figures.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

SUMMED = {
    "marconi_cache_hit_tokens_total": "hit_tokens",
    "marconi_cache_input_tokens_total": "input_tokens",
    "marconi_cache_requests_total": "requests",
    "marconi_cache_hit_requests_total": "hit_requests",
    "marconi_cache_flops_total": "flops_total",
    "marconi_cache_flops_saved_total": "flops_saved",
    "marconi_cache_evictions_total": "evictions",
    "marconi_cache_states_dropped_total": "states_dropped",
    "marconi_tuner_runs_total": "tuner_runs",
    "marconi_cache_promotions_total": "promotions",
    "marconi_cache_demotions_total": "demotions",
    "marconi_cache_host_evictions_total": "host_evictions",
    "marconi_transfer_bytes_total": "transfer_bytes",
    "marconi_transfers_total": "transfers",
    "marconi_transfer_seconds_sum": "transfer_seconds",
    "marconi_remote_hit_tokens_total": "remote_hit_tokens",
}
BY_TIER = {("marconi_cache_tier_hit_tokens_total", "host"): "host_hit_tokens"}
"""Labelled series summed over replicas for one `tier` label value."""
PER_REPLICA = {
    "marconi_cache_alpha": "alpha",
    "marconi_cache_used_bytes": "used_bytes",
    "marconi_cache_capacity_bytes": "capacity_bytes",
}
DELTA_KEYS = (
    "hit_tokens",
    "input_tokens",
    "requests",
    "hit_requests",
    "flops_total",
    "flops_saved",
    "evictions",
    "states_dropped",
    "tuner_runs",
    "promotions",
    "demotions",
    "host_evictions",
    "host_hit_tokens",
    "transfer_bytes",
    "transfers",
    "transfer_seconds",
    "remote_hit_tokens",
)


def parse(text: str) -> dict[str, Any]:
    """The flat dict (module docstring) of a Prometheus text exposition."""
    out: dict[str, Any] = dict.fromkeys((*SUMMED.values(), *BY_TIER.values()), 0.0)
    for key in PER_REPLICA.values():
        out[key] = {}
    replicas: set[str] = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            replica = sample.labels.get("replica")
            if replica is not None:
                replicas.add(replica)
            if sample.name in SUMMED:
                out[SUMMED[sample.name]] += float(sample.value)
            elif (sample.name, sample.labels.get("tier")) in BY_TIER:
                out[BY_TIER[(sample.name, sample.labels["tier"])]] += float(sample.value)
            elif sample.name in PER_REPLICA and replica is not None:
                out[PER_REPLICA[sample.name]][replica] = float(sample.value)
    out["replicas"] = sorted(replicas)
    return out


def scrape(url: str, timeout_s: float = 10.0) -> dict[str, Any] | None:
    """GET ``{url}/metrics`` and parse it; None if unreachable, not 200, or unparsable."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/metrics", timeout=timeout_s) as resp:
            text = resp.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    try:
        return parse(text)
    except ValueError:
        return None


def delta(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """The run's server-side figures: counter differences, ``token_hit_rate`` =
    Δhit_tokens / Δinput_tokens, ``flops_saved_fraction`` = Δflops_saved / Δflops_total
    (None without input), and the final per-replica ``alpha``. None if either is None."""
    if before is None or after is None:
        return None
    out: dict[str, Any] = {
        k: float(after.get(k, 0.0)) - float(before.get(k, 0.0)) for k in DELTA_KEYS
    }
    out["token_hit_rate"] = (
        out["hit_tokens"] / out["input_tokens"] if out["input_tokens"] > 0 else None
    )
    out["flops_saved_fraction"] = (
        out["flops_saved"] / out["flops_total"] if out["flops_total"] > 0 else None
    )
    out["alpha"] = dict(after.get("alpha", {}))
    out["replicas"] = list(after.get("replicas", []))
    return out
