"""A client that leaves at any point of a streamed request releases its plan at once:
before the response headers, right after them, after the first chunk (chat's role
delta) and mid-stream. Real Ray + Serve over HTTP (raw sockets, so the connection can be
cut exactly there); the lease (60 s here) must not be what frees the plan."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from serve_helpers import SERVE_PORT, http_service, local_ray

from marconi_ray.engine.presets.factory import make_model
from marconi_ray.serve.settings import ServeSettings

pytestmark = [pytest.mark.ray, pytest.mark.slow]
PORT = SERVE_PORT
SETTLE_S = 2.0
"""How long the plan may stay open after the client left (the issue asks for ~1 s; the
margin is for a loaded 2-core CI machine; before the fix it was the lease: 60 s here)."""


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    model_dir = str(make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("m") / "tiny"))
    settings = ServeSettings(
        model_dir=model_dir,
        model_name="tiny",
        cache_bytes=10**7,
        port=PORT,
        lease_s=60.0,
        app_name="dropped",
    )
    with local_ray(), http_service(settings) as coordinator:
        yield coordinator


def _send(path: str, body: dict[str, Any]) -> socket.socket:
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", PORT), timeout=30)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


def _read_until(sock: socket.socket, marker: bytes, count: int = 1) -> bytes:
    got = b""
    while got.count(marker) < count:
        chunk = sock.recv(4096)
        assert chunk, f"connection closed before {count} x {marker!r}: {got[-300:]!r}"
        got += chunk
    return got


def _open_plans(coordinator: Any) -> tuple[int, int]:
    stats = ray.get(coordinator.stats.remote())
    return sum(s.in_flight for s in stats), sum(s.reserved for s in stats)


def _wait_released(coordinator: Any) -> float:
    """Seconds until no plan is open and nothing is reserved (fails after SETTLE_S)."""
    t0 = time.monotonic()
    while _open_plans(coordinator) != (0, 0):
        waited = time.monotonic() - t0
        assert waited < SETTLE_S, f"plans still open {waited:.1f} s after the client left"
        time.sleep(0.05)
    return time.monotonic() - t0


LONG = {"max_tokens": 3000, "ignore_eos": True, "temperature": 0.0, "stream": True}
CHAT = ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
TEXT = ("/v1/completions", {"model": "tiny", "prompt": "a long story"})


@pytest.mark.parametrize(
    "where",
    ["before headers", "after headers", "after the first chunk", "mid-stream"],
)
@pytest.mark.parametrize("endpoint", [CHAT, TEXT], ids=["chat", "text"])
def test_a_client_leaving_releases_its_plan_at_once(
    service: Any, where: str, endpoint: tuple[str, dict[str, Any]]
) -> None:
    path, body = endpoint
    for _ in range(3):  # the leak was timing-dependent: several tries per drop point
        sock = _send(path, body | LONG)
        if where == "after headers":
            _read_until(sock, b"\r\n\r\n")
        elif where == "after the first chunk":
            _read_until(sock, b"data: ")
        elif where == "mid-stream":
            _read_until(sock, b"data: ", 6)
        sock.close()
        _wait_released(service)
    assert _open_plans(service) == (0, 0)


def test_a_request_after_the_drops_is_served_and_committed(service: Any) -> None:
    sock = _send(TEXT[0], TEXT[1] | {"max_tokens": 4, "temperature": 0.0, "stream": True})
    reply = _read_until(sock, b"[DONE]")
    sock.close()
    assert b'"finish_reason":"length"' in reply.replace(b" ", b"")
    _wait_released(service)


def test_clients_leaving_together_do_not_fail_the_others(service: Any) -> None:
    """Plans coalesce into shared plan_many calls: one client leaving must not cancel the
    call its batch-mates wait on (Serve cancels a cancelled request's Ray calls, found
    through its context; the shared call now runs outside every request's context).
    Rounds of 16 streams, 8 at a time: odd ones leave after the headers, even ones read
    to the end and must all get 200 and their [DONE]; then nothing stays open."""

    def one(i: int) -> bytes:
        body = TEXT[1] | {"temperature": 0.0, "stream": True, "max_tokens": 3000 if i % 2 else 8}
        sock = _send(TEXT[0], body | {"ignore_eos": True})
        try:
            return _read_until(sock, b"\r\n\r\n" if i % 2 else b"[DONE]")
        finally:
            sock.close()

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        for _ in range(4):
            replies = list(pool.map(one, range(16)))
            for i, reply in enumerate(replies):
                assert reply.startswith(b"HTTP/1.1 200"), (i, reply[:300])
                assert i % 2 or b"[DONE]" in reply, (i, reply[-300:])
            _wait_released(service)
