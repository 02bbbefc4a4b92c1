"""Random inputs and a scaled closeness check shared by the kernel tests."""

from __future__ import annotations

import torch


def assert_close_scaled(actual: torch.Tensor, expected: torch.Tensor, tol: float) -> None:
    """max |actual - expected| <= tol * max(1, max |expected|), after upcasting to float64."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    a, e = actual.double(), expected.double()
    scale = max(1.0, e.abs().max().item()) if e.numel() else 1.0
    err = (a - e).abs().max().item() if e.numel() else 0.0
    assert err <= tol * scale, f"max abs error {err:.3e} > {tol:.1e} * {scale:.3e}"


def ssd_inputs(
    b: int,
    L: int,
    H: int,
    P: int,
    G: int,
    N: int,
    *,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    device: str = "cpu",
) -> dict[str, torch.Tensor]:
    """x [b, L, H, P], dt [b, L, H], A [H], B/C [b, L, G, N], D/dt_bias [H], state [b, H, P, N]."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    out = {
        "x": rnd(b, L, H, P),
        "dt": rnd(b, L, H),
        "A": -torch.exp(rnd(H) * 0.5),
        "B": rnd(b, L, G, N),
        "C": rnd(b, L, G, N),
        "D": rnd(H),
        "dt_bias": rnd(H) * 0.5,
        "state": rnd(b, H, P, N),
    }
    return {k: v.to(device=device, dtype=dtype) for k, v in out.items()}


def mamba1_inputs(
    b: int,
    Dm: int,
    N: int,
    L: int,
    *,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    device: str = "cpu",
) -> dict[str, torch.Tensor]:
    """u/delta/z [b, Dm, L], A [Dm, N], B/C [b, N, L], D/delta_bias [Dm], state [b, Dm, N]."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    out = {
        "u": rnd(b, Dm, L),
        "delta": rnd(b, Dm, L),
        "A": -torch.exp(rnd(Dm, N) * 0.5),
        "B": rnd(b, N, L),
        "C": rnd(b, N, L),
        "D": rnd(Dm),
        "z": rnd(b, Dm, L),
        "delta_bias": rnd(Dm) * 0.5,
        "state": rnd(b, Dm, N),
    }
    return {k: v.to(device=device, dtype=dtype) for k, v in out.items()}


def gated_delta_inputs(
    b: int,
    L: int,
    H: int,
    K: int,
    V: int,
    *,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    decay: float = 0.5,
) -> dict[str, torch.Tensor]:
    """q/k [b, L, H, K], v [b, L, H, V], g [b, L, H] (log-decay <= 0, about -decay * softplus
    of a normal), beta [b, L, H] in (0, 1), state [b, H, K, V] (always float32)."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    out = {
        "q": rnd(b, L, H, K),
        "k": rnd(b, L, H, K),
        "v": rnd(b, L, H, V),
        "g": -torch.nn.functional.softplus(rnd(b, L, H)) * decay,
        "beta": torch.sigmoid(rnd(b, L, H)),
    }
    inputs = {k: v.to(dtype) for k, v in out.items()}
    inputs["state"] = (rnd(b, H, K, V) * 0.5).float()
    return inputs
