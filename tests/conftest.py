"""Shared test setup: torch pinned to one thread, and small helpers."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# Triton kernels run on CPU tensors under Triton's interpreter unless a GPU is present
# (the `triton` marker's tests). Set before anything imports triton: `triton.jit` reads
# it when a kernel is defined.
if not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")
