"""`Engine`: prefix cache (core) + hybrid model + state store + sampler, in one process.

Request lifecycle (`add_request`, then `step` until it is returned):
1. validate the prompt and sampling values (nothing changes on bad input);
2. `cache.plan(prompt)`: the hit length, the hit's state id, the depths to checkpoint;
3. load the hit's KV slots and SSM state from the store; prefill the rest of the prompt,
   capturing the planned states in the same pass (a prompt that is wholly cached needs no
   prefill: its checkpoint kept the next-token logits);
4. decode in batches with the other running requests, capturing the policy's decode
   depths; after the last token, one more step consumes it so that the state after the
   whole sequence (Marconi's "last decoded token" checkpoint) can be kept;
5. `cache.commit`: write the new KV into slots, store the states, free whatever the
   cache rejected or evicted and every slot the tree does not reference.
On any error after planning, the plan is aborted and the request's states freed.

With tensor parallelism every rank runs the same engine calls in lockstep; rank 0's
sampled tokens are broadcast so all ranks stay identical.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from collections.abc import Sequence as Seq
from pathlib import Path
from typing import Any

import numpy as np
import torch

from marconi_kernels import get_kernels
from marconi_ray.core.cost_model import CostModel
from marconi_ray.core.hf_config import spec_from_hf_config
from marconi_ray.core.prefix_cache import CommitResult, PrefixCache
from marconi_ray.core.systems import get_system
from marconi_ray.core.tree_types import Freed
from marconi_ray.core.tuner import BootstrapTuner, TunerConfig, run_grid
from marconi_ray.engine.loader import load_model, read_config
from marconi_ray.engine.parallel import TPGroup
from marconi_ray.engine.results import GenerationResult, Timings, Usage
from marconi_ray.engine.sampling import Sampler, SamplingParams, make_generator
from marconi_ray.engine.seq_state import StateCheckpoint
from marconi_ray.engine.sequence import Sequence
from marconi_ray.engine.state_store import StateStore
from marconi_ray.engine.validation import validate_prompt

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose from {sorted(DTYPES)}")
    return DTYPES[name]


class _Served:
    """The (input, output) of a finished request, as the tuner's `RequestLike`."""

    def __init__(self, seq: Sequence) -> None:
        self.input_tokens = seq.prompt
        self.output_tokens = np.asarray(seq.output, dtype=np.int32)


class Engine:
    """In-process hybrid LLM engine with Marconi prefix caching.

    Args:
        model_dir: HF checkpoint directory (config.json, safetensors, tokenizer files).
        system: caching system from `core.systems` (`vanilla`, `vllm+`, `sglang+`,
            `marconi`).
        cache_bytes: budget of KV + SSM bytes the prefix cache may hold on this device
            (under tensor parallelism: on each rank, which holds its shard of every state).
        dtype: model and cache dtype (`float32`, `bfloat16`, `float16`).
        alpha: fixed FLOP-aware eviction weight; None lets a tuned system bootstrap it.
        tuner: bootstrap tuner settings for tuned systems.
        tp: tensor-parallel rank; None for a single process.
        max_batch: most requests decoded together in one step.
        kernels: `auto` (mamba-ssm kernels on CUDA when installed, else the pure-torch
            references), `ref` or `cuda`.
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
        kernels: str = "auto",
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        spec_system = get_system(system)
        torch_dtype = _dtype(dtype)
        self.model_dir = Path(model_dir)
        cfg, raw = read_config(model_dir)
        self.config = cfg
        self.tp = tp or TPGroup()
        self.model = load_model(
            model_dir, self.tp, torch_dtype, device, get_kernels(device, prefer=kernels)
        )
        self.store = StateStore(self.model)
        elem = torch.empty((), dtype=torch_dtype).element_size()
        self.spec = spec_from_hf_config(raw, dtype_bytes=elem)
        linear, quadratic = self.spec.flops_coeffs()
        # bytes as this rank's store really holds them (== the spec's at world size 1;
        # 1/world of it under TP, plus any replicated B/C conv channels)
        cost = CostModel(linear, quadratic, self.store.kv_bytes_per_token, self.store.state_bytes)
        self.cache = PrefixCache(
            cost, spec_system.cache_config(int(cache_bytes), 0.0 if alpha is None else alpha)
        )
        self.tuner = (
            BootstrapTuner(tuner or TunerConfig()) if spec_system.tuned and alpha is None else None
        )
        self.system = system
        self.caching = spec_system.admission != "none"
        self.max_batch = max_batch
        self.sampler = Sampler()
        self._running: list[Sequence] = []
        self._finished: list[GenerationResult] = []
        self._next_id = 0
        self._tokenizer: Any = None

    # ------------------------------------------------------------------ API
    @property
    def tokenizer(self) -> Any:
        """The model directory's tokenizer (transformers AutoTokenizer, offline)."""
        if self._tokenizer is None:
            from marconi_ray.engine.tokenizer import load_tokenizer

            self._tokenizer = load_tokenizer(self.model_dir)
        return self._tokenizer

    @property
    def num_running(self) -> int:
        return len(self._running)

    def generate(
        self, prompt_tokens: Seq[int], params: SamplingParams | None = None
    ) -> GenerationResult:
        """Run one request to completion."""
        return self.generate_many([prompt_tokens], [params or SamplingParams()])[0]

    def generate_many(
        self, prompts: Seq[Seq[int]], params: Seq[SamplingParams]
    ) -> list[GenerationResult]:
        """Run several requests, prefilling each and decoding them in shared batches;
        results in input order. Bad input raises before any request starts."""
        if len(prompts) != len(params):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        submitted = time.perf_counter()
        pending = [self._validate(p, s) for p, s in zip(prompts, params, strict=True)]
        done: dict[int, GenerationResult] = {}
        ids: list[int] = []
        try:
            while pending or self._running or self._finished:
                while pending and len(self._running) < self.max_batch:
                    prompt, sp = pending.pop(0)
                    ids.append(self._start(prompt, sp, submitted))
                for result in self.step():
                    done[result.request_id] = result
        except BaseException:
            for seq in [s for s in self._running if s.request_id in ids]:
                self._fail(seq)
            raise
        return [done[i] for i in ids]

    def add_request(self, prompt_tokens: Seq[int], params: SamplingParams | None = None) -> int:
        """Validate, plan and prefill one request; it then decodes in `step`. Returns its id."""
        prompt, sp = self._validate(prompt_tokens, params or SamplingParams())
        return self._start(prompt, sp)

    def step(self) -> list[GenerationResult]:
        """One batched decode step over the running requests; returns every request that
        finished since the last call (some may finish right after their prefill)."""
        finished, self._finished = self._finished, []
        batch = self._running[: self.max_batch]
        if not batch:
            return finished
        t0 = time.perf_counter()
        ids = torch.tensor([s.output[-1] for s in batch], dtype=torch.long)
        try:
            logits = self.model.decode(ids, [s.state for s in batch])
        except Exception:
            for s in batch:
                self._fail(s)
            raise
        elapsed = time.perf_counter() - t0
        for row, seq in enumerate(batch):
            seq.decode_s += elapsed
            depth = seq.state.length
            if depth in seq.capture:
                self._capture(seq, depth, logits[row])
            if seq.finishing:
                self._capture(seq, depth, logits[row])
                finished.append(self._finish(seq))
                continue
            self._sample(seq, logits[row : row + 1])
            if seq.finish_reason is not None and not seq.finishing:
                finished.append(self._finish(seq))
        return finished

    # ------------------------------------------------------------------ stages
    def _validate(
        self, prompt: Seq[int], params: SamplingParams
    ) -> tuple[np.ndarray, SamplingParams]:
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(params).__name__}")
        arr = validate_prompt(prompt, self.config.vocab_size, self.config.max_position)
        for t in params.stop_token_ids:
            if t >= self.config.vocab_size:
                raise ValueError(
                    f"stop token id {t} is outside the vocabulary [0, {self.config.vocab_size})"
                )
        return arr, params

    def _start(
        self, prompt: np.ndarray, params: SamplingParams, submitted: float | None = None
    ) -> int:
        plan = self.cache.plan(prompt)
        n = len(prompt)
        max_new = min(params.max_tokens, self.config.max_position - n)
        seq = Sequence(
            request_id=self._next_id,
            prompt=prompt,
            params=params,
            plan=plan,
            state=self.model.new_state(),
            generator=make_generator(params.seed, self.model.device),
            max_new=max_new,
            capture=set(self.cache.decode_capture_depths(n, n + max_new))
            if self.caching
            else set(),
            started=time.perf_counter() if submitted is None else submitted,
        )
        self._next_id += 1
        try:
            self._prefill(seq)
            assert seq.state.logits is not None
            self._sample(seq, seq.state.logits[None])
        except Exception:
            self._fail(seq)
            raise
        self._running.append(seq)
        if seq.finish_reason is not None and not seq.finishing:
            self._finished.append(self._finish(seq))
        return seq.request_id

    def _prefill(self, seq: Sequence) -> None:
        t0 = time.perf_counter()
        plan, n = seq.plan, len(seq.prompt)
        h = plan.hit_len
        if h > 0:
            slots = np.concatenate(self.cache.hit_kv(seq.prompt, h))[:h]
            seq.state = self.store.load(slots, plan.hit_state, h)
        depths = [d for d, _ in plan.checkpoints if h < d <= n]
        if h < n:
            ids = torch.as_tensor(seq.prompt[h:], dtype=torch.long)
            for ckpt in self.model.prefill(ids, seq.state, depths):
                seq.state_ids[ckpt.depth] = self.store.put_state(ckpt)
        seq.prefill_s = time.perf_counter() - t0

    def _sample(self, seq: Sequence, logits: torch.Tensor) -> None:
        token = self.sampler.sample(logits, [seq.params], [seq.generator])
        token = self.tp.broadcast(token.to(torch.long))
        t = int(token[0])
        if seq.first_token_at is None:
            seq.first_token_at = time.perf_counter()
        seq.output.append(t)
        p = seq.params
        if t in p.stop_token_ids or (not p.ignore_eos and t in self.config.eos_token_ids):
            seq.finish_reason = "stop"
        elif len(seq.output) >= seq.max_new:
            seq.finish_reason = "length"
        if seq.finish_reason is not None:
            seq.finishing = self._wants_final_state(seq)

    def _wants_final_state(self, seq: Sequence) -> bool:
        """Does the cache keep a state after the whole sequence (prompt + output)?"""
        if not self.caching:
            return False
        return any(d == seq.n_total for d, _ in self.cache.checkpoints(seq.plan, seq.n_total))

    def _capture(self, seq: Sequence, depth: int, logits: torch.Tensor) -> None:
        if depth in seq.state_ids:
            return
        st = seq.state
        ckpt = StateCheckpoint(depth, dict(st.conv), dict(st.ssm), logits)
        seq.state_ids[depth] = self.store.put_state(ckpt)

    def _finish(self, seq: Sequence) -> GenerationResult:
        self._running.remove(seq)
        try:
            self._commit(seq)
        except Exception:
            self._fail(seq)
            raise
        if self.tuner is not None:
            job = self.tuner.after_request(self.cache, _Served(seq))
            if job is not None:
                self.tuner.adopt(run_grid(job, map), self.cache)
        now = time.perf_counter()
        first = seq.first_token_at or now
        return GenerationResult(
            request_id=seq.request_id,
            tokens=tuple(seq.output),
            finish_reason=seq.finish_reason or "length",
            usage=Usage(len(seq.prompt), len(seq.output), seq.plan.hit_len),
            timings=Timings(first - seq.started, seq.prefill_s, seq.decode_s, now - seq.started),
        )

    def _commit(self, seq: Sequence) -> None:
        full = seq.tokens()
        wanted = self.cache.checkpoints(seq.plan, len(full))
        missing = [d for d, _ in wanted if d not in seq.state_ids]
        if missing:
            raise RuntimeError(f"request {seq.request_id}: no state captured at depths {missing}")
        h = seq.plan.hit_len
        deepest = max((d for d, _ in wanted), default=h)
        slots = self.store.alloc_slots(max(0, deepest - h))
        self.store.write_kv(slots, seq.state, h)
        ids = {d: seq.state_ids[d] for d, _ in wanted}
        extra = [sid for d, sid in seq.state_ids.items() if d not in ids]
        result: CommitResult = self.cache.commit(seq.plan, full, ids, kv=slots, kv_start=h)
        self._release(result.freed)
        self._free_states([*result.rejected_states, *extra])
        kept = self.cache.hit_kv(full, len(full))
        referenced = np.concatenate(kept) if kept else np.empty(0, dtype=np.int64)
        self.store.free_slots(slots[~np.isin(slots, referenced)])

    # ------------------------------------------------------------------ cleanup
    def _release(self, freed: Freed) -> None:
        """Free what the cache evicted or tidied away."""
        self._free_states(freed.states)
        for handle in freed.kv:
            if handle is not None:
                self.store.free_slots(handle)

    def _free_states(self, ids: Iterable[int]) -> None:
        for sid in ids:
            if self.store.has_state(sid):
                self.store.free_state(sid)

    def _fail(self, seq: Sequence) -> None:
        """Undo a request that raised: drop its states and abort its plan (unless the
        commit already closed it)."""
        if seq in self._running:
            self._running.remove(seq)
        self._free_states(seq.state_ids.values())
        if self.cache.is_open(seq.plan):
            self._release(self.cache.abort(seq.plan))
