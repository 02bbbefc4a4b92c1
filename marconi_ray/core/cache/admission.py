"""Admission policies: which SSM states a request checkpoints (strategies + registry).

A policy names checkpoint depths in two phases, so a live engine knows them in time:
- `prefill_checkpoints`, before prefill, from the request's input and the tree; depths
  in (hit_len, n_input]. The engine captures the states there during prefill.
- `decode_checkpoints`, for the sequence the request leaves behind; depths in
  (n_input, n_total]. The engine captures them while decoding.
Each depth comes with its reason: "branch", "last_token", "block" or "speculative".
A policy may also declare that a state it keeps makes an earlier one on the same path
redundant (`superseded_by`): the cache then drops the earlier state when it commits the
new one (the artifact's vLLM+ refills a partial block in place).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from marconi_ray.core.tree.tree_types import NO_STATE, Match

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

    def superseded_by(self, new_depths: Sequence[int]) -> tuple[int, Callable[[int], bool]] | None:
        """For states newly kept at `new_depths` (sorted) on one path: None when they
        replace nothing (the default: states leave only by eviction), else a depth below
        which nothing is replaced and a test of the older depths at or above it."""
        return None

    @property
    def tunable(self) -> bool:
        """Does the policy have a `speculate` knob for the tuner to set?"""
        return False

    @property
    def only_reason(self) -> str | None:
        """The one reason every state of this policy is kept for, if there is one (the
        cache then keeps no per-state record of it)."""
        return None

    def state(self) -> dict[str, int]:
        """Mutable policy state a snapshot must carry (default: none)."""
        return {}

    def set_state(self, state: dict[str, int]) -> None:  # noqa: B027 (a no-op by default)
        """Restore what `state` returned."""


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


class MarconiPlusAdmission(MarconiAdmission):
    """Marconi's admission plus speculative checkpoints inside long inputs (`marconi+`).

    Marconi keeps a state where an input leaves the tree and after the last decoded
    token. Reuse of a prefix that ended *inside* an earlier input (a shared system
    prompt or document seen once before) then misses on its first reuse, where the
    branch checkpoint is only created. `marconi+` also checkpoints each new input at
    block-aligned depths spaced geometrically from the root (`block`, 2 `block`,
    4 `block`, ...: O(log n) states per input, each a "speculative" state), so a first
    reuse of a block-aligned prefix of length L gets at least L/2 of it, and a long
    input's tail can be evicted while its head, the part other requests share, stays.

    Speculation pays only where such reuse exists; where it does not, its states take
    bytes that proven states would use. So `speculate` is a knob the bootstrap tuner sets
    with alpha: it replays its window with speculation on and off and keeps what hit more
    (`core.cache.tuner`). It starts on, and is off while the tuner records its first window.
    """

    def __init__(self, block: int = 512, speculate: bool = True) -> None:
        if block <= 0:
            raise ValueError(f"marconi+ block size must be > 0, got {block}")
        self.block = block
        self.speculate = speculate
        self.name = "marconi+" if block == 512 else f"marconi+:{block}"

    @property
    def tunable(self) -> bool:
        return True

    def speculative_depths(self, hit_len: int, n_input: int) -> list[int]:
        """Block-aligned depths block * 2**k in (hit_len, n_input)."""
        out: list[int] = []
        depth = self.block
        while depth < n_input:
            if depth > hit_len:
                out.append(depth)
            depth *= 2
        return out

    def prefill_checkpoints(self, match: Match, n_input: int) -> list[Checkpoint]:
        base = super().prefill_checkpoints(match, n_input)
        if not self.speculate:
            return base
        taken = {d for d, _ in base}
        spec = [
            (d, "speculative")
            for d in self.speculative_depths(match.hit_len, n_input)
            if d not in taken
        ]
        return sorted(base + spec)

    def state(self) -> dict[str, int]:
        return {"speculate": int(self.speculate)}

    def set_state(self, state: dict[str, int]) -> None:
        self.speculate = bool(state["speculate"])


class FineGrainedAdmission(AdmissionPolicy):
    """vLLM-style, as real vLLM caches: a state at every full block boundary only.

    The last, partial block of a sequence is not cached, so a conversation's next turn
    reuses up to the last full block of the previous one (`fine_grained:B`).
    """

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
        return [(d, "block") for d in range(first, n_total + 1, self.block)]

    @property
    def only_reason(self) -> str | None:
        return "block"


class FineGrainedRefillAdmission(FineGrainedAdmission):
    """The paper's vLLM+ as its artifact runs it (`fine_grained_refill:B`).

    Every full block and the last, partial block of a sequence hold a state. A later
    state in the same block refills that partial block in place: the earlier partial
    state is dropped (`superseded_by`), so stale partial states do not pile up on inner
    nodes, where LRU over leaves would rarely reach them.
    """

    def __init__(self, block: int) -> None:
        super().__init__(block)
        self.name = f"fine_grained_refill:{block}"

    def decode_checkpoints(self, n_input: int, n_total: int) -> list[Checkpoint]:
        out = super().decode_checkpoints(n_input, n_total)
        if n_total % self.block:
            out.append((n_total, "block"))
        return out

    def superseded_by(self, new_depths: Sequence[int]) -> tuple[int, Callable[[int], bool]] | None:
        """A partial state (not block-aligned) is replaced by a new one later in its block."""
        block = self.block

        def replaced(old: int) -> bool:  # a new depth in (old, end of old's block]?
            if old % block == 0:
                return False
            i = bisect_right(new_depths, old)
            return i < len(new_depths) and new_depths[i] <= (old // block + 1) * block

        return ((new_depths[0] - 1) // block) * block if new_depths else 0, replaced


class NoAdmission(AdmissionPolicy):
    """Vanilla inference: nothing is cached, nothing is reused."""

    name = "none"

    def prefill_checkpoints(self, match: Match, n_input: int) -> list[Checkpoint]:
        return []

    def decode_checkpoints(self, n_input: int, n_total: int) -> list[Checkpoint]:
        return []


def _block_size(arg: str, name: str) -> int:
    try:
        return int(arg)
    except ValueError:
        raise ValueError(f"{name} block size must be an integer, got {arg!r}") from None


ADMISSION_POLICIES: Mapping[str, Callable[[str], AdmissionPolicy]] = MappingProxyType(
    {
        "marconi": lambda _arg: MarconiAdmission(),
        "marconi+": lambda arg: (
            MarconiPlusAdmission(_block_size(arg, "marconi+")) if arg else MarconiPlusAdmission()
        ),
        "none": lambda _arg: NoAdmission(),
        "fine_grained": lambda arg: FineGrainedAdmission(_block_size(arg, "fine_grained")),
        "fine_grained_refill": lambda arg: FineGrainedRefillAdmission(
            _block_size(arg, "fine_grained_refill")
        ),
    }
)


def make_admission(spec: str) -> AdmissionPolicy:
    """Build a policy from `name` or `name:ARG` (e.g. `fine_grained:32`)."""
    blocked = ("fine_grained", "fine_grained_refill")
    optional = ("marconi+",)
    name, _, arg = spec.partition(":")
    factory = ADMISSION_POLICIES.get(name)
    if factory is None:
        raise ValueError(
            f"unknown admission policy {spec!r}; choose from {sorted(ADMISSION_POLICIES)}"
        )
    if name in blocked and not arg:
        raise ValueError(f"admission policy {spec!r} needs a block size, e.g. {name}:32")
    if name not in blocked and name not in optional and arg:
        raise ValueError(f"admission policy {name!r} takes no argument, got {spec!r}")
    return factory(arg)
