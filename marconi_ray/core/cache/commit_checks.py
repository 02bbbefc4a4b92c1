"""What makes `PrefixCache.commit` a transaction: the checks it runs before it changes
anything, and, should a later step fail, the repair of the tree and the account of what
the tree holds of the caller's states and KV handles (`CommitFailed`)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from marconi_ray.core.cache.admission import Checkpoint
from marconi_ray.core.tree.radix_tree import RadixTree
from marconi_ray.core.tree.tree_types import NO_STATE, KVHandle, Match, Reclaimed, Tokens


class CommitFailed(RuntimeError):
    """A commit failed after validation (a bug or an exhausted resource, the cause is
    chained). The plan was aborted; the tree keeps its invariants.

    Attributes:
        plan_id: the plan (closed).
        freed: what the tree let go of (evicted states, KV, and what the abort tidied),
            none of it the caller's own: the caller frees these, as after any commit.
        held: the caller's state ids the tree took before the failure, and
        held_kv: the caller's KV handles it took: the caller must not free these; it
            frees its other ids and handles.
    """

    def __init__(self, plan_id: int, freed: Reclaimed, held: set[int], held_kv: set[int]) -> None:
        super().__init__(f"commit of plan {plan_id} failed; the plan was aborted")
        self.plan_id = plan_id
        self.freed = freed
        self.held = held
        self.held_kv = held_kv

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.plan_id, self.freed, self.held, self.held_kv))


def check_kv(kv: KVHandle, kv_start: int, n_total: int, walk: Match | None, end: int) -> None:
    """ValueError unless `kv` is a 1-D integer array of handles for positions from
    `kv_start` on, not past the `n_total` tokens, that covers every token the commit adds:
    `walk` is the tree's match of the tokens up to `end` (the last checkpoint); the new
    tokens are [walk.matched_len, end)."""
    arr = np.asarray(kv)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise ValueError(f"kv must be a 1-D integer array, got dtype {arr.dtype} shape {arr.shape}")
    if not 0 <= kv_start <= n_total:
        raise ValueError(f"kv_start must be in [0, {n_total}], got {kv_start}")
    if len(arr) > n_total - kv_start:
        raise ValueError(
            f"kv covers {len(arr)} positions from {kv_start}, past the {n_total} tokens"
        )
    if walk is None or walk.matched_len >= end:
        return
    if kv_start > walk.matched_len:
        raise ValueError(f"kv starts at {kv_start} but new tokens start at {walk.matched_len}")
    if kv_start + len(arr) < end:
        raise ValueError(
            f"kv covers positions [{kv_start}, {kv_start + len(arr)}) but the new tokens "
            f"run to {end}"
        )


def validated_ids(
    ckpts: list[Checkpoint], state_ids: Mapping[int, int] | None, next_state: int
) -> list[int]:
    """The state id of each checkpoint, in depth order (None: numbered from
    `next_state`); ValueError naming what is missing, unexpected, duplicated or not a
    valid id."""
    if state_ids is None:
        return list(range(next_state, next_state + len(ckpts)))
    wanted = [d for d, _ in ckpts]
    missing = [d for d in wanted if d not in state_ids]
    if missing:
        raise ValueError(f"no state id given for checkpoint depths {missing}")
    if len(state_ids) != len(wanted):  # the depths are distinct: equal sizes, no extra
        extra = sorted(set(state_ids) - set(wanted))
        raise ValueError(f"state ids given for depths {extra}, which are not checkpoints {wanted}")
    ids = [state_ids[d] for d in wanted]
    plain = all(type(sid) is int and sid >= 0 for sid in ids)  # the usual case, checked
    if not plain:
        bad = [sid for sid in ids if not isinstance(sid, (int, np.integer)) or sid < 0]
        if bad:
            raise ValueError(f"state ids must be integers >= 0, got {bad}")
    if len(set(ids)) != len(ids):
        raise ValueError(f"state ids must be distinct, got {ids}")
    return ids if plain else [int(sid) for sid in ids]


def repair(tree: RadixTree, tokens: Tokens, ids: list[int], kv: KVHandle, freed: Reclaimed) -> None:
    """After a failed insert: tidy state-less, unlocked nodes with < 2 children on
    `tokens`' path (a node added before its state was set), deepest first. What they
    held of the tree's goes to `freed`; the caller's own ids and handles do not (the
    caller frees what `held` says the tree does not hold)."""
    own_ids = set(ids)
    own_kv = set() if kv is None else {int(h) for h in np.asarray(kv)}
    tidied = Reclaimed()
    for node in reversed(tree.match(tokens).path):
        if node.parent is not None and node.state == NO_STATE and node.lock == 0:
            tree.tidy(node, tidied)
    freed.states.extend(sid for sid in tidied.states if sid not in own_ids)
    for handles in tidied.kv:
        if handles is None:
            freed.kv.append(None)
            continue
        arr = np.asarray(handles)
        mine = np.isin(arr, np.fromiter(own_kv, np.int64, len(own_kv)))
        if not mine.all():
            freed.kv.append(arr[~mine])
    freed.n_tokens += tidied.n_tokens


def held(
    tree: RadixTree, tokens: Tokens, ids: list[int], kv: KVHandle
) -> tuple[set[int], set[int]]:
    """Which of `ids` and of `kv`'s handles the tree holds on `tokens`' path."""
    want_ids = set(ids)
    want_kv = set() if kv is None else {int(h) for h in np.asarray(kv)}
    states: set[int] = set()
    slots: set[int] = set()
    for node in tree.match(tokens).path:
        if node.state in want_ids:
            states.add(int(node.state))
        if want_kv and node.kv is not None:
            slots.update(int(h) for h in node.kv if int(h) in want_kv)
    return states, slots
