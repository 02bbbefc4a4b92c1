"""`HandoffStream`: one request's events across a prefill/decode hand-off
(`Dispatch.handoff`, `serve.disagg`).

The prefill replica runs the prompt from its own hit and emits the first token (its
dispatch is planned for one), so time to first token is the prefill replica's. Its
commit (relayed before its end reaches here) admits the state after that first token.
Then:
1. the coordinator pins that entry (prompt + first token) on the prefill replica and
   reserves room on the decode replica (`begin_move`), and the decode replica pulls it
   (`Mover.move`: over GLOO / NCCL / NIXL, or the object store);
2. the rest is planned on the decode replica as a continuation (the prompt plus the
   first token, `max_tokens - 1` more: `continuation_params`), which hits the moved
   entry in full and decodes from its stored logits, no prefill at all.
A move that fails (a source or receiver lost, a corrupt payload) leaves the decode
replica to recompute: the output is the same. Faults within each half are the
`GuardedStream`'s: a re-plan goes wherever the coordinator routes it.

The caller sees one stream: every token in order, then one `Completed` whose usage
counts the original prompt and the prefill side's cached tokens. A first token that
ends the request (a stop token, or `max_tokens` 1) ends it there.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from marconi_ray.protocol.orders import TokenEvent
from marconi_ray.protocol.results import Usage
from marconi_ray.serve.messages import Completed, Dispatch

log = logging.getLogger(__name__)


class HandoffStream:
    """The events of a P/D dispatch and of its continuation (module docstring).

    Args:
        backend: the `RayBackend` (its coordinator, mover, `continue_on` and streams).
        dispatch: the prefill replica's dispatch (its `handoff` set).
        streamed: whether the client streams.
    """

    def __init__(self, backend: Any, dispatch: Dispatch, streamed: bool) -> None:
        assert dispatch.handoff is not None
        self._backend = backend
        self._first = dispatch
        self._streamed = streamed
        self._inner: Any = backend.guarded(dispatch, streamed)
        """The current half's `GuardedStream`."""
        self._decoding = False
        self._emitted: list[int] = []
        self._cancelled = False
        self.moved_tokens = 0
        """Tokens of the entry the decode replica received (0: it recomputed)."""

    def __aiter__(self) -> HandoffStream:
        return self

    async def __anext__(self) -> TokenEvent | Completed:
        while True:
            item = await self._inner.__anext__()
            if isinstance(item, TokenEvent):
                self._emitted.append(item.token)
                return item
            handoff = self._first.handoff
            assert handoff is not None
            left = handoff.max_tokens - len(self._emitted)
            if self._decoding or self._cancelled or item.finish_reason != "length" or left <= 0:
                return self._completed(item)
            await self._hand_off(left)

    async def _hand_off(self, left: int) -> None:
        """Move the entry after the first token to the decode replica and continue the
        request there."""
        order, handoff = self._first.order, self._first.handoff
        assert handoff is not None
        tokens = np.concatenate([order.prompt, np.asarray(self._emitted, dtype=np.int32)])
        backend = self._backend
        coordinator = backend.coordinator_of(self._first)
        try:
            ticket = await coordinator.begin_move.remote(
                self._first.replica_id, handoff.replica_id, tokens, "pd"
            )
        except Exception as exc:  # the coordinator is restarting: the decode side recomputes
            log.warning("request %d: no hand-off move (%s)", order.request_id, exc)
            ticket = None
        if ticket is not None:
            result = await backend.mover.move(ticket)
            self.moved_tokens = ticket.depth if result.ok else 0
        dispatch = await backend.continue_on(
            handoff.replica_id, tokens, order.params, self._emitted, left, order.submitted
        )
        self._inner = backend.guarded(dispatch, self._streamed)
        self._decoding = True

    def _completed(self, item: Completed) -> Completed:
        order = self._first.order
        usage = Usage(len(order.prompt), len(self._emitted), order.hit_len)
        return Completed(order.request_id, item.finish_reason, usage, item.timings, spec=item.spec)

    def ready(self) -> bool:
        """Whether the next event is here already. Never before the hand-off: the
        prefill half's end starts the move, and the first token must not wait for it
        (a reader that sees more waiting keeps reading before it sends what it has)."""
        return self._decoding and bool(self._inner.ready())

    def cancel(self) -> None:
        self._cancelled = True
        self._inner.cancel()
