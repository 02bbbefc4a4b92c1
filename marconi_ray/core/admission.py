"""Admission policies: which SSM states a request checkpoints (strategies + registry).

A policy names checkpoint depths in two phases, so a live engine knows them in time:
- `prefill_checkpoints`, before prefill, from the request's input and the tree; depths
  in (hit_len, n_input]. The engine captures the states there during prefill.
- `decode_checkpoints`, for the sequence the request leaves behind; depths in
  (n_input, n_total]. The engine captures them while decoding.
Each depth comes with its reason: "branch", "last_token" or "block".
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from types import MappingProxyType

from marconi_ray.core.tree_types import NO_STATE, Match

Checkpoint = tuple[int, str]


class AdmissionPolicy(ABC):
    """Chooses checkpoint depths for one request."""

    name: str

    @abstractmethod
    def prefill_checkpoints(self, match: Match, n_input: int) -> list[Checkpoint]:
        """Depths in (match.hit_len, n_input] to capture during prefill, increasing."""

    @abstractmethod
    def decode_checkpoints(self, n_input: int, n_total: int) -> list[Checkpoint]:
        """Depths in (n_input, n_total] (or n_total itself) to keep after decoding."""


class MarconiAdmission(AdmissionPolicy):
    """Judicious admission (Marconi section 4.1).

    Speculative insertion: if the input leaves the tree inside an edge, inserting it
    would create a new intermediate node, i.e. a prefix shared with an earlier sequence
    (a branch point): checkpoint there. If it leaves at an existing node that has no
    state (a branch point whose state was never admitted), checkpoint there too. After
    decoding, keep the state after the last decoded token (conversation continuation).
    """

    name = "marconi"

    def prefill_checkpoints(self, match: Match, n_input: int) -> list[Checkpoint]:
        depth = match.matched_len
        if depth <= match.hit_len or depth > n_input:
            return []
        if match.partial is not None:
            return [(depth, "branch")]
        node = match.path[-1] if match.path else None
        if node is not None and node.state == NO_STATE and node.children:
            return [(depth, "branch")]
        return []

    def decode_checkpoints(self, n_input: int, n_total: int) -> list[Checkpoint]:
        return [(n_total, "last_token")]


class FineGrainedAdmission(AdmissionPolicy):
    """vLLM-style: a state at every block boundary, plus the last (partial) block."""

    def __init__(self, block: int) -> None:
        if block <= 0:
            raise ValueError(f"fine_grained block size must be > 0, got {block}")
        self.block = block
        self.name = f"fine_grained:{block}"

    def prefill_checkpoints(self, match: Match, n_input: int) -> list[Checkpoint]:
        first = (match.hit_len // self.block + 1) * self.block
        return [(d, "block") for d in range(first, n_input + 1, self.block)]

    def decode_checkpoints(self, n_input: int, n_total: int) -> list[Checkpoint]:
        first = (n_input // self.block + 1) * self.block
        out = [(d, "block") for d in range(first, n_total + 1, self.block)]
        if n_total % self.block:
            out.append((n_total, "block"))
        return out


class NoAdmission(AdmissionPolicy):
    """Vanilla inference: nothing is cached, nothing is reused."""

    name = "none"

    def prefill_checkpoints(self, match: Match, n_input: int) -> list[Checkpoint]:
        return []

    def decode_checkpoints(self, n_input: int, n_total: int) -> list[Checkpoint]:
        return []


def _fine_grained(arg: str) -> AdmissionPolicy:
    try:
        block = int(arg)
    except ValueError:
        raise ValueError(f"fine_grained block size must be an integer, got {arg!r}") from None
    return FineGrainedAdmission(block)


ADMISSION_POLICIES: Mapping[str, Callable[[str], AdmissionPolicy]] = MappingProxyType(
    {
        "marconi": lambda _arg: MarconiAdmission(),
        "none": lambda _arg: NoAdmission(),
        "fine_grained": _fine_grained,
    }
)


def make_admission(spec: str) -> AdmissionPolicy:
    """Build a policy from `name` or `name:ARG` (e.g. `fine_grained:32`)."""
    name, _, arg = spec.partition(":")
    factory = ADMISSION_POLICIES.get(name)
    if factory is None:
        raise ValueError(
            f"unknown admission policy {spec!r}; choose from {sorted(ADMISSION_POLICIES)}"
        )
    if name == "fine_grained" and not arg:
        raise ValueError(f"admission policy {spec!r} needs a block size, e.g. fine_grained:32")
    if name != "fine_grained" and arg:
        raise ValueError(f"admission policy {name!r} takes no argument, got {spec!r}")
    return factory(arg)
