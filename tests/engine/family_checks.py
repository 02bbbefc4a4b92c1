"""The checks every served family passes against transformers on the same random fp32
weights (its tiny make-model preset): greedy tokens and a cached second turn through the
real serving path (`Engine` with the Marconi cache), and resumption from the states
emitted at any depth. Each family's test module calls them and adds its own checks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from engine_helpers import hf_model, prompts

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.model.decode_batch import DecodeBatch
from marconi_ray.engine.model.hybrid_model import HybridModel
from marconi_ray.engine.model.loader import load_model
from marconi_ray.engine.model.seq_state import SeqState, StateCheckpoint
from marconi_ray.protocol.sampling import SamplingParams

PROMPT_LEN = 300
NEW_TOKENS = 32
DEPTHS = (1, 15, 16, 17, 63, 64, 65, 300)
"""Around the chunks (16 for the tiny Mamba-2 presets, 64 for Gated DeltaNet), the Triton
kernels' block edges and a conv window, and the whole prompt."""
LOGIT_TOL = 1e-4


def hf_greedy(model: Any, ids: list[int], n: int) -> list[int]:
    """`n` greedy tokens of transformers' `generate` after `ids`."""
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
        )
    return list(out[0, len(ids) :].tolist())


HF_LOGIT_TOL = 1e-3
"""Largest difference from transformers' logits (fp32, std ~10): greedy tokens can agree
where a mixer is wrong, logits cannot."""


def check_logits_equal_transformers(model_dir: Path, seed: int = 30) -> HybridModel:
    """The engine's logits over a 300-token prompt equal transformers' forward within
    `HF_LOGIT_TOL`. Returns the model."""
    ref = hf_model(model_dir)
    model = load_model(model_dir)
    ids = prompts(seed, 1, PROMPT_LEN, model.cfg.vocab_size)[0]
    with torch.no_grad():
        want = ref(input_ids=torch.tensor([ids])).logits[0]
    got = model.forward_logits(torch.tensor(ids))
    assert (got - want).abs().max().item() <= HF_LOGIT_TOL
    return model


def check_greedy_and_second_turn(model_dir: Path, seeds: tuple[int, int] = (31, 32)) -> Engine:
    """32 greedy tokens after a 300-token prompt equal transformers' generate; a second
    turn extending the first is served from the cache (its cached tokens reported) and
    still equals transformers on the whole conversation; the store holds exactly the
    bytes the cache accounts for. Returns the engine for the caller's own checks."""
    ref = hf_model(model_dir)
    engine = Engine(model_dir, system="marconi", cache_bytes=10**8)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    vocab = engine.config.vocab_size
    first = prompts(seeds[0], 1, PROMPT_LEN, vocab)[0]
    out = engine.generate(first, params)
    assert list(out.tokens) == hf_greedy(ref, first, NEW_TOKENS)
    assert out.usage.cached_tokens == 0
    second = first + list(out.tokens) + prompts(seeds[1], 1, 40, vocab)[0]
    again = engine.generate(second, params)
    assert again.usage.cached_tokens == len(first) + NEW_TOKENS
    assert list(again.tokens) == hf_greedy(ref, second, NEW_TOKENS)
    assert engine.store.bytes_used == engine.cache.bytes_used > 0
    return engine


def check_resume_at_depths(
    model_dir: Path,
    seed: int = 33,
    on_checkpoint: Callable[[HybridModel, StateCheckpoint, SeqState], None] | None = None,
    depths: tuple[int, ...] = DEPTHS,
) -> HybridModel:
    """States emitted at `depths` (`DEPTHS` unless given) in one prefill of a 300-token
    prompt: resuming from each (KV slices + every recurrent layer's states), prefilling
    the rest and decoding gives the uncached run's logits (within `LOGIT_TOL`) and 8
    greedy tokens.
    `on_checkpoint(model, checkpoint, resumed)` runs the caller's checks on each
    checkpoint before the rest is prefilled. Returns the model."""
    model = load_model(model_dir)
    ids = prompts(seed, 1, PROMPT_LEN, model.cfg.vocab_size)[0]
    state = model.new_state()
    ckpts = model.prefill(torch.tensor(ids), state, list(depths))
    assert [ck.depth for ck in ckpts] == list(depths)
    scratch = model.new_state()
    model.prefill(torch.tensor(ids), scratch)
    assert scratch.logits is not None
    want_logits = scratch.logits.clone()
    want = model.greedy(scratch, 8)
    for ck in ckpts:
        assert set(ck.conv) == set(ck.ssm) == set(model.ssm_blocks), ck.depth
        resumed = SeqState.resumed(ck, state)
        if on_checkpoint is not None:
            on_checkpoint(model, ck, resumed)
        if ck.depth < PROMPT_LEN:
            model.prefill(torch.tensor(ids[ck.depth :]), resumed)
        assert resumed.logits is not None
        assert (resumed.logits - want_logits).abs().max().item() <= LOGIT_TOL, ck.depth
        assert model.greedy(resumed, 8) == want, ck.depth
    return model


def check_batched_decode(model_dir: Path) -> HybridModel:
    """Three sequences of different lengths decoded as one persistent decode batch give,
    step after step, each sequence's own decode logits (within `LOGIT_TOL`)."""
    model = load_model(model_dir)
    alone, _, batch = twin_batch(model, (9, 21, 40), seed=41)
    for _ in range(3):
        ids = torch.tensor([int(st.logits.argmax()) for st in alone if st.logits is not None])
        one = torch.stack([model.decode(ids[b : b + 1], [st])[0] for b, st in enumerate(alone)])
        torch.testing.assert_close(model.decode_batch(ids, batch), one, atol=LOGIT_TOL, rtol=0)
    return model


def twin_batch(
    model: HybridModel, lengths: tuple[int, ...], seed: int
) -> tuple[list[SeqState], list[SeqState], DecodeBatch]:
    """Two identical prefilled sequences per length (random ids from `seed`): the first of
    each pair kept alone, the second joined to a new persistent decode batch (capacity
    4, checked). Returns (alone, batched, batch)."""
    rng = np.random.default_rng(seed)
    alone, batched = [], []
    for n in lengths:
        ids = torch.tensor(rng.integers(3, 200, n).tolist())
        for group in (alone, batched):
            st = model.new_state()
            model.prefill(ids, st)
            group.append(st)
    batch = model.new_decode_batch(4)
    for st in batched:
        batch.join(st)
    batch.check()
    return alone, batched, batch
