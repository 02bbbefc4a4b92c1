"""Which servers the load generator may target: loopback unless explicitly allowed."""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def check_url(url: str, allow_hosts: Iterable[str] = ()) -> str:
    """Return the host of ``url`` if it may be targeted, else raise ValueError naming it.

    Contract: ``url`` must be ``http://`` or ``https://`` with a host; the host must be a
    loopback name (127.0.0.1, localhost, ::1) or appear in ``allow_hosts``.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"url {url!r} must start with http:// or https://")
    host = parts.hostname
    if not host:
        raise ValueError(f"url {url!r} has no host")
    allowed = LOOPBACK_HOSTS | {h.strip("[]").lower() for h in allow_hosts}
    if host.lower() not in allowed:
        raise ValueError(
            f"host {host!r} is not loopback; pass --allow-host {host} to target it on purpose"
        )
    return host
