"""Disk cache of built traces: served from disk the second time, corrupt files rebuilt."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from marconi_ray.traces.cache import cache_key, cached_build, decode_trace, encode_trace
from marconi_ray.traces.sharegpt import build_sharegpt, default_path
from marconi_ray.traces.tokenizer import Tokenizer
from marconi_ray.traces.trace import Request, Trace


def _same(a: Trace, b: Trace) -> None:
    assert a.name == b.name and len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert (x.session_id, x.turn_id, x.ts) == (y.session_id, y.turn_id, y.ts)
        assert np.array_equal(x.input_tokens, y.input_tokens)
        assert np.array_equal(x.output_tokens, y.output_tokens)


class Counting:
    """Wraps a builder and counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, **kwargs: object) -> Trace:
        self.calls += 1
        return build_sharegpt(**kwargs)  # type: ignore[arg-type]


@pytest.fixture()
def source(tmp_path: Path) -> Path:
    conv = [
        {"from": "human", "value": f"q{i} a b"} if i % 2 == 0 else {"from": "gpt", "value": f"r{i}"}
        for i in range(8)
    ]
    path = tmp_path / "src.json"
    path.write_text(
        json.dumps([{"id": f"s{k}_0", "conversations": conv[: 4 + k]} for k in range(4)])
    )
    return path


def test_second_build_is_served_from_disk(
    tmp_path: Path, source: Path, char_tok: Tokenizer
) -> None:
    fn, cache = Counting(), tmp_path / "cache"
    first = cached_build("sg", fn, cache_dir=cache, path=source, n_sessions=3, tokenizer=char_tok)
    second = cached_build("sg", fn, cache_dir=cache, path=source, n_sessions=3, tokenizer=char_tok)
    assert fn.calls == 1
    _same(first, second)
    cached_build("sg", fn, cache_dir=cache, path=source, n_sessions=2, tokenizer=char_tok)
    assert fn.calls == 2  # other arguments -> other key
    assert len(list(cache.glob("*.msgpack"))) == 2


def test_source_change_invalidates(tmp_path: Path, source: Path, char_tok: Tokenizer) -> None:
    fn, cache = Counting(), tmp_path / "cache"
    cached_build("sg", fn, cache_dir=cache, path=source, n_sessions=3, tokenizer=char_tok)
    st = source.stat()
    os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    cached_build("sg", fn, cache_dir=cache, path=source, n_sessions=3, tokenizer=char_tok)
    assert fn.calls == 2


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_file_is_rebuilt(
    tmp_path: Path, source: Path, char_tok: Tokenizer, damage: str
) -> None:
    fn, cache = Counting(), tmp_path / "cache"
    good = cached_build("sg", fn, cache_dir=cache, path=source, n_sessions=4, tokenizer=char_tok)
    (file,) = cache.glob("*.msgpack")
    blob = file.read_bytes()
    file.write_bytes(
        {"truncate": blob[: len(blob) // 2], "garbage": b"\xc1junk" + blob, "empty": b""}[damage]
    )
    again = cached_build("sg", fn, cache_dir=cache, path=source, n_sessions=4, tokenizer=char_tok)
    assert fn.calls == 2
    _same(good, again)
    assert file.read_bytes() == blob  # rewritten
    cached_build("sg", fn, cache_dir=cache, path=source, n_sessions=4, tokenizer=char_tok)
    assert fn.calls == 2


def test_encode_decode_handles_non_prefix_requests() -> None:
    reqs = [
        Request(0, 0, 0.0, np.array([1, 2, 3]), np.array([4])),
        Request(0, 1, 1.0, np.array([1, 2, 9, 9]), np.array([], np.int32)),
        Request(1, 0, 0.5, np.array([7]), np.array([8, 8])),
    ]
    t = Trace.from_requests("x", reqs)
    _same(t, decode_trace(encode_trace(t, "k"), "k"))
    with pytest.raises(ValueError, match="key"):
        decode_trace(encode_trace(t, "k"), "other")


def test_key_needs_explicit_path_and_plain_args(char_tok: Tokenizer) -> None:
    with pytest.raises(ValueError, match="explicit path"):
        cached_build("sg", build_sharegpt, path=None, tokenizer=char_tok)
    with pytest.raises(ValueError, match="weird"):
        cache_key("sg", {"weird": object()})


@pytest.mark.data("sharegpt", "llama2_tokenizer")
def test_real_build_round_trip(tmp_path: Path, llama: Tokenizer) -> None:
    fn = Counting()
    args = {"path": default_path("artifact"), "n_sessions": 5, "tokenizer": llama}
    a = cached_build("sharegpt", fn, cache_dir=tmp_path, **args)
    b = cached_build("sharegpt", fn, cache_dir=tmp_path, **args)
    assert fn.calls == 1
    _same(a, b)
