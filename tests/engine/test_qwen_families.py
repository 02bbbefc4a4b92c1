"""Qwen3.5 (dense, MoE, text-only and multimodal) and Qwen3-Next: the engine against
transformers on the same random fp32 weights, through the real serving path (`Engine`
with the Marconi cache), and resumption from Gated DeltaNet states at any depth."""

from __future__ import annotations

import pytest
import torch
from family_checks import check_greedy_and_second_turn, check_resume_at_depths, twin_batch

from marconi_ray.engine.model.loader import load_model
from marconi_ray.engine.presets.model_presets import QWEN_FAMILIES


@pytest.mark.parametrize("family", QWEN_FAMILIES)
def test_greedy_and_cached_second_turn_equal_transformers(model_dirs, family):
    """See `family_checks.check_greedy_and_second_turn`."""
    check_greedy_and_second_turn(model_dirs[family], seeds=(21, 22))


@pytest.mark.parametrize("family", ["qwen3_5_text", "qwen3_5_moe_text", "qwen3_next"])
def test_resume_from_states_at_any_depth_equals_uncached(model_dirs, family):
    """Resuming from conv and delta-rule states at any depth (see
    `family_checks.check_resume_at_depths`)."""
    check_resume_at_depths(model_dirs[family], seed=23)


def test_decode_batch_holds_each_sequence_state_once(model_dirs):
    """Gated DeltaNet states in the persistent decode batch: members' states are views of
    its rows (one copy each, none per step), and batched decode equals the stacking one."""
    model = load_model(model_dirs["qwen3_next"])
    a, b, batch = twin_batch(model, (12, 20, 33), seed=3)
    i = model.ssm_blocks[0]
    per_seq = sum(t[0].numel() * t.element_size() for t in (batch.conv[i], batch.ssm[i]))
    held = sum(t.numel() * t.element_size() for t in (batch.conv[i], batch.ssm[i]))
    assert held == batch.capacity * per_seq
    ptrs = [st.ssm[i].data_ptr() for st in b]
    for _ in range(3):
        ids = torch.tensor([int(st.logits.argmax()) for st in a])
        torch.testing.assert_close(
            model.decode_batch(ids, batch), model.decode(ids, a), atol=1e-5, rtol=0
        )
    assert [st.ssm[i].data_ptr() for st in b] == ptrs
    batch.check()


def test_vision_weights_are_skipped_with_a_log_line(model_dirs, caplog):
    """The multimodal checkpoint's vision tower is saved but not loaded; the log says so,
    and its language model equals the text-only family's on the same prompt layout."""
    with caplog.at_level("INFO", logger="marconi_ray.engine.model.loader"):
        model = load_model(model_dirs["qwen3_5"])
    assert any("model.visual.*" in r.getMessage() for r in caplog.records)
    assert model.cfg.family == "qwen3_5" and model.cfg.weights_prefix == "model.language_model."
    assert not any("visual" in name for name, _ in model.named_parameters())
