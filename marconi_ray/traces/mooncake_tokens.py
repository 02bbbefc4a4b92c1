"""Deterministic pseudo-random token ids for Mooncake hash blocks and request outputs.

Mooncake traces release block hashes, not tokens. A block id becomes ``block_size`` token
ids and a request's output ``output_length`` token ids, each a pure function of
``(seed, id or request index, position)``: a splitmix64 mix of the three, modulo
``vocab_size``. Blocks and outputs draw from separate streams (distinct domain constants),
so an output never repeats a block by construction. Everything is vectorised with numpy
(uint64 arithmetic wraps silently on arrays).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from marconi_ray.traces.trace import TokenArray

DEFAULT_VOCAB = 32000
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_BLOCK_DOMAIN = 0x426C6F636B  # "Block"
_OUTPUT_DOMAIN = 0x4F7574707574  # "Output"
_PROMPT_DOMAIN = 0x50726F6D7074  # "Prompt"
U64 = npt.NDArray[np.uint64]


def _mix(x: U64) -> U64:
    """The splitmix64 finaliser, element-wise."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    out: U64 = x ^ (x >> np.uint64(31))
    return out


def check_vocab(vocab_size: int) -> int:
    """``vocab_size`` if it is an int in [2, 2**31 - 1], else ValueError naming it."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise ValueError(f"vocab_size must be an int, got {vocab_size!r}")
    if not 2 <= vocab_size <= int(np.iinfo(np.int32).max):
        raise ValueError(f"vocab_size must be in [2, 2**31 - 1], got {vocab_size}")
    return vocab_size


def _stream(keys: U64, length: int, seed: int, domain: int, vocab_size: int) -> TokenArray:
    """``(len(keys), length)`` int32 tokens in [0, vocab_size): row i is keys[i]'s stream."""
    check_vocab(vocab_size)
    head = _mix(np.array([seed & 0xFFFFFFFFFFFFFFFF, domain], dtype=np.uint64))
    base = _mix(_mix(keys ^ head[0]) + head[1])[:, None]
    pos = np.arange(length, dtype=np.uint64)[None, :] * _GOLDEN
    out: TokenArray = (_mix(base + pos) % np.uint64(vocab_size)).astype(np.int32)
    return out


def block_tokens(
    ids: Sequence[int] | npt.NDArray[np.integer],
    block_size: int,
    seed: int = 0,
    vocab_size: int = DEFAULT_VOCAB,
) -> TokenArray:
    """The tokens of each block id: shape ``(len(ids), block_size)``, int32, ids >= 0.

    Row i depends only on ``(seed, ids[i])``: the same id always gets the same tokens.
    """
    keys = np.asarray(ids, dtype=np.int64)
    if keys.size and int(keys.min()) < 0:
        raise ValueError(f"block ids must be >= 0, got {int(keys.min())}")
    return _stream(keys.astype(np.uint64), block_size, seed, _BLOCK_DOMAIN, vocab_size)


def _request_stream(index: int, length: int, seed: int, domain: int, vocab: int) -> TokenArray:
    if index < 0 or length < 0:
        raise ValueError(f"index and length must be >= 0, got {index}, {length}")
    keys = np.array([index], dtype=np.uint64)
    out: TokenArray = _stream(keys, length, seed, domain, vocab)[0]
    return out


def output_tokens(
    index: int, length: int, seed: int = 0, vocab_size: int = DEFAULT_VOCAB
) -> TokenArray:
    """``length`` output tokens of the request at ``index`` (a function of both and seed)."""
    return _request_stream(index, length, seed, _OUTPUT_DOMAIN, vocab_size)


def prompt_tokens(
    index: int, length: int, seed: int = 0, vocab_size: int = DEFAULT_VOCAB
) -> TokenArray:
    """``length`` prompt tokens of the request at ``index``, for traces that give only a
    prompt's length (a stream of its own: never a block's nor an output's tokens)."""
    return _request_stream(index, length, seed, _PROMPT_DOMAIN, vocab_size)
