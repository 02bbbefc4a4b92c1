"""Kernel selection: one place that decides between the pure-torch references and CUDA.

``get_kernels(device, prefer)`` returns a frozen :class:`KernelSet`; callers never import
mamba_ssm or causal_conv1d themselves. The "cuda" builder imports them lazily, so CPU
machines never touch those packages.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .conv import causal_conv1d_ref, causal_conv1d_update_ref
from .selective_scan import selective_scan_ref
from .ssd import ssd_chunk_scan_ref
from .state_update import mamba1_state_update_ref, mamba2_state_update_ref


@dataclass(frozen=True)
class KernelSet:
    """The kernels one engine uses; every field has the signature of its ``_ref`` twin.

    ssd_chunk_scan: see ``ssd_chunk_scan_ref`` (x [b, L, H, P] -> y, state, emitted).
    mamba2_state_update: see ``mamba2_state_update_ref`` (state [b, H, P, N] in place).
    mamba1_state_update: see ``mamba1_state_update_ref`` (state [b, Dm, N] in place).
    causal_conv1d: see ``causal_conv1d_ref`` (x [b, C, L] -> y, state, emitted).
    causal_conv1d_update: see ``causal_conv1d_update_ref`` (state [b, C, K] in place).
    selective_scan: see ``selective_scan_ref`` (u [b, Dm, L] -> y, state, emitted).
    name: registry key of the set ("ref" or "cuda").
    """

    ssd_chunk_scan: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    mamba2_state_update: Callable[..., torch.Tensor]
    mamba1_state_update: Callable[..., torch.Tensor]
    causal_conv1d: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    causal_conv1d_update: Callable[..., torch.Tensor]
    selective_scan: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    name: str


def _build_ref() -> KernelSet:
    """Pure-torch kernels: any device, float32 compute."""
    return KernelSet(
        ssd_chunk_scan=ssd_chunk_scan_ref,
        mamba2_state_update=mamba2_state_update_ref,
        mamba1_state_update=mamba1_state_update_ref,
        causal_conv1d=causal_conv1d_ref,
        causal_conv1d_update=causal_conv1d_update_ref,
        selective_scan=selective_scan_ref,
        name="ref",
    )


@functools.lru_cache(maxsize=1)
def _import_cuda_error() -> str | None:
    """None when mamba_ssm and causal_conv1d import with CUDA present, else the reason."""
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False"
    try:
        from . import cuda_ops  # noqa: F401  (imports mamba_ssm and causal_conv1d)
    except Exception as exc:  # a broken build fails with more than ImportError
        return f"importing mamba_ssm / causal_conv1d failed: {exc!r}"
    return None


def cuda_kernels_available() -> bool:
    """True when the "cuda" kernel set can be built on this machine."""
    return _import_cuda_error() is None


def _build_cuda() -> KernelSet:
    """mamba-ssm / causal-conv1d kernels; the Mamba-1 full scan stays on the reference
    (mamba-ssm's ``selective_scan_fn`` takes no initial state). Raises RuntimeError when
    CUDA or the packages are missing."""
    error = _import_cuda_error()
    if error is not None:
        raise RuntimeError(
            f"kernel set 'cuda' is unavailable ({error}); install the 'gpu' extra "
            "(mamba-ssm, causal-conv1d) on a CUDA machine or use prefer='ref'"
        )
    from . import cuda_ops

    return KernelSet(
        ssd_chunk_scan=cuda_ops.ssd_chunk_scan_cuda,
        mamba2_state_update=cuda_ops.mamba2_state_update_cuda,
        mamba1_state_update=cuda_ops.mamba1_state_update_cuda,
        causal_conv1d=cuda_ops.causal_conv1d_cuda,
        causal_conv1d_update=cuda_ops.causal_conv1d_update_cuda,
        selective_scan=selective_scan_ref,
        name="cuda",
    )


KERNEL_REGISTRY: dict[str, Callable[[], KernelSet]] = {"ref": _build_ref, "cuda": _build_cuda}


def get_kernels(device: torch.device | str = "cpu", prefer: str = "auto") -> KernelSet:
    """Pick the kernel set for ``device``.

    prefer: "auto" (CUDA kernels when the device is CUDA and mamba_ssm + causal_conv1d
    import, else "ref"), or a registry key ("ref", "cuda"). Raises ValueError for an unknown
    ``prefer`` or "cuda" with a non-CUDA device, RuntimeError when "cuda" is requested but
    CUDA or the packages are missing.
    """
    dev = torch.device(device)
    if prefer == "auto":
        prefer = "cuda" if dev.type == "cuda" and cuda_kernels_available() else "ref"
    if prefer not in KERNEL_REGISTRY:
        raise ValueError(
            f"unknown kernel set prefer={prefer!r}; choose 'auto' or one of "
            f"{sorted(KERNEL_REGISTRY)}"
        )
    if prefer == "cuda" and dev.type != "cuda":
        raise ValueError(f"prefer='cuda' needs a CUDA device, got device={str(dev)!r}")
    return KERNEL_REGISTRY[prefer]()
