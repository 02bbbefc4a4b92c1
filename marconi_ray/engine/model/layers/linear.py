"""Column- and row-parallel linear layers."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from marconi_ray.engine.model.layers.weights import WeightSpec
from marconi_ray.engine.model.parallel import Segment, TPGroup, local_size


def column_major(w: torch.Tensor) -> torch.Tensor:
    """`w` [out, in] with the same values stored column-major (its transpose contiguous)."""
    return w.t().contiguous().t()


class ParallelLinear(nn.Module):
    """`y = x @ W.T + b` on this rank's shard.

    Column-parallel (`row_parallel=False`): W's output rows are split by `segments`; the
    output is this rank's slice, no communication. Row-parallel: W's input columns are
    split; the partial products are all-reduced and the (replicated) bias added once;
    with `reduce=False` the caller all-reduces the partial products itself (to sum
    several row-parallel outputs with one all-reduce); rank 0 then adds the bias to its
    partial product, so the sum has it once.
    Replicated: `segments` all have `split=False`.

    Multipliers (muP models): the layer computes `(W (in_scale * x) + b) * out_scale`,
    `out_scales` giving one multiplier per output segment (a row-parallel layer has one
    output segment). They are folded into W and b at load (see `weight_specs`): the same
    function up to float rounding, free at run time; the forward is the plain `x @ W.T + b`.

    Shapes: x [..., in_local] -> y [..., out_local].
    """

    def __init__(
        self,
        in_segments: Sequence[Segment],
        out_segments: Sequence[Segment],
        bias: bool,
        key: str,
        tp: TPGroup,
        dtype: torch.dtype,
        row_parallel: bool = False,
        reduce: bool = True,
        in_scale: float = 1.0,
        out_scales: Sequence[float] = (),
    ) -> None:
        super().__init__()
        if not reduce and not row_parallel:
            raise ValueError(f"{key}: reduce=False is for a row-parallel layer")
        if out_scales and len(out_scales) != len(out_segments):
            raise ValueError(
                f"{key}: {len(out_scales)} output multipliers for {len(out_segments)} segments"
            )
        self.in_scale = in_scale
        self.out_scales = tuple(out_scales) or (1.0,) * len(out_segments)
        self.reduce = reduce
        self.tp = tp
        self.key = key
        self.row_parallel = row_parallel
        self.in_segments = tuple(in_segments)
        self.out_segments = tuple(out_segments)
        n_in, n_out = local_size(in_segments, tp), local_size(out_segments, tp)
        self.weight = nn.Parameter(torch.empty(n_out, n_in, dtype=dtype), requires_grad=False)
        self.bias = (
            nn.Parameter(torch.zeros(n_out, dtype=dtype), requires_grad=False) if bias else None
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = super().__call__(x)
        return out

    def use_column_major(self) -> None:
        """Store W column-major (the same values, W.T contiguous). On CPU, `x @ W.T` is
        then one GEMM over a contiguous [in, out] operand, which the BLAS blocks well for
        a few rows: 5 rows (a verified speculative step, a small batch) cost about what
        1 row does, against twice as much row-major; 1 row and long prefills cost the
        same either way."""
        self.weight.data = column_major(self.weight.data)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.row_parallel:
            return F.linear(x, self.weight, self.bias)
        y = F.linear(x, self.weight)
        if not self.reduce:
            return y if self.bias is None or self.tp.rank else y + self.bias
        y = self.tp.all_reduce(y)
        return y if self.bias is None else y + self.bias

    def _scales(self, of_weight: bool) -> tuple[float, ...]:
        """`WeightSpec.scales` of the weight (in_scale * out_scale per output segment) or
        of the bias (out_scale): () when all are 1, one value when all are equal."""
        values = tuple(s * self.in_scale if of_weight else s for s in self.out_scales)
        if all(v == 1.0 for v in values):
            return ()
        return values[:1] if len(set(values)) == 1 else values

    def weight_specs(self) -> dict[str, WeightSpec]:
        w, b = self._scales(True), self._scales(False)
        if self.row_parallel:
            specs = {"weight": WeightSpec(f"{self.key}.weight", 1, self.in_segments, scales=w)}
            if self.bias is not None:
                specs["bias"] = WeightSpec(f"{self.key}.bias", scales=b)
            return specs
        specs = {"weight": WeightSpec(f"{self.key}.weight", 0, self.out_segments, scales=w)}
        if self.bias is not None:
            specs["bias"] = WeightSpec(f"{self.key}.bias", 0, self.out_segments, scales=b)
        return specs


def column(
    d_in: int,
    outs: Sequence[Segment],
    bias: bool,
    key: str,
    tp: TPGroup,
    dtype: torch.dtype,
    in_scale: float = 1.0,
    out_scales: Sequence[float] = (),
) -> ParallelLinear:
    """A column-parallel projection from the full hidden size (multipliers: see
    `ParallelLinear`)."""
    return ParallelLinear(
        (Segment(d_in, False),),
        outs,
        bias,
        key,
        tp,
        dtype,
        in_scale=in_scale,
        out_scales=out_scales,
    )


def row(
    ins: Sequence[Segment],
    d_out: int,
    bias: bool,
    key: str,
    tp: TPGroup,
    dtype: torch.dtype,
    reduce: bool = True,
    out_scale: float = 1.0,
) -> ParallelLinear:
    """A row-parallel projection back to the full hidden size (all-reduced unless
    `reduce=False`; its output, bias included, times `out_scale`: see `ParallelLinear`)."""
    return ParallelLinear(
        ins,
        (Segment(d_out, False),),
        bias,
        key,
        tp,
        dtype,
        row_parallel=True,
        reduce=reduce,
        out_scales=(out_scale,),
    )
