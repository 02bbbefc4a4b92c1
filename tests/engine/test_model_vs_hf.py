"""Our hybrid model against transformers' implementation of the same random weights."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import hf_logits, hf_model, prompts

from marconi_ray.engine.model.loader import load_model

FAMILIES = ("nemotron_h", "bamba", "jamba")
TOL = 1e-4


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("length", [1, 16, 45])
def test_logits_match_transformers(model_dirs, family, length):
    ref_model = hf_model(model_dirs[family])
    ours = load_model(model_dirs[family])
    ids = prompts(length, 1, length, ours.cfg.vocab_size)[0]
    ref = hf_logits(ref_model, ids)
    got = ours.forward_logits(torch.tensor(ids))
    assert got.shape == ref.shape
    assert ref.std() > 0.5, "weights should give separated logits"
    assert (got - ref).abs().max().item() <= TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_checkpoint_logits_and_resume_match_one_pass(model_dirs, family):
    """Prefill in two calls with checkpoints at chunk-aligned and unaligned depths: each
    checkpoint's logits equal the reference logits at that position."""
    ours = load_model(model_dirs[family])
    ids = prompts(7, 1, 70, ours.cfg.vocab_size)[0]
    ref = hf_logits(hf_model(model_dirs[family]), ids)
    state = ours.new_state()
    first = ours.prefill(torch.tensor(ids[:37]), state, [1, 16, 32, 37])
    second = ours.prefill(torch.tensor(ids[37:]), state, [38, 64, 69, 70])
    for ckpt in first + second:
        assert (ckpt.logits - ref[ckpt.depth - 1]).abs().max().item() <= TOL, ckpt.depth
    assert state.length == 70
    assert (state.logits - ref[-1]).abs().max().item() <= TOL


def test_emit_at_out_of_range_is_rejected(model_dirs):
    ours = load_model(model_dirs["nemotron_h"])
    state = ours.new_state()
    with pytest.raises(ValueError, match="emit_at"):
        ours.prefill(torch.tensor([5, 6, 7]), state, [4])
    assert state.length == 0
