"""`PinnedReplicaRouter.choose_replicas`: a dispatch goes to its planned replica, other
calls (and dispatches whose replica is gone) to every candidate, and every answer asks
Serve to back off before routing again (without it a full replica made the ingress's
router thread spin at ~95% CPU). Every Ray service test routes through the real router
inside Serve; here it is called directly with Serve's own `PendingRequest`."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np
from ray.serve._private.common import RequestMetadata
from ray.serve._private.request_router.common import PendingRequest

from marconi_ray.protocol.orders import PrefillOrder
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.ingress.pinned_router import PinnedReplicaRouter, target_replica
from marconi_ray.serve.messages import Dispatch


def _replica(unique_id: str) -> Any:
    """What the router reads of Serve's `RunningReplica`: its id."""
    return SimpleNamespace(replica_id=SimpleNamespace(unique_id=unique_id))


def _pending(*args: Any) -> PendingRequest:
    return PendingRequest(list(args), {}, RequestMetadata("r", "i"), future=None)  # type: ignore[arg-type]


def _dispatch(replica: str) -> Dispatch:
    order = PrefillOrder(1, np.arange(3, 9, dtype=np.int32), SamplingParams(max_tokens=1), 1)
    return Dispatch(replica, order)


def test_dispatches_are_pinned_and_every_answer_backs_off() -> None:
    a, b = _replica("a"), _replica("b")
    choose = PinnedReplicaRouter.choose_replicas

    async def main() -> list[Any]:
        pinned, other, gone = _pending(_dispatch("b")), _pending("stats"), _pending(_dispatch("z"))
        out = [
            await choose(None, [a, b], pinned),  # type: ignore[arg-type]
            await choose(None, [a, b], other),  # type: ignore[arg-type]
            await choose(None, [a, b], gone),  # type: ignore[arg-type]
        ]
        flags = [p.routing_context.should_backoff for p in (pinned, other, gone)]
        return [out, flags]

    out, flags = asyncio.run(main())
    assert out == [[[b]], [[a, b]], [[a, b]]]
    assert flags == [True, True, True]
    assert target_replica(_pending(_dispatch("q"))) == "q" and target_replica(None) is None
