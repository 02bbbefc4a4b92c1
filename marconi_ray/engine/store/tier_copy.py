"""`TierCopier`: the copies between a store's device tier and its host tier, and their
counters.

On CUDA every copy runs on a dedicated copy stream (`torch.cuda.Stream`), behind the work
already queued on the compute stream (the current one) — the copy stream waits for it on
the device, the host thread never does — and moves data with `non_blocking` copies
between device memory and pinned host memory. A copy to the device also makes the compute
stream wait for the copy's event, so every kernel queued after it reads the copied rows.

Memory safety across the two streams: tensors the store keeps are allocated on the compute
stream, and every device tensor the copy stream reads or writes is `record_stream`ed on it
(`touch`), so the caching allocator never hands its memory out again before the copy is
done; pinned host tensors are protected by PyTorch's host allocator, which records the
copy's event itself. A device *row* a demotion reads is another matter (the pool reuses
rows, not memory): `DeviceKVPool` keeps it pending until the event `run` returns.

On CPU there is one tier of memory and no stream: copies are plain synchronous copies.

Counters (`stats`): bytes copied per direction and seconds spent copying per direction.
On CUDA the seconds are the copy stream's time between two timing events around each
copy (index gathers and DMA, not the wait for the compute stream), added once `poll` finds
the copy complete: copies still in flight are not counted yet. On CPU they are the wall
time of the copy.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch


class CopyEvent(Protocol):
    """What a pool needs of a copy's completion event (`torch.cuda.Event` is one)."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


def device_index(rows: npt.NDArray[np.int64], device: torch.device) -> torch.Tensor:
    """`rows` as an int64 tensor on `device`, on the current stream. On CUDA it goes
    through pinned memory with a non-blocking copy: a plain one would make the host wait
    for the stream to drain."""
    t = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


class TierCopier:
    """Copies between `device` and host memory (pinned when `device` is CUDA)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = (
            torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
            if device.type == "cuda"
            else None
        )
        self.bytes = {True: 0, False: 0}
        """to_host -> bytes copied in that direction."""
        self.seconds = {True: 0.0, False: 0.0}
        """to_host -> seconds spent copying in that direction (see the module docstring)."""
        self._timed: deque[tuple[bool, torch.cuda.Event, torch.cuda.Event]] = deque()

    @property
    def pinned(self) -> bool:
        """Whether host tensors are pinned (page-locked): on CUDA devices."""
        return self.stream is not None

    def host_empty(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised host tensor (pinned on CUDA)."""
        return torch.empty(tuple(shape), dtype=dtype, pin_memory=self.pinned)

    def touch(self, *tensors: torch.Tensor) -> None:
        """Mark device tensors as used by the copy stream (no-op on CPU)."""
        if self.stream is None:
            return
        for t in tensors:
            if t.is_cuda:
                t.record_stream(self.stream)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """`dst.copy_(src)`; inside `run`'s `enqueue` on CUDA, queued on the copy stream
        without blocking the host."""
        dst.copy_(src, non_blocking=self.stream is not None)
        self.touch(dst, src)

    def run(
        self, to_host: bool, n_bytes: int, enqueue: Callable[[], None], wait: bool = True
    ) -> CopyEvent | None:
        """Run `enqueue` (which queues the copies, through `copy` and `touch`) on the copy
        stream after the compute stream's queued work; count `n_bytes` to the host
        (`to_host`) or to the device. Returns the event that completes with the copies on
        CUDA (with `wait`, a copy to the device is also waited for by the compute stream
        now; without, the caller has it `wait` before reading what it wrote), None on
        CPU, where the copies are done on return."""
        self.bytes[to_host] += n_bytes
        if self.stream is None:
            t0 = time.perf_counter()
            enqueue()
            self.seconds[to_host] += time.perf_counter() - t0
            return None
        compute = torch.cuda.current_stream(self.device)
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        done = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        self.stream.wait_stream(compute)
        with torch.cuda.stream(self.stream):
            start.record(self.stream)
            enqueue()
            done.record(self.stream)
        if not to_host and wait:
            compute.wait_event(done)
        self._timed.append((to_host, start, done))
        return done

    def wait(self, event: CopyEvent) -> None:
        """Make the compute stream wait for `event` (work queued after it sees the copy)."""
        if self.stream is not None:
            torch.cuda.current_stream(self.device).wait_event(event)  # type: ignore[arg-type]

    def poll(self) -> None:
        """Add the seconds of the completed copies (in stream order) to `seconds`."""
        while self._timed and self._timed[0][2].query():  # type: ignore[no-untyped-call]
            to_host, start, done = self._timed.popleft()
            self.seconds[to_host] += start.elapsed_time(done) / 1e3
