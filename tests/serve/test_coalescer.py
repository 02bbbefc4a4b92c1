"""`Coalescer`: one batch in flight, what arrives meanwhile leaves together next; results
and errors go to their own callers."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from marconi_ray.serve.ingress.coalescer import Coalescer


class _Sender:
    """Records every batch; each batch waits for `gate` (when set) before answering."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate: asyncio.Event | None = None
        self.out = 0
        self.most_out = 0

    async def __call__(self, batch: list[int]) -> list[int | BaseException]:
        self.batches.append(list(batch))
        self.out += 1
        self.most_out = max(self.most_out, self.out)
        try:
            if self.gate is not None:
                await self.gate.wait()
            await asyncio.sleep(0)
        finally:
            self.out -= 1
        return [ValueError(f"bad {x}") if x < 0 else 10 * x for x in batch]


def test_arrivals_during_a_call_leave_together_in_the_next() -> None:
    sender = _Sender()
    co: Coalescer[int, int] = Coalescer(sender)

    async def main() -> list[int | BaseException]:
        sender.gate = asyncio.Event()
        first = asyncio.ensure_future(co.submit(1))
        await asyncio.sleep(0.01)  # the first batch [1] is out, held at the gate
        rest = [asyncio.ensure_future(co.submit(x)) for x in (2, -3, 4)]
        await asyncio.sleep(0.01)
        assert sender.batches == [[1]]  # nothing else left while one is in flight
        sender.gate.set()
        return await asyncio.gather(first, *rest, return_exceptions=True)

    results = asyncio.run(main())
    assert sender.batches == [[1], [2, -3, 4]] and sender.most_out == 1
    assert results[0] == 10 and results[1] == 20 and results[3] == 40
    assert isinstance(results[2], ValueError) and "bad -3" in str(results[2])
    assert (co.calls, co.items) == (2, 4)


def test_max_in_flight_two_and_a_failed_send() -> None:
    sender = _Sender()
    co: Coalescer[int, int] = Coalescer(sender, max_in_flight=2)

    async def main() -> None:
        sender.gate = asyncio.Event()
        a = asyncio.ensure_future(co.submit(1))
        await asyncio.sleep(0.01)
        b = asyncio.ensure_future(co.submit(2))
        await asyncio.sleep(0.01)
        c = [asyncio.ensure_future(co.submit(x)) for x in (3, 5)]
        await asyncio.sleep(0.01)
        assert sender.batches == [[1], [2]] and sender.out == 2
        sender.gate.set()
        assert await asyncio.gather(a, b, *c) == [10, 20, 30, 50]

    asyncio.run(main())
    assert sender.batches[2] == [3, 5] and sender.most_out == 2

    async def broken(batch: list[int]) -> list[int]:
        raise ConnectionError("gone")

    bad: Coalescer[int, int] = Coalescer(broken)

    async def both() -> list[int | BaseException]:
        return await asyncio.gather(bad.submit(1), bad.submit(2), return_exceptions=True)

    assert all(isinstance(r, ConnectionError) for r in asyncio.run(both()))
    with pytest.raises(ValueError, match="max_in_flight must be >= 1, got 0"):
        Coalescer(broken, max_in_flight=0)


def test_a_batch_runs_outside_its_callers_request_context() -> None:
    """Serve finds the Ray calls to cancel with a departed client through the request's
    context variables: the shared call must not see any caller's (over HTTP:
    tests/serve/test_dropped_clients.py)."""
    request: contextvars.ContextVar[str | None] = contextvars.ContextVar("request", default=None)
    seen: list[str | None] = []

    async def send(batch: list[int]) -> list[int]:
        seen.append(request.get())
        await asyncio.sleep(0)
        return batch

    co: Coalescer[int, int] = Coalescer(send)

    async def caller(x: int) -> int:
        request.set(f"client {x}")
        return await co.submit(x)

    async def main() -> list[int]:
        return await asyncio.gather(*(caller(x) for x in range(5)))

    assert asyncio.run(main()) == [0, 1, 2, 3, 4]
    assert seen and all(s is None for s in seen)
