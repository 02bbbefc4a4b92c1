"""A request whose last token lands exactly on a state boundary the cache keeps (vllm+'s
32-token blocks) has that token consumed, so the commit finds the state: whether the
request ends there by its length or by a grammar completing there (before the fix, the
commit failed: no state captured at that depth)."""

from __future__ import annotations

from pathlib import Path

import pytest
from llguidance import LLMatcher

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.presets.byte_tokenizer import BYTE_OFFSET
from marconi_ray.protocol.sampling import SamplingParams


@pytest.mark.parametrize("how", ["length", "grammar"])
def test_a_request_ending_on_a_block_boundary_keeps_its_block_state(
    model_dirs: dict[str, Path], how: str
) -> None:
    """The next turn then hits the whole block."""
    engine = Engine(model_dirs["nemotron_h"], system="vllm+", cache_bytes=50_000_000)
    prompt = [BYTE_OFFSET + (i % 200) for i in range(60)]  # 4 tokens short of 64
    if how == "length":
        params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    else:
        exact = LLMatcher.grammar_from_lark('start: "abcd"')
        params = SamplingParams(max_tokens=16, temperature=0.0, grammar=exact)
    first = engine.generate(prompt, params)
    assert len(first.tokens) == 4 and len(prompt) + 4 == 64
    again = engine.generate(prompt + list(first.tokens) + [BYTE_OFFSET + 1], SamplingParams(2))
    assert again.usage.cached_tokens == 64
