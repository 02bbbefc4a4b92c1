"""Reading Mooncake-format request traces (JSON Lines with prefix-block hash ids).

One JSON object per line (Mooncake, FAST'25 release)::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, ...]}

``timestamp`` is the arrival in milliseconds; ``input_length``/``output_length`` are token
counts; ``hash_ids`` names the request's prefix blocks of ``block_size`` tokens (512 in
every Mooncake release), so ``len(hash_ids) == ceil(input_length / block_size)`` and the
last block covers ``input_length - block_size * (len(hash_ids) - 1)`` tokens. Ids are
prefix-chained: the same id at position k means the same first k + 1 blocks.

Validation (each failure is a ``TraceFormatError`` starting ``path:line:``): every line is
a JSON object with the four keys; ``timestamp`` is a finite number >= 0 and never smaller
than the previous line's (file order is arrival order: a file out of order is rejected,
not sorted, because the order within a conversation is what chaining relies on);
``input_length`` is an int >= 1, ``output_length`` an int >= 0, ``hash_ids`` a list of
ints >= 0 of the length above. Blank lines are skipped; extra keys are ignored. Files
ending in ``.gz`` are gzip-compressed.
"""

from __future__ import annotations

import gzip
import io
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from marconi_ray.traces.trace import TraceFormatError, json_object

BLOCK_SIZE = 512
KEYS = ("timestamp", "input_length", "output_length", "hash_ids")


@dataclass(frozen=True)
class MooncakeRow:
    """One request of a Mooncake trace, validated (see the module docstring).

    ``index`` is its position among the file's requests (0-based, blank lines skipped);
    ``line`` its 1-based line number, for messages.
    """

    index: int
    line: int
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    def n_full_blocks(self, block_size: int = BLOCK_SIZE) -> int:
        """How many of the request's blocks are complete (``input_length // block_size``)."""
        return self.input_length // block_size


def _open_text(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.GzipFile(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def _int(obj: dict[str, Any], key: str, minimum: int) -> int:
    val = obj[key]
    if isinstance(val, bool) or not isinstance(val, int):
        raise ValueError(f"{key} must be an int, got {val!r:.60}")
    if val < minimum:
        raise ValueError(f"{key} must be >= {minimum}, got {val}")
    return val


def _timestamp(obj: dict[str, Any]) -> float:
    val = obj["timestamp"]
    if isinstance(val, bool) or not isinstance(val, (int, float)):
        raise ValueError(f"timestamp must be a number, got {val!r:.60}")
    if not math.isfinite(val) or val < 0:
        raise ValueError(f"timestamp must be finite and >= 0, got {val!r}")
    return float(val)


def _hash_ids(obj: dict[str, Any], input_length: int, block_size: int) -> tuple[int, ...]:
    val = obj["hash_ids"]
    if not isinstance(val, list):
        raise ValueError(f"hash_ids must be a list of ints, got {type(val).__name__}")
    for h in val:
        if isinstance(h, bool) or not isinstance(h, int) or h < 0:
            raise ValueError(f"hash_ids must hold ints >= 0, got {h!r:.60}")
    want = -(-input_length // block_size)
    if len(val) != want:
        raise ValueError(
            f"len(hash_ids)={len(val)} but input_length={input_length} needs "
            f"ceil({input_length}/{block_size})={want} blocks"
        )
    return tuple(val)


def parse_row(text: str, index: int, line: int, block_size: int = BLOCK_SIZE) -> MooncakeRow:
    """One line as a MooncakeRow; ValueError (no path prefix) saying what is wrong."""
    obj = json_object(text, KEYS)
    n_in = _int(obj, "input_length", 1)
    return MooncakeRow(
        index,
        line,
        _timestamp(obj),
        n_in,
        _int(obj, "output_length", 0),
        _hash_ids(obj, n_in, block_size),
    )


def read_rows(path: str | os.PathLike[str], block_size: int = BLOCK_SIZE) -> list[MooncakeRow]:
    """Every request of a Mooncake file, in file order (module docstring for the checks).

    Raises FileNotFoundError naming the path, or TraceFormatError (``path:line: why``).
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be an int >= 1, got {block_size!r}")
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"trace file not found: {p}")
    rows: list[MooncakeRow] = []
    with _open_text(p) as fh:
        for lineno, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                row = parse_row(text, len(rows), lineno, block_size)
                if rows and row.timestamp_ms < rows[-1].timestamp_ms:
                    raise ValueError(
                        f"timestamp {row.timestamp_ms:g} is before the previous request's "
                        f"{rows[-1].timestamp_ms:g} (line {rows[-1].line}); Mooncake files "
                        "must be in arrival order"
                    )
            except (ValueError, TypeError) as exc:  # JSONDecodeError is a ValueError
                raise TraceFormatError(f"{p}:{lineno}: {exc}") from exc
            rows.append(row)
    return rows
