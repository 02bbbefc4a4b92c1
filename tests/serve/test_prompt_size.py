"""A prompt's size is checked before it is tokenized, and big bodies are prepared off the
ingress's event loop (`/health` keeps answering while they are refused). The app is the
real one over a real tiny model (`LocalBackend`, no Ray); HTTP over ASGI in one loop."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.serve.ingress.api import build_app
from marconi_ray.serve.ingress.local_backend import LocalBackend
from marconi_ray.serve.ingress.openai_protocol import APIError
from marconi_ray.serve.ingress.prepare import ServedModel, prepare_chat, prepare_completion

torch.set_num_threads(1)
NAME = "tiny"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("size") / "tiny")


@pytest.fixture(scope="module")
def model(model_dir: Path) -> ServedModel:
    return ServedModel.load(model_dir, NAME)


class CountingTokenizer:
    """The real tokenizer, counting what it is asked to encode."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name in ("encode", "apply_chat_template"):
            self.calls += 1
        return attr


def sample_texts() -> list[str]:
    """Real prose, tables and code: this project's own documentation, by paragraph."""
    docs = [ROOT / "README.md", ROOT / "docs" / "ARCHITECTURE.md"]
    return [p for d in docs for p in d.read_text().split("\n\n") if p.strip()]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([*"ab \n\t", "é", "中", "<|end|>", "\u00a0"])).map("".join))
def test_the_cheap_bound_never_exceeds_the_real_count(model: ServedModel, text: str) -> None:
    assert model.min_tokens([text]) <= len(model.tokenizer.encode(text))


def test_the_bound_holds_on_real_conversations(model: ServedModel) -> None:
    texts = sample_texts()
    assert len(texts) >= 50
    for text in texts:
        assert model.min_tokens([text]) <= len(model.tokenizer.encode(text))
    assert model.max_piece_chars >= 1


def test_an_oversized_prompt_is_refused_without_tokenizing(model: ServedModel) -> None:
    counting = CountingTokenizer(model.tokenizer)
    spied = ServedModel(
        model.name, counting, model.vocab_size, model.max_position, (), 0, model.max_piece_chars
    )
    big = "x" * 1_000_000
    t0 = time.perf_counter()
    with pytest.raises(APIError) as err:
        prepare_completion({"model": NAME, "prompt": big}, spied)
    assert err.value.status == 400 and err.value.code == "context_length_exceeded"
    assert "at least" in err.value.message and counting.calls == 0
    with pytest.raises(APIError) as chat_err:
        prepare_chat({"model": NAME, "messages": [{"role": "user", "content": big}]}, spied)
    assert chat_err.value.param == "messages" and counting.calls == 0
    assert time.perf_counter() - t0 < 0.5  # tokenizing one of them took ~1.3 s here
    prepare_completion({"model": NAME, "prompt": "fits"}, spied)
    assert counting.calls == 1


def test_health_answers_while_big_bodies_are_tokenized(model_dir: Path) -> None:
    """Bodies of blanks pass the cheap bound (blanks may be dropped by a pre-tokenizer),
    so they are tokenized (~0.3 s each) before their 400: in a worker thread."""
    engine = Engine(model_dir, system="marconi", cache_bytes=10_000_000)
    app = build_app(LocalBackend(engine), ServedModel.load(model_dir, NAME))
    blanks = " " * 900_000
    assert len(json.dumps({"prompt": blanks})) > 16_384  # over ingress.OFFLOAD_BYTES

    async def main() -> tuple[list[int], list[float]]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            body = {"model": NAME, "prompt": blanks, "max_tokens": 1}
            stamps = [time.perf_counter()]
            post = client.post
            big = [asyncio.ensure_future(post("/v1/completions", json=body)) for _ in range(4)]
            while not all(b.done() for b in big):
                assert (await client.get("/health")).status_code == 200
                stamps.append(time.perf_counter())
                await asyncio.sleep(0.02)
            codes = [(await b).status_code for b in big]
            return codes, [b - a for a, b in itertools.pairwise(stamps)]

    codes, gaps = asyncio.run(main())
    assert codes == [400] * 4
    # answered all along: no gap between two /health answers (or before the first) is
    # long (inline, the loop tokenized the four bodies, ~2 s, before answering once)
    assert len(gaps) >= 3 and max(gaps) < 0.5, gaps
