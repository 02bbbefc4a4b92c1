"""Fixtures of the serve tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from redis_server import RedisServer


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A private, password-protected `redis-server` on a free loopback port."""
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.stop()
