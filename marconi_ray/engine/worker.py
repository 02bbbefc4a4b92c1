"""`Worker`: the tensor side of serving. Runs prefill orders and batched decode steps on
one model rank, keeps the request's states in the store, and hands finished requests back
for the cache's commit. It makes no caching decision: those come in `PrefillOrder`s and
`Release`s from the cache side (an in-process `Planner` or the coordinator actor).

Under tensor parallelism every rank's worker receives the same calls in the same order;
the model's collectives keep them in lockstep and rank 0's sampled tokens are broadcast.
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import torch

from marconi_ray.engine.model.hybrid_model import HybridModel
from marconi_ray.engine.model.seq_state import StateCheckpoint
from marconi_ray.engine.sampler import Sampler, make_generator
from marconi_ray.engine.sequence import Sequence
from marconi_ray.engine.store.state_store import StateStore
from marconi_ray.protocol.orders import (
    DEFAULT_MAX_BATCH_TOKENS,
    Finished,
    PrefillOrder,
    Release,
    Slots,
    StepInput,
    StepOutput,
    TokenEvent,
)
from marconi_ray.protocol.results import Timings


class Worker:
    """Model + state store + sampler of one rank; continuous batching over `step`.

    Chunked prefill: a prompt whose uncached part fits in `max_batch_tokens` is prefilled
    by `start` at once (its first token sampled there); a longer one is prefilled
    `max_batch_tokens` tokens per `step` (less the step's decode rows), one long prompt at
    a time, interleaved with the running decodes, so a 16k-token prompt never stalls them
    for its whole prefill. Planned checkpoints land at their exact depths whatever the
    chunking (the model's prefill emits at absolute depths inside each chunk).

    Args:
        max_batch: most sequences decoded together in one step (the rest wait their turn).
        max_batch_tokens: tokens one step processes at most (decode rows + prefill chunk).
    """

    def __init__(
        self,
        model: HybridModel,
        max_batch: int = 8,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
        self.model = model
        self.store = StateStore(model)
        self.tp = model.tp
        self.max_batch = max_batch
        self.max_batch_tokens = max_batch_tokens
        self.sampler = Sampler()
        self._running: list[Sequence] = []
        self._prefilling: list[Sequence] = []
        self._waiting: list[PrefillOrder] = []
        """Orders with a hit held back by `advance` while promotions copy to the device
        (CUDA), so running requests keep decoding; started in order once they land."""
        self._finished: list[Finished] = []
        self._taken: list[Finished] = []
        """The last `take_finished`'s requests, until the next `advance`: a replica that
        never got them (a peer rank failed the step) `cancel`s them, which frees them."""
        self._batch = model.new_decode_batch(max_batch)

    @property
    def num_running(self) -> int:
        """Requests started and not finished (decoding, still prefilling, or waiting for
        their hit's promotion)."""
        return len(self._running) + len(self._prefilling) + len(self._waiting)

    def running_ids(self) -> list[int]:
        ids = [s.request_id for s in (*self._running, *self._prefilling)]
        return ids + [order.request_id for order in self._waiting]

    # ------------------------------------------------------------------ requests
    def start(self, order: PrefillOrder) -> list[TokenEvent]:
        """Load the hit and prefill the rest capturing the ordered states; when it fits in
        `max_batch_tokens`, sample the first token now (its event is returned), else the
        prefill continues chunk by chunk in `step`. On error everything the request
        stored is freed and the error re-raised."""
        seq = Sequence(
            order, self.model.new_state(), make_generator(order.params.seed, self.model.device)
        )
        try:
            self._load_hit(seq)
            if len(order.prompt) - seq.prefilled > self.max_batch_tokens:
                self._prefilling.append(seq)
                return []
            self._prefill(seq, len(order.prompt))
            return [self._first_token(seq)]
        except Exception:
            self._drop(seq)
            raise

    def step(self, prefill_chunk: bool = True) -> list[TokenEvent]:
        """One step: a decode for up to `max_batch` running sequences (oldest first), then
        (unless `prefill_chunk` is False) a prefill chunk of the oldest long prompt with
        the rest of `max_batch_tokens`."""
        batch = self._running[: self.max_batch]
        events = self._decode(batch) if batch else []
        if self._prefilling and prefill_chunk:
            events += self._prefill_chunk(max(1, self.max_batch_tokens - len(batch)))
        return events

    def _prefill_chunk(self, budget: int) -> list[TokenEvent]:
        seq = self._prefilling[0]
        end = min(len(seq.order.prompt), seq.prefilled + budget)
        try:
            self._prefill(seq, end)
            if end < len(seq.order.prompt):
                return []
            self._prefilling.remove(seq)
            return [self._first_token(seq)]
        except Exception:
            self._drop(seq)
            raise

    def _first_token(self, seq: Sequence) -> TokenEvent:
        """Sample a fully prefilled sequence's first token; it joins the decode batch."""
        assert seq.state.logits is not None
        event = self._sample(seq, seq.state.logits[None])
        self._running.append(seq)
        if seq.finish_reason is not None and not seq.finishing:
            self._finish(seq)
        return event

    def _decode(self, batch: list[Sequence]) -> list[TokenEvent]:
        """One decode step of `batch` on the persistent `DecodeBatch` (sequences join it
        once, when they start decoding, and leave it when they end)."""
        t0 = time.perf_counter()
        members = {id(s.state) for s in batch}
        for state in [m for m in self._batch.members if id(m) not in members]:
            self._batch.leave(state)
        for seq in batch:
            if seq.state not in self._batch:
                self._batch.join(seq.state)
        row_of = {id(m): r for r, m in enumerate(self._batch.members)}
        batch = sorted(batch, key=lambda seq: row_of[id(seq.state)])
        ids = torch.tensor([s.output[-1] for s in batch], dtype=torch.long)
        try:
            logits = self.model.decode_batch(ids, self._batch)
        except Exception:
            for s in batch:
                self._drop(s)
            raise
        elapsed = time.perf_counter() - t0
        events: list[TokenEvent] = []
        for row, seq in enumerate(batch):
            seq.decode_s += elapsed
            depth = seq.state.length
            if depth in seq.order.capture or seq.finishing:
                self._capture(seq, depth, logits[row])
            if seq.finishing:
                self._finish(seq)
                continue
            events.append(self._sample(seq, logits[row : row + 1]))
            if seq.finish_reason is not None and not seq.finishing:
                self._finish(seq)
        return events

    def advance(self, step: StepInput) -> StepOutput:
        """Apply one `StepInput` and run one step (see its docstring); the replica's one
        call per step, so a step costs one round trip to each shard."""
        self._taken = []  # the replica got the last step's output
        refused = self.apply_release(step.release)
        events: list[TokenEvent] = []
        failed: list[tuple[int, str]] = []
        orders, self._waiting = [*self._waiting, *step.start], []
        started = False
        for order in orders:
            if order.hit_len and (self._waiting or self.store.promotions_in_flight()):
                self._waiting.append(order)  # its hit is still copying: decodes go on
                continue
            started = True
            try:
                events += self.start(order)
            except Exception as exc:  # reported: the replica aborts its plan
                failed.append((order.request_id, f"{type(exc).__name__}: {exc}"))
        cancelled = [rid for rid in step.stop if not self.stop(rid) and self.cancel(rid)]
        cancelled += [rid for rid in step.cancel if self.cancel(rid)]
        # a step that started requests runs no long-prompt chunk: their first tokens
        # (and the decodes) go out after their own prefills, not after a chunk too
        events += self.step(prefill_chunk=not started)
        return StepOutput(
            tuple(events),
            tuple(self.take_finished()),
            tuple(failed),
            tuple(cancelled),
            tuple(refused),
        )

    def take_finished(self) -> list[Finished]:
        """Requests finished since the last call, each with its states and KV slots."""
        out, self._finished = self._finished, []
        self._taken = out
        return out

    def cancel(self, request_id: int) -> bool:
        """Stop a running request and free everything it stored; False if not running.
        A request the last step finished counts as running until the next `advance`
        (its `Finished` may have been lost with a step another rank failed)."""
        for seq in (*self._running, *self._prefilling):
            if seq.request_id == request_id:
                self._drop(seq)
                return True
        for order in self._waiting:
            if order.request_id == request_id:
                self._waiting.remove(order)  # it stored nothing yet
                return True
        for done in self._taken:
            if done.request_id == request_id:
                self._taken.remove(done)
                self.release(done.stored())
                return True
        return False

    def stop(self, request_id: int) -> bool:
        """Finish a decoding request early (the client went away or hit a stop string): it
        ends as `stop` and is committed like any other. False if it is not decoding (a
        request still prefilling has no output to keep: `cancel` it and abort its plan)."""
        for seq in self._running:
            if seq.request_id == request_id and seq.finish_reason is None:
                seq.finish_reason = "stop"
                seq.finishing = seq.order.keep_final
                if not seq.finishing:
                    self._finish(seq)
                return True
        return False

    def holdings(self) -> tuple[list[int], Slots]:
        """(state ids, KV slot ids) the store holds on the cache's behalf: everything but
        what running and not-yet-taken finished requests own. Reconciliation with the
        coordinator's tree compares against these."""
        owned = {
            sid for seq in (*self._running, *self._prefilling) for sid in seq.state_ids.values()
        }
        owned.update(sid for done in self._finished for sid in done.state_ids.values())
        pending = [done.kv_slots for done in self._finished]
        slots = self.store.used_slots()
        if pending:
            slots = slots[~np.isin(slots, np.concatenate(pending))]
        return [sid for sid in self.store.state_ids() if sid not in owned], slots

    def host_holdings(self) -> tuple[list[int], Slots]:
        """(state ids, KV slot ids) of `holdings` that the store keeps in host memory
        (requests own only device ids: what they computed): reconciliation compares the
        tree's tiers with these."""
        return self.store.host_state_ids(), self.store.host_slot_ids()

    def release(self, release: Release) -> None:
        """`apply_release`, strict: ValueError naming what the store refused (the valid
        frees happened all the same)."""
        refused = self.apply_release(release)
        if refused:
            raise ValueError("; ".join(refused))

    def apply_release(self, release: Release) -> list[str]:
        """Apply the cache side's tier moves, in order, then free the states and slots it
        no longer references, in whichever tier they are. Returns what the store refused
        (empty when it did it all): the moves as a whole when one is bad (nothing moves,
        see `StateStore.apply_moves`), and the ids to free that it does not hold (or that
        are listed twice). Every valid free happens all the same, so nothing batched with
        a refusal leaks; the caller must reconcile with the cache after one."""
        refused = []
        try:
            self.store.apply_moves(release.moves)
        except ValueError as exc:
            refused.append(str(exc))
        counts = Counter(release.states)
        gone = sorted(s for s, n in counts.items() if n > 1 or not self.store.has_state(s))
        for sid in counts:
            if self.store.has_state(sid):
                self.store.free_state(sid)
        if gone:
            refused.append(f"states {gone[:16]} are not held (freed twice?)")
        slots = np.asarray(release.slots, dtype=np.int64)
        try:  # validated there once: the usual case costs nothing more
            self.store.free_slots(slots)
        except ValueError:
            bad = self.store.slots.not_held(slots)
            refused.append(f"KV slots {bad[:16]} are not held (freed twice?)")
            self.store.free_slots(np.unique(slots[~np.isin(slots, bad)]))
        return refused

    # ------------------------------------------------------------------ stages
    def _load_hit(self, seq: Sequence) -> None:
        t0 = time.perf_counter()
        order = seq.order
        if order.hit_len > 0:
            seq.state = self.store.load(
                order.hit_slots[: order.hit_len], order.hit_state, order.hit_len
            )
        seq.prefilled = order.hit_len
        seq.prefill_s += time.perf_counter() - t0

    def _prefill(self, seq: Sequence, end: int) -> None:
        """Prefill prompt positions [seq.prefilled, end), keeping the ordered checkpoints
        that fall inside."""
        t0 = time.perf_counter()
        start = seq.prefilled
        if start < end:
            ids = torch.as_tensor(seq.order.prompt[start:end], dtype=torch.long)
            depths = [d for d in seq.order.checkpoints if start < d <= end]
            for ckpt in self.model.prefill(ids, seq.state, depths):
                seq.state_ids[ckpt.depth] = self.store.put_state(ckpt)
        seq.prefilled = end
        seq.prefill_s += time.perf_counter() - t0

    def _sample(self, seq: Sequence, logits: torch.Tensor) -> TokenEvent:
        token = self.sampler.sample(logits, [seq.order.params], [seq.generator])
        t = int(self.tp.broadcast(token.to(torch.long))[0])
        if seq.first_token_at is None:
            seq.first_token_at = time.time()
        seq.output.append(t)
        p = seq.order.params
        if t in p.stop_token_ids or (not p.ignore_eos and t in self.model.cfg.eos_token_ids):
            seq.finish_reason = "stop"
        elif len(seq.output) >= seq.order.max_new:
            seq.finish_reason = "length"
        if seq.finish_reason is not None:
            seq.finishing = seq.order.keep_final
        return TokenEvent(seq.request_id, t, seq.finish_reason is not None)

    def _capture(self, seq: Sequence, depth: int, logits: torch.Tensor) -> None:
        if depth in seq.state_ids:
            return
        st = seq.state
        seq.state_ids[depth] = self.store.put_state(
            StateCheckpoint(depth, dict(st.conv), dict(st.ssm), logits)
        )

    def _finish(self, seq: Sequence) -> None:
        """Write the KV the cache may keep into slots and queue the request for commit."""
        self._running.remove(seq)
        if seq.state in self._batch:
            self._batch.leave(seq.state)
        h = seq.order.hit_len
        deepest = max(seq.state_ids, default=h)
        slots = self.store.alloc_slots(max(0, deepest - h))
        self.store.write_kv(slots, seq.state, h)
        now = time.time()
        first = seq.first_token_at or now
        self._finished.append(
            Finished(
                request_id=seq.request_id,
                tokens=tuple(seq.output),
                finish_reason=seq.finish_reason or "length",
                state_ids=dict(seq.state_ids),
                kv_slots=slots,
                timings=Timings(
                    first - seq.started, seq.prefill_s, seq.decode_s, now - seq.started
                ),
            )
        )

    def _drop(self, seq: Sequence) -> None:
        if seq.state in self._batch:
            self._batch.leave(seq.state)
        if seq in self._running:
            self._running.remove(seq)
        if seq in self._prefilling:
            self._prefilling.remove(seq)
        self.release(Release(tuple(seq.state_ids.values()), np.empty(0, dtype=np.int64)))
