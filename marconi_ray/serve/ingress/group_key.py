"""Which coordinator of a group plans a request: a stable hash of the prompt's first
tokens, so requests sharing a leading block (a system prompt, a session's earlier
turns) meet the same coordinator, and so the same trees.

The key is the first `key_tokens` tokens (all of a shorter prompt). Too short a key puts
every request behind a common system prompt on one coordinator; too long a key splits a
session whose first turn is shorter than the key from its later turns
(`benchmarks/bench_coordinator_groups.py` measures both on real traces: 256 tokens keeps
ShareGPT, SWE-bench and Mooncake within a point of one coordinator's hit rate).
"""

from __future__ import annotations

import hashlib

import numpy as np
import numpy.typing as npt


def group_of(prompt: npt.NDArray[np.int32], groups: int, key_tokens: int) -> int:
    """The group (0 .. `groups` - 1) of `prompt`: blake2b of its first `key_tokens`
    tokens as little-endian int32, modulo `groups` (the same on every ingress and run)."""
    if groups <= 1:
        return 0
    head = np.ascontiguousarray(prompt[:key_tokens], dtype="<i4").tobytes()
    return int.from_bytes(hashlib.blake2b(head, digest_size=8).digest(), "little") % groups


def spill_order(preferred: int, groups: int) -> list[int]:
    """The coordinators to try, in order: the preferred one, then the next ones round the
    group (a request its coordinator cannot place goes to the next)."""
    return [(preferred + i) % groups for i in range(groups)]
