"""A pickle-free state form of a `PrefixCache`, and its msgpack encoding.

`to_state` turns a cache into a plain structure (dicts with str keys, lists, ints, floats,
str, bytes, bools, None); numpy columns travel as `{"dtype": "<i8", "data": <raw
little-endian bytes>}`. `from_state` validates such a structure and rebuilds the cache:
every malformed input (wrong version or kind, missing or unknown keys, wrong types or
dtypes, inconsistent parent indices or slots, lock counts that open plans do not
explain, ...) raises ValueError naming what is wrong, never another exception.

What the form holds: the cost model and config (so a cache is rebuilt standalone), the
current alpha, clock, id counters, stats, the tree as columns (`RadixTree.flatten`: nodes
in pre-order with their slots, so later evictions break ties as the original's do) and,
optionally, the open plans (tokens, hit node by its index in the node order,
checkpoints, reservation). A restored plan's `freed` is empty: what planning evicted
was handed to the caller when it planned. With `open_plans=False` the form is the
cache as if every open plan were aborted: no plans, no reservations, no locks.

`dumps`/`loads` pack the form with msgpack (bin type, no ext types) and unpack it with
every length bounded by `max_bytes`, str map keys only, and no ext types (so no pickle,
no timestamps).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt

from marconi_ray.core.cost_model import CostModel
from marconi_ray.core.prefix_cache import CacheConfig, Plan, PrefixCache, as_tokens
from marconi_ray.core.radix_tree import FlatTree, RadixTree
from marconi_ray.core.stats import ADMISSION_REASONS, CacheStats
from marconi_ray.core.tree_types import NO_STATE, Freed

SCHEMA_VERSION = 1
CACHE_KIND = "prefix_cache"
DEFAULT_MAX_BYTES = 1 << 30

State = dict[str, Any]

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1

_DTYPES = {"<i4": np.int32, "<i8": np.int64, "<f8": np.float64, "|u1": np.uint8}
_ARRAY_KEYS = ("dtype", "data")
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
)
_COST_KEYS = ("flops_linear", "flops_quadratic", "kv_bytes_per_token", "state_bytes")
_CONFIG_KEYS = ("capacity_bytes", "admission", "eviction", "alpha", "recency")
_STATS_INTS = (
    "requests",
    "hit_requests",
    "input_tokens",
    "hit_tokens",
    "evictions",
    "states_dropped",
    "peak_bytes",
)
_STATS_FLOATS = ("flops_total", "flops_saved")
_STATS_KEYS = (*_STATS_INTS, *_STATS_FLOATS, "states_admitted")
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
_TREE_KEYS = (*_TREE_COLUMNS, "n_slots")
_PLAN_KEYS = ("plan_id", "tokens", "hit_len", "hit_node", "checkpoints", "reserved")


# --------------------------------------------------------------------- arrays
def encode_array(arr: npt.ArrayLike, dtype: str) -> State:
    """A 1-D array as `{"dtype": dtype, "data": raw little-endian bytes}`.

    `dtype` is one of "<i4", "<i8", "<f8", "|u1"; values are cast to it.
    """
    if dtype not in _DTYPES:
        raise ValueError(f"unsupported array dtype {dtype!r}; choose from {sorted(_DTYPES)}")
    out = np.ascontiguousarray(arr, dtype=np.dtype(dtype))
    if out.ndim != 1:
        raise ValueError(f"only 1-D arrays are encoded, got shape {out.shape}")
    return {"dtype": dtype, "data": out.tobytes()}


def decode_array(obj: object, dtype: str, what: str) -> npt.NDArray[Any]:
    """Inverse of `encode_array`, requiring `dtype`; returns a writable native-order copy."""
    fields = Fields(obj, what, _ARRAY_KEYS)
    got = fields.get_str("dtype")
    if got != dtype:
        raise ValueError(f"{what}: expected dtype {dtype!r}, got {got!r}")
    data = fields.get_bytes("data")
    want = np.dtype(dtype)
    if len(data) % want.itemsize:
        raise ValueError(f"{what}: {len(data)} bytes is not a whole number of {dtype} items")
    native: npt.NDArray[Any] = np.frombuffer(data, dtype=want).astype(_DTYPES[dtype])
    return native


# ---------------------------------------------------------------- field reads
def _type_name(value: object) -> str:
    return type(value).__name__


class Fields:
    """Typed reads of one map of a decoded form; every error names the field's path.

    The map must have exactly `keys` (missing or unknown keys raise ValueError).
    """

    def __init__(self, obj: object, path: str, keys: Collection[str]) -> None:
        if not isinstance(obj, dict):
            raise ValueError(f"{path}: expected a map, got {_type_name(obj)}")
        missing = [k for k in keys if k not in obj]
        if missing:
            raise ValueError(f"{path}: missing key(s) {missing}")
        unknown = sorted(str(k) for k in obj if k not in keys)
        if unknown:
            raise ValueError(f"{path}: unknown key(s) {unknown}")
        self.obj: dict[str, Any] = obj
        self.path = path

    def where(self, key: str) -> str:
        return f"{self.path}.{key}"

    def get(self, key: str) -> Any:
        return self.obj[key]

    def get_int(self, key: str, low: int | None = None) -> int:
        return check_int(self.obj[key], self.where(key), low)

    def get_float(self, key: str) -> float:
        return check_float(self.obj[key], self.where(key))

    def get_str(self, key: str) -> str:
        value = self.obj[key]
        if not isinstance(value, str):
            raise ValueError(f"{self.where(key)}: expected str, got {_type_name(value)}")
        return value

    def get_bool(self, key: str) -> bool:
        value = self.obj[key]
        if not isinstance(value, bool):
            raise ValueError(f"{self.where(key)}: expected bool, got {_type_name(value)}")
        return value

    def get_bytes(self, key: str) -> bytes:
        value = self.obj[key]
        if not isinstance(value, bytes):
            raise ValueError(f"{self.where(key)}: expected bytes, got {_type_name(value)}")
        return value

    def get_list(self, key: str) -> list[Any]:
        value = self.obj[key]
        if not isinstance(value, list):
            raise ValueError(f"{self.where(key)}: expected a list, got {_type_name(value)}")
        return value

    def get_array(self, key: str, dtype: str) -> npt.NDArray[Any]:
        return decode_array(self.obj[key], dtype, self.where(key))


def check_int(value: object, what: str, low: int | None = None) -> int:
    """`value` as an int64 (bools refused), >= `low` when given; else ValueError."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{what}: expected int, got {_type_name(value)}")
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"{what}: {value} does not fit in int64")
    if low is not None and value < low:
        raise ValueError(f"{what}: must be >= {low}, got {value}")
    return value


def check_float(value: object, what: str) -> float:
    """`value` (a float or an int, not a bool) as a finite float; else ValueError."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"{what}: expected a number, got {_type_name(value)}")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"{what}: must be finite, got {out}")
    return out


def check_header(obj: object, path: str, kind: str, keys: Collection[str]) -> Fields:
    """Read a versioned map: its `kind` and `version` keys must match, then `keys`."""
    if isinstance(obj, dict):
        if obj.get("kind") != kind:
            raise ValueError(f"{path}: expected kind {kind!r}, got {obj.get('kind')!r}")
        if obj.get("version") != SCHEMA_VERSION:
            raise ValueError(
                f"{path}: unsupported version {obj.get('version')!r} (reads {SCHEMA_VERSION})"
            )
    return Fields(obj, path, keys)


# ----------------------------------------------------------------- encoding
def to_state(cache: PrefixCache, open_plans: bool = True) -> State:
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
    tree: State = {
        name: encode_array(getattr(flat, name), dt) for name, dt in _TREE_COLUMNS.items()
    }
    tree["n_slots"] = int(flat.n_slots)
    cost, config, stats = cache.cost, cache.config, cache.stats
    return {
        "kind": CACHE_KIND,
        "version": SCHEMA_VERSION,
        "cost": {
            "flops_linear": float(cost.flops_linear),
            "flops_quadratic": float(cost.flops_quadratic),
            "kv_bytes_per_token": int(cost.kv_bytes_per_token),
            "state_bytes": int(cost.state_bytes),
        },
        "config": {
            "capacity_bytes": int(config.capacity_bytes),
            "admission": str(config.admission),
            "eviction": str(config.eviction),
            "alpha": float(config.alpha),
            "recency": str(config.recency),
        },
        "alpha": float(cache.alpha),
        "clock": float(cache.clock),
        "next_plan": int(cache._next_plan),
        "next_state": int(cache._next_state),
        "reserved": int(sum(p.reserved for p in plans)),
        "stats": {
            **{k: int(getattr(stats, k)) for k in _STATS_INTS},
            **{k: float(getattr(stats, k)) for k in _STATS_FLOATS},
            "states_admitted": {k: int(v) for k, v in stats.states_admitted.items()},
        },
        "tree": tree,
        "plans": [
            {
                "plan_id": int(plan.plan_id),
                "tokens": encode_array(plan.tokens, "<i4"),
                "hit_len": int(plan.hit_len),
                "hit_node": hit,
                "checkpoints": [[int(depth), str(reason)] for depth, reason in plan.checkpoints],
                "reserved": int(plan.reserved),
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
def from_state(state: object) -> PrefixCache:
    """Validate a `to_state` structure and rebuild the cache; ValueError if malformed."""
    top = check_header(state, "cache", CACHE_KIND, _CACHE_KEYS)
    cost_f = Fields(top.get("cost"), "cache.cost", _COST_KEYS)
    cost = CostModel(
        cost_f.get_float("flops_linear"),
        cost_f.get_float("flops_quadratic"),
        cost_f.get_int("kv_bytes_per_token"),
        cost_f.get_int("state_bytes"),
    )
    config_f = Fields(top.get("config"), "cache.config", _CONFIG_KEYS)
    config = CacheConfig(
        config_f.get_int("capacity_bytes"),
        config_f.get_str("admission"),
        config_f.get_str("eviction"),
        config_f.get_float("alpha"),
        config_f.get_str("recency"),
    )
    cache = PrefixCache(cost, config)
    cache.set_alpha(top.get_float("alpha"))
    cache.clock = top.get_float("clock")
    cache._next_plan = top.get_int("next_plan", 0)
    cache._next_state = top.get_int("next_state", 0)
    cache.stats = _stats_from(top.get("stats"))
    flat = _flat_from(top.get("tree"))
    cache.tree = RadixTree.from_flat(cost, flat)
    plans = [_plan_from(cache, flat, obj, i) for i, obj in enumerate(top.get_list("plans"))]
    _check_plans(cache, flat, plans, top.get_int("reserved", 0))
    cache._open = {plan.plan_id: plan for plan in plans}
    cache.reserved = sum(plan.reserved for plan in plans)
    return cache


def _stats_from(obj: object) -> CacheStats:
    fields = Fields(obj, "cache.stats", _STATS_KEYS)
    stats = CacheStats()
    for key in _STATS_INTS:
        setattr(stats, key, fields.get_int(key, 0))
    for key in _STATS_FLOATS:
        setattr(stats, key, fields.get_float(key))
    admitted = Fields(
        fields.get("states_admitted"), "cache.stats.states_admitted", ADMISSION_REASONS
    )
    stats.states_admitted = {reason: admitted.get_int(reason, 0) for reason in ADMISSION_REASONS}
    return stats


def _flat_from(obj: object) -> FlatTree:
    fields = Fields(obj, "cache.tree", _TREE_KEYS)
    cols = {name: fields.get_array(name, dt) for name, dt in _TREE_COLUMNS.items()}
    has_kv = cols["has_kv"]
    if len(has_kv) and has_kv.max() > 1:
        raise ValueError("cache.tree.has_kv: values must be 0 or 1")
    cols["has_kv"] = has_kv.astype(np.bool_)
    return FlatTree(n_slots=fields.get_int("n_slots", 1), **cols)


def _plan_from(cache: PrefixCache, flat: FlatTree, obj: object, i: int) -> Plan:
    path = f"cache.plans[{i}]"
    fields = Fields(obj, path, _PLAN_KEYS)
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
        Freed(),
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


# ------------------------------------------------------------------- msgpack
def pack(state: State) -> bytes:
    """msgpack bytes of a plain structure (bin type for bytes; anything else raises)."""
    out: bytes = msgpack.packb(state, use_bin_type=True, datetime=False)
    return out


def unpack(data: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    """Inverse of `pack`, bounded: inputs over `max_bytes`, lengths past it, non-str map
    keys, ext types, truncated or trailing data all raise ValueError."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ValueError(f"expected bytes, got {_type_name(data)}")
    if len(data) > max_bytes:
        raise ValueError(f"{len(data)} bytes is over the limit of {max_bytes}")
    limit = max(1, max_bytes)
    unpacker = msgpack.Unpacker(
        raw=False,
        strict_map_key=True,
        use_list=True,
        max_buffer_size=limit,
        max_bin_len=limit,
        max_str_len=limit,
        max_array_len=limit,
        max_map_len=limit,
        max_ext_len=0,
    )
    try:
        unpacker.feed(data)
        obj = unpacker.unpack()
    except (msgpack.UnpackException, ValueError) as exc:
        raise ValueError(f"malformed msgpack data: {str(exc) or type(exc).__name__}") from exc
    try:
        unpacker.unpack()
    except msgpack.OutOfData:
        return obj
    except (msgpack.UnpackException, ValueError):
        pass
    raise ValueError("malformed msgpack data: trailing bytes after the first object")


def dumps(cache: PrefixCache, open_plans: bool = True) -> bytes:
    """`to_state` packed with msgpack."""
    return pack(to_state(cache, open_plans))


def loads(data: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> PrefixCache:
    """`from_state` of bounded-unpacked msgpack bytes; ValueError if malformed."""
    return from_state(unpack(data, max_bytes))
