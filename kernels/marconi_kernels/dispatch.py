"""Kernel selection: one place that decides between the pure-torch references and Triton.

``get_kernels(device, prefer)`` returns a frozen :class:`KernelSet`; callers never import
mamba_ssm or triton themselves. The "triton" set combines mamba-ssm's Triton kernels (the
Mamba-2 chunked scan and the single-step state updates) with our own (the causal conv1d
and its step, the Mamba-1 selective scan, the gated delta rule's and KDA's prefill and step, and
the varlen forms of the conv and every scan that several requests' prefills share). It runs
on CUDA tensors, and on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``),
which is how CI tests it.

A set never falls back silently: each op's implementation is named in
``KernelSet.backends`` and a requested "triton" set that cannot be built raises with the
reason. Only ``prefer="auto"`` chooses, and it logs why it did not pick triton.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from .choices import KERNEL_CHOICES
from .conv import causal_conv1d_ref, causal_conv1d_update_ref, causal_conv1d_varlen_ref
from .gated_delta import (
    gated_delta_chunk_ref,
    gated_delta_chunk_varlen_ref,
    gated_delta_step_ref,
)
from .grouped_matmul import grouped_matmul_ref
from .kda import kda_chunk_ref, kda_chunk_varlen_ref, kda_step_ref
from .lightning import lightning_chunk_ref, lightning_chunk_varlen_ref, lightning_step_ref
from .mlstm import mlstm_chunk_ref, mlstm_chunk_varlen_ref, mlstm_step_ref
from .paged_attention import paged_decode_attention_ref
from .paged_prefill import paged_prefill_attention_ref
from .rglru import rglru_scan_ref, rglru_scan_varlen_ref, rglru_step_ref
from .selective_scan import selective_scan_ref, selective_scan_varlen_ref
from .ssd import ssd_chunk_scan_ref, ssd_chunk_scan_varlen_ref
from .state_update import mamba1_state_update_ref, mamba2_state_update_ref
from .triton_runtime import can_launch_on

log = logging.getLogger(__name__)

OPS = (
    "ssd_chunk_scan",
    "ssd_chunk_scan_varlen",
    "mamba2_state_update",
    "mamba1_state_update",
    "causal_conv1d",
    "causal_conv1d_update",
    "causal_conv1d_varlen",
    "selective_scan",
    "selective_scan_varlen",
    "gated_delta_chunk",
    "gated_delta_chunk_varlen",
    "gated_delta_step",
    "paged_decode_attention",
    "paged_prefill_attention",
    "grouped_matmul",
    "rglru_scan",
    "rglru_scan_varlen",
    "rglru_step",
    "kda_chunk",
    "kda_chunk_varlen",
    "kda_step",
    "lightning_chunk",
    "lightning_chunk_varlen",
    "lightning_step",
    "mlstm_chunk",
    "mlstm_chunk_varlen",
    "mlstm_step",
)


class KernelUnavailable(RuntimeError):
    """The requested kernel set cannot run here; the message says why and what to do."""


@dataclass(frozen=True)
class KernelSet:
    """The kernels one engine uses; every op has the signature of its ``_ref`` twin.

    ssd_chunk_scan: see ``ssd_chunk_scan_ref`` (x [b, L, H, P] -> y, state, emitted).
    ssd_chunk_scan_varlen: see ``ssd_chunk_scan_varlen_ref`` (S sequences packed in x
        [T, H, P], each from its own state -> y, states [S, H, P, N], emitted).
    mamba2_state_update: see ``mamba2_state_update_ref`` (state [b, H, P, N] in place).
    mamba1_state_update: see ``mamba1_state_update_ref`` (state [b, Dm, N] in place).
    causal_conv1d: see ``causal_conv1d_ref`` (x [b, C, L] -> y, state, emitted).
    causal_conv1d_update: see ``causal_conv1d_update_ref`` (state [b, C, K] in place).
    causal_conv1d_varlen: see ``causal_conv1d_varlen_ref`` (S sequences packed in x
        [C, T] -> y, states [S, C, K], emitted).
    selective_scan: see ``selective_scan_ref`` (u [b, Dm, L] -> y, state, emitted).
    selective_scan_varlen: see ``selective_scan_varlen_ref`` (S sequences packed in u
        [Dm, T], each from its own state -> y, states [S, Dm, N], emitted).
    gated_delta_chunk: see ``gated_delta_chunk_ref`` (q, k [b, L, H, K], v [b, L, H, V]
        -> o, state [b, H, K, V], emitted).
    gated_delta_chunk_varlen: see ``gated_delta_chunk_varlen_ref`` (S sequences packed
        in q, k [T, H, K], each from its own state -> o, states [S, H, K, V], emitted).
    gated_delta_step: see ``gated_delta_step_ref`` (state [b, H, K, V] in place).
    paged_decode_attention: see ``paged_decode_attention_ref`` (q [B, H, hd] over pool
        rows [KV, R, hd] through a row table [B, W] -> [B, H, hd]; optional sliding
        ``window``).
    paged_prefill_attention: see ``paged_prefill_attention_ref`` (packed queries
        [T, H, hd] of S sequences, causal over each one's pool rows -> [T, H, hd];
        optional sliding ``window``).
    grouped_matmul: see ``grouped_matmul_ref`` (x [M, K] each row times its expert's
        w [E, N, K] -> [M, N]; the MoE dispatch, no host sync in the triton set).
    rglru_scan: see ``rglru_scan_ref`` (x, a, b [B, D, L] -> y, state [B, D], emitted).
    rglru_scan_varlen: see ``rglru_scan_varlen_ref`` (S sequences packed in x [D, T],
        each from its own state -> y, states [S, D], emitted).
    rglru_step: see ``rglru_step_ref`` (state [B, D] in place).
    kda_chunk, kda_chunk_varlen, kda_step: see ``kda_chunk_ref`` and its twins (KDA, the
        gated delta rule with a per-channel decay g [..., H, K]; shapes as gated_delta).
    lightning_chunk: see ``lightning_chunk_ref`` (MiniMax lightning attention: q, k
        [b, L, H, K], v [b, L, H, V], slope [H] -> o, state [b, H, K, V], emitted).
    lightning_chunk_varlen: see ``lightning_chunk_varlen_ref`` (S sequences packed in
        q, k [T, H, K], each from its own state -> o, states [S, H, K, V], emitted).
    lightning_step: see ``lightning_step_ref`` (state [b, H, K, V] in place).
    mlstm_chunk, mlstm_chunk_varlen, mlstm_step: see ``mlstm_chunk_ref`` and its twins
        (xLSTM's mLSTM cell: q, k [b, L, H, K], v [b, L, H, V], gate preactivations
        [b, L, H]; packed states [b, H, K * V + K + 1]).
    name: registry key of the set ("ref" or "triton").
    backends: op name -> the implementation that runs it (e.g. "triton:mamba-ssm 2.3.2").
    """

    ssd_chunk_scan: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    ssd_chunk_scan_varlen: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    mamba2_state_update: Callable[..., torch.Tensor]
    mamba1_state_update: Callable[..., torch.Tensor]
    causal_conv1d: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    causal_conv1d_update: Callable[..., torch.Tensor]
    causal_conv1d_varlen: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    selective_scan: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    selective_scan_varlen: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    gated_delta_chunk: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    gated_delta_chunk_varlen: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    gated_delta_step: Callable[..., torch.Tensor]
    paged_decode_attention: Callable[..., torch.Tensor]
    paged_prefill_attention: Callable[..., torch.Tensor]
    grouped_matmul: Callable[..., torch.Tensor]
    rglru_scan: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    rglru_scan_varlen: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    rglru_step: Callable[..., torch.Tensor]
    kda_chunk: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    kda_chunk_varlen: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    kda_step: Callable[..., torch.Tensor]
    lightning_chunk: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    lightning_chunk_varlen: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    lightning_step: Callable[..., torch.Tensor]
    mlstm_chunk: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    mlstm_chunk_varlen: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    mlstm_step: Callable[..., torch.Tensor]
    name: str
    backends: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        missing = [op for op in OPS if op not in self.backends]
        if missing:
            raise ValueError(f"kernel set {self.name!r} names no backend for {missing}")


def _build_ref() -> KernelSet:
    """Pure-torch kernels: any device, float32 compute."""
    return KernelSet(
        ssd_chunk_scan=ssd_chunk_scan_ref,
        ssd_chunk_scan_varlen=ssd_chunk_scan_varlen_ref,
        mamba2_state_update=mamba2_state_update_ref,
        mamba1_state_update=mamba1_state_update_ref,
        causal_conv1d=causal_conv1d_ref,
        causal_conv1d_update=causal_conv1d_update_ref,
        causal_conv1d_varlen=causal_conv1d_varlen_ref,
        selective_scan=selective_scan_ref,
        selective_scan_varlen=selective_scan_varlen_ref,
        gated_delta_chunk=gated_delta_chunk_ref,
        gated_delta_chunk_varlen=gated_delta_chunk_varlen_ref,
        gated_delta_step=gated_delta_step_ref,
        paged_decode_attention=paged_decode_attention_ref,
        paged_prefill_attention=paged_prefill_attention_ref,
        grouped_matmul=grouped_matmul_ref,
        rglru_scan=rglru_scan_ref,
        rglru_scan_varlen=rglru_scan_varlen_ref,
        rglru_step=rglru_step_ref,
        kda_chunk=kda_chunk_ref,
        kda_chunk_varlen=kda_chunk_varlen_ref,
        kda_step=kda_step_ref,
        lightning_chunk=lightning_chunk_ref,
        lightning_chunk_varlen=lightning_chunk_varlen_ref,
        lightning_step=lightning_step_ref,
        mlstm_chunk=mlstm_chunk_ref,
        mlstm_chunk_varlen=mlstm_chunk_varlen_ref,
        mlstm_step=mlstm_step_ref,
        name="ref",
        backends=dict.fromkeys(OPS, "ref"),
    )


@functools.lru_cache(maxsize=1)
def _triton_set() -> KernelSet | str:
    """The triton set, or why it cannot be built (imports only; the device is checked
    separately). Cached: imports are tried once per process."""
    try:
        from . import mamba_ssm_ops
        from .mamba_ssm_import import mamba_ssm_version
        from .triton_conv import (
            causal_conv1d_triton,
            causal_conv1d_update_triton,
            causal_conv1d_varlen_triton,
        )
        from .triton_gated_delta import (
            gated_delta_chunk_triton,
            gated_delta_chunk_varlen_triton,
            gated_delta_step_triton,
        )
        from .triton_grouped_matmul import grouped_matmul_triton
        from .triton_kda import kda_chunk_triton, kda_chunk_varlen_triton, kda_step_triton
        from .triton_lightning import (
            lightning_chunk_triton,
            lightning_chunk_varlen_triton,
            lightning_step_triton,
        )
        from .triton_mlstm import (
            mlstm_chunk_triton,
            mlstm_chunk_varlen_triton,
            mlstm_step_triton,
        )
        from .triton_paged_attention import paged_decode_attention_triton
        from .triton_paged_prefill import paged_prefill_attention_triton
        from .triton_rglru import rglru_scan_triton, rglru_scan_varlen_triton, rglru_step_triton
        from .triton_selective_scan import selective_scan_triton, selective_scan_varlen_triton
        from .triton_ssd_varlen import ssd_chunk_scan_varlen_triton

        mamba = mamba_ssm_ops.load()
    except ImportError as exc:
        return str(exc)
    upstream = f"triton:mamba-ssm {mamba_ssm_version()}"
    return KernelSet(
        ssd_chunk_scan=mamba.ssd_chunk_scan,
        ssd_chunk_scan_varlen=ssd_chunk_scan_varlen_triton,
        mamba2_state_update=mamba.mamba2_state_update,
        mamba1_state_update=mamba.mamba1_state_update,
        causal_conv1d=causal_conv1d_triton,
        causal_conv1d_update=causal_conv1d_update_triton,
        causal_conv1d_varlen=causal_conv1d_varlen_triton,
        selective_scan=selective_scan_triton,
        selective_scan_varlen=selective_scan_varlen_triton,
        gated_delta_chunk=gated_delta_chunk_triton,
        gated_delta_chunk_varlen=gated_delta_chunk_varlen_triton,
        gated_delta_step=gated_delta_step_triton,
        paged_decode_attention=paged_decode_attention_triton,
        paged_prefill_attention=paged_prefill_attention_triton,
        grouped_matmul=grouped_matmul_triton,
        rglru_scan=rglru_scan_triton,
        rglru_scan_varlen=rglru_scan_varlen_triton,
        rglru_step=rglru_step_triton,
        kda_chunk=kda_chunk_triton,
        kda_chunk_varlen=kda_chunk_varlen_triton,
        kda_step=kda_step_triton,
        lightning_chunk=lightning_chunk_triton,
        lightning_chunk_varlen=lightning_chunk_varlen_triton,
        lightning_step=lightning_step_triton,
        mlstm_chunk=mlstm_chunk_triton,
        mlstm_chunk_varlen=mlstm_chunk_varlen_triton,
        mlstm_step=mlstm_step_triton,
        name="triton",
        backends={
            "ssd_chunk_scan": upstream,
            "ssd_chunk_scan_varlen": "triton:marconi",
            "mamba2_state_update": upstream,
            "mamba1_state_update": upstream,
            "causal_conv1d": "triton:marconi",
            "causal_conv1d_update": "triton:marconi",
            "causal_conv1d_varlen": "triton:marconi",
            "selective_scan": "triton:marconi",
            "selective_scan_varlen": "triton:marconi",
            "gated_delta_chunk": "triton:marconi",
            "gated_delta_chunk_varlen": "triton:marconi",
            "gated_delta_step": "triton:marconi",
            "paged_decode_attention": "triton:marconi",
            "paged_prefill_attention": "triton:marconi",
            "grouped_matmul": "triton:marconi",
            "rglru_scan": "triton:marconi",
            "rglru_scan_varlen": "triton:marconi",
            "rglru_step": "triton:marconi",
            "kda_chunk": "triton:marconi",
            "kda_chunk_varlen": "triton:marconi",
            "kda_step": "triton:marconi",
            "lightning_chunk": "triton:marconi",
            "lightning_chunk_varlen": "triton:marconi",
            "lightning_step": "triton:marconi",
            "mlstm_chunk": "triton:marconi",
            "mlstm_chunk_varlen": "triton:marconi",
            "mlstm_step": "triton:marconi",
        },
    )


def triton_unavailable(device: torch.device | str = "cuda") -> str | None:
    """None when the "triton" set can run on ``device``'s tensors, else the reason."""
    reason = can_launch_on(torch.device(device))
    if reason is not None:
        return reason
    built = _triton_set()
    return built if isinstance(built, str) else None


def _build_triton(device: torch.device) -> KernelSet:
    reason = triton_unavailable(device)
    if reason is not None:
        raise KernelUnavailable(
            f"kernel set 'triton' is unavailable on {device}: {reason}. Install it with "
            "`make install-gpu` (triton + mamba-ssm's Triton kernels, no nvcc), or use "
            "kernels='ref'"
        )
    built = _triton_set()
    assert isinstance(built, KernelSet)
    return built


KERNEL_REGISTRY: dict[str, Callable[[torch.device], KernelSet]] = {
    "ref": lambda _device: _build_ref(),
    "triton": _build_triton,
}
assert set(KERNEL_CHOICES) == {"auto", *KERNEL_REGISTRY}, "choices.py lists every set"


def get_kernels(device: torch.device | str = "cpu", prefer: str = "auto") -> KernelSet:
    """Pick the kernel set for tensors on ``device``.

    prefer: "auto" (triton on a CUDA device when it can be built, else "ref", logging why
    not), "ref" (pure torch, any device) or "triton" (CUDA, or CPU under
    ``TRITON_INTERPRET=1``). Raises ValueError for an unknown ``prefer``,
    :class:`KernelUnavailable` naming the reason when "triton" cannot run here.
    """
    dev = torch.device(device)
    if prefer == "auto":
        reason = "not a CUDA device" if dev.type != "cuda" else triton_unavailable(dev)
        if reason is None:
            prefer = "triton"
        else:
            log.info("kernels=auto on %s: using the torch references (%s)", dev, reason)
            prefer = "ref"
    if prefer not in KERNEL_REGISTRY:
        raise ValueError(f"unknown kernel set {prefer!r}; choose one of {list(KERNEL_CHOICES)}")
    return KERNEL_REGISTRY[prefer](dev)
