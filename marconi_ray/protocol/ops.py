"""The coordinator's operations on its caches, as typed records (what the journal holds).

Each operation is a frozen dataclass with a `NAME`, `to_record()` (a plain structure in
`core.wire` conventions: arrays as `encode_array`, no pickle) and `from_record(fields)`.
`encode_op`/`decode_op` add and check the `op` name; every malformed field raises
ValueError naming it. The coordinator applies an operation the same way live and when it
replays its journal (`serve.coordinator.cache_state.CacheState.apply`), so this module is
the only place an operation's layout is written.

Operations: `Register` / `Unregister` a replica's cache, `Plan` (a lease grant: route
decision, prompt, sampling parameters), `Commit` (what a finished request stored),
`Abort` (client gone, lease expired, abandoned, reconciliation), `Adopt` (an alpha the
tuner picked), and the two ends of a move between replicas (`serve.disagg`): `Pin` (the
source's entry locked while it is copied) and `Import` (the receiver's room reserved;
its `Commit` admits the entry, with `Finished.finish_reason` "transfer"). Both hold a
lease like a `Plan` and end with an `Abort` (a pin always; an import when it failed).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import numpy as np
import numpy.typing as npt

from marconi_ray.core.cache.tuner import TuneResult, result_from, result_record
from marconi_ray.core.wire import Fields, Record, check_int, encode_array
from marconi_ray.protocol.orders import Finished
from marconi_ray.protocol.results import Timings
from marconi_ray.protocol.sampling import SamplingParams

NO_TIMINGS: Final = Timings(0.0, 0.0, 0.0, 0.0)
"""Timings of a replayed commit (the journal keeps what the cache needs, not timings)."""

_PARAM_KEYS = tuple(f.name for f in dataclasses.fields(SamplingParams))


@dataclass(frozen=True)
class Register:
    """A replica's empty cache, priced as its rank-0 shard's store holds bytes."""

    NAME: ClassVar[str] = "register"
    KEYS: ClassVar[tuple[str, ...]] = ("replica", "kv_bytes_per_token", "state_bytes", "generation")
    replica: str
    kv_bytes_per_token: int
    state_bytes: int
    generation: int

    def to_record(self) -> Record:
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, f: Fields) -> Register:
        return cls(
            f.get_str("replica"),
            f.get_int("kv_bytes_per_token", 0),
            f.get_int("state_bytes", 0),
            f.get_int("generation"),
        )


@dataclass(frozen=True)
class Unregister:
    """Forget a replica and its cache."""

    NAME: ClassVar[str] = "unregister"
    KEYS: ClassVar[tuple[str, ...]] = ("replica",)
    replica: str

    def to_record(self) -> Record:
        return {"replica": self.replica}

    @classmethod
    def from_record(cls, f: Fields) -> Unregister:
        return cls(f.get_str("replica"))


@dataclass(frozen=True, eq=False)
class Plan:
    """Request `request` planned on `replica` (its lease starts)."""

    NAME: ClassVar[str] = "plan"
    KEYS: ClassVar[tuple[str, ...]] = ("replica", "request", "prompt", "params", "submitted")
    replica: str
    request: int
    prompt: npt.NDArray[np.int32]
    params: SamplingParams
    submitted: float

    def to_record(self) -> Record:
        params = {key: getattr(self.params, key) for key in _PARAM_KEYS}  # asdict deep-copies
        params["stop_token_ids"] = list(self.params.stop_token_ids)
        return {
            "replica": self.replica,
            "request": self.request,
            "prompt": encode_array(self.prompt, "<i4"),
            "params": params,
            "submitted": float(self.submitted),
        }

    @classmethod
    def from_record(cls, f: Fields) -> Plan:
        p = Fields(f.get("params"), f.where("params"), _PARAM_KEYS)
        stops = p.get_list("stop_token_ids")
        try:
            params = SamplingParams(**{**p.obj, "stop_token_ids": tuple(stops)})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{f.where('params')}: {exc}") from None
        return cls(
            f.get_str("replica"),
            f.get_int("request", 0),
            f.get_array("prompt", "<i4"),
            params,
            f.get_float("submitted"),
        )


@dataclass(frozen=True, eq=False)
class Commit:
    """What a finished request stored (its states by depth, its KV slots)."""

    NAME: ClassVar[str] = "commit"
    KEYS: ClassVar[tuple[str, ...]] = (
        "replica",
        "request",
        "tokens",
        "finish_reason",
        "state_ids",
        "kv_slots",
    )
    replica: str
    done: Finished

    def to_record(self) -> Record:
        d = self.done
        return {
            "replica": self.replica,
            "request": d.request_id,
            "tokens": encode_array(d.tokens, "<i4"),
            "finish_reason": d.finish_reason,
            "state_ids": [[int(k), int(v)] for k, v in d.state_ids.items()],
            "kv_slots": encode_array(d.kv_slots, "<i8"),
        }

    @classmethod
    def from_record(cls, f: Fields) -> Commit:
        pairs = f.get_list("state_ids")
        state_ids: dict[int, int] = {}
        for i, pair in enumerate(pairs):
            where = f"{f.where('state_ids')}[{i}]"
            if not isinstance(pair, list) or len(pair) != 2:
                raise ValueError(f"{where}: expected [depth, state id]")
            state_ids[check_int(pair[0], where, 0)] = check_int(pair[1], where, 0)
        done = Finished(
            request_id=f.get_int("request", 0),
            tokens=tuple(int(t) for t in f.get_array("tokens", "<i4")),
            finish_reason=f.get_str("finish_reason"),
            state_ids=state_ids,
            kv_slots=f.get_array("kv_slots", "<i8"),
            timings=NO_TIMINGS,
        )
        return cls(f.get_str("replica"), done)


@dataclass(frozen=True)
class Abort:
    """A request's plan released before (or instead of) its commit. `done`, when the
    request finished, is what it stored, freed with it: the store's business, so it is
    not journalled (the cache ends the same either way)."""

    NAME: ClassVar[str] = "abort"
    KEYS: ClassVar[tuple[str, ...]] = ("replica", "request", "reason")
    replica: str
    request: int
    reason: str
    done: Finished | None = dataclasses.field(default=None, compare=False)

    def to_record(self) -> Record:
        return {"replica": self.replica, "request": self.request, "reason": self.reason}

    @classmethod
    def from_record(cls, f: Fields) -> Abort:
        return cls(f.get_str("replica"), f.get_int("request", 0), f.get_str("reason"))


@dataclass(frozen=True)
class Adopt:
    """The tuner's winning alpha for a replica's cache."""

    NAME: ClassVar[str] = "adopt"
    KEYS: ClassVar[tuple[str, ...]] = ("replica", "result")
    replica: str
    result: TuneResult

    def to_record(self) -> Record:
        return {"replica": self.replica, "result": result_record(self.result)}

    @classmethod
    def from_record(cls, f: Fields) -> Adopt:
        return cls(f.get_str("replica"), result_from(f.get("result"), f.where("result")))


@dataclass(frozen=True, eq=False)
class Pin:
    """Lock `replica`'s deepest usable entry of `tokens` under request id `request`,
    for a copy to another replica (`Planner.pin`)."""

    NAME: ClassVar[str] = "pin"
    KEYS: ClassVar[tuple[str, ...]] = ("replica", "request", "tokens")
    replica: str
    request: int
    tokens: npt.NDArray[np.int32]

    def to_record(self) -> Record:
        return {
            "replica": self.replica,
            "request": self.request,
            "tokens": encode_array(self.tokens, "<i4"),
        }

    @classmethod
    def from_record(cls, f: Fields) -> Pin:
        return cls(f.get_str("replica"), f.get_int("request", 0), f.get_array("tokens", "<i4"))


@dataclass(frozen=True, eq=False)
class Import(Pin):
    """Reserve `replica`'s room for an entry of `tokens` copied from another replica
    (`Planner.plan_import`); its `Commit` admits it."""

    NAME: ClassVar[str] = "import"

    @classmethod
    def from_record(cls, f: Fields) -> Import:
        return cls(f.get_str("replica"), f.get_int("request", 0), f.get_array("tokens", "<i4"))


Op = Register | Unregister | Plan | Commit | Abort | Adopt | Pin | Import
OP_TYPES: Final[dict[str, Any]] = {
    cls.NAME: cls for cls in (Register, Unregister, Plan, Commit, Abort, Adopt, Pin, Import)
}


def encode_op(op: Op) -> Record:
    """`op` as a plain structure: `{"op": NAME, **fields}`."""
    return {"op": op.NAME, **op.to_record()}


def decode_op(record: object, path: str = "record") -> Op:
    """The operation in a plain structure of `encode_op`'s form; ValueError naming the
    field when malformed (missing, unknown, wrongly typed or invalid)."""
    if not isinstance(record, dict):
        raise ValueError(f"{path}: expected a map, got {type(record).__name__}")
    name = record.get("op")
    cls = OP_TYPES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"{path}: unknown record op {name!r}")
    body = {k: v for k, v in record.items() if k != "op"}
    result: Op = cls.from_record(Fields(body, f"{path}[{name}]", cls.KEYS))
    return result
