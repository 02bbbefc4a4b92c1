"""Checks of a LoadConfig before a run: each failure is a ValueError naming the value."""

from __future__ import annotations

import math

from loadgen.arrivals import ARRIVALS, parse_think
from loadgen.config import LoadConfig
from loadgen.hosts import check_url
from loadgen.sessions import HISTORY_MODES, PROMPT_MODES


def _positive(name: str, value: float | None, allow_none: bool = True) -> None:
    if value is None:
        if not allow_none:
            raise ValueError(f"{name} is required")
        return
    if isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")


def validate_config(config: LoadConfig) -> None:
    """Raise ValueError naming the first bad field of ``config`` (host, numbers, modes)."""
    check_url(config.url, config.allow_hosts)
    if config.sessions < 1:
        raise ValueError(f"sessions must be >= 1, got {config.sessions}")
    if config.arrivals == "rate" and config.session_rate is None and config.concurrency is None:
        raise ValueError("set a session rate or a concurrency (both are None)")
    _positive("session_rate", config.session_rate)
    _positive("burstiness", config.burstiness, allow_none=False)
    if config.arrivals not in ARRIVALS:
        raise ValueError(f"arrivals {config.arrivals!r} is not one of {', '.join(ARRIVALS)}")
    _positive("time_scale", config.time_scale, allow_none=False)
    if config.concurrency is not None and config.concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {config.concurrency}")
    parse_think(config.think)
    if config.history not in HISTORY_MODES:
        raise ValueError(f"history {config.history!r} is not one of {', '.join(HISTORY_MODES)}")
    if config.prompt_mode not in PROMPT_MODES:
        raise ValueError(
            f"prompt mode {config.prompt_mode!r} is not one of {', '.join(PROMPT_MODES)}"
        )
    if config.vocab_size is not None and config.vocab_size < 9:
        raise ValueError(f"vocab_size must be >= 9, got {config.vocab_size}")
    if config.max_output < 1:
        raise ValueError(f"max_output must be >= 1, got {config.max_output}")
    if config.max_prompt < 1:
        raise ValueError(f"max_prompt must be >= 1, got {config.max_prompt}")
    if config.warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {config.warmup}")
    if config.max_requests is not None and config.max_requests < 1:
        raise ValueError(f"max_requests must be >= 1, got {config.max_requests}")
    _positive("max_seconds", config.max_seconds)
    _positive("timeout_s", config.timeout_s, allow_none=False)
    for name in ("slo_ttft_ms", "slo_tpot_ms", "slo_e2el_ms"):
        _positive(name, getattr(config, name))
