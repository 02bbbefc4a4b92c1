"""The oracle bound: an infinite cache holding a state after every token.

Its hit for a request is the longest prefix of the input that any earlier request's
input + output started with. No admission or eviction policy can beat it.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from marconi_ray.core.cache.tuner import RequestLike
from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.core.tree.radix_tree import RadixTree

_UNIT = CostModel(flops_linear=0.0, flops_quadratic=0.0, kv_bytes_per_token=0, state_bytes=1)


def oracle_hits(requests: Iterable[RequestLike]) -> list[int]:
    """Per request, the longest prefix of its input seen before (input or output)."""
    tree = RadixTree(_UNIT)
    hits: list[int] = []
    for step, req in enumerate(requests):
        inp = req.input_tokens
        hits.append(min(tree.match(inp).matched_len, len(inp)))
        full = np.concatenate([inp, req.output_tokens]) if len(req.output_tokens) else inp
        tree.insert(full, [(len(full), step)], now=float(step))
    return hits
