"""A real `redis-server` (Debian's, installed by `.ci/run`) for tests: the benchmarks'
`RedisProcess` with every write fsynced, stopped by SIGKILL (an outage, not a clean
shutdown), its files in the test's `tmp`."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from redis_process import RedisProcess

PASSWORD = "test-journal-password"


class RedisServer(RedisProcess):
    """Start/stop/restart one redis-server; `url` carries the password."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir, persist=True, fsync="always", password=PASSWORD)

    def stop(self, kill: bool = True) -> None:
        super().stop(kill)
