"""Checks on a request's prompt before anything in the cache or the store changes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt


def validate_prompt(
    tokens: Sequence[int] | npt.NDArray[np.integer], vocab_size: int, max_position: int
) -> npt.NDArray[np.int32]:
    """The prompt as int32 ids; ValueError naming the problem otherwise.

    Rejects: a non-sequence or non-integer ids, an empty prompt, ids outside
    [0, vocab_size), and prompts of `max_position` tokens or more (no room to generate).
    """
    if isinstance(tokens, (str, bytes)):
        raise ValueError("prompt_tokens must be a sequence of token ids, got a string")
    try:
        arr = np.asarray(tokens)
    except (TypeError, ValueError):
        raise ValueError(f"prompt_tokens must be a sequence of token ids, got {tokens!r}") from None
    if arr.ndim != 1:
        raise ValueError(f"prompt_tokens must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("prompt_tokens is empty")
    if arr.dtype.kind not in "iu":
        raise ValueError(f"prompt_tokens must be integers, got dtype {arr.dtype}")
    bad = np.flatnonzero((arr < 0) | (arr >= vocab_size))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"token id {int(arr[i])} at position {i} is outside the vocabulary [0, {vocab_size})"
        )
    if arr.size >= max_position:
        raise ValueError(
            f"prompt has {arr.size} tokens; the context limit is {max_position} "
            "(prompt plus at least one generated token)"
        )
    return arr.astype(np.int32)
