"""Property: for any prompt and any split into cached prefix + rest, resuming is exact.

Hypothesis draws a prompt, a set of checkpoint depths and a resume depth; the model
prefills once emitting states at those depths, then a fresh sequence resumed from the
chosen checkpoint (KV slice + SSM states + logits) must produce the same next-token
logits (within fp32 rounding) and the same greedy continuation as the one-pass run."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from marconi_ray.engine.model.kv_buffer import KVBuffer
from marconi_ray.engine.model.loader import load_model
from marconi_ray.engine.model.seq_state import SeqState


@pytest.fixture(scope="module")
def bamba(model_dirs):
    return load_model(model_dirs["bamba"])


@st.composite
def cases(draw):
    n = draw(st.integers(2, 70))
    ids = draw(st.lists(st.integers(7, 262), min_size=n, max_size=n))
    depths = sorted(draw(st.sets(st.integers(1, n - 1), min_size=1, max_size=4)))
    resume = draw(st.sampled_from(depths))
    return ids, depths, resume


@settings(max_examples=25, deadline=None)
@given(case=cases())
def test_resume_anywhere_matches_one_pass(bamba, case):
    ids, depths, resume = case
    model = bamba
    full = model.new_state()
    ckpts = {c.depth: c for c in model.prefill(torch.tensor(ids), full, depths)}
    ck = ckpts[resume]
    state = SeqState(length=resume, logits=ck.logits)
    for i in model.attn_blocks:
        k, v = full.kv[i].view()
        state.kv[i] = KVBuffer(k[:, :resume].clone(), v[:, :resume].clone())
    state.conv = {i: t.clone() for i, t in ck.conv.items()}
    state.ssm = {i: t.clone() for i, t in ck.ssm.items()}
    model.prefill(torch.tensor(ids[resume:]), state)
    assert state.logits is not None and full.logits is not None
    assert (state.logits - full.logits).abs().max().item() <= 1e-4
    for _ in range(3):
        a, b = int(full.logits.argmax()), int(state.logits.argmax())
        assert a == b
        model.decode(torch.tensor([a]), [full])
        model.decode(torch.tensor([b]), [state])
