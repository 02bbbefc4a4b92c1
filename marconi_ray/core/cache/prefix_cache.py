"""`PrefixCache`: the radix tree + an admission and an eviction policy + a byte budget.

Request protocol (the live coordinator and the replay simulator both follow it):
1. `plan(input_tokens)` matches the input, refreshes access times, locks the hit node
   and returns a `Plan`: the reusable length and the depths to checkpoint in prefill.
2. The engine prefills from the hit, captures the planned states, decodes.
3. `commit(plan, input + output, ...)` admits what fits (evicting first, so the byte
   budget is never exceeded, not even transiently) and unlocks; or `abort(plan)`.

Capacity is a hard limit: when a request's states cannot fit after evicting every
unlocked candidate, the deepest ones are dropped (counted in `states_dropped`).

Two tiers (`CacheConfig.host`, see `core.cache.host_tier` and `core.cache.tiering`):
`capacity_bytes` bounds the device tier and `host.capacity_bytes` the host tier. Making room
on the device demotes or drops victims; `plan` promotes its hit's host bytes back (a `Plan`
says how many hit tokens and bytes came from the host); the moves reach the worker in order in
each mutation's `Reclaimed.moves`. Per tier: bytes held <= its capacity (the device's
plus the reservations), and what a tier frees or moves is something it holds.

The protocol's values live in `cache_types`, the commit's checks and failure accounting
in `commit_checks`; both are re-exported here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import replace
from itertools import repeat

import numpy as np

from marconi_ray.core.cache.admission import AdmissionPolicy, Checkpoint, make_admission
from marconi_ray.core.cache.cache_types import CacheConfig, CommitResult, Plan, as_tokens
from marconi_ray.core.cache.commit_checks import CommitFailed, check_kv, held, repair, validated_ids
from marconi_ray.core.cache.eviction import EvictionPolicy, make_eviction, validate_alpha
from marconi_ray.core.cache.stats import CacheStats, count_reason
from marconi_ray.core.cache.tiering import TierPlacer
from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.core.tree.radix_tree import RadixTree
from marconi_ray.core.tree.tree_types import (
    NO_STATE,
    KVHandle,
    Match,
    Node,
    Reclaimed,
    Tokens,
    tokens_bytes,
)


class PrefixCache:
    """One replica's prefix cache (single-threaded; the coordinator serialises calls)."""

    def __init__(self, cost: CostModel, config: CacheConfig) -> None:
        self.cost = cost
        self.config = config
        self.tree = RadixTree(cost)
        self.admission: AdmissionPolicy = make_admission(config.admission)
        self.eviction: EvictionPolicy = make_eviction(
            config.eviction, config.alpha, config.recency, config.efficiency
        )
        self.stats = CacheStats()
        self.tiers = TierPlacer(config.host, self.eviction) if config.host.enabled else None
        """Demotion, host eviction and promotion; None for a one-tier cache."""
        self.clock = 0.0
        self._next_plan = 0
        self._next_state = 0
        self._open: dict[int, Plan] = {}
        self.reserved = 0
        self.reasons: dict[int, str] = {}
        """Live state id -> why it was admitted (for hits by reason); empty when the
        policy keeps every state for one reason (`AdmissionPolicy.only_reason`)."""
        self.hit_once: set[int] = set()
        """Live state ids that served at least one hit."""
        self._probed: tuple[object, Tokens, RadixTree, int, Match] | None = None
        """(tokens, them validated, tree, tree version, match) of the last `peek`: `plan`
        of the same array object on the unchanged tree reuses the check and the walk
        (route, then plan)."""
        self._planned: tuple[int, RadixTree, int, Match] | None = None
        """(plan id, tree, tree version, match) of the last `plan`: its `commit` on the
        unchanged tree reuses the walk when it can (`_commit_walk`)."""

    # ------------------------------------------------------------------ state
    @property
    def capacity(self) -> int:
        return self.config.capacity_bytes

    @property
    def bytes_used(self) -> int:
        """Bytes held in the device tier (all of them, in a one-tier cache)."""
        return self.tree.device_bytes

    @property
    def host_capacity(self) -> int:
        return self.config.host.capacity_bytes

    def bytes_by_tier(self) -> dict[str, int]:
        """Bytes held now per tier: `device` and `host`."""
        return {"device": self.tree.device_bytes, "host": self.tree.host_bytes}

    def bytes_by_kind(self) -> dict[str, int]:
        """Bytes held now: attention KV and SSM (+ conv) checkpoints."""
        return {"kv": self.tree.kv_bytes, "ssm": self.tree.ssm_bytes}

    @property
    def alpha(self) -> float:
        return self.eviction.alpha

    def set_alpha(self, alpha: float) -> None:
        self.eviction.alpha = validate_alpha(alpha)

    def set_speculate(self, on: bool) -> None:
        """Set the admission policy's `speculate` knob (`marconi+`); ValueError when the
        policy has none."""
        if not self.admission.tunable:
            raise ValueError(f"admission {self.config.admission!r} has no speculate knob")
        self.admission.set_state({"speculate": int(on)})

    @property
    def open_plans(self) -> int:
        return len(self._open)

    def get_plan(self, plan_id: int) -> Plan:
        """The open plan with id `plan_id`; ValueError when none is open."""
        plan = self._open.get(plan_id)
        if plan is None:
            raise ValueError(f"plan {plan_id} is not open")
        return plan

    def _tick(self) -> float:
        self.clock += 1.0
        return self.clock

    # --------------------------------------------------------------- protocol
    def decode_capture_depths(self, n_input: int, max_total: int) -> list[int]:
        """Depths past the input, up to `max_total`, whose states the admission policy
        keeps if decoding reaches them (e.g. block boundaries). A request that ends exactly
        at one of them (`max_total` among them) has its last token consumed so that its
        state exists (`checkpoints` asks for it); the final depth kept by `keeps_final`
        is asked for separately."""
        return [
            d
            for d, _ in self.admission.decode_checkpoints(n_input, max_total)
            if n_input < d <= max_total
        ]

    def keeps_final(self, n_input: int) -> bool:
        """Does the admission policy keep the state after a request's last token?"""
        return any(
            d == n_input + 1 for d, _ in self.admission.decode_checkpoints(n_input, n_input + 1)
        )

    def hit_kv(self, tokens: object, hit_len: int) -> list[KVHandle]:
        """The KV handles of the nodes covering `tokens[:hit_len]`, root first (the last
        may extend past `hit_len`). Call while the plan holding the hit is open."""
        match = self.tree.match(as_tokens(tokens))
        out: list[KVHandle] = []
        for node in match.path:
            if node.depth - len(node.edge) >= hit_len:
                break
            if len(node.edge):
                out.append(node.kv)
        return out

    def path_kv(self, node: Node) -> list[KVHandle]:
        """The KV handles of the edges from the root down to `node` (a plan's hit node:
        what `hit_kv(tokens, plan.hit_len)` returns, without walking the tokens again)."""
        out: list[KVHandle] = []
        cur: Node | None = node
        while cur is not None and cur.parent is not None:
            out.append(cur.kv)
            cur = cur.parent
        return out[::-1]

    def lookup(self, tokens: object) -> int:
        """Reusable length for `tokens`, without side effects."""
        return self.tree.match(as_tokens(tokens)).hit_len

    def peek(self, tokens: object) -> tuple[int, bool]:
        """(reusable length for `tokens`, whether that hit is a leaf: the tree ends at the
        state there, as it does after a conversation's last turn), without side effects
        on the tree. The walk is remembered: a `plan` of the same token array while the
        tree is unchanged does not walk again (the array must not be modified between)."""
        arr = as_tokens(tokens)
        match = self.tree.match(arr)
        self._probed = (tokens, arr, self.tree, self.tree.version, match)
        return match.hit_len, match.hit_len > 0 and not match.hit_node.children

    def _match(self, tokens: object) -> tuple[Tokens, Match]:
        """(`as_tokens(tokens)`, the tree's match of it), reusing `peek`'s check and
        walk of the same object while the tree is unchanged."""
        probed, self._probed = self._probed, None
        if probed is not None:
            was, arr, tree, version, match = probed
            if was is tokens and tree is self.tree and version == self.tree.version:
                return arr, match
        arr = as_tokens(tokens, "input tokens")
        return arr, self.tree.match(arr)

    # ------------------------------------------------------------------ views
    def node_count(self) -> int:
        """Nodes in the tree, the root excluded."""
        return len(self.tree.iter_nodes())

    def referenced(self) -> tuple[set[int], set[int]]:
        """(state ids, KV slot ids) the tree's nodes refer to: what a store must hold."""
        states: set[int] = set()
        slots: set[int] = set()
        for node in self.tree.iter_nodes():
            if node.state != NO_STATE:
                states.add(int(node.state))
            if node.kv is not None and len(node.kv):
                slots.update(int(s) for s in node.kv)
        return states, slots

    def referenced_on_host(self) -> tuple[set[int], set[int]]:
        """(state ids, KV slot ids) of `referenced` that the tree keeps on the host tier:
        what a store must hold in host memory."""
        states: set[int] = set()
        slots: set[int] = set()
        for node in self.tree.iter_nodes():
            if node.state_host:
                states.add(int(node.state))
            if node.host is not None and node.kv is not None:
                slots.update(int(s) for s in np.asarray(node.kv)[node.host])
        return states, slots

    def locked_nodes(self) -> int:
        """Nodes held by a lock (0 when no plan is open)."""
        return sum(n.lock > 0 for n in self.tree.iter_nodes())

    def plan(self, tokens: object, max_output: int | None = None) -> Plan:
        """Match `tokens`, lock the hit and choose the prefill checkpoints.

        With `max_output`, also reserve an upper bound of the bytes the request may admit
        (KV of every token past the hit, up to `max_output` generated ones, and each state
        the policy may keep), evicting unlocked entries to make room, so that what live
        requests hold before they commit is budgeted too: `bytes_used + reserved <=
        capacity` always. When even evicting everything unlocked leaves too little room,
        the reservation is what fits (the commit then drops states as usual).
        """
        arr, match = self._match(tokens)
        now = self._tick()
        planned = (self._next_plan, self.tree, self.tree.version, match)
        if max_output is not None and max_output < 0:
            raise ValueError(f"max_output must be >= 0, got {max_output}")
        self.eviction.on_hit(self.tree, match, now)
        self.tree.lock(match.hit_node)
        ckpts = tuple(self.admission.prefill_checkpoints(match, len(arr)))
        freed = Reclaimed()
        granted = 0
        from_host = (0, 0)
        if self.tiers is not None:
            room = self.capacity - self.reserved
            from_host = self.tiers.promote_hit(
                self.tree, match, now, room, freed, self.stats, self._in_use
            )
        if max_output is not None:
            granted = self._reserve(
                self._upper_bound(len(arr), match.hit_len, ckpts, max_output), freed, now
            )
        self._forget(freed)
        reason = self.reason_of(match.hit_node.state) if match.hit_len else ""
        plan = Plan(
            self._next_plan,
            arr,
            match.hit_len,
            match.hit_node,
            ckpts,
            granted,
            freed,
            reason,
            *from_host,
            min(match.matched_len, len(arr)),
        )
        self._next_plan += 1
        self._open[plan.plan_id] = plan
        self._planned = planned
        return plan

    def plan_import(self, tokens: object) -> Plan:
        """Plan the admission of an entry copied from another replica's cache: the KV of
        `tokens` and the state after all of them (reason `transfer`).

        Locks the local hit (the import's KV starts there: the tree already holds
        `tokens[:hit_len]`) and reserves the bytes the entry adds, evicting to make room.
        Commit it with `commit(plan, tokens, {len(tokens): state_id}, kv, hit_len,
        counted=False)` once the bytes have arrived, or `abort` it. Where the entry cannot
        fit even after evicting every unlocked one, the reservation is what fits and the
        commit drops the state, as for a request. ValueError (nothing changed) when
        `tokens` is empty or the cache already holds a state at its end."""
        arr = as_tokens(tokens, "import tokens")
        if self.tree.match(arr).hit_len == len(arr):
            raise ValueError(f"the cache already holds a state after these {len(arr)} tokens")
        plan = self.plan(arr)
        want = self.cost.kv_bytes(len(arr) - plan.hit_len) + self.cost.state_bytes
        granted = self._reserve(want, plan.freed, self.clock)
        self._forget(plan.freed)
        plan = replace(plan, checkpoints=((len(arr), "transfer"),), reserved=granted, hit_reason="")
        self._open[plan.plan_id] = plan
        return plan

    def _upper_bound(
        self, n_input: int, hit_len: int, ckpts: tuple[Checkpoint, ...], max_output: int
    ) -> int:
        """Most bytes a request can admit: KV past the hit plus every state it may keep."""
        n_max = n_input + max_output
        states = len(ckpts) + len(self.admission.decode_checkpoints(n_input, n_max))
        if states == 0:
            return 0
        return self.cost.kv_bytes(n_max - hit_len) + states * self.cost.state_bytes

    def _reserve(self, want: int, freed: Reclaimed, now: float) -> int:
        """Hold back up to `want` bytes, evicting unlocked entries; returns what was held."""
        self._evict(now, self.capacity - self.reserved - want, freed)
        granted = max(0, min(want, self.capacity - self.bytes_used - self.reserved))
        self.reserved += granted
        return granted

    def _evict(self, now: float, max_bytes: int, freed: Reclaimed) -> bool:
        """Evict (demote or drop, with a host tier) until the device holds at most
        `max_bytes`; counts the victims; returns whether the candidates ran out first.
        The KV on the path of every open plan's hit stays on the device (`_in_use`)."""
        if self.tiers is None:
            evicted, exhausted = self.eviction.evict_until(self.tree, now, max_bytes, freed)
        else:
            evicted, exhausted = self.tiers.evict_device(
                self.tree, now, max_bytes, freed, self.stats, self._in_use
            )
        self.stats.evictions += evicted
        return exhausted

    def _in_use(self) -> set[Node]:
        """Every node on the path of an open plan's hit: its request reads the KV of that
        path in place, in the device rows of its slots (`StateStore.hit_rows`), from its
        start to its commit, so a demotion must not move it (it would free those rows for
        the next prefill to overwrite under the running request). The plan being made is
        not open yet: what it demotes of its own path is applied before its order starts
        (`Dispatch.needs`), and the store copies a hit's host slots to rows of the
        request's own (`StateStore.hit_rows`)."""
        out: set[Node] = set()
        for plan in self._open.values():
            node: Node | None = plan.hit_node
            while node is not None and node not in out:
                out.add(node)
                node = node.parent
        return out

    def is_open(self, plan: Plan) -> bool:
        """True until `plan` is committed or aborted."""
        return plan.plan_id in self._open

    def abort(self, plan: Plan) -> Reclaimed:
        """Release a plan (and its reservation) without caching anything."""
        self._close(plan)
        return self.tree.unlock(plan.hit_node)

    def commit(
        self,
        plan: Plan,
        tokens: object,
        state_ids: Mapping[int, int] | None = None,
        kv: KVHandle = None,
        kv_start: int = 0,
        counted: bool = True,
    ) -> CommitResult:
        """Admit the states of a finished request and release its plan.

        Args:
            plan: from `plan`.
            tokens: input + output tokens; must start with the plan's input.
            state_ids: depth -> state id for exactly the checkpoint depths (`checkpoints`:
                the plan's prefill ones and the policy's decode ones), distinct ids >= 0;
                None lets the cache number them (simulation).
            kv: per-token KV handles (a 1-D integer array) for positions from
                `kv_start` on, covering at least every token the commit adds (up to the
                last checkpoint) and not past `tokens`; `kv_start` must not exceed the
                position where the tree's copy of `tokens` ends (the new tokens' start).
            counted: count it as a request in `stats` (False for an import, which
                serves no request: `plan_import`).

        Transactional: everything is validated before anything changes, so a ValueError
        leaves the cache exactly as it was (the plan stays open; `abort` it or commit
        again). Should a step fail after that (a bug, memory), the plan is aborted (its
        locks and reservation released), the tree keeps its invariants, nothing is
        counted, and `CommitFailed` tells the caller what the tree let go of and which of
        its state ids and KV handles the tree holds.
        """
        self._require_open(plan)
        full = as_tokens(tokens, "tokens")
        n_input = len(plan.tokens)
        if len(full) < n_input or tokens_bytes(full[:n_input]) != tokens_bytes(plan.tokens):
            raise ValueError("committed tokens must start with the planned input tokens")
        ckpts = self.checkpoints(plan, len(full))
        ids = validated_ids(ckpts, state_ids, self._next_state)
        depths = [d for d, _ in ckpts]
        walk = self._commit_walk(plan, full, depths[-1]) if ckpts else None
        if kv is not None:
            check_kv(kv, kv_start, len(full), walk, depths[-1] if depths else 0)
        # ---- nothing above changed the cache; from here on it changes
        if state_ids is None:
            self._next_state += len(ckpts)
        self._close(plan)  # its reserved room is now its commit's
        now = self._tick()
        freed = Reclaimed()
        admitted: list[tuple[int, int, str]] = []
        dropped = 0
        kv_used = (0, 0)
        hit = plan.hit_node
        hit_state = hit.state  # before a refill may replace it
        hit_locked = True
        try:
            if walk is not None:
                attach = walk.attach_node
                self.tree.lock(attach)
                try:
                    keep, walk = self._make_room(full[: depths[-1]], depths, freed, now, walk)
                    dropped = self._count_new(walk, depths[keep:]) if keep < len(depths) else 0
                    if keep:
                        pairs = list(zip(depths[:keep], ids, strict=False))
                        done = self.tree.insert(
                            full[: depths[keep - 1]],
                            pairs,
                            now,
                            kv,
                            kv_start,
                            walk.node_above(depths[0]),
                        )
                        kv_used = (done.new_from, depths[keep - 1])
                        reason = dict(ckpts)
                        admitted = [(d, sid, reason[d]) for d, sid in done.admitted]
                finally:
                    self.tree.unlock_into(attach, freed)
            hit_locked = False
            self.tree.unlock_into(hit, freed)
            if admitted:
                self._drop_superseded(full, [d for d, _, _ in admitted], freed)
        except Exception as exc:
            if hit_locked:
                freed.extend(self.tree.unlock(hit))
            end = depths[-1] if depths else 0
            repair(self.tree, full[:end], ids, kv, freed)
            held_ids, held_kv = held(self.tree, full[:end], ids, kv)
            self._forget(freed)
            if self.admission.only_reason is None:  # what the tree kept keeps its reason
                reason_at = dict(ckpts)
                self.reasons.update(
                    (sid, reason_at[d])
                    for d, sid in zip(depths, ids, strict=True)
                    if sid in held_ids
                )
            raise CommitFailed(plan.plan_id, freed, held_ids, held_kv) from exc
        self._forget(freed)
        self._count_reasons(plan, admitted, hit_state)
        self.stats.states_dropped += dropped
        self.stats.peak_bytes = max(self.stats.peak_bytes, self.bytes_used)
        if self.tiers is not None:
            self.stats.host_peak_bytes = max(self.stats.host_peak_bytes, self.tree.host_bytes)
            self.stats.host_hit_tokens += plan.host_tokens
            self.stats.host_hit_bytes += plan.host_bytes
        if counted:
            self.stats.record_request(
                n_input,
                plan.hit_len,
                self.cost.prefill_flops(n_input),
                self.cost.prefill_flops(plan.hit_len),
                plan.matched_len,
            )
        kept = {sid for _, sid, _ in admitted}
        rejected = tuple(sid for sid in ids if sid not in kept)
        return CommitResult(tuple(admitted), rejected, freed, dropped, kv_used)

    def _commit_walk(self, plan: Plan, full: Tokens, end: int) -> Match:
        """The tree's match of `full[:end]` (`full` starts with the plan's input). The
        plan's own walk is that match while the tree is unchanged, if it stopped at a
        token of the input that the tree lacks (not at the input's end) and `end` reaches
        past the input: a longer sequence walks alike up to that token and stops there."""
        planned, self._planned = self._planned, None
        if planned is not None:
            plan_id, tree, version, match = planned
            if (
                plan_id == plan.plan_id
                and tree is self.tree
                and version == tree.version
                and match.matched_len < len(plan.tokens) <= end
            ):
                return match
        return self.tree.match(full[:end])

    def _forget(self, freed: Reclaimed) -> None:
        """Drop the per-state records of states that left the tree (C-level loops: a
        fine-grained run evicts hundreds of thousands)."""
        states = freed.states
        if states:
            deque(map(self.reasons.pop, states, repeat(None)), maxlen=0)
            self.hit_once.difference_update(states)

    def reason_of(self, state: int) -> str:
        """Why a live state was admitted ("" when unknown)."""
        return self.admission.only_reason or self.reasons.get(state, "")

    def _count_reasons(
        self, plan: Plan, admitted: list[tuple[int, int, str]], hit_state: int
    ) -> None:
        """Stats by admission reason for a committed request whose hit was `hit_state`
        (which the commit may have replaced since)."""
        stats = self.stats
        only = self.admission.only_reason
        if only is not None:
            count_reason(stats.states_admitted, only, len(admitted))
        elif admitted:
            by_reason = stats.states_admitted
            for _, sid, name in admitted:
                self.reasons[sid] = name
                count_reason(by_reason, name)
        reason = plan.hit_reason
        if not reason:
            return
        count_reason(stats.hits_by_reason, reason)
        count_reason(stats.hit_tokens_by_reason, reason, plan.hit_len)
        if hit_state in self.hit_once:
            return
        count_reason(stats.states_hit, reason)
        if plan.hit_node.state == hit_state:  # still live (not replaced by a refill)
            self.hit_once.add(hit_state)

    def _drop_superseded(self, full: Tokens, depths: list[int], freed: Reclaimed) -> None:
        """Remove states on `full`'s path that a newly admitted state at one of `depths`
        replaces (`AdmissionPolicy.superseded_by`); only unlocked nodes with <= 1 child go
        (a partial state other branches still extend, or another plan's hit, stays)."""
        test = self.admission.superseded_by(depths)
        if test is None:
            return
        lowest, replaced = test
        walk = self.tree.match(full[: depths[-1]])
        admitted = set(depths)
        for node in reversed(walk.path):
            if node.depth < lowest:
                break
            if (
                node.state != NO_STATE
                and replaced(node.depth)
                and node.depth not in admitted
                and node.lock == 0
                and len(node.children) <= 1
            ):
                freed.extend(self.tree.evict(node))
                self.stats.states_superseded += 1

    def serve(
        self, input_tokens: object, output_tokens: object, max_output: int | None = None
    ) -> int:
        """Simulate one request end to end; return its hit length. With `max_output`, plan
        reserves room for that many output tokens, as the live service's planner does."""
        return self.serve_plan(input_tokens, output_tokens, max_output).hit_len

    def serve_plan(
        self, input_tokens: object, output_tokens: object, max_output: int | None = None
    ) -> Plan:
        """`serve`, returning the committed request's plan (its hit, host part, moves)."""
        inp = as_tokens(input_tokens, "input tokens")
        out = np.asarray(output_tokens, dtype=np.int32)
        plan = self.plan(inp, max_output)
        self.commit(plan, np.concatenate([inp, out]) if len(out) else inp)
        return plan

    # ---------------------------------------------------------------- helpers
    def _require_open(self, plan: Plan) -> None:
        if plan.plan_id not in self._open:
            raise ValueError(f"plan {plan.plan_id} is not open (already committed or aborted)")

    def _close(self, plan: Plan) -> None:
        self._require_open(plan)
        del self._open[plan.plan_id]
        self.reserved -= plan.reserved

    def checkpoints(self, plan: Plan, n_total: int) -> list[Checkpoint]:
        """Every (depth, reason) `commit` will ask a state id for, when the request ends
        with `n_total` tokens (input + output): the plan's prefill checkpoints and the
        admission policy's decode checkpoints, sorted by depth."""
        n_input = len(plan.tokens)
        merged: dict[int, str] = {}
        for depth, reason in (
            *plan.checkpoints,
            *self.admission.decode_checkpoints(n_input, n_total),
        ):
            if 0 < depth <= n_total:
                merged.setdefault(depth, reason)
        return sorted(merged.items())

    @staticmethod
    def _have(match: Match) -> set[int]:
        """Depths of the states on a walk's path."""
        return {n.depth for n in match.path if n.state != NO_STATE}

    def _needed(self, match: Match, depths: list[int]) -> list[int]:
        """Bytes needed to insert `tokens[:depths[k]]` with the first k+1 states, per k,
        given the tree's `match` of `tokens`."""
        have = self._have(match)
        kv_per_token = self.cost.kv_bytes_per_token
        out: list[int] = []
        n_states = 0
        for depth in depths:
            n_states += depth not in have
            new_tokens = max(0, depth - match.matched_len)
            out.append(new_tokens * kv_per_token + n_states * self.cost.state_bytes)
        return out

    def _count_new(self, match: Match, depths: list[int]) -> int:
        """States of `depths` not already on the path of `match` (a walk at least as
        deep as the last of them). `depths` are distinct. The path is walked up from
        its end only as far as the shallowest of them."""
        if not depths:
            return 0
        wanted = set(depths)
        lowest = min(depths)
        have = 0
        for node in reversed(match.path):
            if node.depth < lowest:
                break
            have += node.depth in wanted and node.state != NO_STATE
        return len(depths) - have

    def _make_room(
        self, tokens: Tokens, depths: list[int], freed: Reclaimed, now: float, match: Match
    ) -> tuple[int, Match]:
        """Evict until all states fit, or nothing is left to evict; return how many fit and
        the tree's match of `tokens` after the evictions (`match` when there were none).

        The caller locks the node where `tokens` attach, so the matched path survives.
        """
        while True:
            # needed[-1] of `_needed`: KV past the walk plus every state not on its path
            new_states = self._count_new(match, depths)
            needed = (
                max(0, depths[-1] - match.matched_len) * self.cost.kv_bytes_per_token
                + new_states * self.cost.state_bytes
            )
            deficit = needed - (self.capacity - self.bytes_used - self.reserved)
            if deficit <= 0:
                return len(depths), match
            exhausted = self._evict(now, self.bytes_used - deficit, freed)
            match = self.tree.match(tokens)
            if exhausted:
                room = self.capacity - self.bytes_used - self.reserved
                return sum(1 for b in self._needed(match, depths) if b <= room), match


__all__ = [
    "CacheConfig",
    "CommitFailed",
    "CommitResult",
    "Plan",
    "PrefixCache",
    "as_tokens",
]
