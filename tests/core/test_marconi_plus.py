"""`marconi+`: Marconi's admission plus speculative block checkpoints, gated by the
bootstrap tuner's `speculate` knob (issue "Beyond Marconi's taxonomy", item 2)."""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import SMALL_COST, Req, cache, toks

from marconi_ray.core.cache import cache_codec
from marconi_ray.core.cache.admission import MarconiPlusAdmission, make_admission
from marconi_ray.core.cache.invariants import check_tree
from marconi_ray.core.cache.tuner import (
    BootstrapTuner,
    TunerConfig,
    result_from,
    result_record,
    run_grid,
)
from marconi_ray.core.sim.reference import ReferenceCache, checked_serve


def test_speculative_depths_are_geometric_block_multiples_past_the_hit() -> None:
    policy = MarconiPlusAdmission(block=4)
    assert policy.speculative_depths(0, 40) == [4, 8, 16, 32]
    assert policy.speculative_depths(8, 40) == [16, 32]
    assert policy.speculative_depths(0, 32) == [4, 8, 16]  # the input's end is not one
    assert make_admission("marconi+").name == "marconi+"
    assert make_admission("marconi+:64").block == 64


@pytest.mark.parametrize("bad", ["marconi+:x", "marconi+:0", "marconi+:-4"])
def test_bad_marconi_plus_block_sizes_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="marconi\\+"):
        make_admission(bad)


def test_a_prefix_that_ended_inside_an_earlier_input_hits_on_its_first_reuse() -> None:
    """A 20-token system prompt seen once inside a longer input: Marconi misses its first
    reuse (the branch is only detected then); marconi+ reuses the 16 tokens up to the
    deepest speculative checkpoint below it."""
    prompt = list(range(100, 120))
    first, second = toks(*prompt, 1, 2, 3, 4, 5), toks(*prompt, 9, 9, 9)
    plain = cache(admission="marconi")
    plus = cache(admission="marconi+:4")
    for c in (plain, plus):
        c.serve(first, toks(7))
    assert plain.serve(second, toks(7)) == 0
    assert plus.serve(second, toks(7)) == 16
    assert plus.stats.states_admitted["speculative"] == 3  # 4, 8, 16
    assert plus.stats.hits_by_reason["speculative"] == 1
    assert plus.stats.hit_tokens_by_reason["speculative"] == 16
    assert plus.stats.states_hit["speculative"] == 1
    check_tree(plus.tree)


def test_the_knob_off_is_marconi() -> None:
    rng = np.random.default_rng(3)
    plain, plus = (
        cache(capacity=3000, admission="marconi"),
        cache(capacity=3000, admission="marconi+:4"),
    )
    plus.set_speculate(False)
    for _ in range(60):
        inp = rng.integers(0, 3, int(rng.integers(1, 30))).astype(np.int32)
        out = rng.integers(0, 3, 3).astype(np.int32)
        assert plain.serve(inp, out) == plus.serve(inp, out)
    assert plus.stats.states_admitted["speculative"] == 0
    with pytest.raises(ValueError, match="no speculate knob"):
        plain.set_speculate(True)


def test_every_hit_is_real_with_speculation_under_pressure() -> None:
    rng = np.random.default_rng(5)
    c, ref = cache(capacity=900, admission="marconi+:3", alpha=0.7), ReferenceCache()
    prefixes = [rng.integers(0, 4, 12).astype(np.int32) for _ in range(3)]
    for _ in range(150):
        inp = np.concatenate([prefixes[int(rng.integers(3))], rng.integers(0, 4, 6)])
        checked_serve(c, ref, inp.astype(np.int32), rng.integers(0, 4, 2).astype(np.int32))
        check_tree(c.tree)
    assert c.stats.states_admitted["speculative"] > 0 and c.stats.hits_by_reason["speculative"]


def shared_prefix_trace(n: int, seed: int, n_prompts: int = 30) -> list[Req]:
    """Requests that reuse `n_prompts` documents (24 tokens) seen inside earlier inputs,
    each one a few times: most reuse is a first or second reuse, which Marconi misses."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(10, 99, 24).astype(np.int32) for _ in range(n_prompts)]
    return [
        Req(
            np.concatenate(
                [prompts[int(rng.integers(n_prompts))], rng.integers(100, 999, 20)]
            ).astype(np.int32),
            rng.integers(100, 999, 4).astype(np.int32),
        )
        for _ in range(n)
    ]


def test_the_tuner_replays_the_window_with_speculation_on_and_off() -> None:
    reqs = shared_prefix_trace(120, seed=1)
    c = cache(capacity=6000, admission="marconi+:8")
    tuner = BootstrapTuner(TunerConfig(multiplier=5, grid=(0.0, 1.0)))
    jobs = []
    for req in reqs:
        c.serve(req.input_tokens, req.output_tokens)
        job = tuner.after_request(c, req)
        if tuner.phase == "recording" and not jobs:
            assert c.admission.state()["speculate"] == 0, "off while the window records"
        if job is not None:
            assert job.knobs == (True, False)
            assert [(a, k) for a, k in job.settings] == [
                (0.0, True),
                (1.0, True),
                (0.0, False),
                (1.0, False),
            ]
            result = run_grid(job)
            jobs.append(result)
            tuner.adopt(result, c)
    assert len(jobs) == 1
    result = jobs[0]
    assert result.best_speculate is not None and len(result.knob_scores) == 4
    on = max(v for _, k, v in result.knob_scores if k)
    off = max(v for _, k, v in result.knob_scores if not k)
    assert result.best_speculate == (on > off)
    assert bool(c.admission.state()["speculate"]) == result.best_speculate
    assert on > off, "shared prompts inside inputs: speculation pays on this trace"
    assert result_from(result_record(result), "r") == result


def test_tuning_is_the_same_serial_or_split_into_tasks() -> None:
    reqs = shared_prefix_trace(60, seed=2)
    c = cache(capacity=2600, admission="marconi+:8")
    for req in reqs[:30]:
        c.serve(req.input_tokens, req.output_tokens)
    from marconi_ray.core.cache.tuner import TuneJob

    window = tuple((r.input_tokens, r.output_tokens) for r in reqs[30:])
    job = TuneJob(
        cache_codec.snapshot(c), window, (0.0, 0.5, 2.0), "token_hit_rate", 30, (True, False)
    )
    assert run_grid(job).knob_scores == run_grid(job, n_tasks=4).knob_scores


def test_the_knob_and_the_reasons_survive_a_snapshot() -> None:
    c = cache(capacity=10**6, admission="marconi+:4", cost=SMALL_COST)
    for req in shared_prefix_trace(20, seed=4):
        c.serve(req.input_tokens, req.output_tokens)
    c.set_speculate(False)
    copy_ = cache_codec.restore(cache_codec.snapshot(c))
    assert copy_.admission.state() == {"speculate": 0}
    assert copy_.reasons == c.reasons and copy_.hit_once == c.hit_once
    assert copy_.stats.to_dict() == c.stats.to_dict()
