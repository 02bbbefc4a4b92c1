"""Qwen3.5 (dense, MoE, text-only and multimodal) and Qwen3-Next: the engine against
transformers on the same random fp32 weights, through the real serving path (`Engine`
with the Marconi cache), and resumption from Gated DeltaNet states at any depth."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_helpers import hf_model, prompts

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.loader import load_model
from marconi_ray.engine.model_presets import QWEN_FAMILIES
from marconi_ray.engine.seq_state import SeqState
from marconi_ray.protocol.sampling import SamplingParams

PROMPT_LEN = 300
NEW_TOKENS = 32
DEPTHS = (1, 15, 16, 17, 63, 64, 65, 300)
"""Around the chunk (64) and the Triton kernels' block edges, and the whole prompt."""


def _hf_greedy(model, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
        )
    return out[0, len(ids) :].tolist()


@pytest.mark.parametrize("family", QWEN_FAMILIES)
def test_greedy_and_cached_second_turn_equal_transformers(model_dirs, family):
    """32 greedy tokens after a 300-token prompt equal transformers' generate; a second
    turn extending the first is served from the cache (cached tokens reported) and still
    equals transformers on the whole conversation."""
    ref = hf_model(model_dirs[family])
    engine = Engine(model_dirs[family], system="marconi", cache_bytes=10**8)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    vocab = engine.config.vocab_size
    first = prompts(21, 1, PROMPT_LEN, vocab)[0]
    out = engine.generate(first, params)
    assert list(out.tokens) == _hf_greedy(ref, first, NEW_TOKENS)
    assert out.usage.cached_tokens == 0
    second = first + list(out.tokens) + prompts(22, 1, 40, vocab)[0]
    again = engine.generate(second, params)
    assert again.usage.cached_tokens == len(first) + NEW_TOKENS
    assert list(again.tokens) == _hf_greedy(ref, second, NEW_TOKENS)


@pytest.mark.parametrize("family", ["qwen3_5_text", "qwen3_5_moe_text", "qwen3_next"])
def test_resume_from_states_at_any_depth_equals_uncached(model_dirs, family):
    """States emitted at 1, 15, 16, 17, 63, 64, 65 and 300 in one prefill: resuming from
    each (KV slice + conv and delta-rule states), prefilling the rest and decoding gives
    the uncached run's logits and tokens."""
    model = load_model(model_dirs[family])
    ids = prompts(23, 1, PROMPT_LEN, model.cfg.vocab_size)[0]
    state = model.new_state()
    ckpts = model.prefill(torch.tensor(ids), state, list(DEPTHS))
    scratch = model.new_state()
    model.prefill(torch.tensor(ids), scratch)
    assert scratch.logits is not None
    want_logits = scratch.logits.clone()
    want = model.greedy(scratch, 8)
    for ck in ckpts:
        resumed = SeqState.resumed(ck, state)
        if ck.depth < PROMPT_LEN:
            model.prefill(torch.tensor(ids[ck.depth :]), resumed)
        assert resumed.logits is not None
        assert (resumed.logits - want_logits).abs().max().item() <= 1e-4, ck.depth
        assert model.greedy(resumed, 8) == want, ck.depth


def test_decode_batch_holds_each_sequence_state_once(model_dirs):
    """Gated DeltaNet states in the persistent decode batch: members' states are views of
    its rows (one copy each, none per step), and batched decode equals the stacking one."""
    model = load_model(model_dirs["qwen3_next"])
    rng = np.random.default_rng(3)
    a, b = [], []
    for n in (12, 20, 33):
        ids = torch.tensor(rng.integers(3, 200, n).tolist())
        for group in (a, b):
            st = model.new_state()
            model.prefill(ids, st)
            group.append(st)
    batch = model.new_decode_batch(4)
    for st in b:
        batch.join(st)
    batch.check()
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
    with caplog.at_level("INFO", logger="marconi_ray.engine.loader"):
        model = load_model(model_dirs["qwen3_5"])
    assert any("model.visual.*" in r.getMessage() for r in caplog.records)
    assert model.cfg.family == "qwen3_5" and model.cfg.weights_prefix == "model.language_model."
    assert not any("visual" in name for name, _ in model.named_parameters())
