"""Fixtures of the load generator tests: the fake OpenAI server (one per module)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from loadgen_fake_server import FakeState, fake_server


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[str, FakeState]]:
    with fake_server() as pair:
        yield pair
