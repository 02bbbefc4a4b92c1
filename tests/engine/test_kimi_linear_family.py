"""Kimi Linear (KDA + MLA + MoE): the engine against transformers on the same random fp32
weights through the real serving path (`Engine` with the Marconi cache), resumption from
the states emitted at any depth, batched decode, what the store holds per token and per
state against the cost model, and two tensor-parallel ranks against one."""

from __future__ import annotations

import torch
from engine_helpers import hf_model, prompts
from family_checks import (
    NEW_TOKENS,
    PROMPT_LEN,
    check_batched_decode,
    check_greedy_and_second_turn,
    check_resume_at_depths,
    hf_greedy,
)
from kda_mla_checks import check_packed_prefill_on_the_pool, check_tp2_equals_tp1
from safetensors.torch import load_file

from marconi_ray.core.model.hf.parse import spec_from_hf_config
from marconi_ray.engine.engine import Engine
from marconi_ray.engine.model.hybrid_model import HybridModel
from marconi_ray.engine.model.layers.kda import KDAMixer
from marconi_ray.engine.model.layers.mla import MLAttention
from marconi_ray.engine.model.loader import load_model, read_config
from marconi_ray.engine.model.seq_state import SeqState, StateCheckpoint
from marconi_ray.protocol.sampling import SamplingParams

FAMILY = "kimi_linear"
GREEDY32 = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)


def test_greedy_and_two_cached_turns_equal_transformers(model_dirs):
    """See `family_checks.check_greedy_and_second_turn` (the store holds exactly what the
    cache accounts), then a third turn on the cached second; the tiny preset is K K K A
    with a dense first feed-forward."""
    engine = check_greedy_and_second_turn(model_dirs[FAMILY])
    assert engine.config.pattern == "K-KEKEAE"
    # a third turn, extending the second (whose prompt and reply the cache holds)
    vocab = engine.config.vocab_size
    first = prompts(31, 1, PROMPT_LEN, vocab)[0]
    second = first + list(engine.generate(first, GREEDY32).tokens) + prompts(32, 1, 40, vocab)[0]
    third = second + list(engine.generate(second, GREEDY32).tokens) + prompts(34, 1, 25, vocab)[0]
    out = engine.generate(third, GREEDY32)
    assert out.usage.cached_tokens == len(second) + NEW_TOKENS
    assert list(out.tokens) == hf_greedy(hf_model(model_dirs[FAMILY]), third, NEW_TOKENS)


def _kda_states(model: HybridModel, ck: StateCheckpoint, resumed: SeqState) -> None:
    """A KDA state is its conv window over [q, k, v] (model dtype) and the float32 delta
    rule state [heads, dk, dk]; an MLA block keeps no recurrent state."""
    for i in model.ssm_blocks:
        mixer = model.ssm(i)
        assert isinstance(mixer, KDAMixer)
        conv, ssm = mixer.empty_state(torch.device("cpu"))
        assert ck.conv[i].shape == conv.shape and ck.ssm[i].shape == ssm.shape
        assert ck.ssm[i].dtype == torch.float32
    assert len(resumed.kv) == 1 and resumed.kv[model.attn_blocks[0]].length == ck.depth


def test_resume_from_states_at_any_depth_equals_uncached(model_dirs):
    """Resuming from KDA states and MLA latent rows at depths around the chunk edges and
    the conv window (see `family_checks.check_resume_at_depths`)."""
    check_resume_at_depths(model_dirs[FAMILY], on_checkpoint=_kda_states)


def test_batched_decode_equals_each_sequence_alone(model_dirs):
    check_batched_decode(model_dirs[FAMILY])


def test_store_bytes_equal_the_cost_model(model_dirs):
    """Per token the store holds MLA's latent and shared key part only (never expanded
    keys and values); per state each KDA block's conv window and float32 state: exactly
    the cost model's figures."""
    cfg, raw = read_config(model_dirs[FAMILY])
    engine = Engine(model_dirs[FAMILY], system="marconi", cache_bytes=10**7)
    spec = spec_from_hf_config(raw, dtype_bytes=4, state_dtype_bytes=4)
    store = engine.store
    mla = cfg.mla
    assert mla is not None and cfg.kda is not None
    assert store.kv_bytes_per_token == spec.kv_bytes_per_token == 4 * mla.cache_width
    assert store.state_bytes == spec.ssm_state_bytes
    k = cfg.kda
    per_block = 4 * (k.conv_dim * k.d_conv + k.n_heads * k.head_dim**2)
    assert store.state_bytes == len(cfg.layers_of("kda")) * per_block
    attn = engine.worker.model.attention(engine.worker.model.attn_blocks[0])
    assert isinstance(attn, MLAttention) and attn.kv_shape == (1, mla.cache_width // 2)


def test_loads_the_checkpoint_layout_with_the_dense_mlp_apart(model_dirs):
    """Kimi Linear's own files keep a dense layer's MLP under `mlp.` (transformers saves
    it under `block_sparse_moe.`, beside the experts of the other layers): both load."""
    d = model_dirs[FAMILY]
    saved = load_file(str(d / "model.safetensors"))
    dense = "model.layers.0.block_sparse_moe."
    moved = {k.replace(dense, "model.layers.0.mlp."): v for k, v in saved.items()}
    assert sum(k.startswith("model.layers.0.mlp.") for k in moved) == 3
    ids = torch.tensor(prompts(5, 1, 20, 512)[0])
    want = load_model(d).forward_logits(ids)
    torch.testing.assert_close(load_model(d, weights=moved).forward_logits(ids), want)


def test_packed_prefill_on_the_pool_equals_one_at_a_time(model_dirs):
    """Three requests (one resuming after cached rows) prefilled in one forward on the
    pool (MLA over each part's own rows, KDA varlen) give the logits, checkpoints and
    latent rows of each prefilled alone."""
    check_packed_prefill_on_the_pool(model_dirs[FAMILY])


def test_tp2_equals_tp1(model_dirs):
    """Two ranks (KDA and MLA heads, MLP and expert widths split; MLA's latent row
    replicated) give the one-rank logits and greedy tokens, a cached second turn too."""
    check_tp2_equals_tp1(model_dirs[FAMILY])
