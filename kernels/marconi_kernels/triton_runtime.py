"""Where and how Triton kernels run: on a CUDA device, or on CPU tensors under Triton's
interpreter (``TRITON_INTERPRET=1``, which is how CI runs every fast path without a GPU).

Two things in third-party launch code need a GPU driver even under the interpreter:
``torch.cuda.device(idx)`` with ``idx=None`` (CPU tensors have no index) and the autotuner's
timing of candidate configs. :func:`prepare_interpreter` makes the first a no-op and pins
each autotuned kernel of a given module to its first config, only when the interpreter is
on and no CUDA device exists; it is idempotent and logs what it did. On a GPU it does nothing.

Our own kernels launch through :func:`device_guard`, which needs none of that.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch

log = logging.getLogger(__name__)

_ORIGINAL_CUDA_DEVICE = torch.cuda.device
_PINNED: set[str] = set()


def interpreting() -> bool:
    """True when Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


def triton_error() -> str | None:
    """None when ``triton`` imports, else why not (a sentence naming the exception)."""
    try:
        import triton  # noqa: F401
    except Exception as exc:  # a broken install fails with more than ImportError
        return f"importing triton failed: {exc!r}"
    return None


def can_launch_on(device: torch.device) -> str | None:
    """None when Triton kernels can run on tensors of ``device``, else the reason.

    CUDA devices need a working ``triton``; CPU tensors need the interpreter as well.
    """
    error = triton_error()
    if error is not None:
        return error
    if device.type == "cuda":
        return None
    if device.type == "cpu" and interpreting():
        return None
    return (
        f"Triton kernels need a CUDA device or TRITON_INTERPRET=1 for {device.type} tensors "
        f"(TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', 'unset')})"
    )


@contextlib.contextmanager
def device_guard(t: torch.Tensor) -> Iterator[None]:
    """Make ``t``'s CUDA device current for a launch; nothing for CPU tensors."""
    if t.is_cuda:
        with _ORIGINAL_CUDA_DEVICE(t.device):
            yield
    else:
        yield


class _CpuSafeCudaDevice(_ORIGINAL_CUDA_DEVICE):
    """``torch.cuda.device`` that accepts the ``None`` / -1 index of CPU tensors (a no-op)."""

    def __init__(self, device: Any) -> None:
        if device is None or (isinstance(device, int) and device < 0):
            self.idx = -1
            self.prev_idx = -1
            return
        super().__init__(device)

    def __enter__(self) -> None:
        if self.idx != -1:
            super().__enter__()  # type: ignore[no-untyped-call]

    def __exit__(self, *exc: object) -> bool:
        if self.idx != -1:
            return bool(super().__exit__(*exc))
        return False


def prepare_interpreter(*modules: ModuleType) -> None:
    """Let third-party Triton launch code run on CPU tensors under the interpreter.

    No-op unless ``TRITON_INTERPRET=1`` and CUDA is unavailable. Then: ``torch.cuda.device``
    accepts a None index, and every ``triton.autotune`` kernel found in ``modules`` keeps
    only its first config (one config is never timed, so no driver is asked for).
    """
    if not interpreting() or torch.cuda.is_available():
        return
    if torch.cuda.device is not _CpuSafeCudaDevice:
        torch.cuda.device = _CpuSafeCudaDevice  # type: ignore[misc]
        log.info("triton interpreter: torch.cuda.device(None) is a no-op in this process")
    from triton.runtime.autotuner import Autotuner

    for module in modules:
        if module.__name__ in _PINNED:
            continue
        pinned = 0
        for value in vars(module).values():
            if isinstance(value, Autotuner) and len(value.configs) > 1:
                value.configs = value.configs[:1]
                pinned += 1
        _PINNED.add(module.__name__)
        if pinned:
            log.info(
                "triton interpreter: %d autotuned kernels of %s pinned to one config",
                pinned,
                module.__name__,
            )
