"""`KVMemory`: the setting a device KV pool is sized from once at start (see
`engine.kv_memory`): a byte budget, or a fraction of the device's free memory (CUDA)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVMemory:
    """The setting: a byte budget, or a fraction of the device's free memory (CUDA)."""

    bytes: int | None = None
    fraction: float | None = None

    def __post_init__(self) -> None:
        if (self.bytes is None) == (self.fraction is None):
            raise ValueError(
                f"set exactly one of kv memory bytes and fraction, got bytes={self.bytes!r}, "
                f"fraction={self.fraction!r}"
            )
        if self.bytes is not None and (isinstance(self.bytes, bool) or self.bytes < 1):
            raise ValueError(f"kv memory bytes must be an int >= 1, got {self.bytes!r}")
        if self.fraction is not None and not 0 < self.fraction <= 1:
            raise ValueError(f"kv memory fraction must be in (0, 1], got {self.fraction!r}")
