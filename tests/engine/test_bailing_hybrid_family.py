"""Ling hybrid (`bailing_hybrid`: KDA with full-rank, bounded gates + MLA with RoPE and a
per-head gate + MoE): the engine against transformers on the same random fp32 weights
(logits, then greedy tokens through the real serving path with the Marconi cache),
resumption from the states emitted at any depth, batched decode, what the store holds
against the cost model, and that each of Ling's differences from Kimi Linear moves the
logits far past the comparison's tolerance (so the logits check would see it wrong)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from engine_helpers import hf_model, prompts
from family_checks import (
    HF_LOGIT_TOL,
    PROMPT_LEN,
    check_batched_decode,
    check_greedy_and_second_turn,
    check_logits_equal_transformers,
    check_resume_at_depths,
)
from kda_mla_checks import check_packed_prefill_on_the_pool, check_tp2_equals_tp1
from safetensors.torch import load_file

from marconi_ray.core.model.hf.parse import spec_from_hf_config
from marconi_ray.engine.engine import Engine
from marconi_ray.engine.model.hybrid_model import HybridModel
from marconi_ray.engine.model.layers.kda import KDAMixer
from marconi_ray.engine.model.layers.mla import MLAttention
from marconi_ray.engine.model.loader import read_config
from marconi_ray.engine.model.seq_state import SeqState, StateCheckpoint

FAMILY = "bailing_hybrid"
MIN_MOVE = 10 * HF_LOGIT_TOL
"""How far (max |logit difference|) dropping one of Ling's pieces must move the logits."""


def test_logits_equal_transformers(model_dirs):
    """The tiny preset is K K K A (dense first feed-forward, then MoE); KDA with the safe
    gate and full-rank projections, MLA with RoPE and the head gate."""
    model = check_logits_equal_transformers(model_dirs[FAMILY])
    assert model.cfg.pattern == "K-KEKEAE"
    kda, mla = model.cfg.kda, model.cfg.mla
    assert kda is not None and not kda.low_rank_gates and kda.gate_lower_bound == -5.0
    assert mla is not None and mla.head_gate and mla.rope_theta is not None


def _drop_safe_gate(m: Any) -> None:
    for layer in m.model.layers:
        gate = getattr(layer.self_attn, "forget_gate", None)
        if gate is not None:
            gate.safe_gate = False


def _drop_rope(m: Any) -> None:
    m.model.rotary_emb.inv_freq.zero_()


def _drop_head_gate(m: Any) -> None:
    m.model.layers[-1].self_attn.g_proj.weight.zero_()


def _drop_mla(m: Any) -> None:
    m.model.layers[-1].self_attn.o_proj.weight.zero_()


def _drop_kda(m: Any) -> None:
    for layer in m.model.layers[:-1]:
        layer.self_attn.o_proj.weight.zero_()


def _drop_experts(m: Any) -> None:
    for layer in m.model.layers[1:]:
        layer.mlp.experts.down_proj.zero_()


def _drop_shared_experts(m: Any) -> None:
    for layer in m.model.layers[1:]:
        layer.mlp.shared_experts.down_proj.weight.zero_()


def test_each_piece_moves_the_logits(model_dirs):
    """transformers' model with one piece removed at a time (the KDA safe gate made
    Kimi's, MLA's RoPE, its head gate, the MLA or KDA layers, the routed or shared
    experts) gives logits more than `MIN_MOVE` away from the intact model's: the engine's
    logit check (within `HF_LOGIT_TOL`) could not pass with that piece wrong."""
    d = model_dirs[FAMILY]
    ids = torch.tensor([prompts(30, 1, PROMPT_LEN, 512)[0]])

    def logits(change: Callable[[Any], None] | None) -> torch.Tensor:
        model = hf_model(d)
        with torch.no_grad():
            if change is not None:
                change(model)
            return model(input_ids=ids).logits[0]

    base = logits(None)
    drops = (_drop_safe_gate, _drop_rope, _drop_head_gate, _drop_mla, _drop_kda,
             _drop_experts, _drop_shared_experts)  # fmt: skip
    moves = {f.__name__: (logits(f) - base).abs().max().item() for f in drops}
    assert min(moves.values()) > MIN_MOVE, moves


def test_greedy_and_second_turn_equal_transformers(model_dirs):
    check_greedy_and_second_turn(model_dirs[FAMILY])


def _kda_states(model: HybridModel, ck: StateCheckpoint, resumed: SeqState) -> None:
    """A KDA state is its conv window over [q, k, v] and the float32 delta-rule state; the
    MLA block keeps its rotated latent rows, one per token."""
    for i in model.ssm_blocks:
        mixer = model.ssm(i)
        assert isinstance(mixer, KDAMixer)
        conv, ssm = mixer.empty_state(torch.device("cpu"))
        assert ck.conv[i].shape == conv.shape and ck.ssm[i].shape == ssm.shape
        assert ck.ssm[i].dtype == torch.float32
    assert len(resumed.kv) == 1 and resumed.kv[model.attn_blocks[0]].length == ck.depth


def test_resume_from_states_at_any_depth_equals_uncached(model_dirs):
    check_resume_at_depths(model_dirs[FAMILY], on_checkpoint=_kda_states)


def test_batched_decode_equals_each_sequence_alone(model_dirs):
    check_batched_decode(model_dirs[FAMILY])


def test_store_bytes_equal_the_cost_model(model_dirs):
    """Per token the store holds MLA's latent and rotated key part; per state each KDA
    block's conv window and float32 state: exactly the cost model's figures."""
    cfg, raw = read_config(model_dirs[FAMILY])
    engine = Engine(model_dirs[FAMILY], system="marconi", cache_bytes=10**7)
    spec = spec_from_hf_config(raw, dtype_bytes=4, state_dtype_bytes=4)
    store = engine.store
    mla, k = cfg.mla, cfg.kda
    assert mla is not None and k is not None
    assert store.kv_bytes_per_token == spec.kv_bytes_per_token == 4 * mla.cache_width
    per_block = 4 * (k.conv_dim * k.d_conv + k.n_heads * k.head_dim**2)
    assert store.state_bytes == spec.ssm_state_bytes == len(cfg.layers_of("kda")) * per_block
    attn = engine.worker.model.attention(engine.worker.model.attn_blocks[0])
    assert isinstance(attn, MLAttention) and attn.g_proj is not None


def test_checkpoint_uses_lings_names(model_dirs):
    """transformers writes Ling's own layout (what the engine reads): `word_embeddings`,
    `attention.dense`, three KDA convs, the forget gate's `f_proj` / `A_log` [H] beside
    them, the router's `expert_bias`."""
    keys = load_file(str(model_dirs[FAMILY] / "model.safetensors"))
    assert "model.word_embeddings.weight" in keys
    layer0, layer3 = "model.layers.0.attention.", "model.layers.3.attention."
    for name in ("q_conv1d.weight", "f_proj.weight", "g_proj.weight", "dense.weight"):
        assert layer0 + name in keys
    assert keys[layer0 + "A_log"].dim() == 1
    assert layer3 + "dense.bias" in keys and layer3 + "g_proj.weight" in keys
    assert "model.layers.1.mlp.gate.expert_bias" in keys


def test_packed_prefill_on_the_pool_equals_one_at_a_time(model_dirs):
    """Three requests (one resuming after 7 cached rows, so its RoPE positions start at
    7) prefilled in one forward on the pool give the logits, KDA checkpoints and rotated
    latent rows of each prefilled alone."""
    check_packed_prefill_on_the_pool(model_dirs[FAMILY])


def test_tp2_engine_equals_tp1(model_dirs):
    """Two ranks (KDA heads with their full-rank gate projections, MLA heads with their
    head gates, MLP and expert widths split; the rotated latent row replicated) give the
    one-rank logits and greedy tokens, a cached second turn too."""
    check_tp2_equals_tp1(model_dirs[FAMILY])
