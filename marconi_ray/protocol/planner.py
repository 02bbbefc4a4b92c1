"""`Planner`: the cache side of one replica. Turns requests into `PrefillOrder`s with a
`core.PrefixCache` (match, checkpoint depths, byte reservation, lock), and finished
requests into commits, returning what the worker must free as `Release`s.

The in-process `Engine` drives one planner; the serve layer's coordinator actor holds
one per replica. Planning is pure bookkeeping: no tensors, no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import numpy.typing as npt

from marconi_ray.core.cache import cache_codec
from marconi_ray.core.cache.host_tier import NO_HOST_TIER, HostTier
from marconi_ray.core.cache.prefix_cache import CommitFailed, Plan, PrefixCache
from marconi_ray.core.cache.systems import get_system
from marconi_ray.core.cache.tuner import (
    BootstrapTuner,
    MapFn,
    TuneJob,
    TunerConfig,
    TuneResult,
    run_grid,
)
from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.core.model.window_term import WindowTerm
from marconi_ray.core.tree.tree_types import KVHandle, Reclaimed
from marconi_ray.core.wire import SCHEMA_VERSION, Record, check_header, check_int
from marconi_ray.protocol.orders import Finished, Move, PrefillOrder, Release, Slots, no_slots
from marconi_ray.protocol.sampling import SamplingParams

PLANNER_KIND = "planner"
_PLANNER_KEYS = ("kind", "version", "max_position", "cache", "requests", "tuner")


def _slots(handles: Iterable[KVHandle]) -> Slots:
    """The KV slot ids of `handles` (None entries skipped), concatenated as int64."""
    arrays = [h for h in handles if h is not None]
    return np.concatenate(arrays, dtype=np.int64, casting="unsafe") if arrays else no_slots()


def moves_of(freed: Reclaimed) -> tuple[Move, ...]:
    """The tier moves of a cache mutation, in order, as the worker's `Move`s."""
    return tuple(Move(m.to_host, m.states, _slots(m.kv)) for m in freed.moves)


def release_of(freed: Reclaimed) -> Release:
    """What the store must do after a cache mutation: its moves, then its frees."""
    return Release(tuple(freed.states), _slots(freed.kv), moves_of(freed))


class _Served:
    """A finished request as the tuner's `RequestLike` (the output becomes an array
    only if the tuner reads it: most requests fall outside its window)."""

    def __init__(self, prompt: npt.NDArray[np.int32], output: tuple[int, ...]) -> None:
        self.input_tokens = prompt
        self._output = output

    @property
    def output_tokens(self) -> npt.NDArray[np.int32]:
        return np.asarray(self._output, dtype=np.int32)


class Planner:
    """One replica's prefix cache, plus bootstrap alpha tuning when `tuner` is given.

    Args:
        max_position: the model's context limit (generation is capped to fit it).
        tune_map: how a tuner job's alpha shares are evaluated in-process (serial `map`).
        on_tune_job: when given, a finished window's job is handed to it instead of being
            evaluated here (the serve layer sends it to the tuner actor, which later
            calls `adopt` with the result).
    """

    def __init__(
        self,
        cache: PrefixCache,
        max_position: int,
        tuner: BootstrapTuner | None = None,
        tune_map: MapFn = map,
        on_tune_job: Callable[[TuneJob], None] | None = None,
    ) -> None:
        self.cache = cache
        self.max_position = max_position
        self.tuner = tuner
        self.tune_map = tune_map
        self.on_tune_job = on_tune_job
        self.caching = cache.config.admission != "none"
        self._plans: dict[int, Plan] = {}

    @classmethod
    def for_system(
        cls,
        system: str,
        flops: tuple[float, float],
        kv_bytes_per_token: int,
        state_bytes: int,
        cache_bytes: int,
        max_position: int,
        alpha: float | None = None,
        tuner: TunerConfig | None = None,
        on_tune_job: Callable[[TuneJob], None] | None = None,
        host: HostTier | None = None,
        windows: tuple[WindowTerm, ...] = (),
    ) -> Planner:
        """A planner for a named caching system (`core.cache.systems`).

        Its cache prices FLOPs with the spec's (linear, quadratic) coefficients `flops`
        and its sliding-window terms `windows` (`ModelSpec.window_terms`), and
        bytes as the replica's store holds them, `cache_bytes` on the device and `host`'s
        budget in host memory (None: no host tier). A tuned system with `alpha` None gets
        a bootstrap tuner (`tuner`, or the defaults); otherwise alpha is fixed.
        """
        spec = get_system(system)
        cost = CostModel(flops[0], flops[1], kv_bytes_per_token, state_bytes, windows)
        config = spec.cache_config(int(cache_bytes), alpha or 0.0, host=host or NO_HOST_TIER)
        cache = PrefixCache(cost, config)
        bootstrap = BootstrapTuner(tuner or TunerConfig()) if spec.tuned and alpha is None else None
        return cls(cache, max_position, bootstrap, on_tune_job=on_tune_job)

    @property
    def open_requests(self) -> int:
        return len(self._plans)

    def is_planned(self, request_id: int) -> bool:
        """True while `request_id` holds a plan (until its commit or abort)."""
        return request_id in self._plans

    def prompt_of(self, request_id: int) -> npt.NDArray[np.int32] | None:
        """The prompt `request_id` was planned with, None when it holds no plan."""
        plan = self._plans.get(request_id)
        return None if plan is None else plan.tokens

    # ------------------------------------------------------------------- state
    def to_record(self) -> Record:
        """The planner as a plain structure (`cache_codec` conventions; msgpack it with
        `wire.pack`): its cache with the open plans, which plan each open request
        holds, `max_position` and the tuner. Callables (`tune_map`, `on_tune_job`) are
        not state: `from_record` takes them again."""
        return {
            "kind": PLANNER_KIND,
            "version": SCHEMA_VERSION,
            "max_position": int(self.max_position),
            "cache": cache_codec.to_record(self.cache),
            "requests": [[int(rid), int(plan.plan_id)] for rid, plan in self._plans.items()],
            "tuner": None if self.tuner is None else self.tuner.to_record(),
        }

    @classmethod
    def from_record(
        cls,
        state: object,
        on_tune_job: Callable[[TuneJob], None] | None = None,
        tune_map: MapFn = map,
    ) -> Planner:
        """Validate a `to_record` structure and rebuild the planner; ValueError if malformed
        (also when its requests and the cache's open plans are not one to one). Open
        requests can then be committed or aborted as if nothing had happened."""
        top = check_header(state, "planner", PLANNER_KIND, _PLANNER_KEYS)
        cache = cache_codec.from_record(top.get("cache"))
        raw_tuner = top.get("tuner")
        tuner = None if raw_tuner is None else BootstrapTuner.from_record(raw_tuner)
        planner = cls(cache, top.get_int("max_position", 1), tuner, tune_map, on_tune_job)
        for i, pair in enumerate(top.get_list("requests")):
            where = f"planner.requests[{i}]"
            if not isinstance(pair, list) or len(pair) != 2:
                raise ValueError(f"{where}: expected a [request_id, plan_id] pair")
            rid = check_int(pair[0], f"{where}[0]")
            if rid in planner._plans:
                raise ValueError(f"{where}: request id {rid} is listed twice")
            planner._plans[rid] = cache.get_plan(check_int(pair[1], f"{where}[1]"))
        held = {plan.plan_id for plan in planner._plans.values()}
        if len(held) != len(planner._plans) or len(held) != cache.open_plans:
            raise ValueError("planner.requests and the cache's open plans are not one to one")
        return planner

    def order(
        self,
        request_id: int,
        prompt: npt.NDArray[np.int32],
        params: SamplingParams,
        submitted: float = 0.0,
    ) -> tuple[PrefillOrder, Release]:
        """Plan one validated request; returns its order and what planning evicted."""
        if request_id in self._plans:
            raise ValueError(f"request id {request_id} is already planned")
        n = len(prompt)
        max_new = max(1, min(params.max_tokens, self.max_position - n))
        plan = self.cache.plan(prompt, max_output=max_new)
        self._plans[request_id] = plan
        h = plan.hit_len
        hit_slots = _slots(self.cache.path_kv(plan.hit_node))[:h] if h else no_slots()
        caching = self.caching
        order = PrefillOrder(
            request_id=request_id,
            prompt=prompt,
            params=params,
            max_new=max_new,
            hit_len=h,
            hit_state=plan.hit_state if h else -1,
            hit_slots=hit_slots,
            checkpoints=tuple(d for d, _ in plan.checkpoints if h < d <= n),
            capture=tuple(self.cache.decode_capture_depths(n, n + max_new)) if caching else (),
            keep_final=caching and self.cache.keeps_final(n),
            submitted=submitted,
        )
        return order, release_of(plan.freed)

    def commit(self, done: Finished) -> Release:
        """Admit what the cache keeps of a finished request; returns what to free. The
        commit of an import (`plan_import`) is `commit_import` of its one state and its
        KV slots (`done.state_ids` holds exactly the state at the entry's end)."""
        if self.is_import(done.request_id):
            n = len(self._plans[done.request_id].tokens)
            if set(done.state_ids) != {n}:
                raise ValueError(
                    f"import {done.request_id}: expected one state at depth {n}, "
                    f"got depths {sorted(done.state_ids)}"
                )
            return self.commit_import(done.request_id, done.state_ids[n], done.kv_slots)
        plan = self._plans.pop(done.request_id)
        prompt = plan.tokens
        full = np.concatenate([prompt, np.asarray(done.tokens, dtype=np.int32)])
        wanted = self.cache.checkpoints(plan, len(full))
        missing = [d for d, _ in wanted if d not in done.state_ids]
        if missing:
            self._plans[done.request_id] = plan
            raise RuntimeError(f"request {done.request_id}: no state captured at depths {missing}")
        ids = {d: done.state_ids[d] for d, _ in wanted}
        extra = tuple(sid for d, sid in done.state_ids.items() if d not in ids)
        try:
            result = self.cache.commit(plan, full, ids, kv=done.kv_slots, kv_start=plan.hit_len)
        except CommitFailed as exc:
            # aborted, nothing counted: the tree keeps what it took, the rest goes back
            own = Release(tuple(done.state_ids.values()), done.kv_slots)
            return release_of(exc.freed) + own.without(exc.held, exc.held_kv)
        except ValueError:
            self._plans[done.request_id] = plan  # refused, still open: abort can follow
            raise
        # the tree took the slots of positions [start, end) (new edges): free the others
        start, end = (max(p - plan.hit_len, 0) for p in result.kv_used)
        kv = done.kv_slots
        unused = kv[:start], kv[max(start, end) :]
        freed = result.freed
        release = Release(
            (*freed.states, *result.rejected_states, *extra),
            np.concatenate([_slots(freed.kv), *unused]),
            moves_of(freed),
        )
        self._after_request(prompt, done.tokens)
        return release

    def abort(self, request_id: int, done: Finished | None = None) -> Release:
        """Release a request's plan (and whatever it stored, if it got that far)."""
        plan = self._plans.pop(request_id, None)
        release = Release() if plan is None else release_of(self.cache.abort(plan))
        if done is not None:
            release = release + Release(tuple(done.state_ids.values()), done.kv_slots)
        return release

    # --------------------------------------------------------------- transfers
    def pin(self, request_id: int, tokens: npt.NDArray[np.int32]) -> tuple[int, int, Slots]:
        """Lock the deepest usable entry of `tokens` for a copy to another replica:
        (depth, state id, KV slots of `tokens[:depth]`); depth 0 when there is none.
        Holds a plan under `request_id` until `abort(request_id)` (the lock and any tier
        promotion its `Release` brings, as for a request's plan)."""
        if request_id in self._plans:
            raise ValueError(f"request id {request_id} is already planned")
        plan = self.cache.plan(tokens)
        self._plans[request_id] = plan
        h = plan.hit_len
        slots = _slots(self.cache.path_kv(plan.hit_node))[:h] if h else no_slots()
        return h, (plan.hit_state if h else -1), slots

    def is_import(self, request_id: int) -> bool:
        """Whether `request_id` holds an import's plan (`plan_import`: its one checkpoint
        is the `transfer` state at the entry's end)."""
        plan = self._plans.get(request_id)
        return plan is not None and plan.checkpoints == ((len(plan.tokens), "transfer"),)

    def pin_release(self, request_id: int) -> Release:
        """What a `pin`'s plan brought for the store to do (its tier promotions)."""
        return release_of(self._plans[request_id].freed)

    def plan_import(
        self, request_id: int, tokens: npt.NDArray[np.int32]
    ) -> tuple[int, Slots, Release]:
        """Plan the admission of an entry for `tokens` copied from another replica
        (`PrefixCache.plan_import`): (hit_len, the KV slots of `tokens[:hit_len]` the
        cache already holds, what planning evicted). The import brings the KV of
        `tokens[hit_len:]` and the state at the end; `commit_import` or `abort` it."""
        if request_id in self._plans:
            raise ValueError(f"request id {request_id} is already planned")
        plan = self.cache.plan_import(tokens)
        self._plans[request_id] = plan
        h = plan.hit_len
        slots = _slots(self.cache.path_kv(plan.hit_node))[:h] if h else no_slots()
        return h, slots, release_of(plan.freed)

    def commit_import(self, request_id: int, state_id: int, kv_slots: Slots) -> Release:
        """Admit an imported entry: `state_id` after all of its tokens and `kv_slots`,
        the KV of its tokens past the planned hit. Returns what to free (what the cache
        did not keep, and what making room evicted). Not counted as a request."""
        plan = self._plans.pop(request_id)
        n = len(plan.tokens)
        try:
            result = self.cache.commit(
                plan,
                plan.tokens,
                {n: state_id},
                kv=kv_slots,
                kv_start=plan.hit_len,
                counted=False,
            )
        except CommitFailed as exc:
            own = Release((state_id,), kv_slots)
            return release_of(exc.freed) + own.without(exc.held, exc.held_kv)
        except ValueError:
            self._plans[request_id] = plan
            raise
        start, end = (max(p - plan.hit_len, 0) for p in result.kv_used)
        unused = kv_slots[:start], kv_slots[max(start, end) :]
        return Release(
            (*result.freed.states, *result.rejected_states),
            np.concatenate([_slots(result.freed.kv), *unused]),
            moves_of(result.freed),
        )

    # ------------------------------------------------------------------ tuning
    def _after_request(self, prompt: npt.NDArray[np.int32], output: tuple[int, ...]) -> None:
        if self.tuner is None:
            return
        job = self.tuner.after_request(self.cache, _Served(prompt, output))
        if job is None:
            return
        if self.on_tune_job is not None:
            self.on_tune_job(job)
        else:
            self.adopt(run_grid(job, self.tune_map))

    def adopt(self, result: TuneResult) -> None:
        """Apply a finished alpha search to the cache and arm the tuner's next window."""
        if self.tuner is None:
            raise ValueError("this planner's system does not tune alpha")
        self.tuner.adopt(result, self.cache)
