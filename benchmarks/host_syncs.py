"""What would make a CUDA host wait for the device, seen on any device: the counters of
`engine_step_probe.py` (which counts them) and of tests/engine/test_decode_no_sync.py
(which fails on them, `strict`).

A host sync is `.item()`, `int()`, `float()` or `bool()` of a tensor (one
`aten._local_scalar_dense`), an op whose output shape depends on the data (`nonzero`,
`masked_select`, `unique`, boolean indexing, `bincount`, `repeat_interleave` by a tensor
of repeats without `output_size`), or a `.tolist()` / `.numpy()` (seen by
`HostReads`: on CPU they dispatch nothing).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

SYNC_OPS = frozenset(
    {
        "_local_scalar_dense",
        "nonzero",
        "masked_select",
        "_unique2",
        "unique_dim",
        "unique_consecutive",
        "bincount",
    }
)
HOST_READS = frozenset({"tolist", "numpy"})


class HostSync(AssertionError):
    """A strict counter saw a host sync."""


def syncs(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the aten op `func` called with `args`, `kwargs` is a host sync."""
    name = func.overloadpacket.__name__
    if name in SYNC_OPS:
        return True
    if name == "repeat_interleave" and func._overloadname != "self_int":
        return kwargs.get("output_size") is None
    if name == "index":
        return any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in args[1] or ())
    return False


class SyncOps(TorchDispatchMode):
    """Counts aten ops, the host syncs among them (`strict`: raises `HostSync` at the
    first) and the bytes of every non-view output."""

    def __init__(self, strict: bool = False) -> None:
        super().__init__()
        self.strict = strict
        self.ops = 0
        self.syncs = 0
        self.bytes_made = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        self.ops += 1
        if syncs(func, args, kwargs):
            if self.strict:
                raise HostSync(f"host sync: aten.{func.overloadpacket.__name__}")
            self.syncs += 1
        out = func(*args, **kwargs)
        if not func.is_view:
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    self.bytes_made += t.numel() * t.element_size()
        return out


class HostReads(TorchFunctionMode):
    """Counts `.tolist()` and `.numpy()` calls (`strict`: raises `HostSync` at the first)."""

    def __init__(self, strict: bool = False) -> None:
        super().__init__()
        self.strict = strict
        self.reads = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if getattr(func, "__name__", "") in HOST_READS:
            if self.strict:
                raise HostSync(f"host read: Tensor.{func.__name__}")
            self.reads += 1
        return func(*args, **(kwargs or {}))
