"""`Worker`: the tensor side of serving. Runs prefill orders and batched decode steps on
one model rank, keeps the request's states in the store, and hands finished requests back
for the cache's commit. It makes no caching decision: those come in `PrefillOrder`s and
`Release`s from the cache side (an in-process `Planner` or the coordinator actor).

Under tensor parallelism every rank's worker receives the same calls in the same order;
the model's collectives keep them in lockstep and rank 0's sampled tokens are broadcast.

KV: one pool (the store's device pool) for running and cached tokens. A request's hit is
its first rows, read in place; every token it computes gets a slot as it is computed
(one allocation per prefill chunk, one per decode step for the whole batch); when it
ends, the slots up to its deepest checkpoint go to the cache as they are and the rest
are freed. A decode step is one attention call per attention layer (the decode batch's
row table), one sampling call, one TP broadcast and one device-to-host read of the
tokens.

Constrained decoding (`SamplingParams.grammar`, `engine.constrained`): a constrained
request gets a grammar matcher when it starts; each sampling call masks the constrained
rows' logits with their grammars' masks (one host fill for all of them, one copy to the
device, on rank 0, which samples), and the tokens read back advance every rank's matchers;
a request whose grammar is complete stops (`stop`).

Speculative decoding (`speculative`, `engine.spec`): a step's sequences that have drafts
run their last token and the drafts in one forward that emits the exact state after
every position (`_verify`); the accepted drafts and one more token are kept and the
sequence takes the state at the accepted depth, with the KV rows past it freed. Nothing
is recomputed, and the cache's checkpoints land where they would without speculation.

Log-probabilities (`SamplingParams.logprobs`) come from the same logits in the same step,
read with the tokens in one transfer. Prompt log-probabilities (`prompt_logprobs`, echo)
score every prompt position as it is prefilled (one `lm_head` over the chunk's rows
rather than its last); a cached hit has no logits kept, so its positions are recomputed
by one forward of the hit's tokens: an echo request gains nothing from the cache's KV
(its states and KV are still reused for the tokens it generates).
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import numpy.typing as npt
import torch

from marconi_ray.engine.constrained import GrammarMasks
from marconi_ray.engine.logprobs import read_logprobs
from marconi_ray.engine.model.hybrid_model import HybridModel
from marconi_ray.engine.model.prefill_part import PrefillPart
from marconi_ray.engine.model.seq_state import SeqState, StateCheckpoint
from marconi_ray.engine.model.step_graphs import StepGraphs, captures
from marconi_ray.engine.sampler import Sampler, make_generator
from marconi_ray.engine.sequence import Sequence
from marconi_ray.engine.spec.acceptance import accept_drafts, accept_greedy
from marconi_ray.engine.spec.cost import StepCost
from marconi_ray.engine.spec.drafters import Drafter, make_drafter
from marconi_ray.engine.spec.mtp import MTPDrafter, MTPRequest, trim_pending
from marconi_ray.engine.spec.stats import SpecStats
from marconi_ray.engine.store.slot_table import HOST
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
from marconi_ray.protocol.results import Logprob, Timings
from marconi_ray.protocol.speculative import SpeculativeConfig


class Worker:
    """Model + state store + sampler of one rank; continuous batching over `step`.

    Prefill: the orders a step starts whose uncached parts fit in `max_batch_tokens`
    together are prefilled in one forward (`HybridModel.prefill_many`; as many forwards
    as the budget needs) and their first tokens sampled in one call. Chunked prefill: a
    prompt whose uncached part exceeds `max_batch_tokens` is prefilled
    `max_batch_tokens` tokens per `step` (less the step's decode rows), one long prompt at
    a time, interleaved with the running decodes, so a 16k-token prompt never stalls them
    for its whole prefill. Planned checkpoints land at their exact depths whatever the
    chunking (the model's prefill emits at absolute depths inside each chunk).

    Args:
        max_batch: most sequences decoded together in one step (the rest wait their turn).
        max_batch_tokens: tokens one step processes at most (decode rows + prefill chunk).
        store: the state store to use (default: a new one for `model`); its device pool
            holds the running requests' KV too.
        max_running_tokens: KV rows the running requests may hold together (None: no
            bound, the pool grows as they need). Admission reserves each request's most
            (`rows_needed`) when it starts; an order that does not fit waits in `advance`
            (first come, first served: later orders wait behind it) until running ones
            end, so a burst of long prompts queues instead of running out of memory, and
            a running request never runs short. With the cache's own byte budget that
            bounds the pool: cache rows + max_running_tokens.
        grammars: the matchers and masks of constrained requests (None: a request with a
            grammar fails to start, naming it).
        speculative: speculative decoding (None: off); `drafter` replaces the drafter
            it names (benchmarks' oracle) or is the one a config alone cannot build (a
            draft model, `mtp`: `engine.draft_model.drafter_for`). An `MTPDrafter` turns
            the model's `emit_hidden` on (the decode step's graphs output the hidden
            states too).
    """

    def __init__(
        self,
        model: HybridModel,
        max_batch: int = 8,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        store: StateStore | None = None,
        max_running_tokens: int | None = None,
        cuda_graphs: str = "auto",
        grammars: GrammarMasks | None = None,
        speculative: SpeculativeConfig | None = None,
        drafter: Drafter | MTPDrafter | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
        if max_running_tokens is not None and max_running_tokens < 1:
            raise ValueError(f"max_running_tokens must be None or >= 1, got {max_running_tokens}")
        self.max_running_tokens = max_running_tokens
        self.reserved_rows = 0
        """KV rows reserved by the running requests (the sum of their `reserved`)."""
        self.model = model
        self.store = store or StateStore(model)
        self.tp = model.tp
        self.max_batch = max_batch
        self.max_batch_tokens = max_batch_tokens
        self.sampler = Sampler()
        self.grammars = grammars
        self.speculative = speculative
        self.drafter = drafter
        if speculative is not None and drafter is None:
            self.drafter = make_drafter(speculative)
        model.emit_hidden = isinstance(self.drafter, MTPDrafter)
        self._eos = model.cfg.eos_token_ids
        self.step_cost = StepCost()
        self.one_forward = True
        """Verify a step's drafts in its decode step's forward (`_decode_and_verify`);
        False: two forwards (benchmarks compare them)."""
        self.spec_stats = SpecStats()
        """Speculative decoding totals (the replica's metrics)."""
        self._running: list[Sequence] = []
        self._prefilling: list[Sequence] = []
        self._starting: list[Sequence] = []
        """Admitted (rows reserved) in this `advance`, not yet started."""
        self._waiting: list[PrefillOrder] = []
        """Orders held back by `advance`: a hit's while promotions copy to the device
        (CUDA), any while the KV rows it needs are reserved by running requests; running
        requests keep decoding meanwhile, and they start in order once they can."""
        self._finished: list[Finished] = []
        self._taken: list[Finished] = []
        """The last `take_finished`'s requests, until the next `advance`: a replica that
        never got them (a peer rank failed the step) `cancel`s them, which frees them."""
        self._batch = model.new_decode_batch(max_batch, self.store.pools)
        self.graphs: StepGraphs | None = None
        """The decode step's CUDA graphs (None: eager steps)."""
        if captures(cuda_graphs, model.device):
            self.graphs = StepGraphs(model, self._batch, capture=True)

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
        need = self.rows_needed(order)
        if not self.fits(need):
            pool = self.store.device_kv
            raise ValueError(
                f"request {order.request_id} needs {need} KV rows, {self.reserved_rows} of "
                f"max_running_tokens={self.max_running_tokens} are reserved "
                f"({pool.capacity - pool.held} of the pool's {pool.capacity} rows free)"
            )
        events, failed = self._start_admitted([self._admit(order)])
        if failed:
            raise failed[0][1]
        return events

    def _admit(self, order: PrefillOrder) -> Sequence:
        """A sequence for `order`, its rows reserved, about to start (`_starting`)."""
        empty = torch.empty(0, dtype=torch.long, device=self.model.device)
        seq = Sequence(
            order,
            SeqState(rows=empty, window_rows=None if self.store.window is None else empty),
            make_generator(order.params.seed, self.model.device),
        )
        seq.reserved = self.rows_needed(order)
        self.reserved_rows += seq.reserved
        self._starting.append(seq)
        return seq

    def _start_admitted(
        self, seqs: list[Sequence]
    ) -> tuple[list[TokenEvent], list[tuple[int, Exception]]]:
        """Start admitted sequences: load their hits; prefill the ones whose uncached
        prompt fits in `max_batch_tokens` several to a forward (as many as fit in it
        together) and sample their first tokens in one call; the longer ones go on
        chunk by chunk, the last forward's spare tokens taking the long prompts' next
        chunks (`_chunks`), then `step`'s. Returns the events and (request id, error) of
        each that failed, everything it stored freed (a failed forward fails its parts)."""
        whole: list[Sequence] = []
        failed: list[tuple[int, Exception]] = []
        for seq in seqs:
            self._starting.remove(seq)
            try:
                self._start_grammar(seq)
                self._load_hit(seq)
            except Exception as exc:
                self._drop(seq)
                failed.append((seq.request_id, exc))
                continue
            if len(seq.order.prompt) - seq.prefilled > self.max_batch_tokens:
                self._prefilling.append(seq)
            else:
                whole.append(seq)
        groups: list[list[Sequence]] = []
        budget = 0
        for seq in whole:
            n = len(seq.order.prompt) - seq.prefilled
            if not groups or budget + n > self.max_batch_tokens:
                groups.append([])
                budget = 0
            groups[-1].append(seq)
            budget += n
        # the last forward's spare tokens go to the long prompts' chunks (a chunk mixes
        # requests: the step then runs no chunk of its own)
        if not groups:
            groups.append([])
        chunks = self._chunks(self.max_batch_tokens - budget)
        ready: list[Sequence] = []
        for g, group in enumerate(groups):
            ends = [len(s.order.prompt) for s in group]
            if g == len(groups) - 1:
                group, ends = group + [s for s, _ in chunks], ends + [e for _, e in chunks]
            if not group:
                continue
            try:
                self._prefill_parts(group, ends)
            except Exception as exc:
                for seq in group:
                    self._drop(seq)
                    failed.append((seq.request_id, exc))
                continue
            for seq, end in zip(group, ends, strict=True):
                if end == len(seq.order.prompt):
                    if seq in self._prefilling:
                        self._prefilling.remove(seq)
                    ready.append(seq)
        if not ready:
            return [], failed
        try:
            return self._first_tokens(ready), failed
        except Exception as exc:
            for seq in ready:
                self._drop(seq)
                failed.append((seq.request_id, exc))
            return [], failed

    def _start_grammar(self, seq: Sequence) -> None:
        """Give a constrained sequence its matcher (ValueError naming what is wrong)."""
        p = seq.order.params
        if p.grammar is None:
            return
        if self.grammars is None:
            raise ValueError(
                f"request {seq.request_id} has a grammar; this worker has no grammar tokenizer"
            )
        seq.matcher = self.grammars.matcher(p.grammar, p.grammar_prefix)

    def rows_needed(self, order: PrefillOrder) -> int:
        """The most KV rows `order` holds while it runs: one per uncached prompt token
        and per token it may generate, plus device copies of its hit's host-tier
        tokens."""
        hit = np.asarray(order.hit_slots[: order.hit_len], dtype=np.int64)
        on_host = int(np.count_nonzero(self.store.slots.tiers_of(hit) == HOST))
        return len(order.prompt) - order.hit_len + order.max_new + on_host

    def fits(self, need: int) -> bool:
        """Whether a request needing `need` rows can start now: within
        `max_running_tokens`, and, in a pool sized once (`DeviceKVPool.sized`), with its
        rows and every running request's rows still to come free in the pool now (rows
        that finished requests handed the cache are free again only once the cache's
        release frees them)."""
        cap = self.max_running_tokens
        if cap is not None and self.reserved_rows + need > cap:
            return False
        pool = self.store.device_kv
        if not pool.sized:
            return True
        live = (*self._running, *self._prefilling, *self._starting)
        to_come = sum(s.reserved - len(s.own) - len(s.staged) for s in live)
        return need + to_come <= pool.capacity - pool.held

    def step(self, prefill_chunk: bool = True) -> list[TokenEvent]:
        """One step: a decode for up to `max_batch` running sequences (oldest first), then
        (unless `prefill_chunk` is False) a prefill chunk of the oldest long prompt with
        the rest of `max_batch_tokens`."""
        batch = self._running[: self.max_batch]
        drafted: list[tuple[Sequence, list[int]]] = []
        t0 = time.perf_counter()
        if self.drafter is not None and batch and self.step_cost.may_draft():
            batch, drafted = self._drafts(batch)
        elif self.model.emit_hidden:
            for seq in batch:
                trim_pending(seq.state)
        if batch and drafted and self.graphs is None and self.one_forward:
            events = self._decode_and_verify(batch, drafted)
        else:
            events = self._decode(batch) if batch else []
            if drafted:
                events += self._verify(drafted)
        if self.drafter is not None:
            self.step_cost.observe(len(events), time.perf_counter() - t0, bool(drafted))
        if self._prefilling and prefill_chunk:
            events += self._prefill_chunk(max(1, self.max_batch_tokens - len(batch)))
        return events

    def _prefill_chunk(self, budget: int) -> list[TokenEvent]:
        """One forward of the long prompts' next chunks, oldest first, `budget` tokens
        in all (several requests when the oldest's rest is shorter); those whose prompt
        is then consumed sample their first tokens."""
        chunks = self._chunks(budget)
        seqs = [seq for seq, _ in chunks]
        try:
            self._prefill_parts(seqs, [end for _, end in chunks])
            done = [seq for seq, end in chunks if end == len(seq.order.prompt)]
            for seq in done:
                self._prefilling.remove(seq)
            return self._first_tokens(done) if done else []
        except Exception:
            for seq in seqs:
                self._drop(seq)
            raise

    def _chunks(self, budget: int) -> list[tuple[Sequence, int]]:
        """(sequence, prompt end) of the long prompts' next chunks, oldest first, within
        `budget` tokens."""
        out: list[tuple[Sequence, int]] = []
        for seq in self._prefilling:
            if budget <= 0:
                break
            end = min(len(seq.order.prompt), seq.prefilled + budget)
            out.append((seq, end))
            budget -= end - seq.prefilled
        return out

    def _first_tokens(self, seqs: list[Sequence]) -> list[TokenEvent]:
        """Sample fully prefilled sequences' first tokens in one call; they join the
        decode batch. With an `MTPDrafter`, the prompt's hidden rows are fed into each
        sequence's MTP layers now (the prefill's share of drafting, as the prompt's own
        KV is), not at its first proposal."""
        logits = [s.state.logits for s in seqs]
        assert all(lg is not None for lg in logits)
        events = self._sample(seqs, torch.stack(logits))  # type: ignore[arg-type]
        for seq in seqs:
            self._running.append(seq)
            if seq.finish_reason is not None and not seq.finishing:
                self._finish(seq)
        if isinstance(self.drafter, MTPDrafter):
            live = [s for s in seqs if s.finish_reason is None]
            self.drafter.feed([self._mtp_request(s, _so_far(s), 0) for s in live])
        return events

    def _mtp_request(self, seq: Sequence, tokens: npt.NDArray[np.int32], k: int) -> MTPRequest:
        """`seq`'s ask of the MTP drafter, `tokens` its sequence so far (its cursor made
        on first use)."""
        assert isinstance(self.drafter, MTPDrafter)
        if seq.draft_cursor is None:
            seq.draft_cursor = self.drafter.cursor()
        return MTPRequest(seq.draft_cursor, seq.state, tokens, k)

    def _decode(self, batch: list[Sequence]) -> list[TokenEvent]:
        """One decode step of `batch` on the persistent `DecodeBatch` (sequences join it
        once, when they start decoding, and leave it when they end)."""
        t0 = time.perf_counter()
        batch, ids = self._decode_rows(batch)
        try:
            self._decode_slots(batch)
            if self.graphs is None:
                logits = self.model.decode_batch(ids, self._batch)
            else:
                logits = self.graphs.decode(ids.to(self.model.device))
        except Exception:
            for s in batch:
                self._drop(s)
            raise
        return self._decoded(batch, logits, time.perf_counter() - t0)

    def _decode_and_verify(
        self, batch: list[Sequence], drafted: list[tuple[Sequence, list[int]]]
    ) -> list[TokenEvent]:
        """`_decode(batch)` and `_verify(drafted)` in one forward
        (`HybridModel.decode_and_prefill`): the step's weights are read once for the
        plain sequences and the verified ones together."""
        t0 = time.perf_counter()
        batch, ids = self._decode_rows(batch)
        parts, mine, slots = self._verify_parts(drafted)
        try:
            self._decode_slots(batch)
            logits, results = self.model.decode_and_prefill(ids, self._batch, parts)
            judged = self._judge(drafted, results)
        except Exception:
            self.store.free_slots(slots)
            for s in [*batch, *(seq for seq, _ in drafted)]:
                self._drop(s)
            raise
        elapsed = time.perf_counter() - t0
        events = self._decoded(batch, logits, elapsed)
        return events + self._verified(drafted, results, mine, judged, elapsed)

    def _decode_rows(self, batch: list[Sequence]) -> tuple[list[Sequence], torch.Tensor]:
        """Make `batch` the decode batch's members (others leave, new ones join); returns
        it in row order and its last tokens' ids."""
        members = {id(s.state) for s in batch}
        for state in [m for m in self._batch.members if id(m) not in members]:
            self._batch.leave(state)
        for seq in batch:
            if seq.state not in self._batch:
                self._batch.join(seq.state)
        row_of = {id(m): r for r, m in enumerate(self._batch.members)}
        batch = sorted(batch, key=lambda seq: row_of[id(seq.state)])
        return batch, torch.tensor([s.output[-1] for s in batch], dtype=torch.long)

    def _decode_slots(self, batch: list[Sequence]) -> None:
        """One new KV slot per member, the decode batch extended with their rows."""
        slots = self.store.alloc_slots(len(batch))
        for seq, slot in zip(batch, slots.tolist(), strict=True):
            seq.own.append(slot)
        rows = torch.as_tensor(self.store.device_rows(slots), device=self.model.device)
        window = None
        if self.store.window is not None:
            new = self._window_rows(batch, [1] * len(batch))
            window = torch.as_tensor(new, device=self.model.device)
        self._batch.extend(rows, window)

    def _decoded(
        self, batch: list[Sequence], logits: torch.Tensor, elapsed: float
    ) -> list[TokenEvent]:
        """After a decode step: capture, finish or sample each member (row order)."""
        sampled: list[int] = []
        for row, seq in enumerate(batch):
            seq.decode_s += elapsed
            depth = seq.state.length
            if depth in seq.order.capture or seq.finishing:
                self._capture(seq, depth, logits[row])
            if seq.finishing:
                self._finish(seq)
            else:
                sampled.append(row)
        if not sampled:
            return []
        picked = [batch[row] for row in sampled]
        rows_of = torch.as_tensor(sampled, device=logits.device)
        events = self._sample(picked, logits if len(sampled) == len(batch) else logits[rows_of])
        for seq in picked:
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
        started = rows_short = False
        admitted: list[Sequence] = []
        for order in orders:
            if order.hit_len and (self._waiting or self.store.promotions_in_flight()):
                self._waiting.append(order)  # its hit is still copying: decodes go on
                continue
            need = self.rows_needed(order)
            cap = self.max_running_tokens
            if cap is not None and need > cap:
                failed.append((order.request_id, f"ValueError: it needs {need} KV rows, "
                               f"more than max_running_tokens={cap}"))  # fmt: skip
                continue
            if rows_short or not self.fits(need):
                rows_short = True  # it waits for rows; later orders wait behind it
                self._waiting.append(order)
                continue
            started = True
            admitted.append(self._admit(order))
        # the admitted prefill several to a forward; a failure is reported: the replica
        # aborts its plan
        new_events, errors = self._start_admitted(admitted)
        events += new_events
        failed += [(rid, f"{type(exc).__name__}: {exc}") for rid, exc in errors]
        cancelled = [rid for rid in step.stop if not self.stop(rid) and self.cancel(rid)]
        cancelled += [rid for rid in step.cancel if self.cancel(rid)]
        # a step that started requests runs no long-prompt chunk of its own (their
        # prefill's spare tokens took one): their first tokens (and the decodes) go out
        # after their own forward, not after a chunk's too
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
                seq.finishing = seq.consumes_last()
                if not seq.finishing:
                    self._finish(seq)
                return True
        return False

    def holdings(self) -> tuple[list[int], Slots]:
        """(state ids, KV slot ids) the store holds on the cache's behalf: everything but
        what running and not-yet-taken finished requests own. Reconciliation with the
        coordinator's tree compares against these."""
        live = (*self._running, *self._prefilling)
        owned = {sid for seq in live for sid in seq.state_ids.values()}
        owned.update(sid for done in self._finished for sid in done.state_ids.values())
        pending = [done.kv_slots for done in self._finished]
        pending += [np.asarray(seq.own, dtype=np.int64) for seq in live]
        pending += [seq.staged for seq in live]
        pending.append(self.store.released_slots())  # let go of, still read: not held
        slots = self.store.used_slots()
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
            # slots first: they are validated there, and staged ones are freed by `_drop`
            # should the state fail
            hit = order.hit_slots[: order.hit_len]
            rows, seq.staged = self.store.hit_rows(hit, order.hit_len)
            seq.reads = self.store.on_device(hit)
            self.store.pin_reads(seq.reads)  # until it ends, whatever the cache frees
            state = self.store.load_state(order.hit_state, order.hit_len)
            state.rows = torch.as_tensor(rows, device=self.model.device)
            if self.store.window is not None:
                window = self._window_hit(seq, state)
                state.window_rows = torch.as_tensor(window, device=self.model.device)
            seq.state = state
            if order.params.prompt_logprobs is not None:
                ids = torch.as_tensor(order.prompt[: order.hit_len], dtype=torch.long)
                self._score_prompt(seq, self.model.forward_logits(ids.to(self.model.device)), 0)
        seq.prefilled = order.hit_len
        seq.prefill_s += time.perf_counter() - t0

    def _window_hit(self, seq: Sequence, state: SeqState) -> npt.NDArray[np.int64]:
        """A hit's window rows (a model with windowed blocks): its checkpoint's window
        (`state.kv`, the last m = min(depth, W) positions) written into new window rows
        the sequence holds, behind `depth - m` positions the window hides (their rows:
        the first of those, never attended); `state.kv` is emptied."""
        window = {i: buf.view() for i, buf in state.kv.items()}
        m = next(iter(window.values()))[0].shape[1]
        rows = self.store.alloc_window(m)
        seq.window.add(rows, state.length - m)
        assert self.store.window_kv is not None
        self.store.window_kv.write(rows, window)
        state.kv = {}
        hidden = np.full(state.length - m, rows[0], dtype=np.int64)
        return np.concatenate([hidden, rows])

    def _grow(self, seq: Sequence, slots: Slots) -> None:
        """Give seq's next len(slots) tokens their rows: their slots' own rows, and with
        windowed blocks new window rows (`_window_rows`)."""
        state = seq.state
        new = torch.as_tensor(self.store.device_rows(slots), device=self.model.device)
        assert state.rows is not None
        if self.store.window is not None:
            window = self._window_rows([seq], [len(slots)])
            assert state.window_rows is not None
            state.window_rows = torch.cat(
                [state.window_rows, torch.as_tensor(window, device=self.model.device)]
            )
        state.rows = torch.cat([state.rows, new])

    def _window_rows(self, seqs: list[Sequence], counts: list[int]) -> npt.NDArray[np.int64]:
        """New window rows for the next counts[s] tokens of each of `seqs` (a
        model with windowed blocks), in order, after freeing the rows their windows have left:
        one free and one allocation for all."""
        window = self.store.window
        assert window is not None
        left = [seq.window.slide(seq.state.length, window) for seq in seqs]
        self.store.free_window(np.concatenate(left))
        rows = self.store.alloc_window(sum(counts))
        at = 0
        for seq, n in zip(seqs, counts, strict=True):
            seq.window.add(rows[at : at + n], seq.state.length)
            at += n
        return rows

    def _window_at(self, seq: Sequence, depth: int) -> npt.NDArray[np.int64] | None:
        """A checkpoint's window rows at `depth` (None for a model without windowed
        blocks)."""
        if self.store.window is None:
            return None
        return seq.window.at(depth, self.store.window)

    def _free_window(self, seq: Sequence) -> None:
        if self.store.window is not None:
            self.store.free_window(seq.window.take_all())

    def _prefill_parts(self, seqs: list[Sequence], ends: list[int]) -> None:
        """Prefill each sequence's prompt positions [seq.prefilled, end) in one forward
        (one slot allocation for all), keeping the ordered checkpoints that fall inside
        and scoring the prompt where asked."""
        t0 = time.perf_counter()
        work = [
            (s, s.prefilled, end) for s, end in zip(seqs, ends, strict=True) if s.prefilled < end
        ]
        if work:
            slots = self.store.alloc_slots(sum(end - start for _, start, end in work))
            parts, at = [], 0
            for seq, start, end in work:
                mine = slots[at : at + end - start]
                at += end - start
                seq.own.extend(mine.tolist())
                self._grow(seq, mine)
                ids = torch.as_tensor(seq.order.prompt[start:end], dtype=torch.long)
                depths = tuple(d for d in seq.order.checkpoints if start < d <= end)
                scored = seq.order.params.prompt_logprobs is not None
                parts.append(PrefillPart(ids, seq.state, depths, scored))
            results = self.model.prefill_many(parts, self.store.pools)
            for (seq, start, _), part, (ckpts, scores) in zip(work, parts, results, strict=True):
                if part.scored:
                    self._score_prompt(seq, scores, start)
                for ckpt in ckpts:
                    window = self._window_at(seq, ckpt.depth)
                    seq.state_ids[ckpt.depth] = self.store.put_state(ckpt, window)
                if self.store.window is not None:  # only the window's rows stay held
                    self.store.free_window(seq.window.slide(seq.state.length, self.store.window))
        elapsed = time.perf_counter() - t0
        for seq, end in zip(seqs, ends, strict=True):
            seq.prefilled = max(seq.prefilled, end)
            seq.prefill_s += elapsed

    def _score_prompt(self, seq: Sequence, logits: torch.Tensor, start: int) -> None:
        """Append the prompt log-probabilities that logits [L, V] of positions
        [start, start + L) give: position p's logits score prompt token p + 1 (the last
        position's score the first generated token instead, in `_sample`)."""
        prompt = seq.order.prompt
        m = min(logits.shape[0], len(prompt) - 1 - start)
        k = seq.order.params.prompt_logprobs
        if m <= 0 or k is None:
            return
        targets = torch.as_tensor(prompt[start + 1 : start + 1 + m], device=logits.device)
        seq.prompt_lps += read_logprobs(logits[:m], targets, [k] * m)

    def _sample(self, seqs: list[Sequence], logits: torch.Tensor) -> list[TokenEvent]:
        """Sample one token for each of `seqs` from logits [len(seqs), V] in one call,
        broadcast them from rank 0 in one collective and read them to the host once
        (with their log-probabilities when a sequence asked for them). Constrained rows
        sample from their grammar's tokens (rank 0 masks them: its tokens are the ones
        broadcast); log-probabilities are of the unmasked logits."""
        raw = logits
        constrained = [i for i, s in enumerate(seqs) if s.matcher is not None]
        if constrained and self.grammars is not None and self.tp.rank == 0:
            logits = logits.clone()
            self.grammars.mask(logits, constrained, [seqs[i].matcher for i in constrained])
        tokens = self.sampler.sample(
            logits, [s.order.params for s in seqs], [s.generator for s in seqs]
        )
        tokens = self.tp.broadcast(tokens.to(torch.long))
        ks = [s.order.params.logprobs for s in seqs]
        scored: list[Logprob | None] = [None] * len(seqs)
        if any(k is not None for k in ks):
            read = read_logprobs(raw, tokens, [k or 0 for k in ks])
            picked = [lp.token for lp in read]
            scored = [lp if k is not None else None for lp, k in zip(read, ks, strict=True)]
        else:
            picked = tokens.tolist()
        now = time.time()
        return [self._take(s, t, lp, now) for s, t, lp in zip(seqs, picked, scored, strict=True)]

    def _take(self, seq: Sequence, t: int, lp: Logprob | None, now: float) -> TokenEvent:
        """Append sampled token `t` to `seq`'s output and decide whether it ends there
        (a stop or end-of-sequence id, its grammar complete, or its length)."""
        prompt_lps: tuple[Logprob | None, ...] = ()
        if seq.first_token_at is None:
            seq.first_token_at = now
            if seq.order.params.prompt_logprobs is not None:
                prompt_lps = (None, *seq.prompt_lps)
                seq.prompt_lps = []
        seq.output.append(t)
        p = seq.order.params
        complete = seq.matcher is not None and GrammarMasks.advance(seq.matcher, t)
        if complete or t in p.stop_token_ids or (not p.ignore_eos and t in self._eos):
            seq.finish_reason = "stop"
        elif len(seq.output) >= seq.order.max_new:
            seq.finish_reason = "length"
        if seq.finish_reason is not None:
            seq.finishing = seq.consumes_last()
        done = seq.finish_reason is not None
        return TokenEvent(seq.request_id, t, done, lp, prompt_lps)

    # ------------------------------------------------------------------ speculation
    def _drafts(
        self, batch: list[Sequence]
    ) -> tuple[list[Sequence], list[tuple[Sequence, list[int]]]]:
        """Split a step's batch: (sequences decoded one token, (sequence, drafts) pairs to
        verify). A sequence drafts when it can take at least one draft and one more token
        within `max_new` and is not backing off (`SpeculativeConfig.backoff`: after a
        verified step that kept none of its drafts); a constrained sequence's drafts are
        cut to what its grammar accepts, and its verified logits masked per position.
        A step drafts at all only while speculation pays on this worker (`StepCost`).
        Adaptive draft length: a sequence drafts one token more than its last
        verification kept (one more after all were kept), up to `num_speculative_tokens`,
        so a rejected draft costs a short verification."""
        assert self.speculative is not None and self.drafter is not None
        plain: list[Sequence] = []
        asks: list[tuple[Sequence, npt.NDArray[np.int32], int]] = []
        for seq in batch:
            room = seq.order.max_new - len(seq.output) - 1
            if seq.finishing or room < 1:
                plain.append(seq)
                trim_pending(seq.state, 0)
                continue
            if seq.spec_wait > 0:
                seq.spec_wait -= 1
                plain.append(seq)
                trim_pending(seq.state)
                continue
            k = min(seq.spec_k or self.speculative.num_speculative_tokens, room)
            asks.append((seq, _so_far(seq), k))
        proposed = self._propose(asks)
        drafted: list[tuple[Sequence, list[int]]] = []
        for (seq, _, k), drafts in zip(asks, proposed, strict=True):
            drafts = drafts[:k]
            if seq.matcher is not None:  # only what the grammar accepts
                drafts = drafts[: GrammarMasks.valid_drafts(seq.matcher, drafts)]
            if drafts:
                drafted.append((seq, drafts))
            else:
                plain.append(seq)
        return plain, drafted

    def _propose(self, asks: list[tuple[Sequence, npt.NDArray[np.int32], int]]) -> list[list[int]]:
        """The drafter's proposals for (sequence, tokens so far, k) asks: one batched
        call for a stateful `MTPDrafter`, one call per sequence for the others."""
        drafter = self.drafter
        if not isinstance(drafter, MTPDrafter):
            assert drafter is not None
            return [drafter.propose(tokens, k) for _, tokens, k in asks]
        return drafter.propose_many([self._mtp_request(seq, t, k) for seq, t, k in asks])

    def _verify(self, drafted: list[tuple[Sequence, list[int]]]) -> list[TokenEvent]:
        """Run each sequence's last token and its drafts (k + 1 positions) in one forward
        for all of them, emitting the exact state and logits after every position; keep
        the accepted drafts and one more token (`spec.acceptance`), rolled back to the
        state after the accepted ones (no recompute), their KV rows kept and the rest
        freed. States at capture depths inside the accepted range are kept as decoding
        would keep them. Rank 0's accepted tokens are broadcast. Log-probabilities come
        from the verified logits (`_verified_logprobs`)."""
        t0 = time.perf_counter()
        parts, mine, slots = self._verify_parts(drafted)
        try:
            results = self.model.prefill_many(parts, self.store.pools)
            judged = self._judge(drafted, results)
        except Exception:
            self.store.free_slots(slots)
            for seq, _ in drafted:
                self._drop(seq)
            raise
        return self._verified(drafted, results, mine, judged, time.perf_counter() - t0)

    def _verify_parts(
        self, drafted: list[tuple[Sequence, list[int]]]
    ) -> tuple[list[PrefillPart], list[np.ndarray], np.ndarray]:
        """The verified sequences out of the decode batch, a KV slot for each of their
        k + 1 positions; returns (their parts, each one's slots, all the slots)."""
        for seq, _ in drafted:
            if seq.state in self._batch:
                self._batch.leave(seq.state)
        slots = self.store.alloc_slots(sum(len(d) + 1 for _, d in drafted))
        parts, mine, at = [], [], 0
        for seq, drafts in drafted:
            ids = [seq.output[-1], *drafts]
            base = seq.state.length
            mine.append(slots[at : at + len(ids)])
            at += len(ids)
            self._grow(seq, mine[-1])
            emit = tuple(range(base + 1, base + len(ids) + 1))
            parts.append(PrefillPart(torch.as_tensor(ids, dtype=torch.long), seq.state, emit))
        return parts, mine, slots

    def _judge(
        self,
        drafted: list[tuple[Sequence, list[int]]],
        results: list[tuple[list[StateCheckpoint], torch.Tensor]],
    ) -> tuple[list[list[int]], list[list[Logprob | None]]]:
        """The verified sequences' emitted tokens (agreed across ranks) and their
        log-probabilities."""
        ckpts = [c for c, _ in results]
        emitted = self._accepted(drafted, ckpts)
        return emitted, self._verified_logprobs(drafted, ckpts, emitted)

    def _verified(
        self,
        drafted: list[tuple[Sequence, list[int]]],
        results: list[tuple[list[StateCheckpoint], torch.Tensor]],
        mine: list[np.ndarray],
        judged: tuple[list[list[int]], list[list[Logprob | None]]],
        elapsed: float,
    ) -> list[TokenEvent]:
        """After a verification: take each sequence's emitted tokens and roll it back to
        the state after them (see `_verify`)."""
        emitted, scored = judged
        now = time.time()
        assert self.speculative is not None
        limit, most = self.speculative.backoff, self.speculative.num_speculative_tokens
        events: list[TokenEvent] = []
        for (seq, drafts), (ckpts, _), rows, out, lps in zip(
            drafted, results, mine, emitted, scored, strict=True
        ):
            base = ckpts[0].depth - 1
            seq.decode_s += elapsed
            seq.spec.record(len(drafts), len(out) - 1)
            self.spec_stats.record(len(drafts), len(out) - 1)
            kept = len(out) - 1
            seq.spec_backoff = 0 if kept else min(max(2, 2 * seq.spec_backoff), limit)
            seq.spec_wait = seq.spec_backoff
            # the next draft: one longer after all were kept, else one past what was
            seq.spec_k = min(most, len(drafts) + 1) if kept == len(drafts) else kept + 1
            taken = 0
            for t, lp in zip(out, lps, strict=True):
                events.append(self._take(seq, t, lp, now))
                taken += 1
                if seq.finish_reason is not None:
                    break
            # consumed: the last token and the drafts before the last one taken
            ckpt = ckpts[taken - 1]
            for c in ckpts[:taken]:
                if c.depth in seq.order.capture and c.depth not in seq.state_ids:
                    window = self._window_at(seq, c.depth)
                    seq.state_ids[c.depth] = self.store.put_state(c, window)
            state = seq.state
            state.conv, state.ssm = dict(ckpt.conv), dict(ckpt.ssm)
            state.length, state.logits = ckpt.depth, ckpt.logits
            assert state.rows is not None
            state.rows = state.rows[: ckpt.depth]
            if state.window_rows is not None:
                state.window_rows = state.window_rows[: ckpt.depth]
            if state.hidden:  # the verified positions' rows: the consumed ones only
                pos, hidden = state.hidden[-1]
                state.hidden[-1] = (pos, hidden[:taken])
            seq.own.extend(rows[:taken].tolist())
            self.store.free_slots(rows[taken:])
            if self.store.window is not None:  # the rejected positions' window rows
                self.store.free_window(seq.window.cut(ckpt.depth))
            assert ckpt.depth == base + taken
            if seq.finish_reason is not None and not seq.finishing:
                self._finish(seq)
        return events

    def _accepted(
        self, drafted: list[tuple[Sequence, list[int]]], ckpts: list[list[StateCheckpoint]]
    ) -> list[list[int]]:
        """Each sequence's emitted tokens (its accepted drafts and one more), decided on
        rank 0 and broadcast in one collective with rank 0's verdict on whether
        speculation pays (`StepCost`), which every rank then adopts."""
        width = max(len(d) for _, d in drafted) + 3
        table = torch.zeros((len(drafted), width), dtype=torch.long)
        table[:, -1] = self.step_cost.verdict()
        greedy = [row for row, (seq, _) in enumerate(drafted) if seq.order.params.greedy]
        masks = self.grammars if self.tp.rank == 0 else None  # rank 0 decides
        best: list[int] = []
        if greedy:  # every greedy sequence's argmax in one read to the host
            stacked = torch.stack([c.logits for row in greedy for c in ckpts[row]])
            at = 0
            for row in greedy:
                seq, drafts = drafted[row]
                if masks is not None and seq.matcher is not None:
                    masks.mask_drafts(stacked[at : at + len(drafts) + 1], seq.matcher, drafts)
                at += len(drafts) + 1
            best = torch.argmax(stacked, dim=-1).tolist()
        at = 0
        for row, ((seq, drafts), cks) in enumerate(zip(drafted, ckpts, strict=True)):
            if seq.order.params.greedy:
                out = accept_greedy(best[at : at + len(cks)], drafts)
                at += len(cks)
            else:
                logits = torch.stack([c.logits for c in cks])
                if masks is not None and seq.matcher is not None:
                    masks.mask_drafts(logits, seq.matcher, drafts)
                out = accept_drafts(logits, drafts, seq.order.params, seq.generator)
            table[row, 0] = len(out)
            table[row, 1 : 1 + len(out)] = torch.as_tensor(out)
        table = self.tp.broadcast(table.to(self.model.device)).cpu()
        assert self.speculative is not None
        self.step_cost.adopt(int(table[0, -1]), self.speculative.backoff)
        return [row[1 : 1 + int(row[0])].tolist() for row in table]

    def _verified_logprobs(
        self,
        drafted: list[tuple[Sequence, list[int]]],
        ckpts: list[list[StateCheckpoint]],
        emitted: list[list[int]],
    ) -> list[list[Logprob | None]]:
        """Per sequence, the log-probabilities of its emitted tokens (None each where it
        asked for none): each token's under the verified logits at its position, as a
        decode step would report it, all sequences' rows read in one transfer."""
        out: list[list[Logprob | None]] = [[None] * len(e) for e in emitted]
        asks = [r for r, (seq, _) in enumerate(drafted) if seq.order.params.logprobs is not None]
        if not asks:
            return out
        rows = [ckpts[r][i].logits for r in asks for i in range(len(emitted[r]))]
        tokens = torch.tensor([t for r in asks for t in emitted[r]], device=rows[0].device)
        ks = [drafted[r][0].order.params.logprobs or 0 for r in asks for _ in emitted[r]]
        read = iter(read_logprobs(torch.stack(rows), tokens, ks))
        for r in asks:
            out[r] = [next(read) for _ in emitted[r]]
        return out

    def _capture(self, seq: Sequence, depth: int, logits: torch.Tensor) -> None:
        if depth in seq.state_ids:
            return
        st = seq.state
        seq.state_ids[depth] = self.store.put_state(
            StateCheckpoint(depth, dict(st.conv), dict(st.ssm), logits),
            self._window_at(seq, depth),
        )

    def _finish(self, seq: Sequence) -> None:
        """Hand the slots the cache may keep (the request's own, up to its deepest
        checkpoint) to its `Finished`, free the rest, and queue it for commit."""
        self._running.remove(seq)
        if seq.state in self._batch:
            self._batch.leave(seq.state)
        h = seq.order.hit_len
        deepest = max(seq.state_ids, default=h)
        own = np.asarray(seq.own, dtype=np.int64)
        assert len(own) == seq.state.length - h, (len(own), seq.state.length, h)
        slots = own[: max(0, deepest - h)]
        self.store.free_slots(np.concatenate([own[len(slots) :], seq.staged]))
        self._end_reads(seq)
        self._free_window(seq)
        seq.own, seq.staged = [], np.empty(0, dtype=np.int64)
        self.reserved_rows -= seq.reserved
        seq.reserved = 0
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
                spec=seq.spec.counts(),
            )
        )

    def _drop(self, seq: Sequence) -> None:
        if seq.state in self._batch:
            self._batch.leave(seq.state)
        if seq in self._running:
            self._running.remove(seq)
        if seq in self._prefilling:
            self._prefilling.remove(seq)
        slots = np.concatenate([np.asarray(seq.own, dtype=np.int64), seq.staged])
        self._free_window(seq)
        seq.own, seq.staged = [], np.empty(0, dtype=np.int64)
        self.reserved_rows -= seq.reserved
        seq.reserved = 0
        self._end_reads(seq)
        self.release(Release(tuple(seq.state_ids.values()), slots))

    def _end_reads(self, seq: Sequence) -> None:
        """The request no longer reads its hit's rows (`StateStore.unpin_reads`)."""
        self.store.unpin_reads(seq.reads)
        seq.reads = np.empty(0, dtype=np.int64)


def _so_far(seq: Sequence) -> npt.NDArray[np.int32]:
    """A sequence's tokens so far: its prompt, then its output."""
    return np.concatenate([seq.order.prompt, np.asarray(seq.output, np.int32)])
