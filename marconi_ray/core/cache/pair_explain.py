"""Why a prompt reused what it did: two prompts through one cache, the second one's
reuse explained (`marconi-ray explain`).

The first prompt (and the tokens generated after it) is served and committed into an
empty cache of the given system; the second is then planned. A hybrid model reuses a
prefix only up to the deepest *state* on it (a recurrent layer resumes from a state at
exactly the reused depth), while attention alone could reuse every cached token, so the
explanation names both: the tokens the cache holds (`cached_tokens`), those a state makes
reusable (`reusable_tokens`), every state along the path with why it was admitted, and
the states the second request will leave (a branch point where it diverges: a third
prompt with the same prefix then reuses it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from marconi_ray.core.cache.findings import Finding, find
from marconi_ray.core.cache.host_tier import NO_HOST_TIER
from marconi_ray.core.cache.prefix_cache import PrefixCache
from marconi_ray.core.cache.systems import SystemSpec
from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.core.tree.tree_types import NO_STATE

Tokens = npt.NDArray[np.int32]


@dataclass(frozen=True)
class PairExplanation:
    """What the second prompt could reuse after the first, and why.

    Attributes:
        shared_tokens: the two sequences' common prefix (the first with its output).
        cached_tokens: tokens of the second prompt the cache holds (KV, with or without
            a state at their end): what an attention-only model would reuse.
        reusable_tokens: the hit: tokens up to the deepest state on that path.
        states: (depth, admission reason) of each state along the cached path.
        kept: (depth, reason) of the states the second request will keep.
        why: one sentence on the difference.
        findings: what the cache's setting makes it not do for this model.
    """

    system: str
    first_tokens: int
    second_tokens: int
    shared_tokens: int
    cached_tokens: int
    reusable_tokens: int
    states: tuple[tuple[int, str], ...]
    kept: tuple[tuple[int, str], ...]
    why: str
    findings: tuple[Finding, ...]


def explain_pair(
    cost: CostModel,
    system: SystemSpec,
    capacity_bytes: int,
    first: Tokens,
    second: Tokens,
    first_output: Tokens | None = None,
    context_limit: int = 1 << 20,
) -> PairExplanation:
    """Serve `first` (then `first_output`, its generated tokens) through an empty cache of
    `system` with `capacity_bytes`, plan `second`, and explain its hit (see the module
    docstring). ValueError naming an empty prompt."""
    for name, tokens in (("first", first), ("second", second)):
        if len(tokens) == 0:
            raise ValueError(f"the {name} prompt is empty")
    out = np.asarray(first_output if first_output is not None else [], dtype=np.int32)
    cache = PrefixCache(cost, system.cache_config(capacity_bytes))
    plan = cache.plan(first)
    full = np.concatenate([np.asarray(first, dtype=np.int32), out])
    cache.commit(plan, full)  # the cache numbers the states, as in a simulation
    match = cache.tree.match(np.asarray(second, dtype=np.int32))
    states = tuple(
        (node.depth, cache.reason_of(node.state))
        for node in match.path
        if node.state != NO_STATE and node.depth <= len(second)
    )
    second_plan = cache.plan(second)
    kept = tuple(second_plan.checkpoints)
    cached = min(match.matched_len, len(second))
    hit = second_plan.hit_len
    cache.abort(second_plan)
    shared = _common_prefix(full, np.asarray(second, dtype=np.int32))
    findings = find(cost, system, capacity_bytes, NO_HOST_TIER, context_limit)
    return PairExplanation(
        system.name,
        len(first),
        len(second),
        shared,
        cached,
        hit,
        states,
        kept,
        _why(cached, hit, states, kept, shared),
        findings,
    )


def _common_prefix(a: Tokens, b: Tokens) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def _why(
    cached: int,
    hit: int,
    states: tuple[tuple[int, str], ...],
    kept: tuple[tuple[int, str], ...],
    shared: int,
) -> str:
    if shared == 0:
        return "the prompts share no prefix: nothing to reuse"
    if cached == 0:
        return f"the prompts share {shared} tokens, but the cache kept none of them"
    if hit == cached:
        return f"all {cached} cached tokens are reusable: a state stands at depth {hit}"
    branch = [d for d, reason in kept if reason == "branch"]
    later = (
        f"; this request keeps a state at the branch point {branch[0]}, so a third "
        f"prompt with these {branch[0]} tokens reuses them"
        if branch
        else ""
    )
    if hit == 0:
        return (
            f"the cache holds {cached} tokens of this prompt but no state on them (states: "
            f"{[d for d, _ in states] or 'none'} on its path): a recurrent layer resumes "
            f"only from a state at exactly the reused depth, so nothing is reused{later}"
        )
    return (
        f"the cache holds {cached} tokens of this prompt, but the deepest state on them is "
        f"at depth {hit}: tokens {hit}..{cached} are recomputed (attention alone could "
        f"reuse all {cached}){later}"
    )
