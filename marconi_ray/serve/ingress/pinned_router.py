"""`PinnedReplicaRouter`: a Ray Serve request router that sends each `Dispatch` to the
replica the coordinator chose for it (the one holding its cached prefix), and each call
about one replica (`Subscription`, `Submissions`, `Settlements`: the `PINNED` messages)
to that replica.

The replica id travels in the call's first such argument. Calls without one (e.g.
stats) and calls for a replica that is gone are routed to any replica; a replica refuses
a call meant for another one, and the ingress then re-plans.
"""

from __future__ import annotations

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from marconi_ray.serve.messages import PINNED


def target_replica(pending: PendingRequest | None) -> str | None:
    """The replica id a pending request is meant for, if it carries a `PINNED` message."""
    if pending is None:
        return None
    for arg in (*pending.args, *pending.kwargs.values()):
        if isinstance(arg, PINNED):
            return arg.replica_id
    return None


class PinnedReplicaRouter(RequestRouter):
    """Route a dispatch to its planned replica; anything else to every candidate.

    Each answer is final (there is no narrower set to try first), so it asks Serve to back
    off before asking again: a replica at `max_ongoing_requests` then makes its requests
    wait with Serve's backoff instead of re-routing in a busy loop (which held a core of
    the ingress at ~95% under load before)."""

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True
        target = target_replica(pending_request)
        if target is not None:
            pinned = [r for r in candidate_replicas if r.replica_id.unique_id == target]
            if pinned:
                return [pinned]
        return [candidate_replicas]
