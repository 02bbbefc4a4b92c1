"""Prefill and decode apart, and remote hits, as a service over the OpenAI HTTP API on a
real local Ray, entries moving over GLOO (Ray Direct Transport): every turn's tokens
are the uncached engine's, later turns report cached tokens (at least a mixed
service's of the same total cache bytes), `/health` names each replica's role,
`/metrics` counts the bytes moved, and each store holds exactly what its tree accounts.
The fault test kills the decode replica while it decodes and the prefill replica in
the middle of a move: every answer is exact, none is an HTTP 500, nothing leaks.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
from prometheus_client.parser import text_string_to_metric_families
from ray import serve
from serve_helpers import SERVE_PORT, http_service, local_ray

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.disagg import DisaggSettings
from marconi_ray.serve.settings import ServeSettings
from marconi_ray.serve.transfer_messages import ReceiveOrder, ShardsQuery

pytestmark = [pytest.mark.ray]

MAX_TOKENS = 6
CACHE_BYTES = 3_000_000


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("disagg") / "tiny")


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> Engine:
    return Engine(model_dir, system="vanilla", cache_bytes=10**8)


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    with local_ray():
        yield


def _settings(model_dir: Path, app: str, **disagg: Any) -> ServeSettings:
    return ServeSettings(
        model_dir=str(model_dir),
        model_name="tiny",
        replicas=2,
        cache_bytes=CACHE_BYTES,
        alpha=1.0,
        heartbeat_s=0.2,
        lease_s=10.0,
        app_name=app,
        port=SERVE_PORT,
        prefill_tflops=1e-4,  # a CPU's prefill: a pulled hit beats recomputing it
        disagg=DisaggSettings(transfer_latency_s=0.0, **disagg),
    )


def _complete(prompt: list[int], max_tokens: int = MAX_TOKENS) -> tuple[list[int], int]:
    """One greedy completion of token ids: (its token ids, its cached prompt tokens)."""
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{SERVE_PORT}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        assert resp.status == 200
        reply = json.loads(resp.read())
    usage = reply["usage"]
    assert usage["prompt_tokens"] == len(prompt) and usage["completion_tokens"] == max_tokens
    ids = [int(t) for t in reply["choices"][0]["token_ids"]]
    return ids, int(usage["prompt_tokens_details"]["cached_tokens"])


def _get(path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{SERVE_PORT}{path}", timeout=30) as resp:
        return resp.read().decode()


def _metric(text: str, name: str, **labels: str) -> float:
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def _sessions(reference: Engine, turns: int) -> list[list[int]]:
    """Three sessions' turns, served one after another: the cached tokens of turns 2+,
    every output checked against the uncached engine."""
    rng = np.random.default_rng(4)
    histories = [rng.integers(7, 263, 40).tolist() for _ in range(3)]
    cached: list[list[int]] = [[] for _ in histories]
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    for turn in range(turns):
        for i, history in enumerate(histories):
            tokens, hit = _complete(history)
            assert tokens == list(reference.generate(history, params).tokens), (i, turn)
            if turn:
                cached[i].append(hit)
            history += tokens + rng.integers(7, 263, 5).tolist()
    return cached


def _stores_match_trees(coordinator: Any, app: str) -> None:
    """Every replica's store holds exactly the bytes its tree accounts, and no cache
    holds a reservation (polled: the replicas free what a commit released
    asynchronously, and a plan of a lost replica ends with its lease)."""
    handle = serve.get_deployment_handle("ModelReplica", app_name=app)
    deadline = time.monotonic() + 30
    while True:
        stats = ray.get(coordinator.stats.remote())
        want = {s.replica_id: s.bytes_used for s in stats}
        reserved = {s.replica_id: s.reserved for s in stats if s.reserved}
        held = {}
        for call in [handle.stats.remote() for _ in range(8)]:
            s = call.result(timeout_s=30)
            held[s["replica_id"]] = int(s["bytes_used"])
        if (held == want and not reserved) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert held == want and not reserved, (held, want, reserved)
    ray.get(coordinator.check_invariants.remote())


def test_prefill_and_decode_apart_are_exact_cache_on_both_sides_and_survive_faults(
    ray_session, model_dir, reference
):
    """A mixed service first (the baseline), then one 1P+1D service: its sessions, then
    the loss of its decode replica mid-request and of its prefill replica mid-move."""
    with http_service(_settings(model_dir, "mixed-base")):
        mixed = _sessions(reference, turns=2)
    settings = _settings(model_dir, "pd", prefill_replicas=1, decode_replicas=1, transfer="gloo")
    with http_service(settings) as coordinator:
        health = json.loads(_get("/health"))
        assert sorted(health["roles"].values()) == ["decode", "prefill"]
        pd = _sessions(reference, turns=2)
        metrics = _get("/metrics")
        _stores_match_trees(coordinator, "pd")
        stats = {s.role: s for s in ray.get(coordinator.stats.remote())}
        for got, base in zip(pd, mixed, strict=True):  # turns 2+: at least the mixed hits
            assert all(g >= b > 0 for g, b in zip(got, base, strict=True)), (pd, mixed)
        assert _metric(metrics, "marconi_transfer_bytes_total", kind="pd") > 0
        assert _metric(metrics, "marconi_transfers_total", kind="pd", outcome="failed") == 0
        assert _metric(metrics, "marconi_transfers_total", kind="pd", mode="gloo") >= 3
        assert _metric(metrics, "marconi_transfers_total", mode="object_store") == 0
        assert _metric(metrics, "marconi_replica_info", role="decode") == 1
        decode = stats["decode"].stats
        assert decode["states_admitted"]["transfer"] >= 3  # each session's first turn moved
        assert decode["states_admitted"]["last_token"] > 0  # and its end-of-turn states cached
        _lose_the_decode_replica_mid_request_and_the_prefill_replica_mid_move(
            coordinator, "pd", reference
        )


def test_mixed_replicas_pull_a_remote_hit(ray_session, model_dir, reference):
    settings = _settings(model_dir, "remote", remote_hits=True, transfer="gloo")
    settings = ServeSettings(**{**settings.__dict__, "routing": "round_robin"})
    with http_service(settings) as coordinator:
        cached = _sessions(reference, turns=2)  # round robin: turn 2 lands on the other one
        metrics = _get("/metrics")
        _stores_match_trees(coordinator, "remote")
    assert all(hits[0] > 40 for hits in cached), cached
    assert _metric(metrics, "marconi_remote_hit_tokens_total") > 0
    assert _metric(metrics, "marconi_transfer_bytes_total", kind="remote_hit") > 0
    assert _metric(metrics, "marconi_transfers_total", kind="remote_hit", mode="gloo") > 0


def _replica_actor(app: str, replica_id: str) -> Any:
    """The Serve replica actor of `replica_id` in application `app`."""
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["name"].startswith(f"SERVE_REPLICA::{app}#") and actor["name"].endswith(
            f"#{replica_id}"
        ):
            return ray.get_actor(actor["name"], namespace=actor["namespace"])
    raise AssertionError(f"no replica actor {replica_id} in {app}")


def _roles(coordinator: Any, want: int, timeout_s: float = 90.0) -> dict[str, str]:
    """Replica id -> role, once `want` replicas are registered and confirmed again."""
    deadline = time.monotonic() + timeout_s
    while True:
        health = ray.get(coordinator.health.remote())
        if health["replicas"] == want and len(health["roles"]) == want:
            return dict(health["roles"])
        assert time.monotonic() < deadline, health
        time.sleep(0.3)


def _lose_the_decode_replica_mid_request_and_the_prefill_replica_mid_move(
    coordinator: Any, app: str, reference: Engine
) -> None:
    """Kill the decode replica while it decodes handed-off requests, then the prefill
    replica in the middle of a move: every answer exact (an HTTP 500 would raise), the
    survivors' stores equal to their trees, nothing reserved."""
    rng = np.random.default_rng(9)
    long = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    roles = _roles(coordinator, 2)
    decode = next(r for r, role in roles.items() if role == "decode")
    prompts = [rng.integers(7, 263, 40).tolist() for _ in range(4)]
    with ThreadPoolExecutor(len(prompts)) as pool:
        calls = [pool.submit(_complete, p, 32) for p in prompts]
        deadline = time.monotonic() + 60
        while not any(  # the decode replica decodes handed-off requests
            s.role == "decode" and s.in_flight for s in ray.get(coordinator.stats.remote())
        ):
            assert time.monotonic() < deadline, "nothing reached the decode replica"
            time.sleep(0.05)
        ray.kill(_replica_actor(app, decode), no_restart=False)
        answers = [c.result(timeout=180) for c in calls]  # an HTTP 500 raises here
    for prompt, (tokens, _) in zip(prompts, answers, strict=True):
        assert tokens == list(reference.generate(prompt, long).tokens)
    roles = _roles(coordinator, 2)  # Serve replaced it: the new one decodes
    prefill = next(r for r, role in roles.items() if role == "prefill")
    decode = next(r for r, role in roles.items() if role == "decode")
    history = prompts[0] + answers[0][0]
    handle = serve.get_deployment_handle("ModelReplica", app_name=app)
    source = handle.transfer_shards.remote(ShardsQuery(prefill)).result(timeout_s=30)
    ticket = ray.get(coordinator.begin_move.remote(prefill, decode, history, "pd"))
    assert ticket is not None  # the prefill side's entry of the first session, pinned
    ray.kill(_replica_actor(app, prefill), no_restart=False)
    order = ReceiveOrder(decode, ticket, tuple(source), "object_store")
    result = handle.receive.remote(order).result(timeout_s=120)
    assert not result.ok and result.refused  # the source died: the receiver recomputes
    _roles(coordinator, 2)
    nxt = history + rng.integers(7, 263, 5).tolist()
    tokens, _ = _complete(nxt)
    short = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    assert tokens == list(reference.generate(nxt, short).tokens)
    _stores_match_trees(coordinator, app)
