"""How cache entries travel between replicas: the `transfer` setting's modes (a registry
of strategies, torch-free so the config and the coordinator can name them).

Every mode but `object_store` is Ray Direct Transport (RDT): the exporting actor's
method returns the payload's tensors by reference and Ray moves them straight to the
importing actor over the named transport; `object_store` copies them through Ray's
object store (any device, any cluster, slowest). NCCL and GLOO need a collective group
over the endpoints (`collective`, a `ray.util.collective` backend); NIXL needs none.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class TransferMode:
    """One way to move a payload.

    Attributes:
        name: the setting's value.
        rdt: the `tensor_transport` of the exporting method (None: the object store).
        collective: the collective backend its endpoints must share (None: none).
        devices: the device types whose tensors it moves.
    """

    name: str
    rdt: str | None
    collective: str | None
    devices: tuple[str, ...]


TRANSFER_MODES: dict[str, TransferMode] = {
    m.name: m
    for m in (
        TransferMode("nixl", "nixl", None, ("cuda", "cpu")),
        TransferMode("nccl", "nccl", "nccl", ("cuda",)),
        TransferMode("gloo", "gloo", "torch_gloo", ("cpu",)),
        TransferMode("object_store", None, None, ("cuda", "cpu")),
    )
}
TRANSFER_CHOICES = ("auto", *TRANSFER_MODES)


def resolve_transfer(name: str, device: str, nixl_available: bool) -> TransferMode:
    """The mode `name` means on `device` (`cpu`, `cuda`): `auto` is NIXL where its
    package is installed, else NCCL on CUDA and GLOO on the CPU. ValueError naming the
    value for an unknown mode or one that cannot move that device's tensors."""
    kind = device.split(":")[0]
    if name == "auto":
        if nixl_available:
            return TRANSFER_MODES["nixl"]
        return TRANSFER_MODES["nccl" if kind == "cuda" else "gloo"]
    mode = TRANSFER_MODES.get(name)
    if mode is None:
        raise ValueError(f"transfer must be one of {', '.join(TRANSFER_CHOICES)}, got {name!r}")
    if kind not in mode.devices:
        raise ValueError(f"transfer {name!r} cannot move {kind} tensors (it moves {mode.devices})")
    if name == "nixl" and not nixl_available:
        raise ValueError("transfer 'nixl' needs the nixl package, which is not installed")
    return mode


def nixl_available() -> bool:
    """Whether the NIXL package is importable in this process."""
    return importlib.util.find_spec("nixl") is not None


def transfer_mode(name: str, device: str, tp: int = 1) -> TransferMode:
    """`resolve_transfer` with this process's view of whether NIXL is installed. At
    tp > 1, `auto` without NIXL is the object store: a collective group (GLOO, NCCL)
    would take over the shard processes' default process group, which tensor
    parallelism holds (`ServeSettings` refuses `gloo` / `nccl` there)."""
    mode = resolve_transfer(name, device, nixl_available())
    if tp > 1 and mode.collective is not None:
        return TRANSFER_MODES["object_store"]
    return mode
