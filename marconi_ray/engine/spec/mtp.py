"""`MTPDrafter`: drafts with the target checkpoint's multi-token-prediction layers
(`engine.model.mtp.MTPHead`), from the target's own final hidden states.

Per sequence an `MTPCursor` keeps the layers' KV of the entries fed so far. Every entry
in it is exact: position j's entry pairs the target's hidden state h_j with the true token
x_{j+1}. A proposal first feeds the entries the target computed since the last one (the
hidden rows the target's forwards appended to `SeqState.hidden`: a prefill's, a decode
step's, a verified step's accepted positions), in one pass per sequence; the last entry's
logits give the first draft. Each further draft is one batched step over the drafting
sequences, fed the previous draft and the layers' own output; those entries' KV is
dropped afterwards, so the cursor holds exact entries only (the rollback is a length).

Positions the target did not compute here (a cache hit's prefix, hidden rows trimmed
while a sequence did not draft) leave gaps in the layers' context: drafts may then be
worse, never wrong (verification decides every token). Drafts are the layers' argmax: a
pure function of the sequence, so every tensor-parallel rank drafts the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import torch

from marconi_ray.engine.model.kv_buffer import KVBuffer
from marconi_ray.engine.model.mtp import MTPHead
from marconi_ray.engine.model.seq_state import SeqState

MAX_PENDING = 256
"""Hidden chunks (one per decode step) a sequence that is not drafting keeps for the
layers (older ones are dropped: a gap in their context, see the module docstring)."""


@dataclass
class MTPCursor:
    """One sequence's multi-token-prediction context.

    Attributes:
        kv: the layers' keys and values of the exact entries fed so far (one buffer
            per attention block).
        fed_to: the position after the last entry fed (0: none).
        last: the last entry fed's (logits [V], output [D]): what the first draft comes
            from while no new position has been computed (a prompt fed right after its
            prefill, then asked to draft).
    """

    kv: list[KVBuffer] = field(default_factory=list)
    fed_to: int = 0
    last: tuple[torch.Tensor, torch.Tensor] | None = None


@dataclass
class MTPRequest:
    """One sequence's ask: its cursor, its state (whose `hidden` rows are taken), the
    sequence so far (prompt + output; its last token the target has not consumed), and
    the most tokens to draft."""

    cursor: MTPCursor
    state: SeqState
    tokens: npt.NDArray[np.integer]
    k: int


class MTPDrafter:
    """Drafts from `head` (see the module docstring). Only a checkpoint's first MTP
    layer drafts (Qwen3.5 and Qwen3-Next ship one)."""

    def __init__(self, head: MTPHead) -> None:
        self.head = head

    def cursor(self) -> MTPCursor:
        return MTPCursor(self.head.new_kv())

    def feed(self, asks: Sequence[MTPRequest]) -> None:
        """Feed each ask's pending hidden rows into its cursor, drafting nothing (a
        prompt's, right after its prefill)."""
        for ask in asks:
            self._feed(ask)

    def propose_many(self, asks: Sequence[MTPRequest]) -> list[list[int]]:
        """Up to `k` drafts for each ask (none for one whose latest position has no
        hidden row here: nothing to draft from). Pure in the sequence: asked again with
        nothing new computed, an ask gets the same drafts."""
        firsts: list[tuple[int, torch.Tensor, torch.Tensor]] = []
        out: list[list[int]] = [[] for _ in asks]
        for a, ask in enumerate(asks):
            fed = self._feed(ask)
            if fed is not None:
                firsts.append((a, *fed))
        if not firsts:
            return out
        logits = torch.stack([lg for _, lg, _ in firsts])
        hidden = torch.stack([h for _, _, h in firsts])
        live = [a for a, _, _ in firsts]
        lengths = {a: asks[a].cursor.kv[0].length for a in live}
        step = 0
        while live:
            ids = torch.argmax(logits, dim=-1)
            for a, t in zip(live, ids.tolist(), strict=True):
                out[a].append(int(t))
            step += 1
            keep = [i for i, a in enumerate(live) if len(out[a]) < asks[a].k]
            if not keep:
                break
            live = [live[i] for i in keep]
            pos = torch.tensor([len(asks[a].tokens) - 2 + step for a in live])
            logits, hidden = self.head.decode(
                ids[keep], hidden[keep], pos, [asks[a].cursor.kv for a in live]
            )
        for a, length in lengths.items():
            for buf in asks[a].cursor.kv:
                buf.length = length  # the drafts' entries out: exact ones only
        return out

    def _feed(self, ask: MTPRequest) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Feed the ask's pending hidden rows; the last entry's (logits [V], output [D])
        when it is the sequence's latest position, else None."""
        cursor, n = ask.cursor, len(ask.tokens)
        chunks, ask.state.hidden = ask.state.hidden, []
        chunks = [(p, rows) for p, rows in chunks if len(rows)]
        latest = cursor.last if cursor.fed_to == n - 1 else None
        if not chunks:
            return latest
        positions = torch.cat([torch.arange(p, p + len(rows)) for p, rows in chunks])
        keep = positions >= cursor.fed_to  # a re-fed position (none expected) is skipped
        rows = torch.cat([rows for _, rows in chunks])[keep.to(chunks[0][1].device)]
        positions = positions[keep]
        if not len(positions):
            return latest
        if int(positions[-1]) > n - 2:
            raise ValueError(
                f"hidden rows up to position {int(positions[-1])} for a sequence of {n} "
                "tokens: the target consumed at most all but the last"
            )
        ids = torch.as_tensor(np.asarray(ask.tokens)[positions.numpy() + 1], dtype=torch.long)
        logits, hidden = self.head.prefill(ids, rows, positions, cursor.kv)
        cursor.fed_to = int(positions[-1]) + 1
        cursor.last = logits[-1], hidden[-1]
        return cursor.last if cursor.fed_to == n - 1 else None


def trim_pending(state: SeqState, most: int = MAX_PENDING) -> None:
    """Keep only the last `most` hidden chunks of a sequence that is not drafting (a
    decode step adds one a step; a prompt's prefill chunks, few and kept until its first
    proposal, are bounded by the prompt). O(1) while under the bound."""
    extra = len(state.hidden) - most
    if extra > 0:
        del state.hidden[:extra]


@torch.inference_mode()
def propose_ref(head: MTPHead, tokens: Sequence[int], k: int) -> list[int]:
    """`MTPDrafter`'s drafts for a sequence computed from scratch, the pure reference:
    the target's hidden states of every consumed position (tokens[:-1]) from one fresh
    prefill, then for each draft every entry (the true ones and the drafted ones so far)
    run again through the layers with empty KV; no cursor, no rollback, no gaps."""
    ids, hidden = entries_ref(head, tokens)
    drafts: list[int] = []
    for _ in range(k):
        logits, out = head.prefill(ids, hidden, torch.arange(len(ids)), head.new_kv())
        drafts.append(int(torch.argmax(logits[-1])))
        ids = torch.cat([ids, torch.tensor([drafts[-1]])])
        hidden = torch.cat([hidden, out[-1:]])
    return drafts


@torch.inference_mode()
def entries_ref(head: MTPHead, tokens: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact entries of a sequence from scratch: ids [n - 1] (tokens[1:]) and the
    target's normed hidden states [n - 1, D] of positions 0 .. n - 2 (one fresh prefill
    of tokens[:-1])."""
    model = head.target
    seq = torch.as_tensor(list(tokens), dtype=torch.long)
    x, _, _ = model._prefill_hidden(seq[:-1], model.new_state(), [])
    return seq[1:], model.normed(x)
