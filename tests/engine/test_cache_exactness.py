"""Invariant 2: reuse is exact. Greedy output resumed from cached states equals greedy
output from scratch, token for token: multi-turn continuations (last-token checkpoints),
branch points, whole-input hits, and checkpoints at arbitrary depths."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_helpers import GREEDY, prompts

from marconi_ray.core.cache.admission import MarconiPlusAdmission
from marconi_ray.engine.engine import Engine
from marconi_ray.engine.model.loader import load_model
from marconi_ray.engine.model.seq_state import SeqState
from marconi_ray.protocol.sampling import SamplingParams

FAMILIES = ("nemotron_h", "bamba", "jamba")


def _conversation(engine: Engine, reference: Engine, seed: int) -> tuple[list[int], int]:
    """Three turns, a branch off the system prompt, then the whole history again."""
    rng = np.random.default_rng(seed)
    vocab = engine.config.vocab_size
    system = rng.integers(7, vocab, 40).tolist()
    history: list[int] = []
    cached = []
    for _ in range(3):
        history += rng.integers(7, vocab, int(rng.integers(5, 30))).tolist()
        got = engine.generate(system + history, GREEDY)
        want = reference.generate(system + history, GREEDY)
        assert got.tokens == want.tokens
        cached.append(got.usage.cached_tokens)
        history += list(got.tokens)
    for _ in range(2):
        branch = system + rng.integers(7, vocab, 12).tolist()
        got = engine.generate(branch, GREEDY)
        assert got.tokens == reference.generate(branch, GREEDY).tokens
        cached.append(got.usage.cached_tokens)
    whole = engine.generate(system + history, GREEDY)
    assert whole.tokens == reference.generate(system + history, GREEDY).tokens
    cached.append(whole.usage.cached_tokens)
    return cached, len(system + history)


@pytest.mark.parametrize("family", FAMILIES)
def test_marconi_reuse_is_exact(model_dirs, family):
    engine = Engine(model_dirs[family], system="marconi", cache_bytes=50_000_000)
    reference = Engine(model_dirs[family], system="vanilla")
    cached, n_history = _conversation(engine, reference, seed=1)
    # turns 2 and 3 resume from the previous turn's last-token state; the second branch
    # hits the branch-point state the first one created; the whole history is cached
    assert cached[1] > 0 and cached[2] > 0
    assert cached[4] == 40
    assert cached[5] == n_history


@pytest.mark.parametrize("system", ["vllm+", "vllm+refill", "sglang+", "marconi+"])
def test_other_systems_reuse_is_exact(model_dirs, system, monkeypatch):
    # marconi+ with 16-token blocks, so this short conversation resumes from speculative
    # states too
    monkeypatch.setattr(MarconiPlusAdmission.__init__, "__defaults__", (16, True))
    engine = Engine(model_dirs["nemotron_h"], system=system, cache_bytes=50_000_000)
    reference = Engine(model_dirs["nemotron_h"], system="vanilla")
    cached, _ = _conversation(engine, reference, seed=2)
    assert max(cached) > 0


def test_full_input_hit_needs_no_prefill(model_dirs):
    engine = Engine(model_dirs["nemotron_h"], system="marconi", cache_bytes=50_000_000)
    prompt = prompts(3, 1, 50, engine.config.vocab_size)[0]
    first = engine.generate(prompt, GREEDY)
    again = engine.generate(prompt + list(first.tokens), GREEDY)
    assert again.usage.cached_tokens == len(prompt) + len(first.tokens)
    assert again.timings.prefill < first.timings.prefill
    ref = Engine(model_dirs["nemotron_h"], system="vanilla")
    assert again.tokens == ref.generate(prompt + list(first.tokens), GREEDY).tokens


@pytest.mark.parametrize("family", FAMILIES)
def test_resume_from_any_checkpoint_depth(model_dirs, family):
    """Checkpoints at random depths (chunk-aligned or not) from one prefill; resuming from
    each (KV slice + SSM state) and decoding greedily matches decoding from scratch."""
    model = load_model(model_dirs[family])
    ids = prompts(11, 1, 60, model.cfg.vocab_size)[0]
    rng = np.random.default_rng(5)
    depths = sorted({16, 32, 59, *rng.integers(1, 60, 5).tolist()})
    state = model.new_state()
    ckpts = model.prefill(torch.tensor(ids), state, depths)

    def greedy(st: SeqState, start: list[int], n: int) -> list[int]:
        out: list[int] = []
        if st.length < len(start):
            model.prefill(torch.tensor(start[st.length :]), st)
        for _ in range(n):
            assert st.logits is not None
            out.append(int(st.logits.argmax()))
            model.decode(torch.tensor([out[-1]]), [st])
        return out

    scratch = greedy(model.new_state(), ids, 5)
    for ck in ckpts:
        resumed = SeqState.resumed(ck, state)
        assert greedy(resumed, ids, 5) == scratch, ck.depth


def test_batched_decode_equals_one_at_a_time(model_dirs):
    engine = Engine(model_dirs["bamba"], system="marconi", cache_bytes=50_000_000, max_batch=4)
    ps = prompts(4, 5, 30, engine.config.vocab_size)
    params = [SamplingParams(max_tokens=4 + i, temperature=0.0, ignore_eos=True) for i in range(5)]
    together = engine.generate_many(ps, params)
    alone = Engine(model_dirs["bamba"], system="vanilla")
    for p, sp, got in zip(ps, params, together, strict=True):
        assert got.tokens == alone.generate(p, sp).tokens
        assert len(got.tokens) == sp.max_tokens


def test_seeded_sampling_is_reproducible_with_cache(model_dirs):
    engine = Engine(model_dirs["nemotron_h"], system="marconi", cache_bytes=50_000_000)
    prompt = prompts(8, 1, 40, engine.config.vocab_size)[0]
    sp = SamplingParams(max_tokens=8, temperature=0.8, top_p=0.9, seed=123, ignore_eos=True)
    a = engine.generate(prompt, sp)
    b = engine.generate(prompt, sp)
    assert a.tokens == b.tokens
    assert b.usage.cached_tokens == 0 or b.usage.cached_tokens <= len(prompt)
