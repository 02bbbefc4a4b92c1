"""How a layer's local parameters are filled from a Hugging Face checkpoint."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from marconi_ray.engine.parallel import Segment


@dataclass(frozen=True)
class WeightSpec:
    """Where one local parameter comes from.

    Attributes:
        key: the checkpoint key relative to the layer's HF prefix (e.g. `in_proj.weight`).
        dim: the dimension split across tensor-parallel ranks, None when replicated.
        segments: the fused row groups along `dim` (one whole segment when empty).
    """

    key: str
    dim: int | None = None
    segments: Sequence[Segment] = ()
