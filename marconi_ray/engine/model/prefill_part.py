"""`PrefillPart`: one request's chunk in a forward that prefills several requests
(`HybridModel.prefill_many`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from marconi_ray.engine.model.seq_state import SeqState


@dataclass(frozen=True)
class PrefillPart:
    """`ids` [L] consumed after `state.length` tokens, updating `state` in place.

    Attributes:
        emit_at: absolute depths d, state.length < d <= state.length + L, sorted: the
            SSM states and next-token logits after each are returned as checkpoints.
        scored: also return the next-token logits at every position of the chunk (prompt
            log-probabilities), [L, V].
    """

    ids: torch.Tensor
    state: SeqState
    emit_at: tuple[int, ...] = ()
    scored: bool = False
