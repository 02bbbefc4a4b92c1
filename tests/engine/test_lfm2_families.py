"""LFM2 and LFM2-MoE: the engine against transformers on the same random fp32 weights,
through the real serving path (`Engine` with the Marconi cache), and resumption from
short-conv states (the conv window, the layer's only state) at any depth."""

from __future__ import annotations

import pytest
import torch
from family_checks import check_greedy_and_second_turn, check_resume_at_depths, twin_batch

from marconi_ray.engine.model.hybrid_model import HybridModel
from marconi_ray.engine.model.layers.short_conv import ShortConvMixer
from marconi_ray.engine.model.loader import load_model
from marconi_ray.engine.model.seq_state import SeqState, StateCheckpoint
from marconi_ray.engine.presets.model_presets import LFM2_FAMILIES


@pytest.mark.parametrize("family", LFM2_FAMILIES)
def test_greedy_and_cached_second_turn_equal_transformers(model_dirs, family):
    """See `family_checks.check_greedy_and_second_turn`."""
    engine = check_greedy_and_second_turn(model_dirs[family])
    assert "shortconv" in engine.config.blocks and "attention" in engine.config.blocks


def _conv_window_only(model: HybridModel, ck: StateCheckpoint, resumed: SeqState) -> None:
    """A short-conv state is the last K inputs of the conv (zero-padded before the first
    token), and nothing else."""
    i = model.ssm_blocks[0]
    k = model.cfg.shortconv.d_conv  # type: ignore[union-attr]
    assert ck.conv[i].shape == (model.cfg.hidden_size, k) and ck.ssm[i].numel() == 0
    assert bool((ck.conv[i][:, : max(0, k - ck.depth)] == 0).all()), ck.depth


@pytest.mark.parametrize("family", LFM2_FAMILIES)
def test_resume_from_states_at_any_depth_equals_uncached(model_dirs, family):
    """Resuming from KV slices and conv windows at any depth (see
    `family_checks.check_resume_at_depths`)."""
    check_resume_at_depths(model_dirs[family], on_checkpoint=_conv_window_only)


def test_decode_batch_holds_each_sequence_state_once(model_dirs):
    """Short-conv states in the persistent decode batch: the conv windows are views of its
    rows (one copy each, none per step), the empty ssm rows hold no bytes, and batched
    decode equals the stacking one."""
    model = load_model(model_dirs["lfm2_moe"])
    assert all(isinstance(model.ssm(i), ShortConvMixer) for i in model.ssm_blocks)
    a, b, batch = twin_batch(model, (2, 20, 33), seed=4)
    i = model.ssm_blocks[0]
    assert batch.ssm[i].numel() == 0
    per_seq = batch.conv[i][0].numel() * batch.conv[i].element_size()
    assert batch.conv[i].numel() * batch.conv[i].element_size() == batch.capacity * per_seq
    ptrs = [st.conv[i].data_ptr() for st in b]
    for _ in range(3):
        ids = torch.tensor([int(st.logits.argmax()) for st in a])
        torch.testing.assert_close(
            model.decode_batch(ids, batch), model.decode(ids, a), atol=1e-5, rtol=0
        )
    assert [st.conv[i].data_ptr() for st in b] == ptrs
    batch.leave(b[1])
    batch.check()
    assert torch.equal(b[1].conv[i], a[1].conv[i])
