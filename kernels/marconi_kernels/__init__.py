"""marconi_kernels: SSM and attention compute kernels for the hybrid model engine.

Pure-torch references (any device, float32 compute) for the Mamba-2 chunked SSD scan with
state emission at arbitrary positions, single-step state updates, the causal conv1d with
state, the Mamba-1 selective scan with an initial state, the gated delta rule (Gated
DeltaNet) prefill with state emission and its decode step, decode and varlen prefill
attention over a token-row table, and the grouped matmul of mixture-of-experts dispatch;
Triton versions of each (ours and mamba-ssm's) that run on CUDA, or on CPU under
``TRITON_INTERPRET=1``.
``get_kernels`` picks a set. Names are imported lazily, so ``marconi_kernels.choices``
needs no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "KERNEL_CHOICES": "marconi_kernels.choices",
    "KERNEL_REGISTRY": "marconi_kernels.dispatch",
    "OPS": "marconi_kernels.dispatch",
    "KernelSet": "marconi_kernels.dispatch",
    "KernelUnavailable": "marconi_kernels.dispatch",
    "get_kernels": "marconi_kernels.dispatch",
    "triton_unavailable": "marconi_kernels.dispatch",
    "causal_conv1d_ref": "marconi_kernels.conv",
    "causal_conv1d_update_ref": "marconi_kernels.conv",
    "causal_conv1d_varlen_ref": "marconi_kernels.conv",
    "gated_delta_chunk_ref": "marconi_kernels.gated_delta",
    "gated_delta_chunk_varlen_ref": "marconi_kernels.gated_delta",
    "gated_delta_recurrent_ref": "marconi_kernels.gated_delta",
    "gated_delta_step_ref": "marconi_kernels.gated_delta",
    "selective_scan_ref": "marconi_kernels.selective_scan",
    "selective_scan_varlen_ref": "marconi_kernels.selective_scan",
    "ssd_chunk_scan_ref": "marconi_kernels.ssd",
    "ssd_chunk_scan_varlen_ref": "marconi_kernels.ssd",
    "ssd_naive_ref": "marconi_kernels.ssd",
    "mamba1_state_update_ref": "marconi_kernels.state_update",
    "paged_decode_attention_ref": "marconi_kernels.paged_attention",
    "paged_prefill_attention_ref": "marconi_kernels.paged_prefill",
    "grouped_matmul_ref": "marconi_kernels.grouped_matmul",
    "rglru_scan_ref": "marconi_kernels.rglru",
    "rglru_scan_varlen_ref": "marconi_kernels.rglru",
    "rglru_step_ref": "marconi_kernels.rglru",
    "kda_chunk_ref": "marconi_kernels.kda",
    "kda_chunk_varlen_ref": "marconi_kernels.kda",
    "kda_recurrent_ref": "marconi_kernels.kda",
    "kda_step_ref": "marconi_kernels.kda",
    "lightning_chunk_ref": "marconi_kernels.lightning",
    "lightning_chunk_varlen_ref": "marconi_kernels.lightning",
    "lightning_recurrent_ref": "marconi_kernels.lightning",
    "lightning_step_ref": "marconi_kernels.lightning",
    "mlstm_chunk_ref": "marconi_kernels.mlstm",
    "mlstm_chunk_varlen_ref": "marconi_kernels.mlstm",
    "mlstm_recurrent_ref": "marconi_kernels.mlstm",
    "mlstm_step_ref": "marconi_kernels.mlstm",
    "mamba2_state_update_ref": "marconi_kernels.state_update",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'marconi_kernels' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
