"""Constrained decoding in the engine (`engine.constrained`): a grammar's tokens only, the
request stopped where the grammar completes, unconstrained rows of the same batch
untouched, a resumed request continuing the grammar where it left off, and the bitmask
expansion equal to its one-token-at-a-time reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from llguidance import LLMatcher

from marconi_ray.engine.constrained import bitmask_words, expand_bitmask, expand_bitmask_ref
from marconi_ray.engine.engine import Engine
from marconi_ray.engine.presets.byte_tokenizer import BYTE_OFFSET
from marconi_ray.engine.spec.drafters import OracleDrafter
from marconi_ray.protocol.model_files import load_tokenizer
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.protocol.speculative import SpeculativeConfig

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["name", "n"],
    "additionalProperties": False,
}
GRAMMAR = LLMatcher.grammar_from_json_schema(SCHEMA, overrides={"whitespace_flexible": False})


def _prompt(i: int) -> list[int]:
    return [BYTE_OFFSET + ord(c) for c in f"request {i}: answer in JSON"]


@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 100])
def test_expand_bitmask_equals_its_reference(vocab: int) -> None:
    g = torch.Generator().manual_seed(vocab)
    words = bitmask_words(vocab)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, words), generator=g, dtype=torch.int32)
    assert torch.equal(expand_bitmask(bitmask, vocab), expand_bitmask_ref(bitmask, vocab))


@pytest.fixture(scope="module")
def engine(model_dirs: dict[str, Path]) -> Engine:
    return Engine(model_dirs["nemotron_h"], system="marconi", cache_bytes=50_000_000)


def _text(engine: Engine, tokens: tuple[int, ...]) -> str:
    return str(load_tokenizer(engine.model_dir).decode(list(tokens)))


def test_sampled_output_satisfies_the_grammar_and_stops_at_its_end(engine: Engine) -> None:
    params = [
        SamplingParams(max_tokens=120, temperature=1.0, seed=s, grammar=GRAMMAR, ignore_eos=True)
        for s in range(12)
    ]
    for result in engine.generate_many([_prompt(i) for i in range(12)], params):
        value = json.loads(_text(engine, result.tokens))
        assert set(value) == {"name", "n"} and len(value["name"]) <= 8
        assert 0 <= value["n"] <= 99
        assert result.finish_reason == "stop"


def test_unconstrained_rows_of_the_same_batch_are_untouched(engine: Engine) -> None:
    free = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    alone = engine.generate_many([_prompt(100), _prompt(101)], [free, free])
    constrained = SamplingParams(max_tokens=60, temperature=0.0, grammar=GRAMMAR)
    mixed = engine.generate_many(
        [_prompt(100), _prompt(7), _prompt(101)], [free, constrained, free]
    )
    assert [r.tokens for r in (mixed[0], mixed[2])] == [r.tokens for r in alone]
    json.loads(_text(engine, mixed[1].tokens))


def test_logprobs_are_of_the_unmasked_distribution(engine: Engine) -> None:
    free = SamplingParams(max_tokens=1, temperature=0.0, logprobs=3)
    masked = SamplingParams(max_tokens=1, temperature=0.0, logprobs=3, grammar=GRAMMAR)
    a = engine.generate(_prompt(200), free)
    b = engine.generate(_prompt(200), masked)
    assert _text(engine, b.tokens) == "{"
    assert b.logprobs[0].top == a.logprobs[0].top  # the same most likely tokens, unmasked


def test_a_resumed_request_continues_its_grammar(engine: Engine) -> None:
    """A re-planned request (prompt + the tokens already streamed, `grammar_prefix` the
    same tokens) generates what the uninterrupted one would have (greedy)."""
    whole = engine.generate(
        _prompt(300), SamplingParams(max_tokens=80, temperature=0.0, grammar=GRAMMAR)
    )
    k = 5
    head = list(whole.tokens[:k])
    rest = engine.generate(
        _prompt(300) + head,
        SamplingParams(max_tokens=80 - k, temperature=0.0, grammar=GRAMMAR, grammar_prefix=head),
    )
    assert head + list(rest.tokens) == list(whole.tokens)


def test_a_bad_grammar_fails_its_request_and_frees_everything(engine: Engine) -> None:
    before = engine.worker.store.device_kv.held
    bad = SamplingParams(max_tokens=4, grammar='{"grammars": [{"lark_grammar": "start: ("}]}')
    with pytest.raises(ValueError, match="grammar"):
        engine.generate(_prompt(400), bad)
    assert engine.worker.num_running == 0 and engine.worker.reserved_rows == 0
    assert engine.worker.store.device_kv.held == before
    assert engine.generate(_prompt(400), SamplingParams(max_tokens=2)).usage.completion_tokens == 2


def test_sampling_params_check_the_grammar_fields() -> None:
    with pytest.raises(ValueError, match="grammar must be"):
        SamplingParams(grammar="")
    with pytest.raises(ValueError, match="grammar_prefix needs a grammar"):
        SamplingParams(grammar_prefix=(1, 2))
    with pytest.raises(ValueError, match="grammar_prefix must be ints"):
        SamplingParams(grammar=GRAMMAR, grammar_prefix=(-1,))


def test_constrained_requests_speculate_within_their_grammar(
    model_dirs: dict[str, Path], engine: Engine
) -> None:
    """With speculation a constrained request's drafts are cut to what its grammar
    accepts and the verified logits are masked per position: greedy tokens equal the
    run without speculation (drafts kept), and sampled ones still satisfy the schema."""
    greedy = SamplingParams(max_tokens=120, temperature=0.0, grammar=GRAMMAR, ignore_eos=True)
    prompts = [_prompt(40 + i) for i in range(3)]
    want = engine.generate_many(prompts, [greedy] * 3)
    futures = {tuple(p): list(r.tokens) for p, r in zip(prompts, want, strict=True)}
    config = SpeculativeConfig(method="oracle", num_speculative_tokens=4, backoff=0)
    spec = Engine(model_dirs["nemotron_h"], system="marconi", cache_bytes=50_000_000,
                  speculative=config, drafter=OracleDrafter(futures, 0.7, vocab=263))  # fmt: skip
    got = spec.generate_many(prompts, [greedy] * 3)
    assert [r.tokens for r in got] == [r.tokens for r in want]
    assert sum(r.spec.accepted for r in got) > 0
    sampled = [
        SamplingParams(max_tokens=120, temperature=1.0, seed=s, grammar=GRAMMAR, ignore_eos=True)
        for s in range(3)
    ]
    for result in spec.generate_many(prompts, sampled):
        value = json.loads(_text(spec, result.tokens))
        assert set(value) == {"name", "n"} and result.finish_reason == "stop"
    spec.store.check()
