"""Single-token SSM state updates used by decode (batched over requests).

Both update ``state`` in place and return the token's output. Computation is float32
(float64 when the state or inputs are float64); the state keeps its own dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._util import compute_dtype, process_dt

_INF = float("inf")


def mamba2_state_update_ref(
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
    """One Mamba-2 recurrence step: ``h = exp(dt*A) h + dt x B^T``; ``y = h C + D x``.

    Args:
        state: [b, H, P, N] float32, updated in place.
        x: [b, H, P]; dt: [b, H] raw (bias, softplus, clamp to dt_limit applied here).
        A: [H] negative; B, C: [b, G, N] with H % G == 0 (head h uses group h // (H // G)).
        D: [H] or None; dt_bias: [H] or None.

    Returns:
        y: [b, H, P] in x.dtype.
    """
    b, H, P, N = state.shape
    G = B.shape[1]
    if x.shape != (b, H, P) or dt.shape != (b, H) or B.shape != (b, G, N) or H % G:
        raise ValueError(
            f"bad shapes: state {tuple(state.shape)}, x {tuple(x.shape)}, "
            f"dt {tuple(dt.shape)}, B {tuple(B.shape)}"
        )
    if C.shape != B.shape:
        raise ValueError(f"C must match B {tuple(B.shape)}, got {tuple(C.shape)}")
    cdt = compute_dtype(state, x, dt, A, B, C)
    dtp = process_dt(dt, dt_bias, dt_softplus, dt_limit, cdt)  # [b, H]
    Bh = B.to(cdt).repeat_interleave(H // G, dim=1)  # [b, H, N]
    Ch = C.to(cdt).repeat_interleave(H // G, dim=1)
    xf = x.to(cdt)
    decay = torch.exp(dtp * A.to(cdt)).view(b * H, 1, 1)
    if state.dtype == cdt and state.is_contiguous():
        new = state.view(b * H, P, N)  # in place: two passes over the state, no temporary
    else:
        new = state.to(cdt).reshape(b * H, P, N)
    new.mul_(decay).baddbmm_((dtp.unsqueeze(-1) * xf).view(b * H, P, 1), Bh.view(b * H, 1, N))
    if new.data_ptr() != state.data_ptr():
        state.copy_(new.view(b, H, P, N))
    y = torch.bmm(Ch.reshape(b * H, 1, N), new.transpose(1, 2)).view(b, H, P)  # h C
    if D is not None:
        y = y + D.to(cdt).view(H, 1) * xf
    return y.to(x.dtype)


def mamba1_state_update_ref(
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
    """One Mamba-1 selective-scan step: ``h = exp(delta*A) h + delta u B``; ``y = h.C + D u``.

    Args:
        state: [b, Dm, N] float32, updated in place.
        u, delta: [b, Dm]; delta raw (delta_bias added and softplus applied here).
        A: [Dm, N] negative; B, C: [b, N]; D: [Dm] or None.
        z: [b, Dm] gate (``y *= silu(z)``) or None; delta_bias: [Dm] or None.

    Returns:
        y: [b, Dm] in u.dtype.
    """
    b, Dm, N = state.shape
    if u.shape != (b, Dm) or delta.shape != (b, Dm) or A.shape != (Dm, N):
        raise ValueError(
            f"bad shapes: state {tuple(state.shape)}, u {tuple(u.shape)}, "
            f"delta {tuple(delta.shape)}, A {tuple(A.shape)}"
        )
    if B.shape != (b, N) or C.shape != (b, N):
        raise ValueError(f"B, C must be {(b, N)}, got {tuple(B.shape)}, {tuple(C.shape)}")
    cdt = compute_dtype(state, u, delta, A, B, C)
    d = process_dt(delta, delta_bias, delta_softplus, dtype=cdt)  # [b, Dm]
    uf = u.to(cdt)
    decay = torch.exp(d.unsqueeze(-1) * A.to(cdt))  # [b, Dm, N]
    in_place = state.dtype == cdt and state.is_contiguous()
    new = state if in_place else state.to(cdt).contiguous()  # in place: no temporaries
    new.mul_(decay).baddbmm_((d * uf).unsqueeze(-1), B.to(cdt).unsqueeze(1))
    if not in_place:
        state.copy_(new)
    y = (new @ C.to(cdt).unsqueeze(-1)).squeeze(-1)  # [b, Dm]
    if D is not None:
        y = y + D.to(cdt) * uf
    if z is not None:
        y = y * F.silu(z.to(cdt))
    return y.to(u.dtype)
