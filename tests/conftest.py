"""Shared test setup: torch pinned to one thread, and small helpers."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
