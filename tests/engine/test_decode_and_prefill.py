"""`HybridModel.decode_and_prefill`: a decode step and several parts' prefills in one
forward (speculative verifications batched with plain decoding) give what
`decode_batch` and `prefill_many` give apart: the same next-token logits, emitted
states, SSM states in the decode batch's rows and keys and values in the pool.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from marconi_ray.engine.model.hybrid_model import HybridModel
from marconi_ray.engine.model.loader import load_model
from marconi_ray.engine.model.paged_kv import ScratchKV
from marconi_ray.engine.model.prefill_part import PrefillPart
from marconi_ray.engine.model.seq_state import SeqState

FAMILIES = ("nemotron_h", "qwen3_5", "lfm2", "zamba2", "falcon_h1", "jamba", "minimax", "xlstm")
LENGTHS = (9, 14, 11, 6)
"""Prompt lengths: the first two decode one token, the last two prefill 4 and 3 more."""
ROWS = 64


def _setup(model: HybridModel) -> tuple[Any, ...]:
    """Four sequences prefilled into a fresh pool; the first two join a decode batch
    extended with the step's rows, the last two get parts of 4 and 3 new tokens."""
    pool = ScratchKV(model.kv_shapes(), ROWS, model.dtype, model.device)
    states, at = [], 0
    for n, seed in zip(LENGTHS, range(4), strict=True):
        ids = (torch.arange(n) * (seed + 3) + 7) % model.cfg.vocab_size
        state = SeqState(rows=torch.arange(at, at + n))
        at += n
        model.prefill(ids, state, (), pool)
        states.append(state)
    batch = model.new_decode_batch(4, pool)
    for state in states[:2]:
        batch.join(state)
    batch.extend(torch.arange(at, at + 2))
    at += 2
    parts = []
    for state, n in zip(states[2:], (4, 3), strict=True):
        state.rows = torch.cat([state.rows, torch.arange(at, at + n)])
        at += n
        emit = tuple(range(state.length + 1, state.length + n + 1))
        parts.append(PrefillPart(torch.arange(n) + 20, state, emit))
    ids = torch.tensor([5, 17])
    return pool, batch, states, parts, ids


@pytest.mark.parametrize("family", FAMILIES)
def test_one_forward_equals_the_two(model_dirs: dict[str, Path], family: str) -> None:
    model = load_model(model_dirs[family])
    pool_a, batch_a, states_a, parts_a, ids = _setup(model)
    logits_a = model.decode_batch(ids, batch_a)
    results_a = model.prefill_many(parts_a, pool_a)
    pool_b, batch_b, states_b, parts_b, _ = _setup(model)
    logits_b, results_b = model.decode_and_prefill(ids, batch_b, parts_b)

    close = {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(logits_b, logits_a, **close)
    for (ckpts_a, lg_a), (ckpts_b, lg_b) in zip(results_a, results_b, strict=True):
        torch.testing.assert_close(lg_b, lg_a, **close)
        assert [c.depth for c in ckpts_b] == [c.depth for c in ckpts_a]
        for ca, cb in zip(ckpts_a, ckpts_b, strict=True):
            for i in model.ssm_blocks:
                torch.testing.assert_close(cb.ssm[i], ca.ssm[i], **close)
                torch.testing.assert_close(cb.conv[i], ca.conv[i], **close)
    assert [s.length for s in states_b] == [s.length for s in states_a]
    for i in model.ssm_blocks:
        for a, b in zip(batch_a.rows(i), batch_b.rows(i), strict=True):
            torch.testing.assert_close(b, a, **close)
    for i in model.attn_blocks:
        torch.testing.assert_close(pool_b.k[i], pool_a.k[i], **close)
        torch.testing.assert_close(pool_b.v[i], pool_a.v[i], **close)


def test_an_unpooled_batch_is_refused(model_dirs: dict[str, Path]) -> None:
    model = load_model(model_dirs["nemotron_h"])
    with pytest.raises(ValueError, match="pooled decode batch"):
        model.decode_and_prefill(torch.tensor([1]), model.new_decode_batch(1), [])
