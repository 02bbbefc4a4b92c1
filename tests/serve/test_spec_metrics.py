"""Speculative decoding behind the OpenAI API (the app over a `LocalBackend` engine with
ngram drafting, on a real tiny model): replies equal an engine's without speculation, and
`/metrics` counts the tokens drafted and kept, overall and by draft position."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.protocol.speculative import SpeculativeConfig
from marconi_ray.serve.ingress.api import build_app
from marconi_ray.serve.ingress.local_backend import LocalBackend
from marconi_ray.serve.ingress.prepare import ServedModel

torch.set_num_threads(1)
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("spec") / "tiny")


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_spec_metrics_count_drafted_and_kept_tokens(model_dir: Path) -> None:
    spec = SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_min=1)
    engine = Engine(model_dir, system="marconi", cache_bytes=50_000_000, speculative=spec)
    plain = Engine(model_dir, system="vanilla")
    body = {"model": "tiny", "max_tokens": 24, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}  # fmt: skip
    served = ServedModel.load(model_dir, "tiny")
    with TestClient(build_app(LocalBackend(engine), served)) as c:
        for i in range(3):
            prompt = f"abcabcabc {i} abcabcabc"
            out = c.post("/v1/completions", json={**body, "prompt": prompt}).json()
            ids = list(served.tokenizer.encode(prompt))
            want = plain.generate(ids, GREEDY).tokens
            assert out["choices"][0]["token_ids"] == list(want)
        samples = _samples(c.get("/metrics").text)
    drafted = samples[("marconi_spec_draft_tokens_total", ())]
    kept = samples[("marconi_spec_accepted_tokens_total", ())]
    assert drafted == engine.worker.spec_stats.drafted > 0
    assert kept == engine.worker.spec_stats.accepted
    by_position = {
        (dict(labels)["position"], dict(labels)["outcome"]): v
        for (name, labels), v in samples.items()
        if name == "marconi_spec_position_tokens_total"
    }
    assert by_position[("0", "drafted")] > 0
    assert sum(v for (_, o), v in by_position.items() if o == "drafted") == drafted
    assert sum(v for (_, o), v in by_position.items() if o == "kept") == kept
