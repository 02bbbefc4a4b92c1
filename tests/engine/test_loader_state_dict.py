"""Loading from an in-memory state dict (what the GPU check does with a 7B model) gives
the same model as loading the folder's safetensors, and its errors name the key."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import hf_model, prompts

from marconi_ray.engine.model.loader import load_model


@pytest.mark.parametrize("family", ["nemotron_h", "jamba"])
def test_state_dict_weights_equal_folder_weights(model_dirs, family):
    """The state dict in checkpoint layout: transformers 5 keeps a MoE's experts fused
    in memory (Jamba's `experts.gate_up_proj`) and writes them per expert, so the
    in-memory dict goes through its save-time conversion first."""
    from transformers.core_model_loading import revert_weight_conversion

    folder = load_model(model_dirs[family])
    ref = hf_model(model_dirs[family])
    weights = revert_weight_conversion(ref, ref.state_dict())
    in_memory = load_model(model_dirs[family], weights=weights)
    ids = torch.tensor(prompts(1, 1, 20, folder.cfg.vocab_size)[0])
    assert torch.equal(folder.forward_logits(ids), in_memory.forward_logits(ids))


def test_state_dict_missing_or_extra_weight_is_named(model_dirs):
    weights = dict(hf_model(model_dirs["nemotron_h"]).state_dict())
    key = next(k for k in weights if k.endswith("A_log"))
    with pytest.raises(ValueError, match=r"surplus\.weight"):
        load_model(model_dirs["nemotron_h"], weights={**weights, "surplus.weight": weights[key]})
    del weights[key]
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        load_model(model_dirs["nemotron_h"], weights=weights)
