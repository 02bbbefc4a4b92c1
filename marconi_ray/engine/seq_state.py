"""`SeqState`: everything one sequence carries between forward calls, on one TP rank."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from marconi_ray.engine.kv_buffer import KVBuffer


@dataclass
class SeqState:
    """The model's cache for one sequence after its first `length` tokens.

    Attributes:
        length: tokens already consumed.
        kv: block index -> keys/values of every consumed token (attention blocks).
        conv: block index -> conv state [conv_local, d_conv] (SSM blocks).
        ssm: block index -> recurrent state, float32 (SSM blocks).
        logits: [vocab] logits after the last consumed token (None before any token).
    """

    length: int = 0
    kv: dict[int, KVBuffer] = field(default_factory=dict)
    conv: dict[int, torch.Tensor] = field(default_factory=dict)
    ssm: dict[int, torch.Tensor] = field(default_factory=dict)
    logits: torch.Tensor | None = None


@dataclass(frozen=True)
class StateCheckpoint:
    """The SSM states and the next-token logits after the first `depth` tokens.

    conv/ssm map SSM block index -> tensor (same shapes as in `SeqState`).
    """

    depth: int
    conv: dict[int, torch.Tensor]
    ssm: dict[int, torch.Tensor]
    logits: torch.Tensor
