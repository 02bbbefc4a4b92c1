"""Where the shared real-data folder lives, and a helper for required input files."""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR_ENV = "MARCONI_DATA_DIR"


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
