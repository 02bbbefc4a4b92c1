"""Log-probabilities (`logprobs`, `prompt_logprobs`): equal to the log-softmax of
transformers' logits for the same tokens, whether the prompt was cached, chunked or
batched with requests that asked for none."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import hf_logits, hf_model, prompts

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.logprobs import read_logprobs, token_logprobs
from marconi_ray.protocol.sampling import SamplingParams

ATOL = 1e-4


def test_token_logprobs_are_the_log_softmax_most_likely_first_ties_by_id():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.5, 2.0], [0.0, 0.0, 0.0, 0.0, 9.0]])
    chosen, ids, lps = token_logprobs(logits, torch.tensor([3, 1]), 3)
    want = torch.log_softmax(logits, dim=-1)
    assert torch.allclose(chosen, want[[0, 1], [3, 1]])
    assert ids.tolist() == [[1, 2, 4], [4, 0, 1]]
    assert torch.allclose(lps, want.gather(1, ids))
    assert token_logprobs(logits, torch.tensor([0, 0]), 0)[1].shape == (2, 0)
    with pytest.raises(ValueError, match="k must be in"):
        token_logprobs(logits, torch.tensor([0, 0]), 6)
    with pytest.raises(ValueError, match="tokens"):
        token_logprobs(logits, torch.tensor([0]), 1)


def test_read_logprobs_gives_each_row_its_own_k():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    tokens = torch.tensor([7, 0, 49])
    got = read_logprobs(logits, tokens, [2, 0, 5])
    want = torch.log_softmax(logits, dim=-1)
    assert [lp.token for lp in got] == [7, 0, 49]
    assert [len(lp.top) for lp in got] == [2, 0, 5]
    for row, lp in enumerate(got):
        assert lp.logprob == pytest.approx(float(want[row, lp.token]), abs=1e-6)
        best = want[row].topk(len(lp.top)).indices.tolist()
        assert [t for t, _ in lp.top] == best
    with pytest.raises(ValueError, match="one k per row"):
        read_logprobs(logits, tokens, [1])


def reference(model, prompt: list[int], output: list[int]) -> torch.Tensor:
    """log-softmax [L, V] of transformers' logits over prompt + output."""
    return torch.log_softmax(hf_logits(model, prompt + output), dim=-1)


@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_5"])
def test_logprobs_equal_transformers_over_cached_and_chunked_turns(model_dirs, family):
    engine = Engine(model_dirs[family], "marconi", 50_000_000, max_batch_tokens=16)
    hf = hf_model(model_dirs[family])
    vocab = engine.config.vocab_size
    params = SamplingParams(
        max_tokens=5, temperature=0.8, seed=3, ignore_eos=True, logprobs=2, prompt_logprobs=1
    )
    history = prompts(11, 1, 40, vocab)[0]
    for turn in range(2):
        got = engine.generate(history, params)
        if turn:
            assert got.usage.cached_tokens > 0  # the hit's positions are scored too
        want = reference(hf, history, list(got.tokens))
        n = len(history)
        assert len(got.prompt_logprobs) == n and got.prompt_logprobs[0] is None
        for p in range(1, n):
            lp = got.prompt_logprobs[p]
            assert lp is not None and lp.token == history[p] and len(lp.top) == 1
            assert lp.logprob == pytest.approx(float(want[p - 1, history[p]]), abs=ATOL)
            assert lp.top[0][0] == int(want[p - 1].argmax())
        assert [lp.token for lp in got.logprobs] == list(got.tokens)
        for i, lp in enumerate(got.logprobs):
            row = want[n - 1 + i]
            assert lp.logprob == pytest.approx(float(row[lp.token]), abs=ATOL)
            assert [t for t, _ in lp.top] == row.topk(2).indices.tolist()
            assert [v for _, v in lp.top] == pytest.approx(row.topk(2).values.tolist(), abs=ATOL)
        history += list(got.tokens) + prompts(20 + turn, 1, 9, vocab)[0]


def test_logprobs_are_per_request_in_a_shared_batch(model_dirs):
    engine = Engine(model_dirs["nemotron_h"], "marconi", 50_000_000)
    vocab = engine.config.vocab_size
    a, b = prompts(5, 2, 12, vocab)
    plain = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    scored = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=0)
    with_lp, without = engine.generate_many([a, b], [scored, plain])
    assert without.logprobs == () and without.prompt_logprobs == ()
    assert [lp.token for lp in with_lp.logprobs] == list(with_lp.tokens)
    assert all(lp.top == () for lp in with_lp.logprobs)
    # asking for log-probabilities changes no token
    assert with_lp.tokens == engine.generate(a, plain).tokens
    # greedy: the sampled token is the most likely one
    assert all(lp.logprob <= 0 for lp in with_lp.logprobs)


def test_bad_logprobs_values_name_the_field():
    for bad in (-1, 21, 2.5, True):
        with pytest.raises(ValueError, match="logprobs must be"):
            SamplingParams(logprobs=bad)
        with pytest.raises(ValueError, match="prompt_logprobs must be"):
            SamplingParams(prompt_logprobs=bad)
