"""API key and body-size limit of the OpenAI app (`serve.ingress.security`), over a real tiny model
(`LocalBackend`, no Ray): 401 for a missing or wrong key on /v1/* and /metrics, /health
open, 413 for oversized bodies (declared or chunked) with nothing planned, the route set
is closed, and the key never shows in a repr or an error message.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import pytest
import torch
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from marconi_ray.core.cache import cache_codec
from marconi_ray.engine.engine import Engine
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.config import API_KEY_ENV, config_from_mapping
from marconi_ray.serve.ingress.api import ROUTES, build_app
from marconi_ray.serve.ingress.local_backend import LocalBackend
from marconi_ray.serve.ingress.prepare import ServedModel
from marconi_ray.serve.ingress.security import MIN_BODY_BYTES, check_bearer, route_path
from marconi_ray.serve.messages import Dispatch
from marconi_ray.serve.settings import ServeSettings

torch.set_num_threads(1)

NAME = "tiny-hybrid"
KEY = "sk-test-0123456789abcdef"
LIMIT = 4096
AUTH = {"Authorization": f"Bearer {KEY}"}
BODY = {"model": NAME, "prompt": "hello", "max_tokens": 2, "temperature": 0}
CHAT = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


class CountingBackend(LocalBackend):
    """`LocalBackend` that counts the requests it was asked to plan."""

    planned = 0

    async def plan(
        self, prompt: npt.NDArray[np.int32], params: SamplingParams, submitted: float
    ) -> Dispatch:
        self.planned += 1
        return await super().plan(prompt, params, submitted)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("security") / "tiny")


@pytest.fixture(scope="module")
def served(model_dir: Path) -> Iterator[tuple[TestClient, CountingBackend]]:
    engine = Engine(model_dir, system="marconi", cache_bytes=50_000_000)
    backend = CountingBackend(engine)
    app = build_app(backend, ServedModel.load(model_dir, NAME), api_key=KEY, max_body_bytes=LIMIT)
    with TestClient(app) as client:
        yield client, backend


@pytest.fixture
def client(served: tuple[TestClient, CountingBackend]) -> TestClient:
    return served[0]


def error_of(response: Any, status: int, code: str | None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    err: dict[str, Any] = response.json()["error"]
    assert set(response.json()) == {"error"}
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["message"]
    assert err["code"] == code and err["param"] is None
    return err


def state(backend: CountingBackend) -> tuple[Any, ...]:
    engine = backend.engine
    return (
        backend.planned,
        cache_codec.snapshot(engine.cache),
        engine.store.bytes_used,
        engine.cache.stats.to_dict(),
        engine.planner.open_requests,
    )


# ---------------------------------------------------------------------- bearer check
def test_check_bearer() -> None:
    assert check_bearer(f"Bearer {KEY}", KEY)
    assert check_bearer(f"bearer   {KEY} ", KEY)  # scheme case-insensitive, spaces trimmed
    assert not check_bearer(None, KEY)
    assert not check_bearer("", KEY)
    assert not check_bearer("Bearer", KEY)
    assert not check_bearer("Bearer ", KEY)
    assert not check_bearer(KEY, KEY)  # no scheme
    assert not check_bearer(f"Basic {KEY}", KEY)
    assert not check_bearer(f"Bearer {KEY[:-1]}", KEY)  # a prefix
    assert not check_bearer(f"Bearer {KEY}x", KEY)  # longer
    assert not check_bearer(f"Bearer {KEY[:-1]}g", KEY)  # differs in the last char
    assert not check_bearer("Bearer \udcff\u00e9", KEY)  # odd text does not raise
    with pytest.raises(ValueError):
        check_bearer("Bearer ", "")


def test_route_path_under_a_prefix() -> None:
    """Under a route prefix (Ray Serve's root_path) /health is still the open path,
    whether the server keeps the prefix in `path` or strips it."""
    assert route_path({"path": "/p/health", "root_path": "/p"}) == "/health"
    assert route_path({"path": "/health", "root_path": "/p"}) == "/health"
    assert route_path({"path": "/health", "root_path": ""}) == "/health"
    assert route_path({"path": "/phealth", "root_path": "/p"}) == "/phealth"


# ---------------------------------------------------------------------- auth over HTTP
@pytest.mark.parametrize(
    ("path", "body"), [("/v1/completions", BODY), ("/v1/chat/completions", CHAT)]
)
def test_generation_needs_the_key(
    served: tuple[TestClient, CountingBackend], path: str, body: dict[str, Any]
) -> None:
    client, backend = served
    before = state(backend)
    err = error_of(client.post(path, json=body), 401, "invalid_api_key")
    assert "missing" in err["message"]
    wrong_keys = [
        "nope",
        KEY[:-1] + "g",  # differs only in the last character
        KEY[:-1],
        KEY + "0",
        KEY.upper(),
    ]
    for wrong in wrong_keys:
        response = client.post(path, json=body, headers={"Authorization": f"Bearer {wrong}"})
        err = error_of(response, 401, "invalid_api_key")
        assert response.headers["www-authenticate"] == "Bearer"
        assert wrong not in err["message"] and KEY not in response.text
    for header in (KEY, f"Basic {KEY}", "Bearer", ""):
        error_of(
            client.post(path, json=body, headers={"Authorization": header}), 401, "invalid_api_key"
        )
    assert state(backend) == before  # nothing planned
    ok = client.post(path, json=body, headers=AUTH)
    assert ok.status_code == 200, ok.text
    assert ok.json()["usage"]["completion_tokens"] == 2
    assert backend.planned == before[0] + 1


def test_models_and_unknown_paths_need_the_key(client: TestClient) -> None:
    error_of(client.get("/v1/models"), 401, "invalid_api_key")
    models = client.get("/v1/models", headers=AUTH)
    assert models.status_code == 200 and models.json()["data"][0]["id"] == NAME
    error_of(client.get("/v1/nothing"), 401, "invalid_api_key")  # no route probing
    assert client.get("/v1/nothing", headers=AUTH).status_code == 404
    error_of(client.get("/v1/%6dodels"), 401, "invalid_api_key")  # percent-encoded path


def test_health_is_open_and_metrics_is_not(client: TestClient) -> None:
    health = client.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    error_of(client.get("/metrics"), 401, "invalid_api_key")
    error_of(client.get("/metrics", headers={"Authorization": "Bearer x"}), 401, "invalid_api_key")
    response = client.get("/metrics", headers=AUTH)
    assert response.status_code == 200
    client.post("/v1/completions", json=BODY)  # one more 401, counted
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(client.get("/metrics", headers=AUTH).text)
        for s in f.samples
    }
    assert got[("marconi_requests_total", (("status", "401"),))] >= 1


def test_without_a_key_everything_is_open(model_dir: Path) -> None:
    engine = Engine(model_dir, system="marconi", cache_bytes=10_000_000)
    app = build_app(LocalBackend(engine), ServedModel.load(model_dir, NAME))
    with TestClient(app) as client:
        assert client.get("/v1/models").status_code == 200
        assert client.get("/metrics").status_code == 200
        assert client.post("/v1/completions", json=BODY).status_code == 200
        # A stray Authorization header is ignored when no key is set.
        assert client.get("/v1/models", headers={"Authorization": "Bearer x"}).status_code == 200


# ---------------------------------------------------------------------- body size
def test_body_over_the_limit_with_content_length(
    served: tuple[TestClient, CountingBackend],
) -> None:
    client, backend = served
    before = state(backend)
    big = {**BODY, "prompt": "x" * LIMIT}
    for path in ("/v1/completions", "/v1/chat/completions"):
        response = client.post(path, json=big, headers=AUTH)
        err = error_of(response, 413, "request_too_large")
        assert str(LIMIT) in err["message"]
    # Declared size alone decides (the body is never read).
    headers = {**AUTH, "Content-Length": str(LIMIT + 1), "Content-Type": "application/json"}
    request = client.build_request("POST", "/v1/completions", content=b"{}", headers=headers)
    request.headers["Content-Length"] = str(LIMIT + 1)
    error_of(client.send(request), 413, "request_too_large")
    assert state(backend) == before
    # A body of exactly the limit is accepted.
    pad = LIMIT - len(httpx.Request("POST", "/", json={**BODY, "prompt": ""}).content)
    exact = httpx.Request("POST", "/", json={**BODY, "prompt": "y" * pad}).content
    assert len(exact) == LIMIT
    at_limit = client.post(
        "/v1/completions", content=exact, headers={**AUTH, "Content-Type": "application/json"}
    )
    assert at_limit.status_code == 200, at_limit.text
    assert backend.planned == before[0] + 1


def test_chunked_body_over_the_limit(served: tuple[TestClient, CountingBackend]) -> None:
    client, backend = served
    before = state(backend)
    sent: list[int] = []

    def chunks() -> Iterator[bytes]:
        yield b'{"model": "' + NAME.encode() + b'", "max_tokens": 2, "prompt": "'
        for _ in range(2 * LIMIT // 512):
            sent.append(512)
            yield b"z" * 512
        yield b'"}'

    for path in ("/v1/completions", "/v1/chat/completions"):
        request = client.build_request(
            "POST", path, content=chunks(), headers={**AUTH, "Content-Type": "application/json"}
        )
        assert "content-length" not in request.headers
        assert request.headers["transfer-encoding"] == "chunked"
        error_of(client.send(request), 413, "request_too_large")
    assert state(backend) == before

    # A chunked body under the limit goes through.
    def small() -> Iterator[bytes]:
        yield b'{"model": "' + NAME.encode() + b'", "max_tokens": 2, '
        yield b'"prompt": "chunked", "temperature": 0}'

    response = client.post("/v1/completions", content=small(), headers=AUTH)
    assert response.status_code == 200, response.text


def test_malformed_content_length_is_400(client: TestClient) -> None:
    for value in ("abc", "-1", "1, 2", "\u00b2"):
        request = client.build_request("POST", "/v1/completions", content=b"{}", headers=AUTH)
        request.headers["Content-Length"] = value.encode("latin-1").decode("latin-1")
        response = client.send(request)
        assert response.status_code == 400, (value, response.text)
        assert "Content-Length" in response.json()["error"]["message"]


def test_unauthenticated_big_body_is_401_not_413(client: TestClient) -> None:
    response = client.post("/v1/completions", json={**BODY, "prompt": "x" * (2 * LIMIT)})
    error_of(response, 401, "invalid_api_key")


# ---------------------------------------------------------------------- routes
def test_route_set_is_closed(model_dir: Path) -> None:
    engine = Engine(model_dir, system="marconi", cache_bytes=10_000_000)
    app = build_app(LocalBackend(engine), ServedModel.load(model_dir, NAME))
    routes: dict[str, set[str]] = {}
    for route in app.routes:
        routes.setdefault(route.path, set()).update(getattr(route, "methods", None) or ())  # type: ignore[attr-defined]
    assert (
        set(routes)
        == ROUTES
        == {
            "/v1/completions",
            "/v1/chat/completions",
            "/v1/models",
            "/health",
            "/metrics",
        }
    )
    assert routes["/v1/completions"] == routes["/v1/chat/completions"] == {"POST"}
    assert all(routes[p] <= {"GET", "HEAD"} for p in ("/v1/models", "/health", "/metrics"))
    with TestClient(app) as client:
        for path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"):
            assert client.get(path).status_code == 404


def test_build_app_refuses_bad_options(model_dir: Path) -> None:
    engine = Engine(model_dir, system="marconi", cache_bytes=10_000_000)
    model = ServedModel.load(model_dir, NAME)
    with pytest.raises(ValueError, match="api_key"):
        build_app(LocalBackend(engine), model, api_key="")
    with pytest.raises(ValueError, match="max_body_bytes"):
        build_app(LocalBackend(engine), model, max_body_bytes=MIN_BODY_BYTES - 1)


# ---------------------------------------------------------------------- settings / config
def test_repr_hides_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    url = "rediss://user:hunter2@cache.example:6380/0"
    s = ServeSettings("m", "m", api_key=KEY, redis_url=url)
    assert s.api_key == KEY
    for text in (repr(s), str(s)):
        assert KEY not in text and "hunter2" not in text
        assert "max_body_bytes=1048576" in text
    c = config_from_mapping({"api_key": KEY, "redis_url": url})
    for text in (repr(c), str(c)):
        assert KEY not in text and "hunter2" not in text


def test_config_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert config_from_mapping({}).api_key is None
    assert config_from_mapping({"api_key": KEY}).api_key == KEY
    monkeypatch.setenv(API_KEY_ENV, "from-env-key")
    assert config_from_mapping({}).api_key == "from-env-key"
    assert config_from_mapping({"api_key": None}).api_key == "from-env-key"
    assert config_from_mapping({"api_key": KEY}).api_key == KEY  # the config wins
    monkeypatch.setenv(API_KEY_ENV, "")
    assert config_from_mapping({}).api_key is None  # empty: unset
    monkeypatch.setenv(API_KEY_ENV, "bad key with spaces")
    with pytest.raises(ValueError, match="api_key") as env_err:
        config_from_mapping({})
    assert "bad key" not in str(env_err.value)
    monkeypatch.delenv(API_KEY_ENV)
    for bad in ("", "has space", "tab\there", "caf\u00e9", 12345678, ["k"]):
        with pytest.raises(ValueError, match="api_key") as err:
            config_from_mapping({"api_key": bad})
        if bad:
            assert str(bad) not in str(err.value)  # the secret is never echoed


def test_config_max_body_bytes() -> None:
    assert config_from_mapping({}).max_body_bytes == 1_048_576
    assert config_from_mapping({"max_body_bytes": 1024}).max_body_bytes == 1024
    assert config_from_mapping({"max_body_bytes": "2e6"}).max_body_bytes == 2_000_000
    for bad in (1023, 0, -5, "lots", True, float("inf")):
        with pytest.raises(ValueError, match="max_body_bytes"):
            config_from_mapping({"max_body_bytes": bad})


def test_config_redis_url() -> None:
    assert config_from_mapping({}).redis_url is None
    for good in ("redis://localhost", "redis://127.0.0.1:6379/0", "rediss://u:p@h.example:6380"):
        assert config_from_mapping({"redis_url": good}).redis_url == good
    for bad in (
        "http://localhost:6379",
        "unix:///tmp/redis.sock",
        "localhost:6379",
        "redis://",
        "redis://:secretpw@",
        "redis://host:notaport",
        "redis://host:99999",
        "redis://ho st",
        "",
        5,
    ):
        with pytest.raises(ValueError, match="redis_url") as err:
            config_from_mapping({"redis_url": bad})
        assert "secretpw" not in str(err.value)


def test_config_to_settings_carries_security(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    c = config_from_mapping(
        {"api_key": KEY, "max_body_bytes": 4096, "redis_url": "redis://localhost:6379/1"}
    )
    monkeypatch.setattr("marconi_ray.serve.config.resolve_model", lambda model, root: Path("/m"))
    s = c.to_settings()
    assert (s.api_key, s.max_body_bytes, s.redis_url) == (KEY, 4096, "redis://localhost:6379/1")
