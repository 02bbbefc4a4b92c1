"""Speculative decoding (`engine.spec`, `Worker._verify`): drafts verified k + 1
positions per sequence in one forward, the exact state kept at the accepted depth.

- Greedy tokens are identical with speculation on and off in every family, over
  multi-turn conversations whose later turns hit the cache, and the cached tokens per
  turn are identical too (the cache's checkpoints land where they would without it).
- An oracle drafter forced to 100% acceptance keeps every draft; at 0% it keeps none,
  backs off, and the tokens are still exact.
- Acceptance by rejection sampling preserves the distribution (tested statistically).
- A stop token inside an accepted run of drafts ends the output exactly there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from marconi_ray.engine.draft_model import drafter_for
from marconi_ray.engine.engine import Engine
from marconi_ray.engine.model.loader import read_config
from marconi_ray.engine.presets.model_presets import FAMILIES
from marconi_ray.engine.sampler import Sampler
from marconi_ray.engine.spec.acceptance import accept_drafts
from marconi_ray.engine.spec.drafters import NgramDrafter, OracleDrafter
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.protocol.speculative import SpeculativeConfig
from marconi_ray.serve.model_source import resolve_model

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
SPEC = SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=3)


def test_ngram_drafts_what_followed_the_latest_longest_match() -> None:
    d = NgramDrafter(1, 3)
    assert d.propose([1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3], 2) == [7, 5]  # latest 3-gram
    assert d.propose([4, 5, 6, 4, 5], 3) == [6, 4, 5]
    assert d.propose([1, 2, 3, 4], 3) == []  # no suffix recurs
    assert d.propose([8, 1, 8], 4) == [1, 8]  # a 1-gram, cut at the sequence's end
    assert NgramDrafter(2, 3).propose([8, 1, 9, 8], 4) == []  # min 2: "8" alone is too short
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpeculativeConfig(num_speculative_tokens=0)
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        SpeculativeConfig(prompt_lookup_min=3, prompt_lookup_max=2)
    with pytest.raises(ValueError, match="method"):
        SpeculativeConfig(method="eagle")


def test_greedy_acceptance_keeps_the_matching_prefix() -> None:
    logits = torch.full((4, 6), -5.0)
    for row, best in enumerate([2, 4, 1, 3]):
        logits[row, best] = 5.0
    assert accept_drafts(logits, [2, 4, 1], GREEDY, None) == [2, 4, 1, 3]  # all + bonus
    assert accept_drafts(logits, [2, 5, 1], GREEDY, None) == [2, 4]  # corrected at 2nd
    assert accept_drafts(logits, [0, 4, 1], GREEDY, None) == [2]
    with pytest.raises(ValueError, match="k \\+ 1"):
        accept_drafts(logits, [2], GREEDY, None)


def test_rejection_sampling_preserves_the_distribution() -> None:
    """Two drafts against a fixed two-position distribution: the first emitted token is
    distributed as p0, and the second, given the first was the first draft, as p1
    (chi-square at p = 0.001, 20,000 draws from a seeded generator)."""
    logits = torch.tensor([[1.0, 0.2, -0.5, 0.7, 0.0], [0.1, 1.2, 0.3, -1.0, 0.4],
                           [0.0, 0.0, 0.0, 0.0, 0.0]])  # fmt: skip
    params = SamplingParams(max_tokens=8, temperature=0.8, top_k=4)
    p = Sampler.probabilities(logits, params).numpy()
    g = torch.Generator().manual_seed(1)
    firsts, seconds = [], []
    for _ in range(20_000):
        out = accept_drafts(logits, [1, 4], params, g)
        firsts.append(out[0])
        if out[0] == 1:
            seconds.append(out[1])
    for draws, probs in ((firsts, p[0]), (seconds, p[1])):
        counts = np.bincount(draws, minlength=5)
        expected = probs * len(draws)
        assert counts[probs == 0].sum() == 0  # top-k cut tokens never appear
        kept = probs > 0
        chi2 = (((counts - expected) ** 2)[kept] / expected[kept]).sum()
        assert chi2 < 18.47, (counts, expected)  # chi-square, 4 dof, p = 0.001


def _conversation(engine: Engine, turns: int = 3) -> list[tuple[Any, ...]]:
    """Greedy turns over a repetitive prompt (so n-grams recur); each turn's prompt is the
    previous prompt, its output and a new segment. Returns (prompt, tokens, cached, spec
    counts) per turn."""
    rng = np.random.default_rng(3)
    motif = rng.integers(7, 200, 9).tolist()
    history = motif * 4
    out = []
    for _ in range(turns):
        result = engine.generate(history, GREEDY)
        out.append((tuple(history), result.tokens, result.usage.cached_tokens, result.spec))
        history = history + list(result.tokens) + motif[:5]
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_and_cached_tokens_are_identical_with_speculation(
    model_dirs: dict[str, Path], family: str
) -> None:
    """An oracle that drafts the true continuation 60% of the time, so every family
    rolls back at varied depths (some drafts kept, some rejected)."""
    plain = Engine(model_dirs[family], system="marconi", cache_bytes=50_000_000)
    without = _conversation(plain)
    oracle = OracleDrafter({p: list(t) for p, t, _, _ in without}, 0.6, vocab=263)
    spec = Engine(model_dirs[family], system="marconi", cache_bytes=50_000_000,
                  speculative=SPEC, drafter=oracle)  # fmt: skip
    with_spec = _conversation(spec)
    assert [r[:3] for r in with_spec] == [r[:3] for r in without]
    assert any(cached for _, _, cached, _ in with_spec[1:])
    kept = sum(c.accepted for *_, c in with_spec)
    drafted = sum(c.drafted for *_, c in with_spec)
    assert 0 < kept < drafted, (kept, drafted)
    stats = spec.worker.spec_stats
    assert (stats.accepted, stats.drafted) == (kept, drafted)
    assert sum(stats.kept_at) == kept and sum(stats.drafted_at) == drafted
    assert all(k <= d for k, d in zip(stats.kept_at, stats.drafted_at, strict=True))
    spec.store.check()
    assert spec.worker.reserved_rows == 0 and spec.worker.num_running == 0
    assert spec.store.device_kv.held == plain.store.device_kv.held  # no row leaked
    assert spec.store.window_rows_held == 0  # a window-state model's rejected drafts' too
    assert spec.cache.bytes_used == plain.cache.bytes_used


@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_5", "lfm2"])
def test_ngram_speculation_keeps_drafts_and_stays_exact(
    model_dirs: dict[str, Path], family: str
) -> None:
    plain = _conversation(Engine(model_dirs[family], system="vanilla"))
    spec = Engine(model_dirs[family], system="marconi", cache_bytes=50_000_000, speculative=SPEC)
    got = _conversation(spec)
    assert [r[1] for r in got] == [r[1] for r in plain]
    assert sum(c.drafted for *_, c in got) > 0


def _futures(engine: Engine, prompts: list[list[int]]) -> dict[tuple[int, ...], list[int]]:
    return {tuple(p): list(engine.generate(p, GREEDY).tokens) for p in prompts}


@pytest.mark.parametrize("rate", [1.0, 0.0])
def test_an_oracle_at_full_or_no_acceptance_stays_exact(
    model_dirs: dict[str, Path], rate: float
) -> None:
    model_dir = model_dirs["qwen3_5"]
    prompts = [[7 + (i * 5 + j) % 250 for j in range(30)] for i in range(3)]
    want = _futures(Engine(model_dir, system="vanilla"), prompts)
    oracle = OracleDrafter(want, rate, vocab=263)
    spec = Engine(model_dir, system="marconi", cache_bytes=50_000_000, speculative=SPEC,
                  drafter=oracle)  # fmt: skip
    results = spec.generate_many(prompts, [GREEDY] * len(prompts))
    assert [list(r.tokens) for r in results] == [want[tuple(p)] for p in prompts]
    for r in results:
        if rate == 1.0:  # every step drafts 4 and keeps them: 24 tokens in 5 steps
            assert r.spec.drafted > 0 and r.spec.accepted == r.spec.drafted
        else:  # nothing kept, and backing off keeps the drafting rare
            assert r.spec.accepted == 0 and 0 < r.spec.drafted <= 4 * 6


def test_a_stop_token_inside_accepted_drafts_ends_the_output_there(
    model_dirs: dict[str, Path],
) -> None:
    model_dir = model_dirs["nemotron_h"]
    prompt = [7 + (j * 3) % 250 for j in range(30)]
    free = list(Engine(model_dir, system="vanilla").generate(prompt, GREEDY).tokens)
    stop = free[9]
    params = SamplingParams(max_tokens=24, temperature=0.0, stop_token_ids=(stop,))
    want = Engine(model_dir, system="vanilla").generate(prompt, params)
    oracle = OracleDrafter({tuple(prompt): free}, 1.0, vocab=263)
    spec = Engine(model_dir, system="marconi", cache_bytes=50_000_000, speculative=SPEC,
                  drafter=oracle)  # fmt: skip
    got = spec.generate(prompt, params)
    assert got.tokens == want.tokens and got.finish_reason == "stop"
    assert got.tokens[-1] == stop and got.spec.accepted > 0
    spec.store.check()


def test_a_draft_model_drafts_for_the_target(model_dirs: dict[str, Path]) -> None:
    """`draft:PATH`: the target drafting for itself keeps every draft; another family
    with the same tokenizer drafts too; the tokens are exact either way; a draft model
    with a bigger vocabulary is refused, naming both sizes."""
    target = model_dirs["nemotron_h"]
    vocab = read_config(target)[0].vocab_size
    prompts = [[7 + (i * 11 + j) % 250 for j in range(30)] for i in range(2)]
    want = [r.tokens for r in Engine(target, system="vanilla").generate_many(prompts, [GREEDY] * 2)]
    for draft, full in ((target, True), (model_dirs["bamba"], False)):
        config = SpeculativeConfig(method=f"draft:{draft}", num_speculative_tokens=3)
        spec = Engine(target, system="marconi", cache_bytes=50_000_000, speculative=config,
                      drafter=drafter_for(config, vocab))  # fmt: skip
        got = spec.generate_many(prompts, [GREEDY] * 2)
        assert [r.tokens for r in got] == want
        stats = spec.worker.spec_stats
        assert stats.drafted > 0
        if full:
            assert stats.accepted == stats.drafted
    with pytest.raises(ValueError, match="draft:"):
        SpeculativeConfig(method="draft:")
    chat = resolve_model("chat")
    with pytest.raises(ValueError, match="4096 token ids"):
        drafter_for(SpeculativeConfig(method=f"draft:{chat}"), vocab)
    with pytest.raises(ValueError, match="drafter_for"):  # the engine alone cannot build it
        Engine(target, speculative=SpeculativeConfig(method=f"draft:{chat}"))


def test_the_cache_and_its_host_tier_are_unchanged_by_speculation(
    model_dirs: dict[str, Path],
) -> None:
    """Under a device budget that evicts to a host tier: every counter of the cache
    (hits, states admitted by reason, evictions, demotions, promotions) and the bytes in
    each tier are the same with speculation as without."""
    model_dir = model_dirs["qwen3_5"]
    kwargs: dict[str, Any] = dict(
        system="marconi", cache_bytes=150_000, host_cache_bytes=5_000_000, host_placement="lru"
    )
    plain = Engine(model_dir, **kwargs)
    without = _conversation(plain, turns=4)
    oracle = OracleDrafter({p: list(t) for p, t, _, _ in without}, 0.7, vocab=263)
    spec = Engine(model_dir, speculative=SPEC, drafter=oracle, **kwargs)
    with_spec = _conversation(spec, turns=4)
    assert [r[:3] for r in with_spec] == [r[:3] for r in without]
    assert spec.worker.spec_stats.accepted > 0
    assert spec.cache.stats.to_dict() == plain.cache.stats.to_dict()
    assert spec.cache.stats.evictions > 0 and spec.cache.stats.demotions > 0
    assert spec.cache.bytes_by_tier() == plain.cache.bytes_by_tier()


def test_log_probabilities_with_speculation_match_decoding(model_dirs: dict[str, Path]) -> None:
    """A request asking for log-probabilities speculates too: each emitted token's
    log-probability and its top alternatives come from the verified logits at its
    position, as decoding reports them (the same ids; values to float tolerance)."""
    model_dir = model_dirs["qwen3_5"]
    prompts = [[7 + (i * 7 + j * 3) % 250 for j in range(30)] for i in range(2)]
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, logprobs=3)
    plain = Engine(model_dir, system="vanilla").generate_many(prompts, [params] * 2)
    futures = {tuple(p): list(r.tokens) for p, r in zip(prompts, plain, strict=True)}
    oracle = OracleDrafter(futures, 0.6, 263)
    spec = Engine(model_dir, system="vanilla", speculative=SPEC, drafter=oracle)
    got = spec.generate_many(prompts, [params] * 2)
    assert [r.tokens for r in got] == [r.tokens for r in plain]
    assert all(r.spec.accepted > 0 for r in got)
    for want, have in zip(plain, got, strict=True):
        assert len(have.logprobs) == len(want.logprobs) == len(want.tokens)
        for a, b in zip(want.logprobs, have.logprobs, strict=True):
            assert (a.token, [t for t, _ in a.top]) == (b.token, [t for t, _ in b.top])
            assert b.logprob == pytest.approx(a.logprob, abs=1e-4)
            assert [v for _, v in b.top] == pytest.approx([v for _, v in a.top], abs=1e-4)


@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_5", "zamba2"])
def test_plain_and_verified_sequences_share_one_forward(
    model_dirs: dict[str, Path], family: str
) -> None:
    """A step where some sequences draft and others do not runs them in one forward
    (`decode_and_prefill`, counted on the real method), and the tokens stay exact."""
    model_dir = model_dirs[family]
    prompts = [[7 + (i * 9 + j * 4) % 250 for j in range(24 + 5 * i)] for i in range(4)]
    want = _futures(Engine(model_dir, system="vanilla"), prompts)
    # only the first two prompts have a future: the others never draft
    oracle = OracleDrafter({p: want[p] for p in list(want)[:2]}, 0.6, vocab=263)
    spec = Engine(model_dir, system="marconi", cache_bytes=50_000_000, speculative=SPEC,
                  drafter=oracle)  # fmt: skip
    model = spec.worker.model
    calls = []
    real = model.decode_and_prefill

    def counted(*args: Any) -> Any:
        calls.append(len(args[2]))
        return real(*args)

    model.decode_and_prefill = counted  # type: ignore[method-assign]
    results = spec.generate_many(prompts, [GREEDY] * len(prompts))
    assert [list(r.tokens) for r in results] == [want[tuple(p)] for p in prompts]
    assert calls and all(n >= 1 for n in calls)
    assert sum(r.spec.accepted for r in results[:2]) > 0
    assert all(r.spec.drafted == 0 for r in results[2:])
    spec.store.check()
