"""LFM2 and LFM2-MoE: the engine against transformers on the same random fp32 weights,
through the real serving path (`Engine` with the Marconi cache), and resumption from
short-conv states (the conv window, the layer's only state) at any depth."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_helpers import hf_model, prompts

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.layers.short_conv import ShortConvMixer
from marconi_ray.engine.loader import load_model
from marconi_ray.engine.model_presets import LFM2_FAMILIES
from marconi_ray.engine.seq_state import SeqState
from marconi_ray.protocol.sampling import SamplingParams

PROMPT_LEN = 300
NEW_TOKENS = 32
DEPTHS = (1, 15, 16, 17, 63, 64, 65, 300)
"""Around the Triton conv's token blocks and a kernel-width window, and the whole prompt."""


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


@pytest.mark.parametrize("family", LFM2_FAMILIES)
def test_greedy_and_cached_second_turn_equal_transformers(model_dirs, family):
    """32 greedy tokens after a 300-token prompt equal transformers' generate; a second
    turn extending the first is served from the cache (cached tokens reported) and still
    equals transformers on the whole conversation."""
    ref = hf_model(model_dirs[family])
    engine = Engine(model_dirs[family], system="marconi", cache_bytes=10**8)
    assert "shortconv" in engine.config.blocks and "attention" in engine.config.blocks
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    vocab = engine.config.vocab_size
    first = prompts(31, 1, PROMPT_LEN, vocab)[0]
    out = engine.generate(first, params)
    assert list(out.tokens) == _hf_greedy(ref, first, NEW_TOKENS)
    assert out.usage.cached_tokens == 0
    second = first + list(out.tokens) + prompts(32, 1, 40, vocab)[0]
    again = engine.generate(second, params)
    assert again.usage.cached_tokens == len(first) + NEW_TOKENS
    assert list(again.tokens) == _hf_greedy(ref, second, NEW_TOKENS)
    assert engine.store.bytes_used == engine.cache.bytes_used


@pytest.mark.parametrize("family", LFM2_FAMILIES)
def test_resume_from_states_at_any_depth_equals_uncached(model_dirs, family):
    """States emitted at 1, 15, 16, 17, 63, 64, 65 and 300 in one prefill: resuming from
    each (KV slice + conv window), prefilling the rest and decoding gives the uncached
    run's logits and tokens. Each state is the last K inputs of the conv (zero-padded
    before the first token), and nothing else."""
    model = load_model(model_dirs[family])
    ids = prompts(33, 1, PROMPT_LEN, model.cfg.vocab_size)[0]
    state = model.new_state()
    ckpts = model.prefill(torch.tensor(ids), state, list(DEPTHS))
    scratch = model.new_state()
    model.prefill(torch.tensor(ids), scratch)
    assert scratch.logits is not None
    want_logits = scratch.logits.clone()
    want = model.greedy(scratch, 8)
    i = model.ssm_blocks[0]
    k = model.cfg.shortconv.d_conv  # type: ignore[union-attr]
    for ck in ckpts:
        assert ck.conv[i].shape == (model.cfg.hidden_size, k) and ck.ssm[i].numel() == 0
        assert bool((ck.conv[i][:, : max(0, k - ck.depth)] == 0).all()), ck.depth
        resumed = SeqState.resumed(ck, state)
        if ck.depth < PROMPT_LEN:
            model.prefill(torch.tensor(ids[ck.depth :]), resumed)
        assert resumed.logits is not None
        assert (resumed.logits - want_logits).abs().max().item() <= 1e-4, ck.depth
        assert model.greedy(resumed, 8) == want, ck.depth


def test_decode_batch_holds_each_sequence_state_once(model_dirs):
    """Short-conv states in the persistent decode batch: the conv windows are views of its
    rows (one copy each, none per step), the empty ssm rows hold no bytes, and batched
    decode equals the stacking one."""
    model = load_model(model_dirs["lfm2_moe"])
    assert all(isinstance(model.ssm(i), ShortConvMixer) for i in model.ssm_blocks)
    rng = np.random.default_rng(4)
    a, b = [], []
    for n in (2, 20, 33):
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
