"""What a node-loss run measured (`NodeLossReport`) and how it is computed from the
clients' `Outcome`s and the coordinator's snapshots."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from node_loss_client import Outcome
from node_loss_run import Timeline


@dataclass(frozen=True)
class Window:
    """The requests that ended in one stretch of the run."""

    requests: int
    ok: int
    errors: dict[str, int]  # HTTP status -> count (clean errors)
    broken: int

    @classmethod
    def of(cls, outcomes: list[Outcome]) -> Window:
        errors = Counter(str(o.status) for o in outcomes if o.kind == "error")
        return cls(
            requests=len(outcomes),
            ok=sum(o.kind == "ok" for o in outcomes),
            errors=dict(sorted(errors.items())),
            broken=sum(o.kind == "broken" for o in outcomes),
        )


@dataclass(frozen=True)
class NodeLossReport:
    """One node-loss run.

    Attributes:
        total: every request; during_loss: those in flight at the kill or started before
            the service recovered (`recover_s` after the kill).
        cut_at_kill: requests of the lost node's sessions in flight when it died (they
            completed elsewhere, or count among the errors or broken ones).
        errors_without_retry_after: clean errors that lack a Retry-After header.
        bad_statuses: clean errors with a status other than 503 (or 429), and details.
        broken_details: the first few broken requests' reasons.
        mismatches: ok requests whose tokens differ from an uninterrupted greedy run (the
            in-process engine); checked: how many were compared.
        node_dead_s: seconds from the kill until the GCS declared the node dead.
        recover_s: seconds from the kill until the first request of a session that lived
            on the lost node completed (on the survivor).
        health_s: seconds from the kill until /health reported exactly the survivor.
        survivor_hit_before / survivor_hit_after: token hit rate (cached / prompt tokens,
            client side) of the sessions that lived on the survivor, in the load before
            the kill and after `recover_s`.
        survivor_sessions_cached: of those sessions, how many got cached tokens on their
            first request after recovery (of survivor_sessions).
        server_hit_before / server_hit_after: the survivor's own token hit rate (the
            coordinator's counters) over the same windows; after the loss it also serves
            the lost node's sessions, whose caches died with it.
        moved_sessions: sessions of the lost node that completed a turn after the kill.
        replicas_after: replicas the coordinator holds after the run.
        tuner_runs / tuner_nodes: alpha searches finished, and the distinct nodes their
            grid tasks ran on (labels).
        placement: where each actor ran (labels: head, worker-0, ...).
    """

    config: dict[str, Any]
    total: Window
    during_loss: Window
    cut_at_kill: Window
    errors_without_retry_after: int
    bad_statuses: list[str]
    broken_details: list[str]
    mismatches: int
    checked: int
    node_dead_s: float | None
    recover_s: float | None
    health_s: float | None
    survivor_hit_before: float | None
    survivor_hit_after: float | None
    survivor_sessions: int
    survivor_sessions_cached: int
    server_hit_before: float | None
    server_hit_after: float | None
    moved_sessions: int
    lost_sessions: int
    replicas_after: int
    tuner_runs: int
    tuner_nodes: list[str]
    placement: dict[str, Any]
    wall_s: float
    machine: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def failures(self) -> list[str]:
        """Every expectation of the run that does not hold (empty: all do)."""
        out = []
        if self.total.broken:
            out.append(f"{self.total.broken} broken requests: {self.broken_details}")
        if self.bad_statuses:
            out.append(f"errors other than 503/429: {self.bad_statuses}")
        if self.errors_without_retry_after:
            out.append(f"{self.errors_without_retry_after} errors without Retry-After")
        if self.mismatches:
            out.append(f"{self.mismatches} outputs differ from the uninterrupted run")
        if not self.lost_sessions or self.moved_sessions < self.lost_sessions:
            out.append(f"traffic did not move: {self.moved_sessions}/{self.lost_sessions}")
        if self.survivor_sessions_cached < self.survivor_sessions or not self.survivor_sessions:
            out.append(
                f"survivor sessions with cached tokens after the loss: "
                f"{self.survivor_sessions_cached}/{self.survivor_sessions}"
            )
        before, after = self.survivor_hit_before, self.survivor_hit_after
        if before is None or after is None or after < 0.9 * before:
            out.append(f"survivor hit rate {before} -> {after} (< 90% of before)")
        if self.replicas_after != 1:
            out.append(f"the coordinator holds {self.replicas_after} replicas, not the survivor")
        if len(self.tuner_nodes) < 2:
            out.append(f"tuner grid tasks ran on {self.tuner_nodes} (< 2 nodes)")
        return out


def hit_rate(outcomes: list[Outcome]) -> float | None:
    """Cached / prompt tokens over `outcomes` (None when empty)."""
    prompt = sum(len(o.prompt) for o in outcomes)
    return None if prompt == 0 else sum(o.cached_tokens for o in outcomes) / prompt


def server_hit(before: dict[str, Any], after: dict[str, Any]) -> float | None:
    """A replica's token hit rate between two snapshots of its `CacheStats.to_dict()`."""
    tokens = int(after["input_tokens"]) - int(before["input_tokens"])
    hits = int(after["hit_tokens"]) - int(before["hit_tokens"])
    return None if tokens <= 0 else hits / tokens


def first_after(outcomes: list[Outcome], sids: set[int], t: float) -> dict[int, Outcome]:
    """Each session's first ok request that started after `t`."""
    out: dict[int, Outcome] = {}
    for o in sorted(outcomes, key=lambda o: o.start):
        if o.kind == "ok" and o.sid in sids and o.start > t and o.sid not in out:
            out[o.sid] = o
    return out


def build_report(
    config: dict[str, Any],
    outcomes: list[Outcome],
    timeline: Timeline,
    labels: dict[str, str],
    where: dict[str, Any],
    history: list[dict[str, Any]],
    mismatches: int,
    wall_s: float,
    machine: dict[str, Any],
) -> NodeLossReport:
    """The report of a run from its outcomes and timeline (see `NodeLossReport`)."""
    tl = timeline
    lost = {sid for sid, rid in tl.homes.items() if rid == tl.victim}
    kept = {sid for sid, rid in tl.homes.items() if rid == tl.survivor}
    moved = first_after(outcomes, lost, tl.t_kill)
    t_back = min((o.end for o in moved.values()), default=None)
    ok = [o for o in outcomes if o.kind == "ok"]
    kept_before = [o for o in ok if o.sid in kept and tl.t_warm <= o.start and o.end < tl.t_kill]
    kept_after = [o for o in ok if o.sid in kept and t_back is not None and o.start > t_back]
    spans = [o for o in outcomes if o.end >= tl.t_kill]
    during = [o for o in spans if t_back is None or o.start <= t_back]
    cut = [o for o in spans if o.sid in lost and o.start < tl.t_kill]
    errors = [o for o in outcomes if o.kind == "error"]
    survivor_stats = (tl.stats_warm[tl.survivor], tl.stats_kill[tl.survivor])
    return NodeLossReport(
        config=config,
        total=Window.of(outcomes),
        during_loss=Window.of(during),
        cut_at_kill=Window.of(cut),
        errors_without_retry_after=sum(o.retry_after is None for o in errors),
        bad_statuses=[f"{o.status}: {o.detail}" for o in errors if o.status not in (503, 429)],
        broken_details=[o.detail for o in outcomes if o.kind == "broken"][:10],
        mismatches=mismatches,
        checked=len(ok),
        node_dead_s=tl.node_dead_s,
        recover_s=None if t_back is None else t_back - tl.t_kill,
        health_s=None if tl.health_at is None else tl.health_at - tl.t_kill,
        survivor_hit_before=hit_rate(kept_before),
        survivor_hit_after=hit_rate(kept_after),
        survivor_sessions=len(kept),
        survivor_sessions_cached=sum(
            o.cached_tokens > 0 for o in first_after(outcomes, kept, tl.t_kill).values()
        ),
        server_hit_before=server_hit(*survivor_stats),
        server_hit_after=server_hit(survivor_stats[1], tl.stats_end[tl.survivor]),
        moved_sessions=len(moved),
        lost_sessions=len(lost),
        replicas_after=len(tl.stats_end),
        tuner_runs=len(history),
        tuner_nodes=sorted({labels.get(n, n) for h in history for n in h["nodes"]}),
        placement=where,
        wall_s=wall_s,
        machine=machine,
    )
