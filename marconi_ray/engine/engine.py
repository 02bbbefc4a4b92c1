"""`Engine`: the in-process pairing of a cache-side `Planner` (core prefix cache, alpha
tuner) and a tensor-side `Worker` (model, state store, sampler).

Request lifecycle (`add_request`, then `step` until it is returned):
1. validate the prompt and sampling values (nothing changes on bad input);
2. the planner plans it: the hit (length, state id, KV slots), the prefill depths to
   checkpoint, the decode depths to capture, and a byte reservation (evicting to make
   room, so the store never holds more than the budget);
3. the worker loads the hit, prefills the rest capturing the planned states in the same
   pass (a wholly cached prompt needs no prefill: its checkpoint kept the logits), then
   decodes in batches with the other running requests; after the last token one more
   step consumes it, so the state after the whole sequence can be kept;
4. the planner commits what the cache admits; the worker frees whatever the cache
   rejected, evicted or does not reference.
On any error after planning, the plan is aborted and the request's states freed.

With tensor parallelism every rank runs the same engine calls in lockstep (each with its
own identical planner); rank 0's sampled tokens are broadcast so all ranks agree.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from marconi_kernels import get_kernels
from marconi_ray.core.cache.host_tier import HostTier
from marconi_ray.core.cache.prefix_cache import PrefixCache
from marconi_ray.core.cache.systems import get_system
from marconi_ray.core.cache.tuner import BootstrapTuner, TunerConfig
from marconi_ray.core.model.hf.parse import spec_from_hf_config
from marconi_ray.engine.kv_memory import KVMemoryPlan, planned_worker
from marconi_ray.engine.model.hybrid_model import HybridModel
from marconi_ray.engine.model.loader import load_model, read_config
from marconi_ray.engine.model.parallel import TPGroup
from marconi_ray.engine.spec.drafters import Drafter
from marconi_ray.engine.spec.mtp import MTPDrafter
from marconi_ray.engine.store.entry_io import EntryPayload, export_entry, import_entry
from marconi_ray.engine.store.state_store import STATE_DTYPE
from marconi_ray.engine.worker import Worker
from marconi_ray.protocol.kv_memory import KVMemory
from marconi_ray.protocol.orders import DEFAULT_MAX_BATCH_TOKENS, Finished, TokenEvent
from marconi_ray.protocol.planner import Planner
from marconi_ray.protocol.results import GenerationResult, Logprob, Usage
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.protocol.speculative import SpeculativeConfig
from marconi_ray.protocol.validation import validate_prompt

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype called `name`; ValueError naming it when unknown."""
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose from {sorted(DTYPES)}")
    return DTYPES[name]


def load_served_model(
    model_dir: str | Path,
    tp: TPGroup | None,
    dtype: str,
    device: torch.device | str,
    kernels: str = "auto",
    weights: Mapping[str, torch.Tensor] | None = None,
) -> HybridModel:
    """This rank's model in dtype `dtype` on `device`, with the kernel set `kernels` asks
    for there (`auto`, `ref` or `triton`; `marconi_kernels.get_kernels`): how the engine
    and the serve layer's shards load a model (the serve layer never picks kernels
    itself). ValueError naming an unknown dtype or kernel set."""
    kernel_set = get_kernels(device, prefer=kernels)
    return load_model(model_dir, tp, torch_dtype(dtype), device, kernel_set, weights)


def build_planner(
    raw_config: dict[str, Any],
    worker: Worker,
    system: str,
    cache_bytes: int,
    alpha: float | None = None,
    tuner: TunerConfig | None = None,
    host: HostTier | None = None,
) -> Planner:
    """A planner whose cache prices bytes as `worker`'s store holds them (this rank's
    shard: exactly `core.model.model_spec`'s figures at world size 1) and FLOPs from the spec;
    `host` is its host tier (None: device only)."""
    elem = torch.empty((), dtype=worker.model.dtype).element_size()
    spec = spec_from_hf_config(raw_config, dtype_bytes=elem, state_dtype_bytes=STATE_DTYPE.itemsize)
    store = worker.store
    return Planner.for_system(
        system,
        spec.flops_coeffs(),
        store.kv_bytes_per_token,
        store.state_bytes,
        cache_bytes,
        worker.model.cfg.max_position,
        alpha,
        tuner,
        host=host,
        windows=spec.window_terms(),
    )


class Engine:
    """In-process hybrid LLM engine with Marconi prefix caching.

    Args:
        model_dir: HF checkpoint directory (config.json, safetensors, tokenizer files).
        system: caching system from `core.cache.systems` (`vanilla`, `vllm+`, `sglang+`,
            `marconi`).
        cache_bytes: budget of KV + SSM bytes the prefix cache may hold on this device
            (under tensor parallelism: on each rank, which holds its shard of every state).
        host_cache_bytes: budget of the cache's host tier, in host memory (same unit;
            0: no host tier). Device evictions then demote to it (see `core.cache.host_tier`).
        host_placement: `flop_aware` (demote what a hit would save more prefill time on
            than its copy costs) or `lru` (demote every victim).
        dtype: model and cache dtype (`float32`, `bfloat16`, `float16`).
        alpha: fixed FLOP-aware eviction weight; None lets a tuned system bootstrap it.
        tuner: bootstrap tuner settings for tuned systems.
        tp: tensor-parallel rank; None for a single process.
        max_batch: most requests decoded together in one step.
        max_batch_tokens: tokens one step processes at most; longer prompts are
            prefilled in chunks interleaved with decode steps (see `Worker`).
        kernels: SSM kernel set: `auto` (Triton on a CUDA device when installed, else
            the pure-torch references, logging why), `ref`, or `triton` (mamba-ssm's and
            our Triton kernels: CUDA, or CPU under `TRITON_INTERPRET=1`; RuntimeError
            naming the reason when it cannot run). `model.kernels.backends` names each
            op's implementation.
        weights: checkpoint tensors by key to load instead of the folder's safetensors
            (see `loader.load_model`).
        max_running_tokens: KV rows the running requests may hold together (`Worker`:
            `add_request` of one that does not fit raises ValueError naming both numbers;
            `generate_many` starts each when it fits); None: no bound.
        kv_memory: size the device KV pool once, from this budget (`engine.kv_memory`):
            the cache's `cache_bytes` inside it, the rest bounding the running requests'
            rows (it sets `max_running_tokens`, so not both); `kv_plan` says how it
            split. None: the pool grows as needed.
        cuda_graphs: `auto` (the decode step replayed as CUDA graphs on CUDA, eager on
            CPU), `on` (CUDA only: ValueError elsewhere) or `off` (`model.step_graphs`).
        speculative: speculative decoding (`Worker`); `drafter` replaces the drafter it
            names (a `draft:MODEL` one: `engine.draft_model.drafter_for`; benchmarks'
            oracle); `mtp` loads the folder's multi-token-prediction layers.
    """

    def __init__(
        self,
        model_dir: str | Path,
        system: str = "marconi",
        cache_bytes: int = 1 << 30,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        alpha: float | None = None,
        tuner: TunerConfig | None = None,
        tp: TPGroup | None = None,
        max_batch: int = 8,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        kernels: str = "auto",
        weights: Mapping[str, torch.Tensor] | None = None,
        host_cache_bytes: int = 0,
        host_placement: str = "flop_aware",
        max_running_tokens: int | None = None,
        kv_memory: KVMemory | None = None,
        cuda_graphs: str = "auto",
        speculative: SpeculativeConfig | None = None,
        drafter: Drafter | MTPDrafter | None = None,
    ) -> None:
        get_system(system)
        self.model_dir = Path(model_dir)
        cfg, raw = read_config(model_dir)
        self.config = cfg
        self.system = system
        model = load_served_model(model_dir, tp, dtype, device, kernels, weights)
        self.kv_plan: KVMemoryPlan | None
        """How `kv_memory` split (None without it)."""
        self.worker, self.kv_plan = planned_worker(
            model,
            max_batch,
            max_batch_tokens,
            max_running_tokens,
            kv_memory,
            cache_bytes,
            cuda_graphs,
            model_dir,
            speculative,
            drafter,
        )
        host = (
            HostTier(int(host_cache_bytes), placement=host_placement) if host_cache_bytes else None
        )
        self.planner = build_planner(raw, self.worker, system, cache_bytes, alpha, tuner, host)
        self._prompts: dict[int, int] = {}
        self._hits: dict[int, int] = {}
        self._lps: dict[int, list[Logprob]] = {}
        self._prompt_lps: dict[int, tuple[Logprob | None, ...]] = {}
        self._results: list[GenerationResult] = []
        self._next_id = 0
        self._tokenizer: Any = None

    # ------------------------------------------------------------------ views
    @property
    def model(self) -> Any:
        return self.worker.model

    @property
    def store(self) -> Any:
        return self.worker.store

    @property
    def cache(self) -> PrefixCache:
        return self.planner.cache

    @property
    def tuner(self) -> BootstrapTuner | None:
        return self.planner.tuner

    @property
    def num_running(self) -> int:
        return self.worker.num_running

    @property
    def tokenizer(self) -> Any:
        """The model directory's tokenizer (transformers AutoTokenizer, offline)."""
        if self._tokenizer is None:
            from marconi_ray.protocol.model_files import load_tokenizer

            self._tokenizer = load_tokenizer(self.model_dir)
        return self._tokenizer

    # ------------------------------------------------------------------ API
    def generate(
        self, prompt_tokens: Sequence[int], params: SamplingParams | None = None
    ) -> GenerationResult:
        """Run one request to completion."""
        return self.generate_many([prompt_tokens], [params or SamplingParams()])[0]

    def generate_many(
        self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams]
    ) -> list[GenerationResult]:
        """Run several requests, prefilling each and decoding them in shared batches;
        results in input order. Bad input raises before any request starts."""
        if len(prompts) != len(params):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        submitted = time.time()
        pending = [self.validate(p, s) for p, s in zip(prompts, params, strict=True)]
        done: dict[int, GenerationResult] = {}
        ids: list[int] = []
        try:
            while pending or self.worker.num_running or self._results:
                while pending and self.worker.num_running < self.worker.max_batch:
                    if self.worker.num_running and not self._fits(*pending[0]):
                        break  # its KV rows are reserved by running requests: wait
                    prompt, sp = pending.pop(0)
                    ids.append(self._start(prompt, sp, submitted))
                for result in self.step():
                    done[result.request_id] = result
        except BaseException:
            for rid in ids:
                if rid not in done:
                    self._abort(rid)
            raise
        return [done[i] for i in ids]

    def add_request(
        self, prompt_tokens: Sequence[int], params: SamplingParams | None = None
    ) -> int:
        """Validate, plan and prefill one request; it then decodes in `step`. Returns its id."""
        prompt, sp = self.validate(prompt_tokens, params or SamplingParams())
        return self._start(prompt, sp, time.time())

    def step(self) -> list[GenerationResult]:
        """One batched decode step over the running requests; returns every request that
        finished since the last call (some finish right after their prefill)."""
        try:
            self._keep(self.worker.step())
        except Exception:
            running = set(self.worker.running_ids())
            finished = {d.request_id: d for d in self.worker.take_finished()}
            for rid in list(self._prompts):
                if rid not in running:
                    self._abort(rid, finished.get(rid))
            raise
        self._commit_finished()
        out, self._results = self._results, []
        return out

    # ------------------------------------------------------------- transfers
    def held_prefix(self, tokens: Sequence[int]) -> int:
        """Tokens of `tokens` this cache could serve as a hit now (its usable depth)."""
        return self.cache.lookup(np.asarray(tokens, dtype=np.int32))

    def export_prefix(self, tokens: Sequence[int], kv_from: int = 0) -> EntryPayload | None:
        """A copy of this cache's deepest usable entry of `tokens` (KV of positions
        [kv_from, depth) and the state at its depth), for another replica's
        `import_prefix`; None when the cache holds none deeper than `kv_from`. The entry
        is locked only while it is copied."""
        rid = self._next_id
        self._next_id += 1
        arr = np.asarray(tokens, dtype=np.int32)
        depth, sid, slots = self.planner.pin(rid, arr)
        try:
            self.worker.release(self.planner.pin_release(rid))
            if depth <= kv_from:
                return None
            return export_entry(self.store, arr[:depth], slots, sid, kv_from)
        finally:
            self.worker.release(self.planner.abort(rid))

    def import_prefix(self, payload: EntryPayload) -> int:
        """Admit an entry another replica exported (`export_prefix`) into this cache;
        returns the hit it makes for its tokens (its depth; 0 when the cache already held
        it or could not keep it). `TransferError` (the store and the cache unchanged)
        when the payload arrived short or corrupt, or does not fit this model or this
        cache's holdings: the caller then recomputes."""
        tokens = payload.meta.tokens
        if self.cache.lookup(tokens) == len(tokens):
            return 0
        rid = self._next_id
        self._next_id += 1
        held, _, release = self.planner.plan_import(rid, tokens)
        self.worker.release(release)
        try:
            sid, slots = import_entry(self.store, payload, tokens, held)
        except Exception:
            self.worker.release(self.planner.abort(rid))
            raise
        self.worker.release(self.planner.commit_import(rid, sid, slots))
        return len(tokens) if self.cache.lookup(tokens) == len(tokens) else 0

    def validate(
        self, prompt: Sequence[int], params: SamplingParams
    ) -> tuple[npt.NDArray[np.int32], SamplingParams]:
        """The prompt as int32 ids and the params; ValueError naming any bad value."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(params).__name__}")
        vocab = self.config.vocab_size
        arr = validate_prompt(prompt, vocab, self.config.max_position)
        for t in params.stop_token_ids:
            if t >= vocab:
                raise ValueError(f"stop token id {t} is outside the vocabulary [0, {vocab})")
        return arr, params

    # ------------------------------------------------------------------ stages
    def _fits(self, prompt: npt.NDArray[np.int32], params: SamplingParams) -> bool:
        """Whether a request surely fits the running rows now (counting no hit)."""
        return self.worker.fits(len(prompt) + params.max_tokens)

    def _start(
        self, prompt: npt.NDArray[np.int32], params: SamplingParams, submitted: float
    ) -> int:
        rid = self._next_id
        self._next_id += 1
        order, release = self.planner.order(rid, prompt, params, submitted)
        self.worker.release(release)
        self._prompts[rid] = len(prompt)
        self._hits[rid] = order.hit_len
        try:
            self._keep(self.worker.start(order))
        except Exception:
            self._abort(rid)
            raise
        self._commit_finished()
        return rid

    def _keep(self, events: list[TokenEvent]) -> None:
        """Collect the log-probabilities the events carry, for the requests' results."""
        for e in events:
            if e.prompt_logprobs:
                self._prompt_lps[e.request_id] = e.prompt_logprobs
            if e.logprob is not None:
                self._lps.setdefault(e.request_id, []).append(e.logprob)

    def _commit_finished(self) -> None:
        for done in self.worker.take_finished():
            try:
                self.worker.release(self.planner.commit(done))
            except Exception:
                self._abort(done.request_id, done)
                raise
            self._results.append(self._result(done))

    def _result(self, done: Finished) -> GenerationResult:
        n_prompt = self._prompts.pop(done.request_id)
        return GenerationResult(
            request_id=done.request_id,
            tokens=done.tokens,
            finish_reason=done.finish_reason,
            usage=Usage(n_prompt, len(done.tokens), self._hits.pop(done.request_id, 0)),
            timings=done.timings,
            logprobs=tuple(self._lps.pop(done.request_id, ())),
            prompt_logprobs=self._prompt_lps.pop(done.request_id, ()),
            spec=done.spec,
        )

    def _abort(self, rid: int, done: Finished | None = None) -> None:
        """Undo a request: stop it, free what it stored, release its plan."""
        self.worker.cancel(rid)
        self.worker.release(self.planner.abort(rid, done))
        self._prompts.pop(rid, None)
        self._hits.pop(rid, None)
        self._lps.pop(rid, None)
        self._prompt_lps.pop(rid, None)
