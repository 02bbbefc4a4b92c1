"""The tuner actor: evaluates bootstrap alpha-tuning jobs on Ray CPU workers.

The coordinator hands each finished tuning window (`core.cache.tuner.TuneJob`) to
`TunerActor.tune(replica_id, job)` without waiting. The actor splits the alpha grid into
`settings.workers` interleaved shares (`TuneJob.tasks`), evaluates each share as a Ray
task with one CPU and no GPU, spread across the cluster's nodes
(`placement.TUNER_TASK_OPTIONS`; each task reports the node it ran on), picks the best
alpha (`run_grid`: the same answer as a serial evaluation), records the run, and pushes
the result back with `coordinator.adopt.remote(replica_id, result)` (fire and forget).
The actor itself takes no CPU and is threaded (`max_concurrency`), so `history()` and
`runs()` answer while a search is running.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Final

import ray

from marconi_ray.core.cache.tuner import AlphaTask, TuneJob, TuneResult, run_grid
from marconi_ray.serve.placement import TUNER_TASK_OPTIONS
from marconi_ray.serve.settings import COORDINATOR_NAME, NAMESPACE, TUNER_NAME, TunerSettings

MAX_CONCURRENCY: Final = 4
"""Threads of the actor: concurrent searches plus `history`/`runs` calls."""


@dataclass(frozen=True)
class TuneRecord:
    """One finished search, as `TunerActor.history()` reports it.

    Attributes:
        replica_id: the replica whose cache the window came from.
        start_request: index of the window's first request in that replica's stream.
        window_requests: requests replayed per alpha.
        best_alpha: the winner (ties: the smallest alpha).
        scores: (alpha, objective) for every alpha of the grid, in grid order.
        wall_s: seconds the grid evaluation took, Ray scheduling included.
        workers: Ray tasks the grid was split across.
        pushed: whether the result was sent to the coordinator (False when no
            coordinator actor of that name exists).
        nodes: the Ray node id each grid task ran on, in task order.
    """

    replica_id: str
    start_request: int
    window_requests: int
    best_alpha: float
    scores: tuple[tuple[float, float], ...]
    wall_s: float
    workers: int
    pushed: bool
    nodes: tuple[str, ...] = ()


def _on_node(fn: Callable[[AlphaTask], list[float]], task: AlphaTask) -> tuple[list[float], str]:
    """`fn(task)` and the id of the Ray node it ran on (the body of one grid task)."""
    return fn(task), ray.get_runtime_context().get_node_id()


class TunerActor:
    """Runs alpha grid searches on Ray tasks; see the module docstring.

    Args:
        settings: `workers` is how many Ray tasks one search is split across.
        coordinator_name / namespace: the named actor results are pushed to.
    """

    def __init__(
        self,
        settings: TunerSettings,
        coordinator_name: str = COORDINATOR_NAME,
        namespace: str = NAMESPACE,
    ) -> None:
        if settings.workers < 1:
            raise ValueError(f"tuner workers must be >= 1, got {settings.workers}")
        self.settings = settings
        self.coordinator_name = coordinator_name
        self.namespace = namespace
        self._records: list[TuneRecord] = []
        self._lock = threading.Lock()
        self._remote: Any = ray.remote(**TUNER_TASK_OPTIONS)(_on_node)

    def _ray_map(
        self,
        fn: Callable[[AlphaTask], list[float]],
        tasks: Iterable[AlphaTask],
        nodes: list[str],
    ) -> list[list[float]]:
        """`map(fn, tasks)` with each call a Ray task (`TUNER_TASK_OPTIONS`), results in
        task order; the node id of each task is appended to `nodes`."""
        refs = [self._remote.remote(fn, task) for task in tasks]
        results: list[tuple[list[float], str]] = ray.get(refs)
        nodes.extend(node for _, node in results)
        return [scores for scores, _ in results]

    def tune(self, replica_id: str, job: TuneJob) -> TuneResult:
        """Evaluate `job`'s grid on `settings.workers` Ray tasks, record the run, push the
        result to the coordinator (not waiting for it) and return it.

        Raises:
            ValueError: naming `replica_id` when it is empty or `job` when it is not a
                `TuneJob`. A failing evaluation task raises its error here.
        """
        if not isinstance(replica_id, str) or not replica_id:
            raise ValueError(f"replica_id must be a non-empty string, got {replica_id!r}")
        if not isinstance(job, TuneJob):
            raise ValueError(f"job must be a TuneJob, got {type(job).__name__}")
        workers = len(job.tasks(self.settings.workers))
        nodes: list[str] = []
        map_fn = functools.partial(self._ray_map, nodes=nodes)
        result = run_grid(job, map_fn=map_fn, n_tasks=self.settings.workers)
        pushed = self._push(replica_id, result)
        record = TuneRecord(
            replica_id=replica_id,
            start_request=result.start_request,
            window_requests=result.window_requests,
            best_alpha=result.best_alpha,
            scores=result.scores,
            wall_s=result.wall_s,
            workers=workers,
            pushed=pushed,
            nodes=tuple(nodes),
        )
        with self._lock:
            self._records.append(record)
        return result

    def _push(self, replica_id: str, result: TuneResult) -> bool:
        try:
            coordinator = ray.get_actor(self.coordinator_name, namespace=self.namespace)
        except ValueError:  # no such actor (yet, or any more)
            return False
        coordinator.adopt.remote(replica_id, result)
        return True

    def history(self) -> list[dict[str, Any]]:
        """Every finished search, oldest first, as plain dicts (`TuneRecord` fields;
        `scores` as a list of [alpha, score] pairs, `nodes` as a list)."""
        with self._lock:
            records = list(self._records)
        out = []
        for record in records:
            row = asdict(record)
            row["scores"] = [list(pair) for pair in record.scores]
            row["nodes"] = list(record.nodes)
            out.append(row)
        return out

    def runs(self) -> int:
        """How many searches have finished."""
        with self._lock:
            return len(self._records)


def start_tuner(
    settings: TunerSettings,
    coordinator_name: str = COORDINATOR_NAME,
    *,
    name: str = TUNER_NAME,
    namespace: str = NAMESPACE,
    detached: bool = True,
    resources: Mapping[str, float] | None = None,
) -> Any:
    """The named tuner actor (created, or the existing one: `get_if_exists`).

    It takes no CPU itself (its Ray tasks take one each) and, like the coordinator, is
    detached by default so the Serve application outlives the driver that deployed it;
    `stop_tuner` removes it. `resources` pins it (see `placement.control_resources`).
    Ray restarts it when its process or node dies (`max_restarts=-1`) and retries the
    searches in flight then (`max_task_retries=-1`); a job lost anyway is sent again by
    the coordinator (`CacheCoordinator.resend_jobs`). Requires a connected Ray.
    """
    options: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "num_cpus": 0,
        "max_concurrency": MAX_CONCURRENCY,
        "get_if_exists": True,
        "max_restarts": -1,
        "max_task_retries": -1,
    }
    if resources:
        options["resources"] = dict(resources)
    if detached:
        options["lifetime"] = "detached"
    return ray.remote(TunerActor).options(**options).remote(settings, coordinator_name, namespace)


def stop_tuner(name: str = TUNER_NAME, namespace: str = NAMESPACE) -> bool:
    """Kill the named tuner actor; False when there is none."""
    try:
        handle = ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    ray.kill(handle)
    return True
