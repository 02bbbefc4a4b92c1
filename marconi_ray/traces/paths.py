"""Where the shared real-data folder lives, the files of it the package reads
(:data:`DATA_FILES`), and helpers for required input files."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

DATA_DIR_ENV = "MARCONI_DATA_DIR"

DATA_FILES: dict[str, Path] = {
    # the `sharegpt` trace (artifact mode)
    "sharegpt": Path("sharegpt")
    / "ShareGPT_V3_unfiltered_cleaned_split.ge10rounds_from_first17671.json",
    # the `sharegpt-rejoined` trace, and raw replies for the detokenizer tests
    "sharegpt_head4000": Path("sharegpt") / "ShareGPT_V3_unfiltered_cleaned_split.head4000.json",
    # the `swebench` trace: a folder of `*.traj.json` files
    "swebench": Path("swebench_agent_trajectories")
    / "mini_swe_agent_gemini3pro_swebench_verified"
    / "trajs",
    # the `mooncake` and `mooncake-chained` traces
    "mooncake": Path("mooncake") / "synthetic_trace.jsonl",
    # the default tokenizer of every built trace (`load_tokenizer(None)`)
    "llama2_tokenizer": Path("tokenizers") / "llama2" / "tokenizer.model",
}
"""Every file (or folder) of the shared data folder that the package reads, by name, as a
path under the data folder. The trace builders' default paths are these (held by
tests/traces/test_traces_registry.py), and the tests' `@pytest.mark.data(NAME, ...)` marker
(tests/conftest.py) skips a test naming one that is absent."""


def default_data_dir() -> Path:
    """The shared data folder (it may not exist).

    ``$MARCONI_DATA_DIR`` if set and non-empty, else ``<repo root>/../shared/data`` where the
    repo root is two folders above this package (``marconi_ray/traces/..``/..).
    """
    env = os.environ.get(DATA_DIR_ENV, "")
    if env:
        return Path(env).expanduser()
    repo_root = Path(__file__).resolve().parents[2]
    return repo_root.parent / "shared" / "data"


def require_file(path: str | os.PathLike[str]) -> Path:
    """Return ``path`` as a Path if it is an existing file, else FileNotFoundError naming it."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"required file not found: {p}")
    return p


def require_dir(path: str | os.PathLike[str]) -> Path:
    """Return ``path`` as a Path if it is an existing folder, else FileNotFoundError naming it."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"required folder not found: {p}")
    return p


def data_path(name: str, data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The path of the shared data file ``name`` (a key of :data:`DATA_FILES`) under
    ``data_dir`` (default :func:`default_data_dir`); KeyError naming the known ones."""
    if name not in DATA_FILES:
        raise KeyError(f"unknown data file {name!r}; known: {', '.join(DATA_FILES)}")
    base = Path(data_dir) if data_dir is not None else default_data_dir()
    return base / DATA_FILES[name]


def missing_data(
    names: Iterable[str], data_dir: str | os.PathLike[str] | None = None
) -> dict[str, Path]:
    """Those of the data files ``names`` that are absent, each with the path it was
    looked for at (empty when all are there)."""
    paths = {name: data_path(name, data_dir) for name in names}
    return {name: p for name, p in paths.items() if not p.exists()}
