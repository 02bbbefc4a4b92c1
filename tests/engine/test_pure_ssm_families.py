"""Mamba, Falcon-Mamba and Mamba-2: the pure state-space families (no attention, no KV)
against transformers on the same random fp32 weights, through the real serving path
(`Engine` with the Marconi cache), and resumption from their states at any depth."""

from __future__ import annotations

import pytest
from family_checks import (
    check_batched_decode,
    check_greedy_and_second_turn,
    check_logits_equal_transformers,
    check_resume_at_depths,
)

from marconi_ray.engine.presets.model_presets import PURE_SSM_FAMILIES


@pytest.mark.parametrize("family", PURE_SSM_FAMILIES)
def test_greedy_and_cached_second_turn_equal_transformers(model_dirs, family):
    """See `family_checks.check_greedy_and_second_turn`; the model keeps no KV, so the
    cache holds states only."""
    engine = check_greedy_and_second_turn(model_dirs[family])
    assert "attention" not in engine.config.blocks
    assert engine.model.attn_blocks == []


@pytest.mark.parametrize("family", PURE_SSM_FAMILIES)
def test_logits_equal_transformers(model_dirs, family):
    """See `family_checks.check_logits_equal_transformers`."""
    check_logits_equal_transformers(model_dirs[family])


@pytest.mark.parametrize("family", PURE_SSM_FAMILIES)
def test_resume_from_states_at_any_depth_equals_uncached(model_dirs, family):
    """Resuming from the conv and SSM states alone at any depth (see
    `family_checks.check_resume_at_depths`)."""
    model = check_resume_at_depths(model_dirs[family])
    assert model.kv_shapes() == {}


@pytest.mark.parametrize("family", PURE_SSM_FAMILIES)
def test_batched_decode_equals_each_sequence(model_dirs, family):
    """See `family_checks.check_batched_decode`."""
    check_batched_decode(model_dirs[family])
