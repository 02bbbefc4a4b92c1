"""Shared test setup: torch pinned to one thread, and the `data` marker.

`@pytest.mark.data("sharegpt", "llama2_tokenizer")` marks a test that reads files of the
shared data folder (`../shared/data`, or `$MARCONI_DATA_DIR`), by their names in
`marconi_ray.traces.paths.DATA_FILES`; it is skipped, with a reason naming each absent
file, when any of them is missing. A bare `@pytest.mark.data` or an unknown name is a
collection error."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# Triton kernels run on CPU tensors under Triton's interpreter unless a GPU is present
# (the `triton` marker's tests). Set before anything imports triton: `triton.jit` reads
# it when a kernel is defined.
if not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "data(*names): reads these files of the shared data folder (names of "
        "marconi_ray.traces.paths.DATA_FILES); skipped when one is absent",
    )
    compile_packages()


def compile_packages() -> None:
    """Byte-compile the repository's packages (a no-op when their `__pycache__` is up to
    date). Where PYTHONDONTWRITEBYTECODE is set (CI containers), no process writes one,
    so every Ray worker (one per actor: each shard, replica, coordinator, tuner)
    compiled again the modules it imports: ~0.6 s of CPU for a model replica."""
    import compileall
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for package in ("marconi_ray", "loadgen", "kernels/marconi_kernels"):
        if (root / package).is_dir():
            compileall.compile_dir(root / package, quiet=1)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the local Ray the Ray tests share (tests/ray_session.py), if one was started."""
    import sys

    if "ray_session" in sys.modules:
        sys.modules["ray_session"].stop_ray()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip each `data`-marked test whose data files are absent (see the module docstring)."""
    from marconi_ray.traces.paths import DATA_FILES, missing_data

    known = ", ".join(DATA_FILES)
    for item in items:
        names: list[str] = []
        for mark in item.iter_markers("data"):
            if not mark.args or not all(isinstance(a, str) for a in mark.args):
                raise pytest.UsageError(
                    f"{item.nodeid}: @pytest.mark.data takes the names of the data files "
                    f"the test reads (of {known})"
                )
            names += mark.args
        try:
            missing = missing_data(names)
        except KeyError as exc:
            raise pytest.UsageError(f"{item.nodeid}: {exc.args[0]}") from None
        if missing:
            absent = ", ".join(f"{name} ({path})" for name, path in missing.items())
            item.add_marker(pytest.mark.skip(reason=f"needs shared data, absent: {absent}"))
