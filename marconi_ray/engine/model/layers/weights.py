"""How a layer's local parameters are filled from a Hugging Face checkpoint."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from marconi_ray.engine.model.parallel import Segment


@dataclass(frozen=True)
class WeightSpec:
    """Where one local parameter comes from.

    Attributes:
        key: the checkpoint key relative to the layer's HF prefix (e.g. `in_proj.weight`).
        dim: the dimension split across tensor-parallel ranks, None when replicated.
        segments: the fused row groups along `dim` (one whole segment when empty).
        stack: when > 0, the parameter stacks `stack` checkpoint tensors along a new
            first dim: `key` has an `{e}` field, filled with 0..stack-1 (one key per
            expert), and `dim` / `segments` split each of them.
        scales: multipliers folded into the checkpoint tensor at load, before it is split
            (muP models): none when empty, one value for the whole tensor, else one per
            segment of `segments`, along `dim`.
        parts: when set, the checkpoint tensor is the concatenation along `dim` of these
            (keys like `key`; `key` is then the first), split by `segments` as one tensor
            would be: OLMo Hybrid's checkpoints store its one q/k/v conv as three tensors,
            whose sizes need not be the q, k and v widths (transformers' writer splits the
            conv into three near-equal chunks).
    """

    key: str
    dim: int | None = None
    segments: Sequence[Segment] = ()
    stack: int = 0
    scales: tuple[float, ...] = ()
    parts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.parts and (self.dim is None or self.stack or self.scales):
            raise ValueError(f"{self.key}: parts join along a split dim, unstacked, unscaled")
        if len(self.scales) > 1 and (self.dim is None or len(self.scales) != len(self.segments)):
            raise ValueError(
                f"{self.key}: {len(self.scales)} multipliers need as many segments along a "
                f"split dim, got dim={self.dim} and {len(self.segments)} segments"
            )

    def checkpoint_keys(self) -> tuple[str, ...]:
        """The checkpoint keys this parameter reads (relative to the model prefix)."""
        if self.stack:
            return tuple(self.key.format(e=e) for e in range(self.stack))
        return self.parts or (self.key,)
