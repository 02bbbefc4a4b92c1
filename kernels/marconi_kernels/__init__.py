"""marconi_kernels: SSM compute kernels for the hybrid model engine.

Pure-torch references (any device, float32 compute) for the Mamba-2 chunked SSD scan with
state emission at arbitrary positions, single-step state updates, the causal conv1d with
state, and the Mamba-1 selective scan with an initial state; ``get_kernels`` picks the
mamba-ssm / causal-conv1d CUDA versions where available.
"""

from .conv import causal_conv1d_ref, causal_conv1d_update_ref
from .dispatch import KERNEL_REGISTRY, KernelSet, cuda_kernels_available, get_kernels
from .selective_scan import selective_scan_ref
from .ssd import ssd_chunk_scan_ref, ssd_naive_ref
from .state_update import mamba1_state_update_ref, mamba2_state_update_ref

__all__ = [
    "KERNEL_REGISTRY",
    "KernelSet",
    "causal_conv1d_ref",
    "causal_conv1d_update_ref",
    "cuda_kernels_available",
    "get_kernels",
    "mamba1_state_update_ref",
    "mamba2_state_update_ref",
    "selective_scan_ref",
    "ssd_chunk_scan_ref",
    "ssd_naive_ref",
]
