"""`SeqState`: everything one sequence carries between forward calls, on one TP rank."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from marconi_ray.engine.model.kv_buffer import KVBuffer


@dataclass
class SeqState:
    """The model's cache for one sequence after its first `length` tokens.

    Attributes:
        length: tokens already consumed.
        kv: block index -> keys/values of every consumed token (attention blocks).
        conv: block index -> conv state [conv_local, d_conv] (SSM blocks).
        ssm: block index -> recurrent state, float32 (SSM blocks).
        logits: [vocab] logits after the last consumed token (None before any token).
        rows: a pooled sequence's KV (the serving path): [length] long, its pool rows in
            token order (see `paged_kv`); `kv` is then empty. None: the KV is in `kv`,
            or the sequence is a member of a pooled `DecodeBatch`, whose row table
            holds its rows.
        window_rows: with a window pool (a model with sliding-window blocks, served),
            the rows of its windowed blocks' KV, [length] long like `rows`: only the
            last W positions' are its own, the earlier ones are rows the window has left
            (`engine.window_rows`), never attended. None otherwise, or while a member of
            a pooled `DecodeBatch`.
        hidden: while the model's `emit_hidden` is on, the final normed hidden states of
            the positions its forwards consumed, as (first position, rows [n, D]) chunks
            in order, for a drafter that reads them (`engine.spec.mtp`), which takes them.
    """

    length: int = 0
    kv: dict[int, KVBuffer] = field(default_factory=dict)
    conv: dict[int, torch.Tensor] = field(default_factory=dict)
    ssm: dict[int, torch.Tensor] = field(default_factory=dict)
    logits: torch.Tensor | None = None
    rows: torch.Tensor | None = None
    window_rows: torch.Tensor | None = None
    hidden: list[tuple[int, torch.Tensor]] = field(default_factory=list)

    @classmethod
    def resumed(cls, ckpt: StateCheckpoint, kv_of: SeqState) -> SeqState:
        """The state after `ckpt.depth` tokens, as a cache hit restores it: `ckpt`'s SSM
        states and logits, and the first `depth` keys/values of `kv_of` (a sequence with
        the same first `depth` tokens that consumed at least that many). Tensors are
        copies, so both sources stay as they are."""
        if kv_of.length < ckpt.depth:
            raise ValueError(f"kv_of has {kv_of.length} tokens, fewer than depth {ckpt.depth}")
        out = cls(length=ckpt.depth, logits=ckpt.logits)
        for i, buf in kv_of.kv.items():
            k, v = buf.view()
            out.kv[i] = KVBuffer(k[:, : ckpt.depth].clone(), v[:, : ckpt.depth].clone())
        out.conv = {i: t.clone() for i, t in ckpt.conv.items()}
        out.ssm = {i: t.clone() for i, t in ckpt.ssm.items()}
        return out


@dataclass(frozen=True)
class StateCheckpoint:
    """The SSM states and the next-token logits after the first `depth` tokens.

    conv/ssm map SSM block index -> tensor (same shapes as in `SeqState`).
    window: with sliding-window blocks (`HybridModel.window_blocks`, W = `window_state`),
        such a block's index -> (k, v) [n_kv_local, m, head_dim], the KV of the last m
        positions before `depth`, oldest first (m = min(depth, W), or W padded past
        them once stored); empty without such blocks (the others' KV is per token, in
        the tree).
    """

    depth: int
    conv: dict[int, torch.Tensor]
    ssm: dict[int, torch.Tensor]
    logits: torch.Tensor
    window: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def with_window_of(self, state: SeqState, window: int) -> StateCheckpoint:
        """This checkpoint with its window taken from `state`'s KV buffers (a sequence
        that consumed at least `depth` tokens; views, the store copies them)."""
        if state.length < self.depth:
            raise ValueError(f"state has {state.length} tokens, fewer than depth {self.depth}")
        start = max(0, self.depth - window)
        kv = {}
        for i, buf in state.kv.items():
            k, v = buf.view()
            kv[i] = (k[:, start : self.depth], v[:, start : self.depth])
        return dataclasses.replace(self, window=kv)
