"""Kernel-set selection: references on CPU, clear errors for bad or unavailable choices."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import marconi_kernels
from marconi_kernels import KERNEL_REGISTRY, KernelSet, cuda_kernels_available, get_kernels


def test_cpu_gets_reference_kernels():
    ks = get_kernels("cpu")
    assert ks.name == "ref"
    assert ks.ssd_chunk_scan is marconi_kernels.ssd_chunk_scan_ref
    assert ks.selective_scan is marconi_kernels.selective_scan_ref
    assert get_kernels(torch.device("cpu"), prefer="ref").name == "ref"
    assert set(KERNEL_REGISTRY) == {"ref", "cuda"}


def test_kernel_set_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_kernels().name = "other"  # type: ignore[misc]
    assert all(
        callable(getattr(get_kernels(), f.name)) or f.name == "name"
        for f in dataclasses.fields(KernelSet)
    )


def test_unknown_prefer_raises_naming_it():
    with pytest.raises(ValueError, match="triton-magic"):
        get_kernels("cpu", prefer="triton-magic")


def test_cuda_on_cpu_device_raises_value_error():
    with pytest.raises(ValueError, match="CUDA device"):
        get_kernels("cpu", prefer="cuda")


@pytest.mark.skipif(cuda_kernels_available(), reason="CUDA kernels are available here")
def test_cuda_unavailable_raises_clear_error_and_auto_falls_back():
    with pytest.raises(RuntimeError, match="'cuda' is unavailable"):
        get_kernels("cuda", prefer="cuda")
    assert get_kernels("cuda").name == "ref"
