"""`StepGraphs`: the pooled decode step with static shapes, replayed as CUDA graphs.

A CUDA graph replays a recorded sequence of kernels on the same buffers, so the step it
records must have fixed shapes and addresses and no host sync. `StepGraphs` runs the
step of a `DecodeBatch` of n members on a batch-size bucket nb >= n (`buckets`: powers of
two up to the batch's capacity, and the capacity) over static inputs: the token ids,
positions, new KV rows and attended lengths live in buffers of the batch's capacity, the
SSM states are the batch's own rows `[:nb]` and the row table is the batch's whole
table (and, with a window pool, the window table and new window rows). Rows n..nb-1 are
padding: token 0 at position 0, attending over each pool's `scratch_row` alone and
writing their K/V there, their SSM states the batch's spare rows
(never a member's); their logits are dropped. With the model's `emit_hidden` (an MTP
drafter) the step also outputs the final normed hidden states, and each member's row is
appended to its `SeqState.hidden` as the eager step does.

One graph per bucket for the current table and pool tensors: a table that doubles its
width or a pool that grows (never, for a pool sized once) invalidates them and the next
steps capture anew. A capture first runs the step twice on a side stream (Triton's
autotuning happens there), restores the SSM rows those runs advanced, then records; a
replay recomputes exactly what the eager step computes. Without capture (CPU, or
`cuda_graphs: off`) the same static step can run eagerly: that is what the CPU tests
check against the unpadded step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from marconi_ray.engine.model.decode_batch import DecodeBatch
from marconi_ray.engine.model.paged_kv import DecodeKV, PagedDecode

MODES = ("auto", "on", "off")
Outputs = tuple[torch.Tensor, torch.Tensor | None]
"""A static step's outputs: logits [nb, V] and, with the model's `emit_hidden`, the
final normed hidden states [nb, D] (a drafter's: `engine.spec.mtp`), else None."""


def captures(mode: str, device: torch.device) -> bool:
    """Whether `cuda_graphs` = `mode` captures on `device`: `auto` on CUDA only, `on`
    (ValueError off CUDA), `off` never."""
    if mode not in MODES:
        raise ValueError(f"cuda_graphs must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "on" and device.type != "cuda":
        raise ValueError(f"cuda_graphs 'on' needs a CUDA device, got {device.type}")
    return mode != "off" and device.type == "cuda"


def buckets(capacity: int) -> list[int]:
    """The batch sizes a step is padded to: 1, 2, 4, ... below `capacity`, and it."""
    out = [1]
    while out[-1] * 2 < capacity:
        out.append(out[-1] * 2)
    return sorted({*out, capacity})


class StepGraphs:
    """Static-shape decode steps of `batch` (pooled) on `model`, captured as CUDA graphs
    when `capture` (see the module docstring).

    Attributes:
        captured: graphs recorded so far (one per bucket, again after an invalidation).
    """

    def __init__(self, model: Any, batch: DecodeBatch, capture: bool) -> None:
        pools = [p for p in (batch.pool, batch.window_pool) if p is not None]
        if batch.pool is None or not all(hasattr(p, "scratch_row") for p in pools):
            raise ValueError("static decode steps need a pooled batch with a scratch row")
        self.model = model
        self.batch = batch
        self.capture = capture
        self.buckets = buckets(batch.capacity)
        device = batch.table.device
        self.ids = torch.zeros(batch.capacity, dtype=torch.long, device=device)
        self.positions = torch.zeros_like(self.ids)
        self.new = torch.zeros_like(self.ids)
        self.window_new = torch.zeros_like(self.ids)
        self.lens = torch.ones_like(self.ids)
        self.captured = 0
        self._graphs: dict[int, tuple[Any, Outputs]] = {}
        self._layout: tuple[int, ...] = ()
        self._mempool: Any = None

    def bucket(self, n: int) -> int:
        """The bucket a step of `n` members runs at."""
        return next(b for b in self.buckets if b >= n)

    @torch.inference_mode()
    def decode(self, ids: torch.Tensor) -> torch.Tensor:
        """`HybridModel.decode_batch(ids, batch)` for an `extend`ed pooled batch, on the
        static buffers; returns the members' logits [n, V] (a copy: the graph's output
        buffer is the next replay's)."""
        batch = self.batch
        n = len(batch)
        nb = self.bucket(n)
        new, lens = batch.step_rows()
        scratch = batch.pool.scratch_row  # type: ignore[union-attr]
        self.ids[:n].copy_(ids)
        self.ids[n:nb].zero_()
        self.new[:n].copy_(new)
        self.new[n:nb].fill_(scratch)
        self.lens[:n].copy_(lens)
        self.lens[n:nb].fill_(1)
        self.positions[:n].copy_(batch.positions())
        self.positions[n:nb].zero_()
        batch.table[n:nb, 0] = scratch
        window_new = batch.window_step_rows()
        if window_new is not None:
            window_scratch = batch.window_pool.scratch_row  # type: ignore[union-attr]
            self.window_new[:n].copy_(window_new)
            self.window_new[n:nb].fill_(window_scratch)
            batch.window_table[n:nb, 0] = window_scratch
        out, normed = self._run(nb)
        logits = out[:n].clone()
        if normed is not None:  # the model's emit_hidden: each member's row, a copy
            self.model.keep_hidden(normed[:n].clone(), batch.members)
        for member in batch.members:
            member.length += 1
        batch.advance()
        return logits

    def _step(self, nb: int) -> Callable[[], Outputs]:
        model, batch = self.model, self.batch
        pool = batch.pool
        assert pool is not None
        attend = model.kernels.paged_decode_attention
        table, lens = batch.table[:nb], self.lens[:nb]
        rows = {i: (batch.conv[i][:nb], batch.ssm[i][:nb]) for i in model.ssm_blocks}
        kv: dict[int, DecodeKV] = {}
        for i in model.attn_blocks:
            if i in batch.window_blocks:
                window = batch.window_pool
                assert window is not None
                kv[i] = PagedDecode(
                    window.k[i], window.v[i], batch.window_table[:nb], lens,
                    self.window_new[:nb], attend,
                )  # fmt: skip
            else:
                kv[i] = PagedDecode(pool.k[i], pool.v[i], table, lens, self.new[:nb], attend)
        ids, positions = self.ids[:nb], self.positions[:nb]

        def step() -> Outputs:
            if model.emit_hidden:
                out: Outputs = model._decode_normed(ids, positions, rows, kv)
                return out
            return model._decode(ids, positions, rows, kv), None

        return step

    def _run(self, nb: int) -> Outputs:
        step = self._step(nb)
        if not self.capture:
            return step()
        layout = self._current_layout()
        if layout != self._layout:  # a wider table or a grown pool: record anew
            self._graphs, self._layout = {}, layout
        if nb not in self._graphs:
            self._graphs[nb] = self._record(step, nb)
            self.captured += 1
        graph, out = self._graphs[nb]
        graph.replay()
        return out

    def _current_layout(self) -> tuple[int, ...]:
        batch = self.batch
        pools = [p for p in (batch.pool, batch.window_pool) if p is not None]
        tensors = [t for p in pools for t in (*p.k.values(), *p.v.values())]
        tables = (batch.table.data_ptr(), batch.window_table.data_ptr(), batch.table.shape[1])
        return (*tables, *(t.data_ptr() for t in tensors))

    def _record(self, step: Callable[[], Outputs], nb: int) -> tuple[Any, Outputs]:
        batch = self.batch
        saved = {i: (batch.conv[i][:nb].clone(), batch.ssm[i][:nb].clone()) for i in batch.conv}
        device = batch.table.device
        side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                step()
        torch.cuda.current_stream(device).wait_stream(side)
        for i, (conv, ssm) in saved.items():  # the warm-up runs advanced them
            batch.conv[i][:nb].copy_(conv)
            batch.ssm[i][:nb].copy_(ssm)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._mempool):
            out = step()
        self._mempool = graph.pool()
        return graph, out
