"""Resolve a trace spec (a builder name or an artifact JSONL file) to a Trace.

Specs: ``sharegpt`` (artifact mode), ``sharegpt-rejoined``, ``swebench``, ``sample`` (the
packaged 20-session ShareGPT sample; needs no data folder), or a path to an artifact
``.jsonl``/``.jsonl.gz`` file. Builds go through the disk cache (:mod:`.cache`).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from marconi_ray.core.trace import Trace, read_jsonl, with_session_rate
from marconi_ray.traces import sharegpt, swebench
from marconi_ray.traces.cache import cached_build
from marconi_ray.traces.tokenizer import LLAMA2_RELPATH, Tokenizer, load_tokenizer

SAMPLE_RESOURCE = "sharegpt_sample.jsonl.gz"


@dataclass(frozen=True)
class Builder:
    """A named trace builder: ``fn(path=..., tokenizer=..., **fixed, **kw)``."""

    fn: Callable[..., Trace]
    default_path: Callable[[str | os.PathLike[str] | None], Path]
    fixed: tuple[tuple[str, Any], ...] = ()


BUILDERS: dict[str, Builder] = {
    "sharegpt": Builder(
        sharegpt.build_sharegpt,
        lambda d: sharegpt.default_path("artifact", d),
        (("mode", "artifact"),),
    ),
    "sharegpt-rejoined": Builder(
        sharegpt.build_sharegpt,
        lambda d: sharegpt.default_path("rejoined", d),
        (("mode", "rejoined"),),
    ),
    "swebench": Builder(swebench.build_swebench, swebench.default_path),
}
CHOICES = (*BUILDERS, "sample", "<file.jsonl[.gz]>")


def load_sample() -> Trace:
    """The packaged sample: the first 20 sessions of the artifact-mode ShareGPT trace."""
    ref = resources.files("marconi_ray.data").joinpath(SAMPLE_RESOURCE)
    with resources.as_file(ref) as path:
        return read_jsonl(path, name="sample")


def _check_kwargs(spec: str, fn: Callable[..., Trace] | None, kw: dict[str, Any]) -> None:
    allowed = set(inspect.signature(fn).parameters) if fn is not None else set()
    allowed -= {"path", "tokenizer", "mode", "n_sessions", "sessions_per_second"}
    unknown = sorted(set(kw) - allowed)
    if unknown:
        raise ValueError(
            f"trace {spec!r} takes no option(s) {', '.join(unknown)}"
            + (f"; allowed: {', '.join(sorted(allowed))}" if allowed else "")
        )


def load_trace(
    spec: str,
    *,
    n_sessions: int | None = None,
    sessions_per_second: float | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    tokenizer: Tokenizer | str | os.PathLike[str] | None = None,
    use_cache: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
    **kw: Any,
) -> Trace:
    """Load the trace named by ``spec`` (see the module docstring).

    For builders, ``n_sessions``/``sessions_per_second`` of None mean the builder's
    defaults, ``data_dir`` (default :func:`default_data_dir`) holds the sources and the
    default Llama-2 tokenizer, ``tokenizer`` is a Tokenizer or a path for
    :func:`load_tokenizer`, and ``kw``
    are further builder options (e.g. ``gaps``, ``seed``, ``max_tokens``). For ``sample``
    and files, ``n_sessions`` keeps the first sessions and ``sessions_per_second``
    re-times session starts (:func:`with_session_rate`). Unknown specs or options raise
    ValueError naming them.
    """
    builder = BUILDERS.get(spec)
    if builder is None:
        if spec == "sample":
            trace = load_sample()
        elif Path(spec).is_file():
            trace = read_jsonl(spec)
        else:
            raise ValueError(
                f"unknown trace {spec!r} (not a builder name nor an existing file); "
                f"choose one of {', '.join(CHOICES)}"
            )
        _check_kwargs(spec, None, kw)
        if n_sessions is not None:
            trace = trace.first_sessions(n_sessions)
        if sessions_per_second is not None:
            trace = with_session_rate(trace, sessions_per_second)
        return trace
    _check_kwargs(spec, builder.fn, kw)
    args: dict[str, Any] = dict(builder.fixed) | kw
    args["path"] = builder.default_path(data_dir)
    if n_sessions is not None:
        args["n_sessions"] = n_sessions
    if sessions_per_second is not None:
        args["sessions_per_second"] = sessions_per_second
    if tokenizer is None and data_dir is not None:
        tokenizer = Path(data_dir) / LLAMA2_RELPATH
    args["tokenizer"] = tokenizer if isinstance(tokenizer, Tokenizer) else load_tokenizer(tokenizer)
    if use_cache:
        return cached_build(spec, builder.fn, cache_dir=cache_dir, **args)
    return builder.fn(**args)
