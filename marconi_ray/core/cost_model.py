"""The numbers a cache needs from a model: FLOPs as a function of length, and state bytes.

A `ModelSpec` knows every layer; the cache only needs four scalars, because the FLOPs to
prefill a full sequence of n tokens from scratch are a quadratic polynomial
`total(n) = linear * n + quadratic * n**2` (attention's score/AV term is the only
quadratic one), so prefilling `n_new` tokens after a cached prefix of `n_prefix` costs
`total(n_prefix + n_new) - total(n_prefix)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class SpecLike(Protocol):
    """What `CostModel.from_spec` reads from a `ModelSpec`."""

    @property
    def kv_bytes_per_token(self) -> int: ...

    @property
    def ssm_state_bytes(self) -> int: ...

    def flops_coeffs(self) -> tuple[float, float]: ...


@dataclass(frozen=True)
class CostModel:
    """FLOP and byte model of one hybrid LLM, as seen by the prefix cache.

    Attributes:
        flops_linear: FLOPs per token of a from-scratch prefill (all linear terms).
        flops_quadratic: coefficient of n**2 in the from-scratch prefill FLOPs.
        kv_bytes_per_token: KV bytes of one token over all attention layers.
        state_bytes: bytes of one SSM checkpoint (SSM + conv state, all SSM layers).
    """

    flops_linear: float
    flops_quadratic: float
    kv_bytes_per_token: int
    state_bytes: int

    def __post_init__(self) -> None:
        if self.flops_linear < 0 or self.flops_quadratic < 0:
            raise ValueError(
                f"FLOP coefficients must be >= 0, got ({self.flops_linear}, {self.flops_quadratic})"
            )
        if self.kv_bytes_per_token < 0:
            raise ValueError(f"kv_bytes_per_token must be >= 0, got {self.kv_bytes_per_token}")
        if self.state_bytes <= 0:
            raise ValueError(f"state_bytes must be > 0, got {self.state_bytes}")

    @classmethod
    def from_spec(cls, spec: SpecLike) -> CostModel:
        linear, quadratic = spec.flops_coeffs()
        return cls(linear, quadratic, spec.kv_bytes_per_token, spec.ssm_state_bytes)

    def total_flops(self, n: int) -> float:
        """FLOPs to prefill n tokens from scratch."""
        return self.flops_linear * n + self.flops_quadratic * n * n

    def prefill_flops(self, n_new: int, n_prefix: int = 0) -> float:
        """FLOPs to prefill `n_new` tokens after a cached prefix of `n_prefix` tokens."""
        end = n_prefix + n_new
        return self.flops_linear * n_new + self.flops_quadratic * (end * end - n_prefix * n_prefix)

    def kv_bytes(self, n_tokens: int) -> int:
        return self.kv_bytes_per_token * n_tokens

    def efficiency(self, depth: int, anchor_depth: int, edge_len: int, is_leaf: bool) -> float:
        """FLOPs saved per byte freed by evicting a state-holding node.

        Args:
            depth: tokens from the root to the end of the node.
            anchor_depth: depth of its nearest state-holding ancestor (0 for the root):
                a request that would have hit this node falls back there.
            edge_len: tokens on the node's edge.
            is_leaf: a leaf frees its edge's KV with its state; an inner node's KV is
                merged into its child, so only the state is freed.
        """
        freed = self.state_bytes + (self.kv_bytes_per_token * edge_len if is_leaf else 0)
        return self.prefill_flops(depth - anchor_depth, anchor_depth) / freed
