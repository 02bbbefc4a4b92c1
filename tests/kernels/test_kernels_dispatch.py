"""Kernel-set selection: references on CPU, the triton set where it can run, and clear
errors (never a silent fallback) for bad or unavailable choices."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

import marconi_kernels
from marconi_kernels import KERNEL_CHOICES, KERNEL_REGISTRY, OPS, KernelSet, get_kernels
from marconi_kernels.triton_runtime import can_launch_on


def test_cpu_gets_reference_kernels():
    ks = get_kernels("cpu")
    assert ks.name == "ref"
    assert ks.ssd_chunk_scan is marconi_kernels.ssd_chunk_scan_ref
    assert ks.selective_scan is marconi_kernels.selective_scan_ref
    assert ks.gated_delta_chunk is marconi_kernels.gated_delta_chunk_ref
    assert ks.gated_delta_step is marconi_kernels.gated_delta_step_ref
    assert get_kernels(torch.device("cpu"), prefer="ref").name == "ref"
    assert set(KERNEL_REGISTRY) == {"ref", "triton"}
    assert KERNEL_CHOICES == ("auto", "ref", "triton")
    assert dict(ks.backends) == dict.fromkeys(OPS, "ref")


def test_kernel_set_is_frozen_and_names_every_op():
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_kernels().name = "other"  # type: ignore[misc]
    assert all(callable(getattr(get_kernels(), op)) for op in OPS)
    ref = get_kernels()
    fields = {f.name: getattr(ref, f.name) for f in dataclasses.fields(KernelSet)}
    with pytest.raises(ValueError, match=OPS[-1]):
        KernelSet(**{**fields, "backends": {op: "ref" for op in OPS[:-1]}})


def test_unknown_prefer_raises_naming_it():
    with pytest.raises(ValueError, match="triton-magic"):
        get_kernels("cpu", prefer="triton-magic")


def test_auto_on_cpu_logs_why_not_triton(caplog):
    with caplog.at_level(logging.INFO, logger="marconi_kernels.dispatch"):
        assert get_kernels("cpu", prefer="auto").name == "ref"
    assert "not a CUDA device" in caplog.text


def test_triton_on_cpu_without_interpreter_fails_loudly(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert "TRITON_INTERPRET" in (can_launch_on(torch.device("cpu")) or "")
    with pytest.raises(RuntimeError, match="'triton' is unavailable on cpu"):
        get_kernels("cpu", prefer="triton")


@pytest.mark.triton
def test_triton_on_cpu_under_the_interpreter():
    ks = get_kernels("cpu", prefer="triton")
    assert ks.name == "triton"
    assert set(ks.backends) == set(OPS)
    assert ks.backends["causal_conv1d"] == "triton:marconi"
    assert ks.backends["gated_delta_chunk"] == ks.backends["gated_delta_step"] == "triton:marconi"
    assert ks.gated_delta_chunk.__name__ == "gated_delta_chunk_triton"
    assert ks.gated_delta_step.__name__ == "gated_delta_step_triton"
    assert ks.backends["ssd_chunk_scan"].startswith("triton:mamba-ssm ")
