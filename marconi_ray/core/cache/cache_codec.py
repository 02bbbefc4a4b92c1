"""A pickle-free record of a `PrefixCache`, and its msgpack encoding (`core.wire`).

`to_record` turns a cache into a plain structure (dicts with str keys, lists, ints, floats,
str, bytes, bools, None); numpy columns travel as `{"dtype": "<i8", "data": <raw
little-endian bytes>}`. `from_record` validates such a structure and rebuilds the cache:
every malformed input (wrong version or kind, missing or unknown keys, wrong types or
dtypes, inconsistent parent indices or slots, lock counts that open plans do not
explain, ...) raises ValueError naming what is wrong, never another exception.

What the form holds: the cost model and config (so a cache is rebuilt standalone), the
current alpha, clock, id counters, stats, the tree as columns (`RadixTree.flatten`: nodes
in pre-order with their slots, so later evictions break ties as the original's do), why
each live state was admitted and which served a hit (`reasons`), the admission policy's
mutable state (`admission_state`: marconi+'s speculate knob) and, optionally, the open
plans (tokens, hit node by its index in the node order, checkpoints, reservation).
Keys added after the first version (`_OPTIONAL_KEYS`) may be missing: older forms
restore with their defaults. A restored plan's `freed` is empty: what planning evicted
was handed to the caller when it planned. With `open_plans=False` the form is the
cache as if every open plan were aborted: no plans, no reservations, no locks.

`dumps`/`loads` pack the form with msgpack (bin type, no ext types) and unpack it with
every length bounded by `max_bytes`, str map keys only, and no ext types (so no pickle,
no timestamps).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt

from marconi_ray.core.cache.host_tier import NO_HOST_TIER, HostTier
from marconi_ray.core.cache.prefix_cache import CacheConfig, Plan, PrefixCache, as_tokens
from marconi_ray.core.cache.stats import ADMISSION_REASONS, LOCAL_REASONS, CacheStats
from marconi_ray.core.model.cost_model import DEFAULT_EFFICIENCY, CostModel
from marconi_ray.core.model.window_term import WindowTerm
from marconi_ray.core.tree.radix_tree import FlatTree, RadixTree
from marconi_ray.core.tree.tree_types import NO_STATE, Reclaimed
from marconi_ray.core.wire import (
    DEFAULT_MAX_BYTES,
    SCHEMA_VERSION,
    Fields,
    Record,
    check_float,
    check_header,
    check_int,
    encode_array,
    pack,
    unpack,
)

CACHE_KIND = "prefix_cache"

_CACHE_KEYS = (
    "kind",
    "version",
    "cost",
    "config",
    "alpha",
    "clock",
    "next_plan",
    "next_state",
    "reserved",
    "stats",
    "tree",
    "plans",
    "reasons",
    "admission_state",
)
_COST_KEYS = ("flops_linear", "flops_quadratic", "kv_bytes_per_token", "state_bytes", "windows")
_CONFIG_KEYS = (
    "capacity_bytes",
    "admission",
    "eviction",
    "alpha",
    "recency",
    "efficiency",
    "host",
)
_HOST_KEYS = ("capacity_bytes", "gbps", "prefill_tflops", "placement")
_TIER_STATS = (
    "host_hit_tokens",
    "host_hit_bytes",
    "promotions",
    "promoted_bytes",
    "demotions",
    "demoted_bytes",
    "host_evictions",
    "host_peak_bytes",
)
_OPTIONAL_KEYS: dict[str, object] = {
    "efficiency": DEFAULT_EFFICIENCY,
    "host": None,
    "host_tokens": 0,
    "host_bytes": 0,
    "matched_len": 0,
    "stateless_misses": 0,
    "stateless_miss_tokens": 0,
    **dict.fromkeys(_TIER_STATS, 0),
    "states_superseded": 0,
    "hits_by_reason": {},
    "hit_tokens_by_reason": {},
    "states_hit": {},
    "reasons": None,
    "admission_state": {},
    "windows": [],
}
"""Keys later versions of the form added, and the value a form without one means (so
snapshots written before them still restore as before)."""
_STATS_INTS = (
    "requests",
    "hit_requests",
    "input_tokens",
    "hit_tokens",
    "evictions",
    "states_dropped",
    "states_superseded",
    "peak_bytes",
    "stateless_misses",
    "stateless_miss_tokens",
    *_TIER_STATS,
)
_STATS_FLOATS = ("flops_total", "flops_saved")
_STATS_BY_REASON = ("states_admitted", "hits_by_reason", "hit_tokens_by_reason", "states_hit")
_STATS_KEYS = (*_STATS_INTS, *_STATS_FLOATS, *_STATS_BY_REASON)
_REASON_KEYS = ("state", "reason", "hit_once")
_TREE_COLUMNS = {
    "parent": "<i8",
    "slot": "<i8",
    "edge_len": "<i8",
    "edges": "<i4",
    "has_kv": "|u1",
    "kv": "<i8",
    "state": "<i8",
    "lock": "<i8",
    "last_access": "<f8",
    "free": "<i8",
}
_TIER_COLUMNS = {"host": "|u1", "state_host": "|u1"}
"""Tree columns of the tiers, bools as bytes; a form without them (written before there
were tiers, or by a one-tier cache) holds everything on the device."""
_TREE_KEYS = (*_TREE_COLUMNS, *_TIER_COLUMNS, "n_slots")
_PLAN_KEYS = (
    "plan_id",
    "tokens",
    "hit_len",
    "hit_node",
    "checkpoints",
    "reserved",
    "host_tokens",
    "host_bytes",
    "matched_len",
)


# ----------------------------------------------------------------- encoding
def to_record(cache: PrefixCache, open_plans: bool = True) -> Record:
    """The cache as a plain structure (see the module docstring).

    Args:
        open_plans: keep the open plans, their reservations and the locks they hold;
            False gives the cache as if every open plan were aborted.
    Raises:
        ValueError: the tree's locks are not exactly those of the open plans (e.g.
            called from inside a mutation), or a KV handle is not an integer array.
    """
    flat = cache.tree.flatten()
    plans = sorted(cache._open.values(), key=lambda p: p.plan_id)
    hits, held = _plan_locks(cache.tree, flat, plans)
    if not np.array_equal(held, flat.lock):
        raise ValueError("the tree's lock counts are not those of the open plans")
    if not open_plans:
        plans, hits = [], []
        flat = dataclasses.replace(flat, lock=np.zeros_like(flat.lock))
    tree: Record = {
        name: encode_array(getattr(flat, name), dt) for name, dt in _TREE_COLUMNS.items()
    }
    if flat.host.any() or flat.state_host.any():
        tree.update(
            {name: encode_array(getattr(flat, name), dt) for name, dt in _TIER_COLUMNS.items()}
        )
    tree["n_slots"] = int(flat.n_slots)
    cost, config, stats = cache.cost, cache.config, cache.stats
    host = config.host
    return {
        "kind": CACHE_KIND,
        "version": SCHEMA_VERSION,
        "cost": {
            "flops_linear": float(cost.flops_linear),
            "flops_quadratic": float(cost.flops_quadratic),
            "kv_bytes_per_token": int(cost.kv_bytes_per_token),
            "state_bytes": int(cost.state_bytes),
            "windows": [[float(t.coefficient), int(t.window)] for t in cost.windows],
        },
        "config": {
            "capacity_bytes": int(config.capacity_bytes),
            "admission": str(config.admission),
            "eviction": str(config.eviction),
            "alpha": float(config.alpha),
            "recency": str(config.recency),
            "efficiency": str(config.efficiency),
            "host": None
            if not host.enabled
            else {
                "capacity_bytes": int(host.capacity_bytes),
                "gbps": float(host.gbps),
                "prefill_tflops": float(host.prefill_tflops),
                "placement": str(host.placement),
            },
        },
        "alpha": float(cache.alpha),
        "clock": float(cache.clock),
        "next_plan": int(cache._next_plan),
        "next_state": int(cache._next_state),
        "reserved": int(sum(p.reserved for p in plans)),
        "stats": {
            **{k: int(getattr(stats, k)) for k in _STATS_INTS},
            **{k: float(getattr(stats, k)) for k in _STATS_FLOATS},
            **{
                name: {k: int(v) for k, v in getattr(stats, name).items()}
                for name in _STATS_BY_REASON
            },
        },
        "reasons": _reasons_record(cache),
        "admission_state": {k: int(v) for k, v in cache.admission.state().items()},
        "tree": tree,
        "plans": [
            {
                "plan_id": int(plan.plan_id),
                "tokens": encode_array(plan.tokens, "<i4"),
                "hit_len": int(plan.hit_len),
                "hit_node": hit,
                "checkpoints": [[int(depth), str(reason)] for depth, reason in plan.checkpoints],
                "reserved": int(plan.reserved),
                "host_tokens": int(plan.host_tokens),
                "host_bytes": int(plan.host_bytes),
                "matched_len": int(plan.matched_len),
            }
            for plan, hit in zip(plans, hits, strict=True)
        ],
    }


def _plan_locks(
    tree: RadixTree, flat: FlatTree, plans: list[Plan]
) -> tuple[list[int], npt.NDArray[np.int64]]:
    """Each plan's hit node index in `flat`, and the locks the plans hold per node."""
    index_of_slot = {int(s): i for i, s in enumerate(flat.slot)}
    hits: list[int] = []
    for plan in plans:
        node = plan.hit_node
        if node is tree.root:
            hits.append(0)
        elif tree.nodes.get(node.slot) is node:
            hits.append(index_of_slot[node.slot])
        else:
            raise ValueError(f"plan {plan.plan_id}: its hit node is not in the tree")
    held = np.bincount(np.asarray(hits, dtype=np.int64), minlength=len(flat.parent))
    held[0] = 0  # locking the root is a no-op
    return hits, held


# ----------------------------------------------------------------- decoding
def from_record(state: object) -> PrefixCache:
    """Validate a `to_state` structure and rebuild the cache; ValueError if malformed."""
    top = check_header(_with_defaults(state, _CACHE_KEYS), "cache", CACHE_KIND, _CACHE_KEYS)
    cost_f = Fields(_with_defaults(top.get("cost"), _COST_KEYS), "cache.cost", _COST_KEYS)
    cost = CostModel(
        cost_f.get_float("flops_linear"),
        cost_f.get_float("flops_quadratic"),
        cost_f.get_int("kv_bytes_per_token"),
        cost_f.get_int("state_bytes"),
        _windows_from(cost_f.get("windows"), cost_f.where("windows")),
    )
    config_f = Fields(_with_defaults(top.get("config"), _CONFIG_KEYS), "cache.config", _CONFIG_KEYS)
    config = CacheConfig(
        config_f.get_int("capacity_bytes"),
        config_f.get_str("admission"),
        config_f.get_str("eviction"),
        config_f.get_float("alpha"),
        config_f.get_str("recency"),
        config_f.get_str("efficiency"),
        _host_from(config_f.get("host")),
    )
    cache = PrefixCache(cost, config)
    cache.set_alpha(top.get_float("alpha"))
    cache.clock = top.get_float("clock")
    cache._next_plan = top.get_int("next_plan", 0)
    cache._next_state = top.get_int("next_state", 0)
    cache.stats = _stats_from(top.get("stats"))
    flat = _flat_from(top.get("tree"))
    cache.tree = RadixTree.from_flat(cost, flat)
    _reasons_from(top.get("reasons"), cache, flat)
    admission_state = Fields(
        top.get("admission_state"), "cache.admission_state", tuple(cache.admission.state())
    )
    cache.admission.set_state({k: admission_state.get_int(k) for k in cache.admission.state()})
    plans = [_plan_from(cache, flat, obj, i) for i, obj in enumerate(top.get_list("plans"))]
    _check_plans(cache, flat, plans, top.get_int("reserved", 0))
    cache._open = {plan.plan_id: plan for plan in plans}
    cache.reserved = sum(plan.reserved for plan in plans)
    return cache


def _host_from(obj: object) -> HostTier:
    """The host tier of a form's config (None: one tier)."""
    if obj is None:
        return NO_HOST_TIER
    f = Fields(obj, "cache.config.host", _HOST_KEYS)
    return HostTier(
        f.get_int("capacity_bytes", 0),
        f.get_float("gbps"),
        f.get_float("prefill_tflops"),
        f.get_str("placement"),
    )


def _windows_from(obj: object, where: str) -> tuple[WindowTerm, ...]:
    """The cost's window terms from [[coefficient, window], ...]; ValueError naming `where`."""
    if not isinstance(obj, list):
        raise ValueError(f"{where}: expected a list, got {type(obj).__name__}")
    out = []
    for i, item in enumerate(obj):
        if not isinstance(item, list) or len(item) != 2:
            raise ValueError(f"{where}[{i}]: expected [coefficient, window], got {item!r}")
        coefficient = check_float(item[0], f"{where}[{i}][0]")
        out.append(WindowTerm(coefficient, check_int(item[1], f"{where}[{i}][1]", 1)))
    return tuple(out)


def _with_defaults(obj: object, keys: tuple[str, ...]) -> object:
    """A map of the form, with the `_OPTIONAL_KEYS` among `keys` (its key list) that it
    lacks filled in (a copy; anything but a map as it is)."""
    if not isinstance(obj, dict):
        return obj
    out = dict(obj)
    for key in keys:
        if key in _OPTIONAL_KEYS:
            out.setdefault(key, _OPTIONAL_KEYS[key])
    return out


def _stats_from(obj: object) -> CacheStats:
    fields = Fields(_with_defaults(obj, _STATS_KEYS), "cache.stats", _STATS_KEYS)
    stats = CacheStats()
    for key in _STATS_INTS:
        setattr(stats, key, fields.get_int(key, 0))
    for key in _STATS_FLOATS:
        setattr(stats, key, fields.get_float(key))
    for name in _STATS_BY_REASON:
        got = fields.get(name)
        present = tuple(got) if isinstance(got, dict) else ADMISSION_REASONS
        counts = Fields(got, f"cache.stats.{name}", present)
        unknown = sorted(set(present) - set(ADMISSION_REASONS))
        if unknown:
            raise ValueError(f"cache.stats.{name}: unknown key(s) {unknown}")
        keys = [r for r in ADMISSION_REASONS if r in LOCAL_REASONS or r in present]
        setattr(stats, name, {r: counts.get_int(r, 0) if r in present else 0 for r in keys})
    return stats


def _reasons_record(cache: PrefixCache) -> Record:
    """Why each live state was admitted, as columns (state ids, reason codes: indices in
    `ADMISSION_REASONS`), and the live states that served a hit."""
    ids = np.fromiter(cache.reasons, np.int64, len(cache.reasons))
    codes = np.fromiter(
        (ADMISSION_REASONS.index(r) for r in cache.reasons.values()), np.int64, len(ids)
    )
    hit = np.fromiter(sorted(cache.hit_once), np.int64, len(cache.hit_once))
    return {
        "state": encode_array(ids, "<i8"),
        "reason": encode_array(codes, "<i8"),
        "hit_once": encode_array(hit, "<i8"),
    }


def _reasons_from(obj: object, cache: PrefixCache, flat: FlatTree) -> None:
    """Restore `cache.reasons` and `cache.hit_once`; every state must be one the tree holds
    (a form without them, from before they existed, restores none)."""
    if obj is None:
        return
    f = Fields(obj, "cache.reasons", _REASON_KEYS)
    ids = f.get_array("state", "<i8")
    codes = f.get_array("reason", "<i8")
    hit = f.get_array("hit_once", "<i8")
    if len(ids) != len(codes):
        raise ValueError("cache.reasons: state and reason columns of different lengths")
    if len(codes) and (codes.min() < 0 or codes.max() >= len(ADMISSION_REASONS)):
        raise ValueError(f"cache.reasons.reason: codes must be in [0, {len(ADMISSION_REASONS)})")
    unknown = np.setdiff1d(np.concatenate([ids, hit]), flat.state[flat.state != NO_STATE])
    if len(unknown):
        raise ValueError(f"cache.reasons: state {int(unknown[0])} is not in the tree")
    cache.reasons = {int(i): ADMISSION_REASONS[int(c)] for i, c in zip(ids, codes, strict=True)}
    cache.hit_once = {int(i) for i in hit}


def _flat_from(obj: object) -> FlatTree:
    if isinstance(obj, dict) and not any(name in obj for name in _TIER_COLUMNS):
        obj = {**obj, "host": None, "state_host": None}  # one tier: filled in below
    fields = Fields(obj, "cache.tree", _TREE_KEYS)
    cols = {name: fields.get_array(name, dt) for name, dt in _TREE_COLUMNS.items()}
    if fields.get("host") is None:
        cols["host"] = np.zeros(len(cols["edges"]), dtype=np.uint8)
        cols["state_host"] = np.zeros(len(cols["state"]), dtype=np.uint8)
    else:
        cols.update({name: fields.get_array(name, dt) for name, dt in _TIER_COLUMNS.items()})
    for name in ("has_kv", *_TIER_COLUMNS):
        column = cols[name]
        if len(column) and column.max() > 1:
            raise ValueError(f"cache.tree.{name}: values must be 0 or 1")
        cols[name] = column.astype(np.bool_)
    return FlatTree(n_slots=fields.get_int("n_slots", 1), **cols)


def _plan_from(cache: PrefixCache, flat: FlatTree, obj: object, i: int) -> Plan:
    path = f"cache.plans[{i}]"
    fields = Fields(_with_defaults(obj, _PLAN_KEYS), path, _PLAN_KEYS)
    tokens = as_tokens(fields.get_array("tokens", "<i4"), f"{path}.tokens")
    hit_len = fields.get_int("hit_len", 0)
    hit = fields.get_int("hit_node", 0)
    if hit >= len(flat.slot):
        raise ValueError(f"{path}.hit_node: index {hit} is past the {len(flat.slot)} nodes")
    node = cache.tree.nodes[int(flat.slot[hit])]
    if node.depth != hit_len:
        raise ValueError(f"{path}: hit_len {hit_len} is not its hit node's depth {node.depth}")
    if hit_len > len(tokens):
        raise ValueError(f"{path}: hit_len {hit_len} is past its {len(tokens)} tokens")
    if hit and node.state == NO_STATE:
        raise ValueError(f"{path}: its hit node holds no state")
    if not np.array_equal(cache.tree.path_tokens(node), tokens[:hit_len]):
        raise ValueError(f"{path}: its hit node is not on its tokens' path")
    checkpoints: list[tuple[int, str]] = []
    for j, item in enumerate(fields.get_list("checkpoints")):
        where = f"{path}.checkpoints[{j}]"
        if not isinstance(item, list) or len(item) != 2:
            raise ValueError(f"{where}: expected a [depth, reason] pair")
        depth = check_int(item[0], where, hit_len + 1)
        if depth > len(tokens) or (checkpoints and depth <= checkpoints[-1][0]):
            raise ValueError(f"{where}: depths must increase within (hit_len, len(tokens)]")
        if item[1] not in ADMISSION_REASONS:
            raise ValueError(f"{where}: unknown reason {item[1]!r}")
        checkpoints.append((depth, item[1]))
    return Plan(
        fields.get_int("plan_id", 0),
        tokens,
        hit_len,
        node,
        tuple(checkpoints),
        fields.get_int("reserved", 0),
        Reclaimed(),
        cache.reason_of(node.state) if hit_len else "",
        fields.get_int("host_tokens", 0),
        fields.get_int("host_bytes", 0),
        fields.get_int("matched_len", 0),
    )


def _check_plans(cache: PrefixCache, flat: FlatTree, plans: list[Plan], reserved: int) -> None:
    ids = [plan.plan_id for plan in plans]
    if len(set(ids)) != len(ids):
        raise ValueError("cache.plans: two plans share an id")
    if ids and max(ids) >= cache._next_plan:
        raise ValueError(f"cache.plans: plan id {max(ids)} >= next_plan {cache._next_plan}")
    if reserved != sum(plan.reserved for plan in plans):
        raise ValueError(f"cache.reserved {reserved} is not the sum of the plans' reservations")
    _, held = _plan_locks(cache.tree, flat, plans)
    wrong = np.flatnonzero(held != flat.lock)
    if len(wrong):
        i = int(wrong[0])
        raise ValueError(
            f"cache.tree: node {i} holds {flat.lock[i]} lock(s), open plans hold {held[i]}"
        )


def dumps(cache: PrefixCache, open_plans: bool = True) -> bytes:
    """`to_record` packed with msgpack."""
    return pack(to_record(cache, open_plans))


def loads(data: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> PrefixCache:
    """`from_record` of bounded-unpacked msgpack bytes; ValueError if malformed."""
    return from_record(unpack(data, max_bytes))


def snapshot(cache: PrefixCache) -> bytes:
    """A self-contained copy of the cache (tree, policies, stats) as msgpack bytes, taken
    as if every open plan were aborted: without open plans, their reservations and the
    locks they hold, so nothing stays pinned in a copy that replays other requests.
    Equal caches give equal bytes."""
    return dumps(cache, open_plans=False)


def restore(data: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> PrefixCache:
    """The cache `snapshot` (or `dumps`) encoded; ValueError if `data` is malformed or
    longer than `max_bytes`."""
    return loads(data, max_bytes)
