"""The numbers a cache needs from a model: FLOPs as a function of length, and state bytes.

A `ModelSpec` knows every layer; the cache only needs four scalars, because the FLOPs to
prefill a full sequence of n tokens from scratch are a quadratic polynomial
`total(n) = linear * n + quadratic * n**2` (attention's score/AV term is the only
quadratic one), plus one `WindowTerm` per sliding window (`c * n * min(n, W)`: a windowed
layer's queries see at most W keys), so prefilling `n_new` tokens after a cached prefix
of `n_prefix` costs `total(n_prefix + n_new) - total(n_prefix)`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

import numpy as np
import numpy.typing as npt

from marconi_ray.core.model.window_term import WindowTerm

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


class SpecLike(Protocol):
    """What `CostModel.from_spec` reads from a `ModelSpec`."""

    @property
    def kv_bytes_per_token(self) -> int: ...

    @property
    def ssm_state_bytes(self) -> int: ...

    def flops_coeffs(self) -> tuple[float, float]: ...

    def window_terms(self) -> tuple[WindowTerm, ...]: ...


@dataclass(frozen=True)
class CostModel:
    """FLOP and byte model of one hybrid LLM, as seen by the prefix cache.

    Attributes:
        flops_linear: FLOPs per token of a from-scratch prefill (all linear terms).
        flops_quadratic: coefficient of n**2 in the from-scratch prefill FLOPs.
        kv_bytes_per_token: KV bytes of one token over all attention layers.
        state_bytes: bytes of one SSM checkpoint (SSM + conv state, all SSM layers).
        windows: the sliding-window attention FLOPs, one term per window (see
            `core.model.window_term`); none for a model without such layers.
    """

    flops_linear: float
    flops_quadratic: float
    kv_bytes_per_token: int
    state_bytes: int
    windows: tuple[WindowTerm, ...] = ()

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
        return cls(
            linear, quadratic, spec.kv_bytes_per_token, spec.ssm_state_bytes, spec.window_terms()
        )

    def total_flops(self, n: int) -> float:
        """FLOPs to prefill n tokens from scratch."""
        out = self.flops_linear * n + self.flops_quadratic * n * n
        for t in self.windows:
            out = out + t.coefficient * t.pairs(n)
        return out

    def prefill_flops(self, n_new: int, n_prefix: int = 0) -> float:
        """FLOPs to prefill `n_new` tokens after a cached prefix of `n_prefix` tokens."""
        end = n_prefix + n_new
        out = self.flops_linear * n_new + self.flops_quadratic * (end * end - n_prefix * n_prefix)
        for t in self.windows:
            out = out + t.coefficient * (t.pairs(end) - t.pairs(n_prefix))
        return out

    def kv_bytes(self, n_tokens: int) -> int:
        return self.kv_bytes_per_token * n_tokens

    def efficiency(
        self,
        depth: int,
        anchor_depth: int,
        edge_len: int,
        is_leaf: bool,
        formula: str = "freed",
    ) -> float:
        """FLOPs saved per byte held by a state-holding node, by `formula` (the scalar
        reference of `EFFICIENCY_FORMULAS`, which the eviction policy evaluates vectorised).

        Args:
            depth: tokens from the root to the end of the node.
            anchor_depth: depth of its nearest state-holding ancestor (0 for the root):
                a request that would have hit this node falls back there.
            edge_len: tokens on the node's edge.
            is_leaf: a leaf frees its edge's KV with its state; an inner node's KV is
                merged into its child, so only the state is freed.
            formula: a name from `EFFICIENCY_FORMULAS`:
                `freed`: prefill_flops(depth - anchor, anchor) / (state + KV of the edge if
                    a leaf, else state): FLOPs lost per byte eviction frees (default).
                `paper`: total_flops(depth) / (state + KV of all `depth` tokens): the
                    node's whole prefix per byte of everything it holds (Marconi's text).
                `artifact`: prefill_flops(edge_len, depth - edge_len) / (state + KV of all
                    `depth` tokens): the edge given its parent, per byte of the path (the
                    authors' simulator, without its MLP-FLOP bug).
                `uniform`: prefill_flops(depth - anchor, anchor) / (state + KV of the
                    edge), leaves and inner nodes alike.
        """
        validate_efficiency(formula)
        if formula == "paper":
            return self.total_flops(depth) / (self.state_bytes + self.kv_bytes(depth))
        if formula == "artifact":
            return self.prefill_flops(edge_len, depth - edge_len) / (
                self.state_bytes + self.kv_bytes(depth)
            )
        if formula == "uniform":
            return self.prefill_flops(depth - anchor_depth, anchor_depth) / (
                self.state_bytes + self.kv_bytes(edge_len)
            )
        freed = self.state_bytes + (self.kv_bytes_per_token * edge_len if is_leaf else 0)
        return self.prefill_flops(depth - anchor_depth, anchor_depth) / freed

    def efficiencies(
        self,
        depth: IntArray,
        anchor_depth: IntArray,
        edge_len: IntArray,
        is_leaf: npt.NDArray[np.bool_],
        formula: str = "freed",
    ) -> FloatArray:
        """`efficiency` of many nodes at once (int64 / bool arrays of one length); equal,
        element by element and bit for bit, to the scalar reference."""
        fn = EFFICIENCY_FORMULAS[validate_efficiency(formula)]
        return fn(self, depth, anchor_depth, edge_len, is_leaf)


# Vectorised formulas: the same floating-point operations in the same order as the
# scalar reference (`CostModel.efficiency`), so values match it bit for bit. Integer parts
# are exact in any order (int64, as Python's ints are below 3e9 tokens), so they take the
# fewest numpy calls: `end**2 - n_prefix**2 == n_new * (end + n_prefix)`.
def _prefill(cost: CostModel, n_new: IntArray, n_prefix: IntArray, end: IntArray) -> FloatArray:
    """`CostModel.prefill_flops(n_new, n_prefix)`, given `end == n_prefix + n_new`."""
    out: FloatArray = cost.flops_linear * n_new + cost.flops_quadratic * (n_new * (end + n_prefix))
    for t in cost.windows:
        out = out + t.coefficient * (t.pairs_array(end) - t.pairs_array(n_prefix))
    return out


def _eff_freed(
    cost: CostModel,
    depth: IntArray,
    anchor: IntArray,
    edge_len: IntArray,
    leaf: npt.NDArray[np.bool_],
) -> FloatArray:
    freed = cost.state_bytes + cost.kv_bytes_per_token * (edge_len * leaf)
    out: FloatArray = _prefill(cost, depth - anchor, anchor, depth) / freed
    return out


def _eff_paper(
    cost: CostModel,
    depth: IntArray,
    anchor: IntArray,
    edge_len: IntArray,
    leaf: npt.NDArray[np.bool_],
) -> FloatArray:
    flops = cost.flops_linear * depth + cost.flops_quadratic * depth * depth
    for t in cost.windows:
        flops = flops + t.coefficient * t.pairs_array(depth)
    out: FloatArray = flops / (cost.state_bytes + cost.kv_bytes_per_token * depth)
    return out


def _eff_artifact(
    cost: CostModel,
    depth: IntArray,
    anchor: IntArray,
    edge_len: IntArray,
    leaf: npt.NDArray[np.bool_],
) -> FloatArray:
    out: FloatArray = _prefill(cost, edge_len, depth - edge_len, depth) / (
        cost.state_bytes + cost.kv_bytes_per_token * depth
    )
    return out


def _eff_uniform(
    cost: CostModel,
    depth: IntArray,
    anchor: IntArray,
    edge_len: IntArray,
    leaf: npt.NDArray[np.bool_],
) -> FloatArray:
    out: FloatArray = _prefill(cost, depth - anchor, anchor, depth) / (
        cost.state_bytes + cost.kv_bytes_per_token * edge_len
    )
    return out


EfficiencyFormula = Callable[
    [CostModel, IntArray, IntArray, IntArray, npt.NDArray[np.bool_]], FloatArray
]

EFFICIENCY_FORMULAS: Mapping[str, EfficiencyFormula] = MappingProxyType(
    {
        "freed": _eff_freed,
        "paper": _eff_paper,
        "artifact": _eff_artifact,
        "uniform": _eff_uniform,
    }
)
"""FLOP-efficiency formulas of FLOP-aware eviction by name (see `CostModel.efficiency`)."""

DEFAULT_EFFICIENCY = "freed"


def validate_efficiency(formula: str) -> str:
    """`formula` if it names an `EFFICIENCY_FORMULAS` entry; else ValueError naming it."""
    if formula not in EFFICIENCY_FORMULAS:
        raise ValueError(
            f"unknown efficiency formula {formula!r}; choose from {sorted(EFFICIENCY_FORMULAS)}"
        )
    return formula
