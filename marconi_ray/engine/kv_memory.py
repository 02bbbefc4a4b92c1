"""Sizing the device KV pool from a memory budget, as vLLM sizes its KV cache from
`gpu_memory_utilization`: the pool for running and cached tokens is allocated once at
start, the cache's byte budget inside it, and the rest bounds the running requests' rows
(`Worker.max_running_tokens`), so admission waits when rows run short instead of the
device running out of memory.

The budget is `KVMemory.bytes` (`protocol.kv_memory`; any device, the setting to use on
CPU) or `KVMemory.fraction` of the device's free memory once the weights are loaded and the
kernels warmed up (CUDA). Of it, the running requests' recurrent states are set aside
first (`STATES_PER_REQUEST` per decode slot: its live state, a branch-point checkpoint and
its final state, which Marconi's admission orders at most), then the cache's budget; the
rest, in KV rows, is what the running requests may reserve. The pool holds the running
rows plus as many as the cache's budget could fill with KV alone.

A model with sliding-window blocks (`HybridModel.window_blocks`, W = `window_state`:
their KV is in each checkpoint, not per token) has running rows of theirs in a pool of
its own (`engine.window_rows`): each running request holds at most W + 1 between steps,
a step adds at most its `max_batch_tokens`, so `window_rows` = max_batch * (W + 1) +
max_batch_tokens are set aside with the running states, and the window pool is
allocated at that size.

What the coordinator's byte accounting counts stays as it was: its tree's bytes (KV of
the slots it references plus its states) against `cache_bytes`; running requests' rows
are the worker's (`reserved_rows`), bounded here, never the cache's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from marconi_ray.engine.constrained import GrammarMasks
from marconi_ray.engine.model.hybrid_model import HybridModel
from marconi_ray.engine.model.mtp import load_mtp
from marconi_ray.engine.spec.drafters import Drafter
from marconi_ray.engine.spec.mtp import MTPDrafter
from marconi_ray.engine.store.state_store import StateStore
from marconi_ray.engine.worker import Worker
from marconi_ray.protocol.kv_memory import KVMemory
from marconi_ray.protocol.orders import DEFAULT_MAX_BATCH_TOKENS
from marconi_ray.protocol.speculative import SpeculativeConfig

STATES_PER_REQUEST = 3


def memory_budget(memory: KVMemory, device: torch.device) -> int:
    """`memory`'s budget in bytes on `device` (ValueError for a fraction off CUDA)."""
    if memory.bytes is not None:
        return int(memory.bytes)
    assert memory.fraction is not None
    if device.type != "cuda":
        raise ValueError(
            f"a kv memory fraction ({memory.fraction}) needs a CUDA device, not {device}; "
            "set a byte budget instead"
        )
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    return int(free * memory.fraction)


@dataclass(frozen=True)
class KVMemoryPlan:
    """How a budget splits (bytes unless named rows)."""

    budget: int
    cache_bytes: int
    running_states: int
    max_running_tokens: int
    pool_rows: int
    kv_bytes_per_token: int
    window_rows: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_kv_memory(
    budget: int,
    cache_bytes: int,
    kv_bytes_per_token: int,
    state_bytes: int,
    max_batch: int,
    window_rows: int = 0,
    window_row_bytes: int = 0,
) -> KVMemoryPlan:
    """Split `budget` (see the module docstring); ValueError naming the numbers when it
    leaves the running requests not one row. A model with no per-token KV (the pure
    SSMs, RecurrentGemma whose only KV is windowed: `kv_bytes_per_token` 0) needs no
    row: the plan has none, and the budget must only hold the cache, the running states
    and the `window_rows` running window rows of `window_row_bytes` each (ValueError
    naming the numbers otherwise)."""
    states = STATES_PER_REQUEST * max_batch * state_bytes + window_rows * window_row_bytes
    if kv_bytes_per_token == 0:
        if budget < cache_bytes + states:
            held = "states" if not window_rows else f"states and {window_rows} window rows"
            kept = "no KV" if not window_rows else "no per-token KV"
            raise ValueError(
                f"a kv memory budget of {budget} bytes cannot hold the cache ({cache_bytes}) "
                f"and {max_batch} running requests' {held} ({states}); the model keeps {kept}"
            )
        return KVMemoryPlan(budget, cache_bytes, states, 0, 0, 0, window_rows)
    rows = (budget - cache_bytes - states) // kv_bytes_per_token
    if rows < 1:
        raise ValueError(
            f"a kv memory budget of {budget} bytes leaves no KV row for running requests: "
            f"the cache takes {cache_bytes}, {max_batch} running requests' states {states}, "
            f"a row is {kv_bytes_per_token} bytes"
        )
    pool_rows = rows + cache_bytes // kv_bytes_per_token
    return KVMemoryPlan(budget, cache_bytes, states, int(rows), int(pool_rows), kv_bytes_per_token)


def planned_store(
    model: HybridModel,
    memory: KVMemory,
    cache_bytes: int,
    max_batch: int,
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
) -> tuple[StateStore, KVMemoryPlan]:
    """A `StateStore` for `model` whose device pool (and window pool) is allocated whole
    from the plan of `memory` (its budget measured now, so call it after loading and
    warming up)."""
    store = StateStore(model)
    window_rows = 0
    if store.window is not None:
        window_rows = max_batch * (store.window + 1) + max_batch_tokens
    plan = plan_kv_memory(
        memory_budget(memory, model.device),
        cache_bytes,
        store.kv_bytes_per_token,
        store.state_bytes,
        max_batch,
        window_rows,
        store.window_row_bytes,
    )
    store.device_kv.reserve(plan.pool_rows)
    if store.window_kv is not None:
        store.window_kv.reserve(window_rows)
    return store, plan


def planned_worker(
    model: HybridModel,
    max_batch: int,
    max_batch_tokens: int,
    max_running_tokens: int | None,
    kv_memory: KVMemory | None,
    cache_bytes: int,
    cuda_graphs: str = "auto",
    tokenizer_dir: str | Path | None = None,
    speculative: SpeculativeConfig | None = None,
    drafter: Drafter | MTPDrafter | None = None,
) -> tuple[Worker, KVMemoryPlan | None]:
    """The `Worker` of `model`, its store's pool sized from `kv_memory` (which then sets
    `max_running_tokens`: ValueError when both are given) and the plan; without
    `kv_memory`, a growing pool and no plan. With `tokenizer_dir` (the model folder),
    it serves constrained requests with that folder's tokenizer; with `speculative`, it
    drafts and verifies (`drafter` replacing the one it names; `mtp` loads the folder's
    multi-token-prediction layers, before the pool is sized). Call it after loading and
    warming up."""
    if speculative is not None and speculative.method == "mtp" and drafter is None:
        if tokenizer_dir is None:
            raise ValueError("speculative method 'mtp' needs the model folder (tokenizer_dir)")
        drafter = MTPDrafter(load_mtp(model, tokenizer_dir))
    store, plan = None, None
    if kv_memory is not None:
        if max_running_tokens is not None:
            raise ValueError(
                f"set max_running_tokens ({max_running_tokens}) or kv_memory, not both: "
                "kv_memory sets it"
            )
        store, plan = planned_store(model, kv_memory, cache_bytes, max_batch, max_batch_tokens)
        # a model with no KV has no rows to bound (its plan has none)
        max_running_tokens = plan.max_running_tokens or None
    worker = Worker(
        model,
        max_batch,
        max_batch_tokens,
        store=store,
        max_running_tokens=max_running_tokens,
        cuda_graphs=cuda_graphs,
        grammars=None if tokenizer_dir is None else GrammarMasks.of(model, tokenizer_dir),
        speculative=speculative,
        drafter=drafter,
    )
    return worker, plan
