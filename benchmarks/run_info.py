"""`machine`: what a benchmark report records about the run (machine, versions, commit)."""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def machine(packages: tuple[str, ...]) -> dict[str, Any]:
    """CPU count, Python, the installed versions of `packages`, the time (UTC), and the
    git commit of this checkout with whether tracked files differ from it."""

    def git(*a: str) -> str:
        run = subprocess.run(["git", *a], cwd=HERE, capture_output=True, text=True)
        return run.stdout.strip()

    out: dict[str, Any] = {"cpu_count": os.cpu_count(), "python": platform.python_version()}
    out["versions"] = {p: version(p) for p in packages}
    out["timestamp"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return out | {"git_commit": git("rev-parse", "HEAD"), "git_dirty": dirty}
