"""`RedisProcess`: a private `redis-server` for a benchmark or a test (the service's
journal); `tests/serve/redis_server.py` uses it too."""

from __future__ import annotations

import contextlib
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any


def die_with_parent() -> None:
    """In a child before exec: SIGTERM it when the thread that started it ends (Linux
    prctl; start it from the main thread, whose end is this process's)."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class RedisProcess:
    """A redis-server on a free loopback port with a random password (or `password`), its
    files in `workdir`, ended with the process that started it. With `persist`, AOF
    persistence (`fsync`: `everysec` or `always`), so a stop/start is an outage of the
    server, not a loss of what it held; without, nothing is persisted (`--save ""
    --appendonly no`)."""

    def __init__(
        self,
        workdir: Path,
        persist: bool = False,
        fsync: str = "everysec",
        password: str | None = None,
    ) -> None:
        if fsync not in ("everysec", "always"):
            raise ValueError(f"fsync must be everysec or always, got {fsync!r}")
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (make redis, or .ci/run)")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.password = password or secrets.token_hex(16)
        self.binary, self.workdir = binary, workdir
        self.persist, self.fsync = persist, fsync
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        """Start the server and wait (up to 20 s) until it answers a PING."""
        import redis

        self.workdir.mkdir(parents=True, exist_ok=True)
        aof = ("yes", "--appendfsync", self.fsync) if self.persist else ("no",)
        self.proc = subprocess.Popen(
            [
                *(self.binary, "--port", str(self.port), "--bind", "127.0.0.1"),
                *("--requirepass", self.password, "--dir", str(self.workdir), "--save", ""),
                *("--appendonly", *aof),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )
        probe = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 20
        while True:
            try:
                probe.ping()
                return self
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.05)

    def stop(self, kill: bool = False) -> None:
        """SIGTERM (a persisting server writes its AOF and exits), SIGKILL after 10 s; with
        `kill`, SIGKILL at once (a crash: only what was fsynced survives)."""
        if self.proc is not None:
            if not kill:
                self.proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(10)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
            self.proc = None

    def client(self) -> Any:
        """A redis-py client of this server."""
        import redis

        return redis.Redis.from_url(self.url)
