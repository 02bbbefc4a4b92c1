"""mamba-ssm's Triton kernels (>= 2.2) behind the signatures of our ``_ref`` twins.

Used for the Mamba-2 chunked scan (``mamba_chunk_scan_combined``) and both single-step
state updates (``selective_state_update``). dt/delta bias, softplus and clamp are applied
here in float32 (:func:`process_dt`) and the processed values are handed to the kernels with
their own dt handling off, so both implementations agree on dt semantics
(``selective_state_update`` has no dt_limit). ``dt_bias`` and ``D`` are always passed as
tensors (zeros when absent): mamba-ssm computes their strides unconditionally, so a None
crashes the launch (``TypeError: Value after * must be an iterable``).

Modules are imported by :func:`load`, through :mod:`mamba_ssm_import` (no compiled CUDA
extension needed); under the interpreter their autotuners are pinned to one config.
"""

from __future__ import annotations

import itertools
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ._util import check_emit_at, process_dt
from .mamba_ssm_import import import_mamba_triton
from .triton_runtime import prepare_interpreter

_INF = float("inf")


@dataclass(frozen=True)
class MambaSsmKernels:
    """The mamba-ssm entry points, bound once: ``chunk_scan`` is
    ``mamba_chunk_scan_combined``, ``state_update`` is ``selective_state_update``."""

    chunk_scan: Callable[..., Any]
    state_update: Callable[..., Any]

    # ------------------------------------------------------------------ Mamba-2 scan
    def ssd_chunk_scan(
        self,
        x: torch.Tensor,
        dt: torch.Tensor,
        A: torch.Tensor,
        B: torch.Tensor,
        C: torch.Tensor,
        *,
        chunk_size: int,
        D: torch.Tensor | None = None,
        dt_bias: torch.Tensor | None = None,
        dt_softplus: bool = True,
        dt_limit: tuple[float, float] = (0.0, _INF),
        initial_state: torch.Tensor | None = None,
        emit_at: Sequence[int] = (),
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Signature of ``ssd_chunk_scan_ref``.

        x [b, L, H, P]; dt [b, L, H] raw; A [H]; B, C [b, L, G, N]; D [H] or None;
        initial_state [b, H, P, N] float32 or None. Emitted states come from one kernel
        call per segment between emit positions, chaining final -> initial states (exact,
        float32; Marconi plans at most a few per request). Returns (y [b, L, H, P] in
        x.dtype, final_state [b, H, P, N] float32, emitted [len(emit_at), b, H, P, N]).
        """
        b, L, H, P = x.shape
        N = B.shape[-1]
        positions = check_emit_at(emit_at, L)
        state = None if initial_state is None else initial_state.float().contiguous()
        if L == 0:
            final = state if state is not None else x.new_zeros(b, H, P, N, dtype=torch.float32)
            return x.clone(), final, final.new_empty((0, b, H, P, N))
        dtp = process_dt(dt, dt_bias, dt_softplus, dt_limit, torch.float32)
        Af = A.float().contiguous()
        Df = (torch.zeros(H, device=x.device) if D is None else D.float()).contiguous()
        counts = Counter(positions)
        ys: list[torch.Tensor] = []
        emitted: list[torch.Tensor] = []
        for s, e in itertools.pairwise(sorted({0, L, *positions})):
            y_seg, state = self.chunk_scan(
                x[:, s:e].contiguous(),
                dtp[:, s:e].contiguous(),
                Af,
                B[:, s:e].contiguous(),
                C[:, s:e].contiguous(),
                chunk_size,
                D=Df,
                initial_states=state,
                dt_softplus=False,
                return_final_states=True,
            )
            state = state.float()
            ys.append(y_seg)
            emitted.extend(state.clone() for _ in range(counts.get(e, 0)))
        assert state is not None
        y = (ys[0] if len(ys) == 1 else torch.cat(ys, dim=1)).to(x.dtype)
        emitted_t = torch.stack(emitted) if emitted else state.new_empty((0, b, H, P, N))
        return y, state, emitted_t

    # ------------------------------------------------------------------ decode steps
    def mamba2_state_update(
        self,
        state: torch.Tensor,
        x: torch.Tensor,
        dt: torch.Tensor,
        A: torch.Tensor,
        B: torch.Tensor,
        C: torch.Tensor,
        *,
        D: torch.Tensor | None = None,
        dt_bias: torch.Tensor | None = None,
        dt_softplus: bool = True,
        dt_limit: tuple[float, float] = (0.0, _INF),
    ) -> torch.Tensor:
        """Signature of ``mamba2_state_update_ref``: state [b, H, P, N] float32 (in place);
        x [b, H, P]; dt [b, H] raw; A [H]; B, C [b, G, N]; D [H] or None. Per-head
        parameters are expanded with stride 0 over P (the kernel's tied-head-dim path).
        Returns y [b, H, P] in x.dtype."""
        b, H, P, N = state.shape
        dtp = process_dt(dt, dt_bias, dt_softplus, dt_limit, torch.float32)
        zeros = torch.zeros((), device=x.device, dtype=torch.float32)
        y: torch.Tensor = self.state_update(
            state,
            x,
            dtp.unsqueeze(-1).expand(b, H, P),
            A.float()[:, None, None].expand(H, P, N),
            B,
            C,
            D=(zeros.expand(H) if D is None else D.float())[:, None].expand(H, P),
            z=None,
            dt_bias=zeros.expand(H, P),
            dt_softplus=False,
        )
        return y.to(x.dtype)

    def mamba1_state_update(
        self,
        state: torch.Tensor,
        u: torch.Tensor,
        delta: torch.Tensor,
        A: torch.Tensor,
        B: torch.Tensor,
        C: torch.Tensor,
        *,
        D: torch.Tensor | None = None,
        z: torch.Tensor | None = None,
        delta_bias: torch.Tensor | None = None,
        delta_softplus: bool = True,
    ) -> torch.Tensor:
        """Signature of ``mamba1_state_update_ref``: state [b, Dm, N] float32 (in place);
        u, delta [b, Dm] (delta raw); A [Dm, N]; B, C [b, N]; D [Dm]; z [b, Dm];
        delta_bias [Dm]. Returns y [b, Dm] in u.dtype."""
        Dm = state.shape[1]
        d = process_dt(delta, delta_bias, delta_softplus, dtype=torch.float32)
        zeros = torch.zeros(Dm, device=u.device, dtype=torch.float32)
        y: torch.Tensor = self.state_update(
            state,
            u,
            d,
            A.float(),
            B,
            C,
            D=zeros if D is None else D.float(),
            z=z,
            dt_bias=zeros,
            dt_softplus=False,
        )
        return y.to(u.dtype)


def load() -> MambaSsmKernels:
    """Import mamba-ssm's Triton kernels (ImportError with the reason when they cannot be)."""
    ssd, ssu = import_mamba_triton()
    prepare_interpreter(*_autotuned_modules())
    return MambaSsmKernels(
        chunk_scan=ssd.mamba_chunk_scan_combined, state_update=ssu.selective_state_update
    )


def _autotuned_modules() -> list[Any]:
    """The mamba-ssm modules that define ``triton.autotune`` kernels we launch."""
    names = (
        "ssd_bmm",
        "ssd_chunk_state",
        "ssd_state_passing",
        "ssd_chunk_scan",
        "selective_state_update",
    )
    return [
        sys.modules[f"mamba_ssm.ops.triton.{n}"]
        for n in names
        if f"mamba_ssm.ops.triton.{n}" in sys.modules
    ]
