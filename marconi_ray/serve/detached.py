"""`detached`: run a coroutine as a task that belongs to no request.

Ray Serve cancels the Ray calls a request made when the request is cancelled (its client
left), and it finds them through the request's context variables, which a task inherits
from the code that creates it. Work shared by several requests (a coalesced
`plan_many`, a replica's step loop and heartbeats) or meant to outlive one (settling or
draining a departed client's dispatch) must therefore start from an empty context, or
one client leaving cancels it for all.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def detached(
    coro: Coroutine[Any, Any, T], keep: set[asyncio.Task[Any]] | None = None
) -> asyncio.Task[T]:
    """`coro` as a task of the running loop in a fresh, empty context; held in `keep`
    until it ends (the loop keeps only weak references to its tasks: without `keep` the
    caller must hold it)."""
    task = asyncio.get_running_loop().create_task(coro, context=contextvars.Context())
    if keep is not None:
        keep.add(task)
        task.add_done_callback(keep.discard)
    return task
