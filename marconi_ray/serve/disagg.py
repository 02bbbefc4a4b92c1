"""Prefill/decode roles and cache transfers between replicas: the deployment's settings
(`DisaggSettings`) and how a registering replica gets its role (`assign_role`).

Roles: with `prefill_replicas` P and `decode_replicas` D both 0 (the default) every
replica is `mixed`, as before. Otherwise the coordinator gives each replica a role as it
registers, in registration order: prefill until P replicas hold that role, then decode
(a replica that replaces a lost one takes the role that lost it; replicas beyond P + D,
e.g. added by hand, decode). When a replica leaves and its role has fewer replicas than
it should while the other has more (a replacement registered before the lost replica
was dropped), the latest-registered replica of the other role takes it
(`rebalance_roles`). A role only steers routing: any replica can run any request
(a re-plan after a fault goes wherever the router says), so a lost role never strands
a request.

Transfers: a cache entry (the KV of a token sequence and the mixer state at its end)
moves from one replica's store into another's over `transfer` (`serve.transfer_modes`),
for a P/D hand-off, a pull of a decode-side hit to a prefill replica, or a remote hit
between mixed replicas (`remote_hits`). Whether a move beats recomputing is priced by
the coordinator (`serve.coordinator.routing.disagg`) with `transfer_gbps`,
`transfer_latency_s` and the deployment's `prefill_tflops`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from marconi_ray.serve.transfer_modes import TRANSFER_CHOICES

ROLES: Final = ("mixed", "prefill", "decode")

DEFAULT_TRANSFER_GBPS: Final = 50.0
"""GB/s of a replica-to-replica copy: one 400 Gb/s link (RDMA between H200 nodes)."""
DEFAULT_TRANSFER_LATENCY_S: Final = 1e-3
"""Seconds of set-up per move (the control round trips before the bytes flow)."""


@dataclass(frozen=True)
class DisaggSettings:
    """Roles and transfers (see the module docstring).

    Attributes:
        prefill_replicas, decode_replicas: replicas of each role; both 0: mixed replicas.
        transfer: how entries move: `auto` (NIXL where installed, else NCCL on CUDA and
            GLOO on CPU), `nixl`, `nccl`, `gloo` or `object_store`.
        transfer_gbps: GB/s the coordinator prices a move at.
        transfer_latency_s: seconds each move costs on top of its bytes.
        remote_hits: mixed replicas pull a deeper hit held by another replica when that
            beats recomputing it.
        transfer_timeout_s: how long one move may take before it counts as failed (the
            receiver then recomputes; the source's pin is released).
    """

    prefill_replicas: int = 0
    decode_replicas: int = 0
    transfer: str = "auto"
    transfer_gbps: float = DEFAULT_TRANSFER_GBPS
    transfer_latency_s: float = DEFAULT_TRANSFER_LATENCY_S
    remote_hits: bool = False
    transfer_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("prefill_replicas", "decode_replicas"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if (self.prefill_replicas == 0) != (self.decode_replicas == 0):
            raise ValueError(
                "prefill_replicas and decode_replicas are both 0 (mixed replicas) or both "
                f">= 1, got {self.prefill_replicas} and {self.decode_replicas}"
            )
        if self.transfer not in TRANSFER_CHOICES:
            raise ValueError(
                f"transfer must be one of {', '.join(TRANSFER_CHOICES)}, got {self.transfer!r}"
            )
        for name in ("transfer_gbps", "transfer_timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0 < value < float("inf")):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        latency = self.transfer_latency_s
        if not (isinstance(latency, int | float) and 0 <= latency < float("inf")):
            raise ValueError(f"transfer_latency_s must be a number >= 0, got {latency!r}")
        if self.remote_hits and self.roles:
            raise ValueError(
                "remote_hits is for mixed replicas (prefill_replicas = decode_replicas = 0); "
                "prefill and decode replicas move entries already"
            )

    @property
    def roles(self) -> bool:
        """Replicas have prefill and decode roles."""
        return self.prefill_replicas > 0

    @property
    def moves(self) -> bool:
        """Entries move between replicas (roles, or remote hits)."""
        return self.roles or self.remote_hits

    @property
    def replicas(self) -> int:
        """Replicas the roles name (0 for mixed replicas)."""
        return self.prefill_replicas + self.decode_replicas


def assign_role(settings: DisaggSettings, taken: Iterable[str]) -> str:
    """The role of a replica registering beside replicas holding the roles `taken`."""
    if not settings.roles:
        return "mixed"
    prefill = sum(1 for role in taken if role == "prefill")
    return "prefill" if prefill < settings.prefill_replicas else "decode"


def rebalance_roles(settings: DisaggSettings, roles: list[tuple[str, str]]) -> dict[str, str]:
    """The role changes that give each role its count again, for the replicas `roles`
    ((id, role) in registration order): while one role has fewer replicas than it
    should and the other more, the latest-registered replica of the surplus role moves.
    Deterministic (a journal replay makes the same changes)."""
    if not settings.roles:
        return {}
    want = {"prefill": settings.prefill_replicas, "decode": settings.decode_replicas}
    current = dict(roles)
    changes: dict[str, str] = {}
    for short, surplus in (("prefill", "decode"), ("decode", "prefill")):
        while True:
            count = {r: sum(1 for v in current.values() if v == r) for r in want}
            if count[short] >= want[short] or count[surplus] <= want[surplus]:
                break
            mover = [rid for rid, _ in roles if current[rid] == surplus][-1]
            current[mover] = changes[mover] = short
    return changes
