"""`ClusterCost`: the clock of the cluster replay (`core.sim.cluster_replay`): prefill,
decode and link speeds of one replica, turning FLOPs and bytes into seconds.

Figures (defaults), for H200s on a 400 Gb/s fabric:
- `prefill_tflops` = 400 TFLOP/s: an H200's dense bf16 peak (989 TFLOP/s) at about 40%
  utilisation, what long-prompt prefill reaches in practice; the figure the single-cache
  replay's clock uses (`core.cache.host_tier.DEFAULT_PREFILL_TFLOPS`), so the two replays
  price a hit alike.
- `transfer_gbps` = 50 GB/s: one 400 Gb/s link (400 / 8), the rate of a replica-to-replica
  copy of KV and states (RDMA); concurrent copies do not share it (not modelled).
- `transfer_latency_s` = 1 ms per copy: a control round trip to set the copy up (the
  receiver asks, the sender registers and posts) on top of the wire time.
- `decode_step_s` = 8 ms, `decode_batch` = 32: a replica decodes 32 sequences per step
  and steps every 8 ms, so one sequence gets a token every 8 ms (its TPOT) and a request
  stays open on its decoding replica for `n_output x 8 ms` after its first token, while a
  decoded token takes only 8 / 32 = 0.25 ms of the replica's time: decode work loads a
  replica in proportion to its output tokens and the rest of the step is the batch's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from marconi_ray.core.cache.host_tier import DEFAULT_PREFILL_TFLOPS
from marconi_ray.core.model.cost_model import CostModel

DEFAULT_TRANSFER_GBPS = 50.0
"""GB/s of one 400 Gb/s link."""
DEFAULT_TRANSFER_LATENCY_S = 1e-3
"""Seconds of set-up per copy between replicas."""
DEFAULT_DECODE_STEP_S = 8e-3
"""Seconds of one batched decode step: a sequence's time per output token."""
DEFAULT_DECODE_BATCH = 32
"""Sequences one decode step serves."""


def _check(value: float, name: str, allow_zero: bool) -> None:
    ok = math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value}")


@dataclass(frozen=True)
class ClusterCost:
    """Speeds of one replica and of a link between two (module docstring for the figures).

    Attributes:
        prefill_tflops: effective prefill FLOP/s of one replica, in TFLOP/s (> 0).
        transfer_gbps: replica-to-replica copy bandwidth, GB/s (1e9 bytes per second; > 0).
        transfer_latency_s: fixed seconds of every copy (>= 0).
        decode_step_s: seconds of one decode step, a sequence's time per output token
            (>= 0).
        decode_batch: sequences one step decodes (>= 1).
    """

    prefill_tflops: float = DEFAULT_PREFILL_TFLOPS
    transfer_gbps: float = DEFAULT_TRANSFER_GBPS
    transfer_latency_s: float = DEFAULT_TRANSFER_LATENCY_S
    decode_step_s: float = DEFAULT_DECODE_STEP_S
    decode_batch: int = DEFAULT_DECODE_BATCH

    def __post_init__(self) -> None:
        _check(self.prefill_tflops, "prefill_tflops", allow_zero=False)
        _check(self.transfer_gbps, "transfer_gbps", allow_zero=False)
        _check(self.transfer_latency_s, "transfer_latency_s", allow_zero=True)
        _check(self.decode_step_s, "decode_step_s", allow_zero=True)
        batch = self.decode_batch
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"decode_batch must be an int >= 1, got {batch!r}")

    def prefill_seconds(self, cost: CostModel, n_new: int, n_prefix: int = 0) -> float:
        """Seconds to prefill `n_new` tokens after a cached prefix of `n_prefix`."""
        return float(cost.prefill_flops(n_new, n_prefix)) / (self.prefill_tflops * 1e12)

    def transfer_seconds(self, n_bytes: int) -> float:
        """Seconds of one copy of `n_bytes` between replicas (0 when nothing moves)."""
        if n_bytes <= 0:
            return 0.0
        return self.transfer_latency_s + n_bytes / (self.transfer_gbps * 1e9)

    def decode_seconds(self, n_tokens: int) -> float:
        """Replica seconds of decoding `n_tokens` tokens (their share of the steps)."""
        return self.decode_step_s * n_tokens / self.decode_batch

    def decode_residence(self, n_tokens: int) -> float:
        """Seconds a request decoding `n_tokens` tokens stays on its replica after its
        first token (one step per token)."""
        return self.decode_step_s * n_tokens

    @staticmethod
    def entry_bytes(cost: CostModel, hit_len: int, held_kv: int) -> int:
        """Bytes of a cached entry of `hit_len` tokens copied to a replica that already
        holds the KV of the first `held_kv` tokens of its path: the KV it lacks and one
        SSM state."""
        return cost.kv_bytes(max(0, hit_len - held_kv)) + cost.state_bytes
