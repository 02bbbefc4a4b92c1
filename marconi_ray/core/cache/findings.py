"""Findings: when a configured cache can do nothing for a model, or part of its setting
does nothing, said once at start instead of found out from a hit rate of zero.

Users of hybrid caches report caching that silently does nothing: a budget too small for
one state, a mode quietly downgraded, a tier never used. `find` checks a cache's setting
against the model's prices (`CostModel`) before any request, with no replay:

- `caches_nothing`: the system admits nothing (`vanilla`);
- `budget_below_one_entry`: the budget cannot hold one state with the KV of
  `PROBE_TOKENS` tokens (a hit needs both), so nothing useful is ever admitted;
- `host_tier_unused`: with FLOP-aware placement, a cached turn (a state with the KV of
  its own tokens) is not worth a copy to the host at any depth up to the context limit,
  so such victims are all dropped and the host tier stays all but empty (the prefill a
  hit saves grows as a*L + b*L**2 and the copy as c + d*L: their difference is convex in
  L, so checking the shortest and the longest turn covers every depth);
- `alpha_ignored`: a fixed alpha was set for a system whose eviction does not weigh FLOPs;
- `host_settings_ignored`: the host tier's placement, bandwidth or prefill clock was set
  away from its default while there is no host tier (its budget is 0);
- `tuner_ignored`: tuner options were set while nothing is tuned (a fixed alpha, or a
  system whose eviction does not weigh FLOPs).

Each finding has a stable `code` (a metric label) and a message naming the values.
"""

from __future__ import annotations

from dataclasses import dataclass

from marconi_ray.core.cache.host_tier import NO_HOST_TIER, HostTier
from marconi_ray.core.cache.systems import SystemSpec
from marconi_ray.core.model.cost_model import CostModel

PROBE_TOKENS = 256
"""Tokens of KV a cached entry is probed with (`budget_below_one_entry`)."""

FINDING_CODES = (
    "caches_nothing",
    "budget_below_one_entry",
    "host_tier_unused",
    "alpha_ignored",
    "host_settings_ignored",
    "tuner_ignored",
)


@dataclass(frozen=True)
class Finding:
    """One thing the cache's setting makes it not do: `code` (one of `FINDING_CODES`)
    and a message naming the values."""

    code: str
    message: str


def find(
    cost: CostModel,
    system: SystemSpec,
    capacity_bytes: int,
    host: HostTier,
    context_limit: int,
    alpha: float | None = None,
    tuner_set: tuple[str, ...] = (),
) -> tuple[Finding, ...]:
    """What the cache of `system` with `capacity_bytes` per replica (and `host`, whose
    placement settings are checked even with no budget) will not do for a model priced
    by `cost` whose context holds `context_limit` tokens; `alpha`: the fixed alpha set,
    None when tuned or unset; `tuner_set`: the tuner options set away from their
    defaults. Empty when it can do its job."""
    out: list[Finding] = []
    if system.admission == "none":
        out.append(
            Finding(
                "caches_nothing",
                f"system {system.name!r} caches nothing: every request prefills in full",
            )
        )
    probe = min(PROBE_TOKENS, max(1, context_limit))
    entry = cost.state_bytes + cost.kv_bytes(probe)
    if capacity_bytes < entry:
        out.append(
            Finding(
                "budget_below_one_entry",
                f"cache_bytes {capacity_bytes:,} cannot hold one state ({cost.state_bytes:,} "
                f"bytes) with the KV of {probe} tokens ({cost.kv_bytes(probe):,} bytes): "
                f"nothing useful is cached; give it at least {entry:,} bytes",
            )
        )
    if host.enabled and host.placement == "flop_aware":
        out.extend(_host_tier(cost, host, context_limit))
    if alpha is not None and system.eviction != "flop_aware":
        out.append(
            Finding(
                "alpha_ignored",
                f"alpha {alpha} is ignored: system {system.name!r} evicts by "
                f"{system.eviction}, which does not weigh FLOPs",
            )
        )
    out.extend(_ignored(system, host, alpha, tuner_set))
    return tuple(out)


def _ignored(
    system: SystemSpec, host: HostTier, alpha: float | None, tuner_set: tuple[str, ...]
) -> list[Finding]:
    """`host_settings_ignored` and `tuner_ignored` (see the module docstring)."""
    out: list[Finding] = []
    if not host.enabled:
        default = NO_HOST_TIER
        changed = [
            f"{name} {getattr(host, attr)!r}"
            for name, attr in (
                ("host_placement", "placement"),
                ("host_gbps", "gbps"),
                ("prefill_tflops", "prefill_tflops"),
            )
            if getattr(host, attr) != getattr(default, attr)
        ]
        if changed:
            out.append(
                Finding(
                    "host_settings_ignored",
                    f"{', '.join(changed)} ignored: host_cache_bytes is 0, so there is no "
                    "host tier; give it a budget to use them",
                )
            )
    tuned = alpha is None and system.eviction == "flop_aware"
    if tuner_set and not tuned:
        why = (
            f"alpha is fixed at {alpha}"
            if alpha is not None
            else f"system {system.name!r} evicts by {system.eviction}"
        )
        out.append(
            Finding(
                "tuner_ignored",
                f"tuner options {', '.join(tuner_set)} ignored: nothing is tuned ({why})",
            )
        )
    return out


def _host_tier(cost: CostModel, host: HostTier, context_limit: int) -> list[Finding]:
    """`host_tier_unused` when no cached turn of 1 .. `context_limit` tokens is worth
    its copy (see the module docstring)."""
    limit = max(1, context_limit)
    for depth in (1, limit):
        if host.worth_demoting(cost.total_flops(depth), cost.state_bytes + cost.kv_bytes(depth)):
            return []
    n_bytes = cost.state_bytes + cost.kv_bytes(limit)
    saves = host.prefill_seconds(cost.total_flops(limit)) * 1e3
    copy = host.copy_seconds(n_bytes) * 1e3
    return [
        Finding(
            "host_tier_unused",
            f"host_placement flop_aware will drop, not demote, every cached turn: one of "
            f"the whole context ({limit} tokens) saves {saves:.4f} ms of prefill at "
            f"{host.prefill_tflops} TFLOP/s, less than the {copy:.4f} ms its {n_bytes:,} "
            f"bytes take to copy back at {host.gbps} GB/s (shorter turns pay even less); "
            "use host_placement lru, or this hardware's own prefill_tflops",
        )
    ]
