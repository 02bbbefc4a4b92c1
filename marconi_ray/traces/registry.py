"""Resolve a trace spec (a builder name, a Mooncake spec or a JSONL file) to a Trace.

Specs: ``sharegpt`` (artifact mode), ``sharegpt-rejoined``, ``swebench``, ``sample`` (the
packaged 20-session ShareGPT sample; needs no data folder), ``mooncake:FILE`` /
``mooncake-chained:FILE`` (a Mooncake-format file of hash ids, unchained or with
conversations chained, :mod:`.mooncake`; bare ``mooncake`` / ``mooncake-chained`` read
the shared ``mooncake/synthetic_trace.jsonl`` of the data folder), ``azure:FILE`` (an
Azure LLM inference trace CSV of arrival times and lengths, :mod:`.azure`), or a path to an
artifact ``.jsonl``/``.jsonl.gz`` file. Tokenized builds go through the disk cache
(:mod:`.cache`); Mooncake traces need no tokenizer and are rebuilt each time (about a
second for the shared file).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from marconi_ray.traces import azure, mooncake, sharegpt, swebench
from marconi_ray.traces.cache import cached_build
from marconi_ray.traces.tokenizer import LLAMA2_RELPATH, Tokenizer, load_tokenizer
from marconi_ray.traces.trace import Trace, read_jsonl, with_session_rate

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
MOONCAKE_KINDS = {"mooncake": False, "mooncake-chained": True}
"""Mooncake spec prefixes and whether they chain conversations."""
AZURE = "azure"
"""Spec prefix of an Azure LLM inference trace CSV (`azure:FILE`, :mod:`.azure`)."""
CHOICES = (
    *BUILDERS,
    "sample",
    *(f"{kind}[:FILE]" for kind in MOONCAKE_KINDS),
    f"{AZURE}:FILE",
    "<file.jsonl[.gz]>",
)


def mooncake_spec(spec: str) -> tuple[bool, str | None] | None:
    """``(chained, file)`` for ``mooncake[-chained][:FILE]`` (file None: the shared
    one), None for any other spec; ValueError for an empty ``FILE`` after the colon."""
    kind, colon, file = spec.partition(":")
    if kind not in MOONCAKE_KINDS:
        return None
    if colon and not file:
        raise ValueError(f"trace {spec!r}: no file after '{kind}:'")
    return MOONCAKE_KINDS[kind], (file or None)


def load_sample() -> Trace:
    """The packaged sample: the first 20 sessions of the artifact-mode ShareGPT trace."""
    ref = resources.files("marconi_ray.data").joinpath(SAMPLE_RESOURCE)
    with resources.as_file(ref) as path:
        return read_jsonl(path, name="sample")


def _check_kwargs(spec: str, fn: Callable[..., Trace] | None, kw: dict[str, Any]) -> None:
    allowed = set(inspect.signature(fn).parameters) if fn is not None else set()
    allowed -= {"path", "tokenizer", "mode", "chained", "n_sessions", "sessions_per_second"}
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
    re-times session starts (:func:`with_session_rate`). Mooncake specs take the same two
    (sessions as built, :func:`.mooncake.build_mooncake`), ``data_dir`` for the shared
    file, and the options ``seed``, ``vocab_size``, ``block_size``, ``name``; ``tokenizer``
    and the disk cache are not used. Unknown specs or options raise ValueError naming them.
    """
    kind, colon, azure_file = spec.partition(":")
    if kind == AZURE and colon:
        if not azure_file:
            raise ValueError(f"trace {spec!r}: no file after '{AZURE}:'")
        _check_kwargs(spec, azure.read_azure, kw)
        return azure.read_azure(
            azure_file, n_sessions=n_sessions, sessions_per_second=sessions_per_second, **kw
        )
    moon = mooncake_spec(spec)
    if moon is not None:
        chained, file = moon
        _check_kwargs(spec, mooncake.build_mooncake, kw)
        return mooncake.build_mooncake(
            file if file is not None else mooncake.default_path(data_dir),
            chained=chained,
            n_sessions=n_sessions,
            sessions_per_second=sessions_per_second,
            **kw,
        )
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
