"""`replica.outbox.Outbox`: its invariants (see the module docstring), checked directly."""

from __future__ import annotations

import asyncio

from marconi_ray.protocol.orders import TokenEvent
from marconi_ray.protocol.results import Timings, Usage
from marconi_ray.serve.messages import Completed, ReplicaFailed
from marconi_ray.serve.replica.outbox import Outbox


def _done(rid: int) -> Completed:
    return Completed(rid, "length", Usage(3, 2, 0), Timings(0.0, 0.0, 0.0, 0.0))


def test_items_arrive_in_order_with_one_end_and_nothing_after_it() -> None:
    async def main() -> None:
        box = Outbox()
        a, b = box.sink(1, streamed=True), box.sink(2, streamed=True)
        assert box.rids == {1, 2}
        a.put_nowait(TokenEvent(1, 10, False))
        b.put_nowait(TokenEvent(2, 20, False))
        a.put_nowait(TokenEvent(1, 11, True))
        a.put_nowait(_done(1))
        a.put_nowait(TokenEvent(1, 12, False))  # after its end: ignored
        first = await asyncio.wait_for(box.take(), 1)
        assert [e.token for e in first[1][:2]] == [10, 11] and first[1][2] == _done(1)  # type: ignore[union-attr]
        assert len(first[1]) == 3 and [e.token for e in first[2]] == [20]  # type: ignore[union-attr]
        assert box.rids == {2}
        failure = ReplicaFailed("lost a shard")
        b.put_nowait(failure)
        assert await asyncio.wait_for(box.take(), 1) == {2: [failure]} and not box.rids
        b.put_nowait(TokenEvent(2, 21, False))
        assert not box._ready.is_set()  # nothing new: the next take waits

    asyncio.run(main())


def test_a_whole_answer_is_held_until_its_end() -> None:
    async def main() -> None:
        box = Outbox()
        whole = box.sink(5, streamed=False)
        whole.put_nowait(TokenEvent(5, 1, False))
        whole.put_nowait(TokenEvent(5, 2, True))
        assert not box._ready.is_set()  # held: no message for it yet
        whole.put_nowait(_done(5))
        message = await asyncio.wait_for(box.take(), 1)
        assert [type(i).__name__ for i in message[5]] == ["TokenEvent", "TokenEvent", "Completed"]
        assert not box.rids

    asyncio.run(main())


def test_take_with_a_timeout_returns_an_empty_message_when_nothing_came() -> None:
    async def main() -> None:
        box = Outbox()
        assert await box.take(0.01) == {}
        box.sink(3, streamed=True).put_nowait(TokenEvent(3, 9, False))
        message = await box.take(0.01)
        assert [e.token for e in message[3]] == [9]  # type: ignore[union-attr]

    asyncio.run(main())
