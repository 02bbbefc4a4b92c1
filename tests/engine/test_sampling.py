"""SamplingParams validation and the batched Sampler (greedy, top-k, top-p, seeding)."""

from __future__ import annotations

import math

import pytest
import torch

from marconi_ray.engine.sampler import Sampler, make_generator
from marconi_ray.protocol.sampling import SamplingParams

torch.set_num_threads(1)
VOCAB = 50


def _logits(rows: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def _draws(logits: torch.Tensor, params: SamplingParams, seed: int | None, n: int) -> list[int]:
    gen = make_generator(seed, "cpu")
    row = logits[:1]
    return [int(Sampler().sample(row, [params], [gen])[0]) for _ in range(n)]


def test_greedy_is_argmax_lowest_id_on_ties() -> None:
    logits = _logits()
    params = [SamplingParams(temperature=0.0)] * 4
    out = Sampler().sample(logits, params, [None] * 4)
    assert out.dtype == torch.long
    assert torch.equal(out, logits.argmax(dim=-1))
    tied = torch.zeros(1, VOCAB)
    tied[0, [7, 3, 9]] = 5.0
    assert int(Sampler().sample(tied, [SamplingParams(temperature=0)], [None])[0]) == 3


def test_seeded_sampling_is_reproducible_and_seeds_differ() -> None:
    logits = torch.zeros(1, VOCAB)  # uniform: draws vary a lot
    params = SamplingParams(temperature=1.0, seed=1)
    first = _draws(logits, params, 1, 20)
    assert first == _draws(logits, params, 1, 20)
    assert first != _draws(logits, params, 2, 20)


def test_row_result_does_not_depend_on_other_rows() -> None:
    logits = _logits(3)
    p = SamplingParams(temperature=0.8, top_k=10, top_p=0.9)
    alone = Sampler().sample(logits[1:2], [p], [make_generator(5, "cpu")])
    params = [SamplingParams(temperature=0), p, SamplingParams(temperature=2.0)]
    gens = [None, make_generator(5, "cpu"), make_generator(9, "cpu")]
    batched = Sampler().sample(logits, params, gens)
    assert int(batched[1]) == int(alone[0])
    assert int(batched[0]) == int(logits[0].argmax())


@pytest.mark.parametrize("params", [SamplingParams(top_k=1), SamplingParams(top_p=1e-6)])
def test_top_k_one_and_tiny_top_p_are_greedy(params: SamplingParams) -> None:
    logits = _logits(6, seed=3)
    gens = [make_generator(i, "cpu") for i in range(6)]
    out = Sampler().sample(logits, [params] * 6, gens)
    assert torch.equal(out, logits.argmax(dim=-1))


def test_top_k_restricts_support() -> None:
    logits = _logits(1, seed=4) / 10  # flat enough that every kept id shows up
    allowed = set(logits[0].topk(5).indices.tolist())
    seen = set(_draws(logits, SamplingParams(top_k=5), 0, 400))
    assert seen == allowed


def test_top_p_restricts_support_to_the_nucleus() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    seen = set(_draws(logits, SamplingParams(top_p=0.75), 0, 300))
    assert seen == {0, 1}
    seen = set(_draws(logits, SamplingParams(top_p=0.85), 0, 300))
    assert seen == {0, 1, 2}


def test_temperature_changes_spread() -> None:
    logits = _logits(1, seed=5)
    cold = _draws(logits, SamplingParams(temperature=0.05), 0, 100)
    hot = _draws(logits, SamplingParams(temperature=5.0), 0, 100)
    assert len(set(cold)) < len(set(hot))


def test_sampler_rejects_mismatched_inputs() -> None:
    with pytest.raises(ValueError, match="rows"):
        Sampler().sample(_logits(2), [SamplingParams()], [None, None])
    with pytest.raises(ValueError, match="shape"):
        Sampler().sample(torch.zeros(VOCAB), [SamplingParams()], [None])


def test_params_defaults_and_conversion() -> None:
    p = SamplingParams(stop_token_ids=[5, 6], temperature=1)  # type: ignore[arg-type]
    assert p.stop_token_ids == (5, 6)
    assert isinstance(p.temperature, float)
    assert not p.greedy and SamplingParams(temperature=0).greedy
    assert make_generator(None, "cpu") is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 0),
        ("max_tokens", True),
        ("max_tokens", 2.0),
        ("temperature", -0.1),
        ("temperature", math.inf),
        ("temperature", math.nan),
        ("temperature", "1"),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_p", math.nan),
        ("top_k", -2),
        ("top_k", 1.5),
        ("seed", -1),
        ("seed", True),
        ("stop_token_ids", [-1]),
        ("stop_token_ids", ["a"]),
        ("stop_token_ids", 5),
        ("ignore_eos", 1),
    ],
)
def test_invalid_params_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})  # type: ignore[arg-type]


def test_make_generator_rejects_bad_seed() -> None:
    with pytest.raises(ValueError, match="seed"):
        make_generator(-3, "cpu")


def test_seed_above_64_bits_is_rejected():
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(seed=2**64)
    assert SamplingParams(seed=2**64 - 1).seed == 2**64 - 1
