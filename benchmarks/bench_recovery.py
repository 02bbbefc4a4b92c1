"""Recovery time of the coordinator, from its kill to the first served cache hit, with a
large journalled tree (issue closing report: "Recovery time of the coordinator (kill to
first served hit) with 10k nodes journalled").

Real Ray (a fresh `address="local"` instance) and a real `redis-server` (a private one on
a free loopback port, password, no persistence files; or --redis-url). The coordinator is
the service's own actor (`serve.app.start_coordinator`: named, detached,
`max_restarts=-1`, journal in Redis); no model replica runs: one synthetic replica
`bench-0` plays the replica's side of the protocol with bookkeeping only (a counter hands
out state ids and KV slot ids; it tracks what its "store" holds, minus what every
`Release` frees, so its `reconcile` reports the truth).

1. Build: multi-turn sessions (ShareGPT-like lognormal lengths, random tokens, each
   session opening with one of a few shared system prompts so the tree branches) are
   planned and committed on the coordinator (pipelined in batches of sessions, one turn
   at a time) until the tree holds --nodes nodes (`check_invariants()`). The cache is
   large enough that nothing is evicted; alpha is fixed (no tuner actor).
2. For each variant, --repeats times:
   - `records`: recovery replays every journalled record (no snapshot: snapshot_every is
     larger than the run);
   - `snapshot`: `snapshot()` just before the kill, so recovery decodes one snapshot.
   `ray.kill(coordinator, no_restart=False)`, then, timed from the kill: heartbeat until
   the restarted coordinator answers `reconcile` (an answer `ok` comes from the old
   instance, still dying), `reconcile` with the replica's holdings, then `plan` the next
   turn of a finished session and check its hit (`order.hit_len > 0`): that is the first
   served hit. The probe turn is then committed like any other, so every repeat has one
   more node. All `records` repeats run first (a snapshot drops the records).
   A restart whose recovery failed (the new instance answers `register`: it started
   empty, e.g. Redis timed out reading the journal) is recorded with the coordinator's
   error and the coordinator is killed again (--max-failures).

Reported per variant (median over the repeats, every repeat in the JSON): kill -> first
served hit; its phases (kill -> heartbeat answered, of which the replay the coordinator
measured itself in `journal_status()["recovery"]["seconds"]`; reconcile; the plan);
records replayed, nodes restored, Redis `used_memory` at the kill, the stream's length and
the snapshot's size.

Writes OUT/bench_recovery.json and OUT/bench_recovery.md; prints the table.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from redis_process import RedisProcess
from tqdm import tqdm

from marconi_ray.protocol.orders import Finished, Release
from marconi_ray.protocol.release_log import ReleaseCursor, Releases
from marconi_ray.protocol.results import Timings
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.messages import Dispatch
from marconi_ray.serve.settings import NAMESPACE, ServeSettings

REPLICA = "bench-0"
VARIANTS = ("records", "snapshot")
NO_TIMINGS = Timings(0.0, 0.0, 0.0, 0.0)
FIRST_TOKEN = 7  # below: special tokens of the tiny model's vocabulary


# ---------------------------------------------------------------------- redis
@contextlib.contextmanager
def redis_url(args: argparse.Namespace, workdir: Path) -> Iterator[str]:
    """--redis-url, or a private redis-server for the run."""
    if args.redis_url:
        yield args.redis_url
        return
    server = RedisProcess(workdir).start()
    try:
        yield server.url
    finally:
        server.stop()


def redis_figures(client: Any, settings: ServeSettings) -> dict[str, int]:
    """Redis memory and the journal's keys as they are now."""
    prefix = settings.journal_prefix
    return {
        "redis_used_memory": int(client.info("memory")["used_memory"]),
        "stream_records": int(client.xlen(f"{prefix}:journal")),
        "snapshot_bytes": int(client.strlen(f"{prefix}:snapshot")),
    }


# ---------------------------------------------------------------------- workload
@dataclass
class Session:
    """One conversation: its system prompt, then (user message, reply length) per turn;
    `history` is every token so far (prompt + reply of the turns served)."""

    system: int
    turns: list[tuple[np.ndarray, int]]
    history: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    served: int = 0


def lognormal_len(rng: np.random.Generator, mean: float, low: int, high: int) -> int:
    """A ShareGPT-like length: lognormal (sigma 0.8) with this mean, clipped."""
    sigma = 0.8
    mu = np.log(mean) - sigma**2 / 2
    return int(np.clip(round(rng.lognormal(mu, sigma)), low, high))


class Workload:
    """Endless sessions of --turns turns opening with one of --system-prompts prefixes."""

    def __init__(self, args: argparse.Namespace, vocab: int, max_position: int) -> None:
        self.rng = np.random.default_rng(args.seed)
        self.args = args
        self.vocab = vocab
        self.limit = max_position - 8
        self.systems = [
            self.tokens(lognormal_len(self.rng, args.system_tokens, 16, 4 * args.system_tokens))
            for _ in range(args.system_prompts)
        ]

    def tokens(self, n: int) -> np.ndarray:
        return self.rng.integers(FIRST_TOKEN, self.vocab, n).astype(np.int32)

    def session(self) -> Session:
        a = self.args
        sys_id = int(self.rng.integers(len(self.systems)))
        total = len(self.systems[sys_id])
        turns: list[tuple[np.ndarray, int]] = []
        for _ in range(int(self.rng.integers(a.min_turns, a.max_turns + 1))):
            user = self.tokens(lognormal_len(self.rng, a.user_tokens, 4, 4 * a.user_tokens))
            reply = lognormal_len(self.rng, a.output_tokens, 2, 4 * a.output_tokens)
            if total + len(user) + reply > self.limit:
                break
            total += len(user) + reply
            turns.append((user, reply))
        return Session(sys_id, turns, self.systems[sys_id].copy())

    def extra_turn(self, session: Session) -> tuple[np.ndarray, int]:
        """One more turn for a finished session (the recovery probe)."""
        return self.tokens(self.args.user_tokens), max(2, self.args.output_tokens // 4)


# ---------------------------------------------------------------------- replica
class SyntheticReplica:
    """The replica side of the protocol, without tensors: unique state ids and KV slot
    ids from counters, and what its store holds (what it stored minus what was freed)."""

    def __init__(self, rng: np.random.Generator, vocab: int) -> None:
        self.rng = rng
        self.vocab = vocab
        self.next_state = 1
        self.next_slot = 0
        self.states: set[int] = set()
        self.slots: set[int] = set()
        self.freed_states = 0
        self.freed_slots = 0
        self.cursor = ReleaseCursor(0)
        """How far into its release log it applied (following the generation answers carry)."""

    def take(self, releases: Releases) -> None:
        """Apply a coordinator answer as a replica does: each log entry once, in order."""
        if releases.generation and releases.generation != self.cursor.generation:
            self.cursor.reset(releases.generation)
        self.release(self.cursor.take(releases))

    def release(self, release: Release) -> None:
        for sid in release.states:
            if sid in self.states:
                self.states.discard(sid)
                self.freed_states += 1
        for slot in np.asarray(release.slots, dtype=np.int64).tolist():
            if slot in self.slots:
                self.slots.discard(slot)
                self.freed_slots += 1

    def run(self, dispatch: Dispatch, reply: int) -> Finished:
        """What a worker would report after running `dispatch` and decoding `reply`
        tokens: a state at every prefill checkpoint, at every capture depth decoding
        reached, and after the whole sequence (`keep_final`, else after its last
        sampled token); KV slots for [hit_len, deepest state)."""
        self.take(dispatch.releases)
        order = dispatch.order
        n = len(order.prompt)
        out = min(reply, order.max_new)
        tokens = self.rng.integers(FIRST_TOKEN, self.vocab, out).astype(np.int32)
        n_total = n + out
        depths = set(order.checkpoints)
        depths.update(d for d in order.capture if n < d <= n_total)
        depths.add(n_total if order.keep_final else n_total - 1)
        state_ids = {}
        for depth in sorted(depths):
            state_ids[depth] = self.next_state
            self.states.add(self.next_state)
            self.next_state += 1
        deepest = max(state_ids, default=order.hit_len)
        count = max(0, deepest - order.hit_len)
        slots = np.arange(self.next_slot, self.next_slot + count, dtype=np.int64)
        self.next_slot += count
        self.slots.update(slots.tolist())
        return Finished(
            request_id=order.request_id,
            tokens=tuple(int(t) for t in tokens),
            finish_reason="length",
            state_ids=state_ids,
            kv_slots=slots,
            timings=NO_TIMINGS,
        )

    def holdings(self) -> tuple[list[int], np.ndarray]:
        return sorted(self.states), np.fromiter(sorted(self.slots), np.int64, len(self.slots))


# ---------------------------------------------------------------------- build
def params(reply: int) -> SamplingParams:
    return SamplingParams(max_tokens=reply, temperature=0.0, ignore_eos=True)


def serve_turns(
    coord: Any,
    replica: SyntheticReplica,
    batch: list[tuple[Session, np.ndarray, int]],
) -> list[Dispatch]:
    """Plan every (session, user message, reply length) of `batch` (pipelined), then
    commit them all; each session's history grows by its prompt's tail and reply."""
    import ray

    prompts = [np.concatenate([s.history, user]) for s, user, _ in batch]
    dispatches: list[Dispatch] = ray.get(
        [
            coord.plan.remote(p, params(reply), time.time())
            for p, (_, _, reply) in zip(prompts, batch, strict=True)
        ]
    )
    finished = [replica.run(d, reply) for d, (_, _, reply) in zip(dispatches, batch, strict=True)]
    applied = replica.cursor.applied
    answers = ray.get(
        [
            coord.commit.remote(d.replica_id, f, applied)
            for d, f in zip(dispatches, finished, strict=True)
        ]
    )
    for answer in answers:
        replica.take(answer)
    for (session, _, _), prompt, done in zip(batch, prompts, finished, strict=True):
        session.history = np.concatenate([prompt, np.asarray(done.tokens, np.int32)])
        session.served += 1
    return dispatches


def build_tree(
    args: argparse.Namespace, coord: Any, replica: SyntheticReplica, work: Workload
) -> tuple[list[Session], dict[str, Any]]:
    """Serve sessions until the tree holds `args.nodes` nodes; the finished sessions."""
    import ray

    done: list[Session] = []
    turns = 0
    hits = 0
    t0 = time.perf_counter()
    nodes = 0
    with tqdm(
        total=args.nodes, desc="building tree", unit="node", disable=args.no_progress or None
    ) as bar:
        while nodes < args.nodes:
            if len(done) >= args.max_sessions:
                raise SystemExit(
                    f"--max-sessions {args.max_sessions} reached with only {nodes} nodes"
                )
            sessions = [work.session() for _ in range(args.batch)]
            sessions = [s for s in sessions if s.turns]
            if not sessions:
                continue
            for t in range(max(len(s.turns) for s in sessions)):
                batch = [(s, *s.turns[t]) for s in sessions if t < len(s.turns)]
                dispatches = serve_turns(coord, replica, batch)
                turns += len(batch)
                hits += sum(d.order.hit_len > 0 for d in dispatches)
            done.extend(sessions)
            ray.get(coord.heartbeat.remote(REPLICA, []))
            nodes = int(ray.get(coord.check_invariants.remote()))
            bar.update(min(nodes, args.nodes) - bar.n)
            bar.set_postfix(sessions=len(done), turns=turns)
    return done, {
        "sessions": len(done),
        "turns": turns,
        "turns_with_hit": hits,
        "nodes": nodes,
        "seconds": time.perf_counter() - t0,
        "held_states": len(replica.states),
        "held_slots": len(replica.slots),
    }


# ---------------------------------------------------------------------- measure
def wait_restarted(
    args: argparse.Namespace, coord: Any, t_kill: float, counts: dict[str, int]
) -> str:
    """Heartbeat until a new coordinator instance answers: its status ("reconcile" for a
    restored replica, "register" when it started without it). An "ok" comes from the
    old instance, not dead yet."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    deadline = t_kill + args.timeout
    while True:
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            raise SystemExit(f"the coordinator did not come back in {args.timeout} s")
        try:
            status, _gen = ray.get(coord.heartbeat.remote(REPLICA, []), timeout=remaining)
        except (RayActorError, GetTimeoutError):
            counts["failed"] += 1
            time.sleep(0.01)
            continue
        if status != "ok":
            return str(status)
        counts["old"] += 1
        time.sleep(0.005)


def recover_once(
    args: argparse.Namespace,
    coord: Any,
    replica: SyntheticReplica,
    probe: Session,
    work: Workload,
    settings: ServeSettings,
    client: Any,
    variant: str,
) -> dict[str, Any]:
    """Kill the coordinator and time kill -> first served hit (see the module doc)."""
    import ray

    row: dict[str, Any] = {"variant": variant}
    if variant == "snapshot":
        t = time.perf_counter()
        assert ray.get(coord.snapshot.remote()), "the store refused the snapshot"
        row["snapshot_write_s"] = time.perf_counter() - t
    row["nodes_before"] = int(ray.get(coord.check_invariants.remote()))
    row.update(redis_figures(client, settings))
    user, reply = work.extra_turn(probe)
    prompt = np.concatenate([probe.history, user])
    expected = len(probe.history)  # its last turn's final state
    counts = {"failed": 0, "old": 0}

    failed: list[dict[str, Any]] = []
    while True:  # until a restart restores the tree (a failed one is killed again)
        t_kill = time.perf_counter()
        ray.kill(coord, no_restart=False)
        status = wait_restarted(args, coord, t_kill, counts)
        if status == "reconcile":
            break
        # "register": the new instance does not know the replica, i.e. its recovery
        # failed and it started empty (nothing was journalled since: the records stay)
        recovery = ray.get(coord.journal_status.remote())["recovery"]
        failed.append({"after_s": time.perf_counter() - t_kill, "recovery": recovery})
        print(
            f"[bench_recovery] {variant}: the restarted coordinator started EMPTY "
            f"({recovery.get('error')}); killing it again",
            file=sys.stderr,
        )
        if len(failed) >= args.max_failures:
            raise SystemExit(f"{len(failed)} failed recoveries in a row: {failed}")
    t_alive = time.perf_counter()
    held_states, held_slots = replica.holdings()
    _gen, answer = ray.get(
        coord.reconcile.remote(REPLICA, held_states, held_slots, applied=replica.cursor.applied)
    )
    release = answer.direct
    t_reconciled = time.perf_counter()
    dispatch: Dispatch = ray.get(coord.plan.remote(prompt, params(reply), time.time()))
    t_hit = time.perf_counter()
    hit = dispatch.order.hit_len
    assert hit > 0, f"no hit after recovery (prompt of {len(prompt)} tokens)"
    # serve the probe turn to the end, like any other turn
    finished = replica.run(dispatch, reply)
    replica.take(answer)
    replica.take(
        ray.get(coord.commit.remote(dispatch.replica_id, finished, replica.cursor.applied))
    )
    probe.history = np.concatenate([prompt, np.asarray(finished.tokens, np.int32)])
    recovery = ray.get(coord.journal_status.remote())["recovery"]
    assert recovery["ok"], f"recovery failed: {recovery}"
    row.update(
        kill_to_hit_s=t_hit - t_kill,
        kill_to_alive_s=t_alive - t_kill,
        replay_s=float(recovery["seconds"]),
        restart_overhead_s=(t_alive - t_kill) - float(recovery["seconds"]),
        reconcile_s=t_reconciled - t_alive,
        plan_s=t_hit - t_reconciled,
        records_replayed=int(recovery["records"]),
        from_snapshot=bool(recovery["snapshot"]),
        nodes_restored=int(recovery["nodes"]),
        open_plans_restored=int(recovery["open_plans"]),
        reconcile_freed_states=len(release.states),
        reconcile_freed_slots=len(release.slots),
        probe_prompt_tokens=len(prompt),
        probe_hit_len=int(hit),
        probe_expected_hit=expected,
        heartbeats_failed=counts["failed"],
        heartbeats_from_old_instance=counts["old"],
        failed_recoveries=len(failed),
        failed_recovery_details=failed,
    )
    return row


MEDIAN_KEYS = (
    "kill_to_hit_s",
    "kill_to_alive_s",
    "replay_s",
    "restart_overhead_s",
    "reconcile_s",
    "plan_s",
    "records_replayed",
    "nodes_restored",
    "redis_used_memory",
    "stream_records",
    "snapshot_bytes",
)


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"repeats": len(rows)}
    for key in MEDIAN_KEYS:
        values = [r[key] for r in rows]
        out[key] = statistics.median(values)
        if key.endswith("_s"):
            out[f"{key}_min"], out[f"{key}_max"] = min(values), max(values)
    out["failed_recoveries"] = sum(r["failed_recoveries"] for r in rows)
    if rows and "snapshot_write_s" in rows[0]:
        out["snapshot_write_s"] = statistics.median(r["snapshot_write_s"] for r in rows)
    return out


def markdown(summary: dict[str, dict[str, Any]]) -> str:
    mib = 1 << 20
    lines = [
        "| variant | kill -> first hit (s) | min-max | kill -> heartbeat (s) | replay (s, "
        "coordinator) | restart overhead (s) | reconcile (s) | plan (s) | records replayed "
        "| nodes restored | Redis used_memory (MiB) | stream records | snapshot (MiB) "
        "| failed restarts |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for variant, s in summary.items():
        lines.append(
            f"| {variant} | {s['kill_to_hit_s']:.2f} | {s['kill_to_hit_s_min']:.2f}-"
            f"{s['kill_to_hit_s_max']:.2f} | {s['kill_to_alive_s']:.2f} | {s['replay_s']:.2f} "
            f"| {s['restart_overhead_s']:.2f} | {s['reconcile_s']:.3f} | {s['plan_s']:.3f} | "
            f"{s['records_replayed']:,} | {s['nodes_restored']:,} | "
            f"{s['redis_used_memory'] / mib:.1f} | {s['stream_records']:,} | "
            f"{s['snapshot_bytes'] / mib:.2f} | {s['failed_recoveries']} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------- driver
def settings_for(args: argparse.Namespace, model_dir: Path, url: str) -> ServeSettings:
    return ServeSettings(
        model_dir=str(model_dir),
        model_name="tiny",
        cache_bytes=args.cache_bytes,
        alpha=1.0,  # fixed: no bootstrap tuner, no tuner actor
        redis_url=url,
        lease_s=args.lease_s,
        snapshot_every=args.snapshot_every,
        app_name=args.app_name,
    )


def start_ray(args: argparse.Namespace) -> None:
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(
        address="local",
        num_cpus=args.ray_cpus,
        object_store_memory=args.object_store_mb << 20,
        include_dashboard=False,
        namespace=NAMESPACE,
        log_to_driver=False,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    a = p.add_argument
    a("--out", default="benchmarks/results/recovery", help="output folder [%(default)s]")
    a("--nodes", type=int, default=10_000, help="tree nodes to build before the kills [10000]")
    a(
        "--max-sessions",
        type=int,
        default=50_000,
        help="give up when this many sessions did not reach --nodes [%(default)s]",
    )
    a("--repeats", type=int, default=3, help="kills per variant (median reported) [3]")
    a(
        "--variants",
        default=",".join(VARIANTS),
        help="comma-separated, run in this order: records (replay every journalled record) "
        "and/or snapshot (snapshot() just before the kill) [%(default)s]",
    )
    a("--min-turns", type=int, default=2, help="turns of a session, at least [2]")
    a("--max-turns", type=int, default=3, help="turns of a session, at most [3]")
    a("--system-prompts", type=int, default=32, help="distinct shared system prompts [32]")
    a("--system-tokens", type=int, default=256, help="mean system-prompt length [256]")
    a("--user-tokens", type=int, default=48, help="mean user-message length [48]")
    a("--output-tokens", type=int, default=64, help="mean reply length [64]")
    a(
        "--batch",
        type=int,
        default=64,
        help="sessions served together while building (their plans, then their commits, "
        "sent pipelined one turn at a time) [%(default)s]",
    )
    a(
        "--cache-bytes",
        type=lambda s: round(float(s)),
        default=10**12,
        help="prefix-cache budget of the replica in bytes; large so nothing is evicted "
        "[%(default)s]",
    )
    a(
        "--snapshot-every",
        type=int,
        default=10**9,
        help="journal records between automatic snapshots; larger than the run so the "
        "records variant replays them all [%(default)s]",
    )
    a(
        "--lease-s",
        type=float,
        default=3600.0,
        help="lease / replica silence limit of the coordinator [%(default)s]",
    )
    a(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds a restarted coordinator may take to answer [%(default)s]",
    )
    a(
        "--redis-url",
        default=None,
        help="use this Redis instead of starting a private redis-server (its journal keys "
        "of --app-name are cleared at the end)",
    )
    a(
        "--max-failures",
        type=int,
        default=3,
        help="failed recoveries (the restarted coordinator started empty) tolerated per "
        "repeat; each is recorded and the coordinator killed again [%(default)s]",
    )
    a(
        "--app-name",
        default="recov-bench",
        help="application name (actor and journal keys) [%(default)s]",
    )
    a("--ray-cpus", type=int, default=2, help="logical CPUs of the local Ray [%(default)s]")
    a("--object-store-mb", type=int, default=256, help="Ray object store in MiB [256]")
    a("--seed", type=int, default=0, help="seed of the synthetic sessions [%(default)s]")
    a("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad or not args.variants:
        p.error(f"unknown variant {bad or args.variants}; choose from {list(VARIANTS)}")
    if "records" in args.variants and "snapshot" in args.variants:
        args.variants = ["records", "snapshot"]  # a snapshot drops the records
    for name in ("nodes", "repeats", "batch", "min_turns", "system_prompts", "max_sessions"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("system_tokens", "user_tokens", "output_tokens"):
        if getattr(args, name) < 4:
            p.error(f"--{name.replace('_', '-')} must be >= 4")
    if args.max_turns < args.min_turns:
        p.error("--max-turns must be >= --min-turns")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import ray
    import redis

    from marconi_ray.core.model.hf.parse import spec_from_hf_config
    from marconi_ray.engine.model.loader import read_config
    from marconi_ray.engine.presets.factory import make_model
    from marconi_ray.serve.app import shutdown_app, start_coordinator

    start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="bench-recovery-"))
    model_dir = make_model("tiny", "nemotron_h", tmp / "tiny")
    cfg, raw = read_config(model_dir)
    spec = spec_from_hf_config(raw, dtype_bytes=4)  # float32, as the settings' default dtype
    vocab = cfg.vocab_size
    work = Workload(args, vocab, cfg.max_position)
    replica = SyntheticReplica(np.random.default_rng(args.seed + 1), vocab)
    rows: dict[str, list[dict[str, Any]]] = {v: [] for v in args.variants}
    try:
        with redis_url(args, tmp / "redis") as url:
            settings = settings_for(args, model_dir, url)
            client = redis.Redis.from_url(url)
            redis_version = client.info("server")["redis_version"]
            start_ray(args)
            try:
                coord = start_coordinator(settings)
                ray.get(
                    coord.register_replica.remote(
                        REPLICA, spec.kv_bytes_per_token, spec.ssm_state_bytes
                    )
                )
                sessions, build = build_tree(args, coord, replica, work)
                build.update(redis_figures(client, settings))
                print(
                    f"[bench_recovery] built {build['nodes']:,} nodes from {build['sessions']:,} "
                    f"sessions ({build['turns']:,} turns) in {build['seconds']:.0f} s",
                    file=sys.stderr,
                )
                probes = itertools.cycle(sessions[:: max(1, len(sessions) // 97)])
                for variant in args.variants:
                    for i in range(args.repeats):
                        row = recover_once(
                            args, coord, replica, next(probes), work, settings, client, variant
                        )
                        rows[variant].append(row)
                        print(
                            f"[bench_recovery] {variant} #{i + 1}: kill -> first hit "
                            f"{row['kill_to_hit_s']:.2f} s (replay {row['replay_s']:.2f} s, "
                            f"{row['records_replayed']:,} records, {row['nodes_restored']:,} "
                            f"nodes, hit {row['probe_hit_len']} tokens)",
                            file=sys.stderr,
                        )
                final_nodes = int(ray.get(coord.check_invariants.remote()))
            finally:
                with contextlib.suppress(Exception):
                    shutdown_app(settings)
                ray.shutdown()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    summary = {v: summarise(r) for v, r in rows.items()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "no_progress")},
        "environment": {
            "ray": ray.__version__,
            "redis_server": redis_version,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_at_end": os.getloadavg(),
        },
        "replica": {
            "kv_bytes_per_token": spec.kv_bytes_per_token,
            "state_bytes": spec.ssm_state_bytes,
        },
        "build": build,
        "final_nodes": final_nodes,
        "summary": summary,
        "repeats": rows,
        "wall_s": time.perf_counter() - start,
    }
    (out / "bench_recovery.json").write_text(json.dumps(doc, indent=2, default=float) + "\n")
    shape = (
        f"{build['nodes']:,} tree nodes journalled in Redis ({build['sessions']:,} sessions, "
        f"{build['turns']:,} turns, {args.system_prompts} shared system prompts), one "
        f"synthetic replica; median of {args.repeats} kills per variant; "
        f"{os.cpu_count()} CPUs, Ray {ray.__version__}, redis-server {redis_version}"
    )
    table = markdown(summary)
    note = (
        "kill -> first hit = ray.kill(no_restart=False) until the restarted coordinator's "
        "first `plan` returned a hit (heartbeat answered `reconcile` -> `reconcile` -> "
        "`plan`); replay = what the coordinator measured for reading the journal and "
        "rebuilding its trees; restart overhead = kill -> heartbeat answered minus replay "
        "(Ray's restart of the actor process, imports, settings)."
    )
    (out / "bench_recovery.md").write_text(f"{shape}\n\n{table}\n\n{note}\n")
    print(f"\n{shape}\n\n{table}\n\n{note}")
    written = ", ".join(str(out / f) for f in ("bench_recovery.json", "bench_recovery.md"))
    print(f"\nwall time {doc['wall_s']:.0f} s; wrote {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
