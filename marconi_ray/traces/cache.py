"""On-disk cache of tokenized traces, so rebuilding a trace is fast.

Key: sha256 of (format version, builder name, every argument; an existing file/folder
argument contributes its size and mtime (each file in a folder), a tokenizer its
fingerprint). Folder: ``$MARCONI_CACHE_DIR`` or ``~/.cache/marconi_ray/traces``.

A file is msgpack: ``{"format", "key", "name", "requests"}`` where each request is
``[session_id, turn_id, ts, shared, input_suffix, output]``: ``shared`` is the length of
the prefix the input shares with the previous request (input + output) of its session,
and the token arrays are little-endian int32 bytes. This delta encoding keeps growing
agent contexts small. A file that fails to decode or carries another key is rebuilt.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from marconi_ray.traces.tokenizer import Tokenizer, load_tokenizer
from marconi_ray.traces.trace import Request, Trace

FORMAT_VERSION = 1
CACHE_DIR_ENV = "MARCONI_CACHE_DIR"
_I32 = np.dtype("<i4")


def default_cache_dir() -> Path:
    """``$MARCONI_CACHE_DIR`` if set and non-empty, else ``~/.cache/marconi_ray/traces``."""
    env = os.environ.get(CACHE_DIR_ENV, "")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "marconi_ray" / "traces"


def _stat(p: Path) -> list[Any]:
    st = p.stat()
    return [st.st_size, st.st_mtime_ns]


def _describe(name: str, value: Any) -> Any:
    """A JSON-able description of one builder argument for the cache key."""
    if isinstance(value, Tokenizer):
        return {"tokenizer": value.fingerprint}
    if isinstance(value, os.PathLike) or (isinstance(value, str) and name.endswith("path")):
        p = Path(value).resolve()
        if p.is_file():
            return {"file": str(p), "stat": _stat(p)}
        if p.is_dir():
            files = sorted(f for f in p.rglob("*") if f.is_file())
            return {"dir": str(p), "files": [[str(f.relative_to(p)), *_stat(f)] for f in files]}
        return {"missing": str(p)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(f"cannot build a cache key from argument {name}={value!r}")


def cache_key(builder_name: str, kwargs: dict[str, Any]) -> str:
    """The hex sha256 key of one build (see the module docstring)."""
    desc = {k: _describe(k, v) for k, v in sorted(kwargs.items())}
    blob = json.dumps([FORMAT_VERSION, builder_name, desc], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _shared_len(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size)
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def encode_trace(trace: Trace, key: str) -> bytes:
    """Serialise ``trace`` (delta-encoded per session) under ``key``."""
    prev: dict[int, np.ndarray] = {}
    rows = []
    for r in trace.requests:
        last = prev.get(r.session_id, np.zeros(0, np.int32))
        shared = _shared_len(r.input_tokens, last)
        rows.append(
            [
                r.session_id,
                r.turn_id,
                r.ts,
                shared,
                r.input_tokens[shared:].astype(_I32).tobytes(),
                r.output_tokens.astype(_I32).tobytes(),
            ]
        )
        prev[r.session_id] = r.tokens
    return msgpack.packb(
        {"format": FORMAT_VERSION, "key": key, "name": trace.name, "requests": rows},
        use_bin_type=True,
    )


def decode_trace(blob: bytes, key: str) -> Trace:
    """Inverse of :func:`encode_trace`; ValueError if the blob is not a trace for ``key``."""
    obj = msgpack.unpackb(blob, raw=False)
    if not isinstance(obj, dict) or obj.get("format") != FORMAT_VERSION or obj.get("key") != key:
        raise ValueError("cache file has another format or key")
    prev: dict[int, np.ndarray] = {}
    requests = []
    for sid, turn, ts, shared, suffix, out in obj["requests"]:
        last = prev.get(sid, np.zeros(0, np.int32))
        if not 0 <= shared <= last.size:
            raise ValueError(f"bad shared prefix length {shared}")
        inp = np.concatenate([last[:shared], np.frombuffer(suffix, _I32)]).astype(np.int32)
        req = Request(sid, turn, ts, inp, np.frombuffer(out, _I32).astype(np.int32))
        requests.append(req)
        prev[sid] = req.tokens
    return Trace.from_requests(str(obj["name"]), requests)


def _write_atomic(path: Path, blob: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(blob)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cached_build(
    builder_name: str,
    fn: Callable[..., Trace],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    **kwargs: Any,
) -> Trace:
    """``fn(**kwargs)``, served from the disk cache when an identical build was stored.

    ``kwargs`` must name the source explicitly (``path`` not None); a ``tokenizer`` of None
    is resolved to the default (Llama-2) here so that it enters the key. A cache that
    cannot be written (read-only folder) is skipped silently.
    """
    if "path" in kwargs and kwargs["path"] is None:
        raise ValueError(f"cached_build({builder_name!r}) needs an explicit path, got None")
    if "tokenizer" in kwargs and kwargs["tokenizer"] is None:
        kwargs["tokenizer"] = load_tokenizer(None)
    key = cache_key(builder_name, kwargs)
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    file = folder / f"{builder_name}-{key[:32]}.msgpack"
    if file.is_file():
        try:
            return decode_trace(file.read_bytes(), key)
        except (ValueError, TypeError, KeyError, IndexError, msgpack.UnpackException):
            pass  # corrupt or stale: rebuild below and overwrite
    trace = fn(**kwargs)
    with contextlib.suppress(OSError):
        _write_atomic(file, encode_trace(trace, key))
    return trace
