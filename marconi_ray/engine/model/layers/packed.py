"""Several sequences' prefills through one SSM mixer call: their tokens packed one sequence
after another (rows [T, D]), as `HybridModel.prefill_many` runs them.

A mixer's row-wise work (projections, gates, norms, out_proj) runs once over all T rows;
what carries state along a sequence (the causal conv, the scan) runs as one varlen kernel
call for all the sequences, each from its own states, emitting at its own depths (one
sequence keeps the one-sequence kernels). `PackedPart` is one sequence's share;
`PartStates` what the mixer hands back for it; `packed_conv`, `cu_seqlens`,
`stacked_states` and `split_states` are the steps every mixer shares.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from marconi_kernels import KernelSet

Pair = tuple[torch.Tensor, torch.Tensor]
"""(final state, states emitted at the part's depths) of one part."""


@dataclass(frozen=True)
class PackedPart:
    """One sequence's rows [start, stop) of a packed prefill, with its states before them
    (None: zeros) and the positions p in 1..stop - start (relative, sorted) to emit."""

    start: int
    stop: int
    conv: torch.Tensor | None = None
    ssm: torch.Tensor | None = None
    emit_at: tuple[int, ...] = ()

    @property
    def length(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class PartStates:
    """A part's states after its rows (conv [C, K], ssm: the mixer's shape) and at its
    emit depths (stacked: [len(emit_at), ...])."""

    conv: torch.Tensor
    ssm: torch.Tensor
    conv_emitted: torch.Tensor
    ssm_emitted: torch.Tensor


def packed_conv(
    kernels: KernelSet,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    parts: Sequence[PackedPart],
    activation: str | None,
) -> tuple[torch.Tensor, list[Pair]]:
    """The causal conv of every part from its own conv state: x [T, C] packed, weight
    [C, K]; returns y [T, C] and per part (final state [C, K], emitted [E, C, K]).

    One part runs `causal_conv1d`; several, one `causal_conv1d_varlen` call for all of
    them (a part without a state starts from zeros)."""
    if len(parts) == 1:
        (p,) = parts
        y, final, emitted = kernels.causal_conv1d(
            x.t()[None],
            weight,
            bias,
            initial_state=None if p.conv is None else p.conv[None],
            activation=activation,
            emit_at=p.emit_at,
        )
        return y[0].t(), [(final[0], emitted[:, 0])]
    y, finals, emitted = kernels.causal_conv1d_varlen(
        x.t(),
        weight,
        bias,
        cu_seqlens=cu_seqlens(parts),
        initial_states=stacked_states([p.conv for p in parts], lambda: x.new_zeros(weight.shape)),
        activation=activation,
        emit_at=[p.emit_at for p in parts],
    )
    return y.t(), split_states(parts, finals, emitted)


def cu_seqlens(parts: Sequence[PackedPart]) -> list[int]:
    """The parts' row offsets, [0, stop_0, stop_1, ...] (a varlen kernel's cu_seqlens)."""
    return [parts[0].start, *(p.stop for p in parts)]


def stacked_states(
    states: Sequence[torch.Tensor | None], empty: Callable[[], torch.Tensor]
) -> torch.Tensor | None:
    """The parts' states stacked [S, ...] for a varlen kernel (in the first one's dtype),
    `empty()` (the zero state, made only when needed) for a part that has none; None when
    no part has one (the kernel then starts every part from zeros)."""
    present = [s for s in states if s is not None]
    if not present:
        return None
    dtype = present[0].dtype
    if len(present) == len(states):
        return torch.stack([s.to(dtype) for s in present])
    zero = empty().to(dtype)
    return torch.stack([zero if s is None else s.to(dtype) for s in states])


def split_states(
    parts: Sequence[PackedPart], finals: torch.Tensor, emitted: torch.Tensor
) -> list[Pair]:
    """A varlen kernel's final states [S, ...] and emitted ones [E, ...] (part by part,
    in emit order) as each part's (final, emitted [len(emit_at), ...])."""
    out: list[Pair] = []
    e = 0
    for k, p in enumerate(parts):
        out.append((finals[k], emitted[e : e + len(p.emit_at)]))
        e += len(p.emit_at)
    return out


def delta_rule_parts(
    one: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    many: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    qkvgb: tuple[torch.Tensor, ...],
    parts: Sequence[PackedPart],
    chunk_size: Callable[[int], int],
    empty_state: Callable[[], torch.Tensor],
) -> tuple[torch.Tensor, list[Pair]]:
    """A delta-rule scan (Gated DeltaNet, KDA) over packed parts: `one` (the kernel set's
    `*_chunk`) for a single part, else `many` (`*_chunk_varlen`), each part from its own
    state (`empty_state()` for none), q and k L2-normalised in the kernel.

    Args:
        qkvgb: (q, k [T, H, K], v [T, H, V], g [T, H] or [T, H, K], beta [T, H]).
        chunk_size: the chunk length for a prefill of the given number of tokens.
    Returns: o [T, H, V] and per part (final state, emitted states [len(emit_at), ...]).
    """
    if len(parts) == 1:
        (p,) = parts
        o, final, emitted = one(
            *(t[None] for t in qkvgb), chunk_size=chunk_size(p.length),
            initial_state=None if p.ssm is None else p.ssm[None],
            emit_at=p.emit_at, use_qk_l2norm=True,
        )  # fmt: skip
        return o[0], [(final[0], emitted[:, 0])]
    o, finals, emitted = many(
        *qkvgb, cu_seqlens=cu_seqlens(parts),
        chunk_size=chunk_size(max(p.length for p in parts)),
        initial_states=stacked_states([p.ssm for p in parts], empty_state),
        emit_at=[p.emit_at for p in parts], use_qk_l2norm=True,
    )  # fmt: skip
    return o, split_states(parts, finals, emitted)


class PackedMixer:
    """`prefill` of one sequence as a packed prefill of one part, for mixers that define
    `prefill_packed(x [T, D], parts) -> (y [T, D], [PartStates per part])`."""

    def prefill_packed(
        self, x: torch.Tensor, parts: Sequence[PackedPart]
    ) -> tuple[torch.Tensor, list[PartStates]]:
        raise NotImplementedError

    def prefill(
        self,
        x: torch.Tensor,
        conv: torch.Tensor | None,
        ssm: torch.Tensor | None,
        emit_at: Sequence[int] = (),
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run L new tokens from the given states.

        Args:
            x: [L, d_model]. conv, ssm: the states before these tokens, or None (zeros).
            emit_at: positions p in 1..L (relative) whose states to return.
        Returns:
            y [L, d_model], final conv [C, K], final ssm (the mixer's shape),
            emitted conv [len(emit_at), C, K], emitted ssm [len(emit_at), ...].
        """
        y, (out,) = self.prefill_packed(x, [PackedPart(0, x.shape[0], conv, ssm, tuple(emit_at))])
        return y, out.conv, out.ssm, out.conv_emitted, out.ssm_emitted


def part_states(convs: Sequence[Pair], ssms: Sequence[Pair]) -> list[PartStates]:
    """Each part's `PartStates` from its conv and ssm (final, emitted) pairs."""
    return [PartStates(c[0], s[0], c[1], s[1]) for c, s in zip(convs, ssms, strict=True)]
