"""`Sequence`: one in-flight request inside the engine (prompt, plan, model state, output)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import torch

from marconi_ray.core.prefix_cache import Plan
from marconi_ray.engine.sampling import SamplingParams
from marconi_ray.engine.seq_state import SeqState


@dataclass
class Sequence:
    """Engine-internal bookkeeping of one request, from plan to commit.

    Attributes:
        state_ids: depth -> store state id of every checkpoint captured so far.
        capture: decode depths whose state the admission policy wants if reached.
        finishing: the last token is sampled; one more decode step consumes it so the
            state after the whole sequence can be checkpointed.
    """

    request_id: int
    prompt: npt.NDArray[np.int32]
    params: SamplingParams
    plan: Plan
    state: SeqState
    generator: torch.Generator | None
    max_new: int
    capture: set[int]
    started: float = field(default_factory=time.perf_counter)
    output: list[int] = field(default_factory=list)
    state_ids: dict[int, int] = field(default_factory=dict)
    first_token_at: float | None = None
    prefill_s: float = 0.0
    decode_s: float = 0.0
    finish_reason: str | None = None
    finishing: bool = False

    @property
    def n_total(self) -> int:
        return len(self.prompt) + len(self.output)

    def tokens(self) -> npt.NDArray[np.int32]:
        """Prompt + output so far."""
        return np.concatenate([self.prompt, np.asarray(self.output, dtype=np.int32)])
