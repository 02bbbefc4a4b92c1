"""What a client sees when no replica can run its request (every re-plan after a lost
replica failed, `ReplicaUnavailable`): a 503 with Retry-After, streamed or not, as long as
no output was sent; an `error` event with the 503's body after that. Other failures stay
500s. The app over a real tiny model (`LocalBackend`), its stream made to fail."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.protocol.orders import TokenEvent
from marconi_ray.serve.ingress.api import build_app
from marconi_ray.serve.ingress.local_backend import LocalBackend
from marconi_ray.serve.ingress.prepare import ServedModel
from marconi_ray.serve.ingress.ray_backend import ReplicaUnavailable
from marconi_ray.serve.messages import Completed, Dispatch

torch.set_num_threads(1)
NAME = "tiny"
BODY = {"model": NAME, "prompt": "hello there", "max_tokens": 6, "temperature": 0}


class FailingStream:
    """The real stream's first `after` token events, then `error`."""

    def __init__(self, inner: Any, after: int, error: Exception) -> None:
        self.inner, self.after, self.error = inner, after, error

    def __aiter__(self) -> FailingStream:
        return self

    async def __anext__(self) -> TokenEvent | Completed:
        if self.after == 0:
            self.inner.cancel()
            raise self.error
        self.after -= 1
        event: TokenEvent | Completed = await self.inner.__anext__()
        return event

    def ready(self) -> bool:
        return self.after > 0 and self.inner.ready()

    def cancel(self) -> None:
        self.inner.cancel()


class FailingBackend(LocalBackend):
    def __init__(self, engine: Engine, after: int, error: Exception) -> None:
        super().__init__(engine)
        self.after, self.error = after, error

    def generate(self, dispatch: Dispatch, stream: bool = True) -> Any:
        return FailingStream(super().generate(dispatch, stream), self.after, self.error)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("unavailable") / "tiny")


def _client(model_dir: Path, after: int, error: Exception) -> TestClient:
    engine = Engine(model_dir, system="marconi", cache_bytes=10_000_000)
    backend = FailingBackend(engine, after, error)
    return TestClient(build_app(backend, ServedModel.load(model_dir, NAME)))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_no_replica_before_any_output_is_a_503_with_retry_after(
    model_dir: Path, stream: bool
) -> None:
    with _client(model_dir, 0, ReplicaUnavailable("replica lost, re-plans failed")) as client:
        response = client.post("/v1/completions", json={**BODY, "stream": stream})
        assert response.status_code == 503, response.text
        assert response.headers["retry-after"] == "1"
        error = response.json()["error"]
        assert error["type"] == "service_unavailable" and "re-plans failed" in error["message"]
        metrics = client.get("/metrics").text
        assert 'marconi_requests_total{status="503"} 1.0' in metrics


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_other_failures_before_any_output_stay_500(model_dir: Path, stream: bool) -> None:
    with _client(model_dir, 0, RuntimeError("boom")) as client:
        response = client.post("/v1/completions", json={**BODY, "stream": stream})
        assert response.status_code == 500, response.text
        assert "retry-after" not in response.headers
        assert "boom" in response.json()["error"]["message"]


def test_no_replica_mid_stream_is_an_error_event_with_the_503_body(model_dir: Path) -> None:
    with _client(model_dir, 3, ReplicaUnavailable("lost mid-stream")) as client:
        body = {**BODY, "stream": True, "ignore_eos": True, "return_token_ids": True}
        response = client.post("/v1/completions", json=body)
        assert response.status_code == 200
        lines = [ln.removeprefix("data: ") for ln in response.text.split("\n\n") if ln]
        assert lines[-1] == "[DONE]"
        chunks = [json.loads(ln) for ln in lines[:-1]]
        ids = [t for c in chunks if "choices" in c for t in c["choices"][0]["token_ids"]]
        assert 0 < len(ids) <= 3, "what was generated before the failure went out"
        assert chunks[-1]["error"]["type"] == "service_unavailable"
