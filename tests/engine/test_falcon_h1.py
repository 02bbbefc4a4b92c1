"""FalconH1 (attention and Mamba-2 in parallel in every layer, muP multipliers): the engine
against transformers on the same random fp32 weights, through the real serving path
(`Engine` with the Marconi cache), resumption from states at any depth, batched decode,
and the Mamba-2 norm and bias options a FalconH1 config may set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_helpers import hf_logits, hf_model, prompts
from family_checks import check_greedy_and_second_turn, check_resume_at_depths

from marconi_ray.engine.model.hybrid_model import HybridModel
from marconi_ray.engine.model.layers.linear import row
from marconi_ray.engine.model.loader import load_model, read_config
from marconi_ray.engine.model.parallel import Segment, TPGroup
from marconi_ray.engine.presets.byte_tokenizer import BYTE_OFFSET, BYTE_VOCAB_SIZE
from marconi_ray.engine.presets.factory import (
    MAX_STRAY_PROB,
    MAX_TEMPERATURE,
    PRINTABLE_IDS,
    build_model,
)
from marconi_ray.engine.presets.model_presets import FALCON_MULTIPLIERS

MULTIPLIERS = {k: list(v) if isinstance(v, tuple) else v for k, v in FALCON_MULTIPLIERS.items()}
"""The preset's multipliers as config keyword arguments (lists, not tuples)."""


def test_tiny_preset_runs_parallel_groups_with_multipliers(model_dirs):
    """Each layer is one (attention, Mamba-2) group led by the input norm, then the MLP;
    the preset's multipliers reach the configs and the weights they are folded into."""
    model = load_model(model_dirs["falcon_h1"])
    cfg = model.cfg
    assert cfg.blocks[:3] == ("attention", "mamba2", "mlp") and cfg.parallel_mixers
    assert model.groups[:2] == ((0, 1), (2,)) and len(model.groups) == 2 * cfg.hf_layer[-1] + 2
    assert model.layers[1].norm is None and model.layers[0].norm is not None
    assert cfg.mamba2 is not None and cfg.mamba2.in_proj_scales == tuple(
        FALCON_MULTIPLIERS["ssm_multipliers"]
    )
    assert cfg.scales.embedding == FALCON_MULTIPLIERS["embedding_multiplier"]
    specs = model.weight_specs()
    assert specs["blocks.1.mixer.in_proj.weight"].scales == tuple(
        FALCON_MULTIPLIERS["ssm_in_multiplier"] * m for m in FALCON_MULTIPLIERS["ssm_multipliers"]
    )
    assert specs["blocks.0.mixer.o.weight"].scales == (
        FALCON_MULTIPLIERS["attention_out_multiplier"],
    )
    assert specs["blocks.2.mixer.up.weight"].scales == ()


def test_greedy_and_cached_second_turn_equal_transformers(model_dirs):
    """See `family_checks.check_greedy_and_second_turn`."""
    check_greedy_and_second_turn(model_dirs["falcon_h1"])


def test_resume_from_states_at_any_depth_equals_uncached(model_dirs):
    """Resuming from KV slices and the conv and SSM states of every layer at any depth
    (see `family_checks.check_resume_at_depths`)."""
    model = check_resume_at_depths(model_dirs["falcon_h1"])
    assert len(model.attn_blocks) == len(model.ssm_blocks) > 0


def _falcon_dir(out: Path, **options: Any) -> Path:
    """A 2-layer FalconH1 with the preset's multipliers, `options`, and random (non-zero,
    non-one) biases and norm weights, saved with transformers."""
    from transformers import FalconH1Config, FalconH1ForCausalLM

    cfg = FalconH1Config(
        vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=96, mamba_d_ssm=128, mamba_n_heads=4,
        mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_chunk_size=16,
        initializer_range=0.2, **MULTIPLIERS, **options,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = FalconH1ForCausalLM(cfg).eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.normal_(0.0, 0.3)
                elif "norm" in name:
                    p.uniform_(0.5, 1.5)
    model.save_pretrained(out)
    return out


@pytest.mark.parametrize(
    "options",
    [
        {"mamba_rms_norm": True, "mamba_norm_before_gate": False},
        {
            "mamba_rms_norm": True,
            "mamba_norm_before_gate": True,
            "attention_bias": True,
            "mlp_bias": True,
            "mamba_proj_bias": True,
            "projectors_bias": True,
        },
    ],
    ids=["gated-norm", "norm-before-gate-and-biases"],
)
def test_mamba_norm_options_and_biases_equal_transformers(tmp_path, options):
    """The gated RMSNorm (after or before the gate) and biases on every projection, with
    the multipliers folded into them: prefill logits equal transformers'."""
    model_dir = _falcon_dir(tmp_path, **options)
    ids = prompts(34, 1, 40, 300)[0]
    ref = hf_logits(hf_model(model_dir), ids)
    got = load_model(model_dir).forward_logits(torch.tensor(ids))
    assert ref.std() > 0.1
    assert (got - ref).abs().max().item() <= 1e-4


def test_multipliers_change_the_output(tmp_path):
    """The same weights with every multiplier set to 1 give other logits, so the
    comparisons above check them."""
    model_dir = _falcon_dir(tmp_path)
    ids = torch.tensor(prompts(35, 1, 20, 300)[0])
    with_mup = load_model(model_dir).forward_logits(ids)
    path = model_dir / "config.json"
    raw = json.loads(path.read_text())
    for key, value in MULTIPLIERS.items():
        assert raw[key] == value
        raw[key] = [1.0] * len(value) if isinstance(value, list) else 1.0
    path.write_text(json.dumps(raw))
    without = load_model(model_dir).forward_logits(ids)
    assert (with_mup - without).abs().max().item() > 0.1


def test_tensor_parallel_group_takes_one_all_reduce(model_dirs, monkeypatch):
    """A rank of 2 all-reduces once per (attention, Mamba-2) group and once per MLP: the
    two mixers' partial outputs are summed before the all-reduce."""
    cfg = read_config(model_dirs["falcon_h1"])[0]
    calls: list[tuple[int, ...]] = []

    def count(self: TPGroup, x: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(x.shape))
        return x

    monkeypatch.setattr(TPGroup, "all_reduce", count)
    shard = HybridModel(cfg, TPGroup(0, 2))  # only the collectives matter, not the values
    with torch.no_grad():
        for p in shard.parameters():
            p.normal_(0.0, 0.02)
    shard.forward_logits(torch.arange(3, 10))
    assert calls == [(7, cfg.hidden_size)] * 2 * (cfg.hf_layer[-1] + 1)


def test_row_parallel_partial_sums_carry_the_bias_once():
    """reduce=False: rank 0's partial product has the bias, rank 1's not, so the sum the
    caller all-reduces equals the full layer (folded output multiplier included)."""
    torch.manual_seed(0)
    full = torch.randn(6, 8)
    bias = torch.randn(6)
    x = torch.randn(3, 8)
    parts = []
    for rank in range(2):
        tp = TPGroup(rank, 2)
        layer = row((Segment(8),), 6, True, "o_proj", tp, torch.float32, False, 0.5)
        specs = layer.weight_specs()
        assert specs["weight"].scales == specs["bias"].scales == (0.5,)
        with torch.no_grad():
            layer.weight.copy_(full[:, 4 * rank : 4 * rank + 4] * 0.5)
            layer.bias.copy_(bias * 0.5)
        parts.append(layer(x[:, 4 * rank : 4 * rank + 4]))  # this rank's input slice
    torch.testing.assert_close(parts[0] + parts[1], (x @ full.T + bias) * 0.5)
    torch.testing.assert_close(parts[1], x[:, 4:] @ full[:, 4:].T * 0.5)


def test_lift_survives_the_output_multipliers():
    """The factory divides the LM head by lm_head_multiplier and the lift bias by the last
    down multiplier: at the API's highest temperature the non-printable ids stay
    negligible and their logits exactly 0 (the full sampled-text check runs for other
    families in test_no_replacement_char; it passed for falcon_h1 too but costs ~25 s)."""
    model = build_model("tiny", "falcon_h1", seed=1)
    g = torch.Generator().manual_seed(4)
    prompt = torch.randint(BYTE_OFFSET, BYTE_VOCAB_SIZE, (1, 48), generator=g)
    with torch.no_grad():
        logits = model(input_ids=prompt).logits[0].double()
    keep = torch.zeros(logits.shape[-1], dtype=torch.bool)
    keep[list(PRINTABLE_IDS)] = True
    stray = torch.softmax(logits / MAX_TEMPERATURE, dim=-1)[:, ~keep].sum(-1)
    assert float(stray.max()) <= MAX_STRAY_PROB
    assert bool((logits[:, ~keep] == 0).all()) and bool(keep[logits.argmax(-1)].all())
