"""The persistent decode batch: members keep their SSM states in preallocated rows (views,
updated in place by each step, never stacked or copied), joins and leaves keep the rows
compact, and decoding through it equals the stacking decode."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import prompts
from family_checks import check_batched_decode

from marconi_ray.engine.model.loader import load_model
from marconi_ray.engine.presets.model_presets import FAMILIES


def _prefilled(model, seeds):
    states = []
    for seed in seeds:
        st = model.new_state()
        model.prefill(torch.tensor(prompts(seed, 1, 12 + seed, model.cfg.vocab_size)[0]), st)
        states.append(st)
    return states


def test_decode_batch_equals_stacked_decode_and_updates_in_place(model_dirs):
    model = load_model(model_dirs["nemotron_h"])
    batch = model.new_decode_batch(4)
    a, b = _prefilled(model, [1, 2, 3]), _prefilled(model, [1, 2, 3])
    for st in b:
        batch.join(st)
    batch.check()
    ptrs = [st.ssm[model.ssm_blocks[0]].data_ptr() for st in b]
    for _ in range(3):
        ids = torch.tensor([int(st.logits.argmax()) for st in a])
        want = model.decode(ids, a)
        got = model.decode_batch(ids, batch)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert [st.ssm[model.ssm_blocks[0]].data_ptr() for st in b] == ptrs, "no copies per step"
    for x, y in zip(a, b, strict=True):
        assert x.length == y.length
        for i in model.ssm_blocks:
            torch.testing.assert_close(x.ssm[i], y.ssm[i], atol=1e-5, rtol=0)


def test_leave_moves_the_last_row_and_detaches_the_leaver(model_dirs):
    model = load_model(model_dirs["jamba"])
    batch = model.new_decode_batch(3)
    states = _prefilled(model, [4, 5, 6])
    for st in states:
        batch.join(st)
    i = model.ssm_blocks[0]
    last_before = states[2].ssm[i].clone()
    batch.leave(states[0])
    batch.check()
    assert batch.members == [states[2], states[1]]
    torch.testing.assert_close(batch.ssm[i][0], last_before)
    own = states[0].ssm[i]
    batch.ssm[i].zero_()
    assert own.abs().sum() > 0, "the leaver owns a copy"
    batch.join(states[0])
    batch.check()
    assert len(batch) == 3


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_decodes_a_batch_as_one_by_one(model_dirs, family):
    """See `family_checks.check_batched_decode`: every served family's recurrent states
    (Mamba-1/2, Gated DeltaNet, short conv) and KV (attention, Zamba2's shared block) in
    one persistent decode batch."""
    check_batched_decode(model_dirs[family])
