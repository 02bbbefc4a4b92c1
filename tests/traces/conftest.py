"""Session-scoped fixtures: the shared data folder, the Llama-2 tokenizer, built traces.

The data-backed fixtures do not skip: a test using one names the files it reads with
`@pytest.mark.data(...)` (tests/conftest.py), which skips it when they are absent. Built
traces are cached inside the test session to keep tests fast.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from marconi_ray.traces import mooncake, sharegpt, swebench
from marconi_ray.traces.paths import default_data_dir
from marconi_ray.traces.tokenizer import Tokenizer, load_tokenizer
from marconi_ray.traces.trace import Trace


class CharTokenizer:
    """A tiny deterministic tokenizer for synthetic tests: one token per character."""

    name = "chars"
    vocab_size = 1 << 16
    fingerprint = "chars-v1"

    def encode(self, text: str, bos: bool) -> list[int]:
        return ([1] if bos else []) + [2 + (ord(c) % 60000) for c in text]


@pytest.fixture(scope="session")
def char_tok() -> Tokenizer:
    return CharTokenizer()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return default_data_dir()


@pytest.fixture(scope="session")
def mooncake_file() -> Path:
    """The shared Mooncake synthetic trace."""
    return mooncake.default_path()


@pytest.fixture(scope="session")
def llama(data_dir: Path) -> Tokenizer:
    return load_tokenizer(None)


@pytest.fixture(scope="session")
def sharegpt100(data_dir: Path, llama: Tokenizer) -> Trace:
    return sharegpt.build_sharegpt(n_sessions=100, tokenizer=llama)


@pytest.fixture(scope="session")
def rejoined(data_dir: Path, llama: Tokenizer) -> Trace:
    return sharegpt.build_sharegpt(mode="rejoined", n_sessions=40, tokenizer=llama, seed=3)


@pytest.fixture(scope="session")
def swe(data_dir: Path, llama: Tokenizer) -> Trace:
    return swebench.build_swebench(tokenizer=llama)


@pytest.fixture(scope="session")
def swe_drop(data_dir: Path, llama: Tokenizer) -> Trace:
    return swebench.build_swebench(tokenizer=llama, drop_old_observations=True, n_sessions=10)


@pytest.fixture(scope="session")
def sharegpt_records(data_dir: Path) -> list[dict[str, object]]:
    with open(sharegpt.default_path("artifact"), encoding="utf-8") as fh:
        records: list[dict[str, object]] = json.load(fh)
    return records


@pytest.fixture()
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty data folder and a private cache folder."""
    empty = tmp_path / "empty-data"
    empty.mkdir()
    monkeypatch.setenv("MARCONI_DATA_DIR", str(empty))
    monkeypatch.setenv("MARCONI_CACHE_DIR", str(tmp_path / "cache"))
    yield empty
