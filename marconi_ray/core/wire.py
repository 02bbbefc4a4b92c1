"""The wire toolkit: plain structures (dicts with str keys, lists, ints, floats, str,
bytes, bools, None) and their bounded msgpack encoding, with typed, path-naming reads.

Every form that crosses a process or lands in Redis (prefix-cache snapshots, tuner and
planner records, journal operations) is built from these: numpy columns travel as
`{"dtype": "<i8", "data": <raw little-endian bytes>}` (`encode_array`), maps are read
with `Fields` (exact keys, typed getters, errors naming the field's path), versioned maps
with `check_header`. `pack`/`unpack` use msgpack's bin type and no ext types (so no
pickle, no timestamps), and `unpack` bounds every length by `max_bytes`. Malformed input
raises ValueError naming what is wrong, never another exception.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt

SCHEMA_VERSION = 1
DEFAULT_MAX_BYTES = 1 << 30

Record = dict[str, Any]
"""A plain structure ready for `pack` (the serialized form of something)."""

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_DTYPES = {"<i4": np.int32, "<i8": np.int64, "<f8": np.float64, "|u1": np.uint8}
_ARRAY_KEYS = ("dtype", "data")


# --------------------------------------------------------------------- arrays
def encode_array(arr: npt.ArrayLike, dtype: str) -> Record:
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
def type_name(value: object) -> str:
    return type(value).__name__


class Fields:
    """Typed reads of one map of a decoded form; every error names the field's path.

    The map must have exactly `keys` (missing or unknown keys raise ValueError).
    """

    def __init__(self, obj: object, path: str, keys: Collection[str]) -> None:
        if not isinstance(obj, dict):
            raise ValueError(f"{path}: expected a map, got {type_name(obj)}")
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
            raise ValueError(f"{self.where(key)}: expected str, got {type_name(value)}")
        return value

    def get_bool(self, key: str) -> bool:
        value = self.obj[key]
        if not isinstance(value, bool):
            raise ValueError(f"{self.where(key)}: expected bool, got {type_name(value)}")
        return value

    def get_bytes(self, key: str) -> bytes:
        value = self.obj[key]
        if not isinstance(value, bytes):
            raise ValueError(f"{self.where(key)}: expected bytes, got {type_name(value)}")
        return value

    def get_list(self, key: str) -> list[Any]:
        value = self.obj[key]
        if not isinstance(value, list):
            raise ValueError(f"{self.where(key)}: expected a list, got {type_name(value)}")
        return value

    def get_array(self, key: str, dtype: str) -> npt.NDArray[Any]:
        return decode_array(self.obj[key], dtype, self.where(key))


def check_int(value: object, what: str, low: int | None = None) -> int:
    """`value` as an int64 (bools refused), >= `low` when given; else ValueError."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{what}: expected int, got {type_name(value)}")
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"{what}: {value} does not fit in int64")
    if low is not None and value < low:
        raise ValueError(f"{what}: must be >= {low}, got {value}")
    return value


def check_float(value: object, what: str) -> float:
    """`value` (a float or an int, not a bool) as a finite float; else ValueError."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"{what}: expected a number, got {type_name(value)}")
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


# ------------------------------------------------------------------- msgpack
def pack(record: Record) -> bytes:
    """msgpack bytes of a plain structure (bin type for bytes; anything else raises)."""
    out: bytes = msgpack.packb(record, use_bin_type=True, datetime=False)
    return out


def bounded_unpacker(max_bytes: int) -> msgpack.Unpacker:
    """A msgpack `Unpacker` that buffers at most `max_bytes` (>= 1), allows no length past
    it, str map keys only, and no ext types."""
    limit = max(1, max_bytes)
    return msgpack.Unpacker(
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


def unpack(data: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    """Inverse of `pack`, bounded: inputs over `max_bytes`, lengths past it, non-str map
    keys, ext types, truncated or trailing data all raise ValueError."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ValueError(f"expected bytes, got {type_name(data)}")
    if len(data) > max_bytes:
        raise ValueError(f"{len(data)} bytes is over the limit of {max_bytes}")
    unpacker = bounded_unpacker(max_bytes)
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
