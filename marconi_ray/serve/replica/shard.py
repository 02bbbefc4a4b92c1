"""`ShardActor`: one tensor-parallel rank of a model replica, as a Ray actor.

It holds this rank's slice of the model and of the state store (a `Worker`). The replica
drives all its shards in lockstep: every shard receives the same calls in the same order,
and the model's all-reduces (gloo on CPU, NCCL on GPU) keep their computations in step.
Only rank 0's return values are used by the replica (all ranks return the same).

Threads: a step may arrive through a Ray Compiled Graph (`advance_packed`), whose tasks
run on a background thread of the actor (Ray's `_ray_system` concurrency group), while
every other call runs on the actor's main thread. Every method that touches the worker
(or the process group) holds the shard's one lock, so the two never interleave.
"""

from __future__ import annotations

import pickle
import socket
import threading
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from marconi_ray.engine.draft_model import drafter_for
from marconi_ray.engine.engine import load_served_model
from marconi_ray.engine.kv_memory import planned_worker
from marconi_ray.engine.model.parallel import TPGroup
from marconi_ray.engine.store.entry_io import EntryPayload
from marconi_ray.engine.worker import Worker
from marconi_ray.protocol.kv_memory import KVMemory
from marconi_ray.protocol.orders import (
    DEFAULT_MAX_BATCH_TOKENS,
    Release,
    Slots,
    StepInput,
    StepOutput,
)
from marconi_ray.protocol.speculative import SpeculativeConfig
from marconi_ray.serve.host_memory import check_this_node
from marconi_ray.serve.hub_model import HubModel
from marconi_ray.serve.replica.entry_endpoint import EntryEndpoint
from marconi_ray.serve.replica.ticket_io import export_ticket, import_ticket
from marconi_ray.serve.transfer_messages import ImportResult, MoveTicket

DIST_TIMEOUT = timedelta(seconds=120)


def bind_device(device: str) -> torch.device:
    """This process's device, made current. Ray exposes the GPU it assigned to a shard
    as its only visible device, so a bare ``cuda`` means ``cuda:0``; the process group
    and every kernel launch then use it, and NCCL never guesses a device."""
    dev = torch.device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", 0 if dev.index is None else dev.index)
        torch.cuda.set_device(dev)
    return dev


def free_address() -> str:
    """A tcp:// rendezvous address on this node with a free port."""
    host = socket.gethostbyname(socket.gethostname())
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return f"tcp://{host}:{port}"


class ShardActor(EntryEndpoint):
    """Rank `rank` of `world`; call `setup` on every rank (concurrently) before use.

    Thread-safe: `advance`, `release`, `stop`, `cancel`, `holdings`, `store_stats`,
    `tier_stats`, `shutdown` and the two ends of a move (`export_<mode>(ticket)`,
    `import_ticket`) each hold `self.lock` for their whole run, so a call arriving on
    another thread (see the module docstring) waits for the one in progress. `setup`
    runs before any of them and takes no lock.

    Moves (`serve.disagg`): rank i of the source exports its shard of the ticket's
    entry (`EntryEndpoint.export_<mode>`), rank i of the receiver imports it."""

    def __init__(self, rank: int, world: int) -> None:
        torch.set_num_threads(1)
        self.rank = rank
        self.world = world
        self.worker: Worker | None = None
        self.device = torch.device("cpu")
        self.lock = threading.Lock()

    def address(self) -> str:
        """Rank 0 picks the process group's rendezvous address."""
        return free_address()

    def setup(
        self,
        model_dir: str,
        address: str,
        dtype: str,
        device: str,
        max_batch: int,
        kernels: str = "auto",
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        hub_model: HubModel | None = None,
        host_cache_bytes: int = 0,
        max_running_tokens: int | None = None,
        kv_memory: KVMemory | None = None,
        cache_bytes: int = 0,
        cuda_graphs: str = "auto",
        speculative: SpeculativeConfig | None = None,
    ) -> dict[str, Any]:
        """Bind this rank's device, join the process group (world > 1), load this rank's
        shard and warm its kernels up (JIT and autotuning happen here, not in the first
        request); returns the store's per-token KV bytes and per-state bytes, the model's
        limits, and the kernel set with the backend of each op.

        With `hub_model`, the model is that Hugging Face snapshot in this node's cache
        (downloaded first where allowed), and `model_dir` (the driver's copy) is unused.
        First of all, a host tier of `host_cache_bytes` per rank that this node's free
        memory cannot hold for the whole replica (its `world` ranks share the node) is
        refused: ValueError naming both numbers (`serve.host_memory`). With `kv_memory`,
        the device KV pool is allocated once from that budget after the warm-up, with
        `cache_bytes` (this rank's cache budget) inside it (`engine.kv_memory`); `kv_memory`
        in the result says how it split. With `speculative`, its worker drafts and
        verifies; every rank drafts the same and takes rank 0's accepted tokens."""
        check_this_node(host_cache_bytes, self.world)
        if hub_model is not None:
            model_dir = str(hub_model.local_dir())
        dev = self.device = bind_device(device)
        if self.world > 1:
            dist.init_process_group(
                backend="nccl" if dev.type == "cuda" else "gloo",
                init_method=address,
                rank=self.rank,
                world_size=self.world,
                timeout=DIST_TIMEOUT,
                device_id=dev if dev.type == "cuda" else None,
            )
        tp = TPGroup(self.rank, self.world)
        model = load_served_model(model_dir, tp, dtype, dev, kernels)
        warm_s = model.warm_up()
        drafter = drafter_for(speculative, model.cfg.vocab_size)
        # the pool's budget is measured now: after the weights and the warm-up
        self.worker, plan = planned_worker(
            model,
            max_batch,
            max_batch_tokens,
            max_running_tokens,
            kv_memory,
            cache_bytes,
            cuda_graphs,
            model_dir,
            speculative,
            drafter,
        )
        return {
            "kernels": model.kernels.name,
            "backends": dict(model.kernels.backends),
            "warm_up_s": round(warm_s, 3),
            "kv_memory": None if plan is None else plan.to_dict(),
            "cuda_graphs": self.worker.graphs is not None,
            "kv_bytes_per_token": self.worker.store.kv_bytes_per_token,
            "state_bytes": self.worker.store.state_bytes,
            "max_position": model.cfg.max_position,
            "vocab_size": model.cfg.vocab_size,
        }

    def _w(self) -> Worker:
        if self.worker is None:
            raise RuntimeError("shard used before setup")
        return self.worker

    # ------------------------------------------------------------------ lockstep calls
    def advance(self, step: StepInput) -> StepOutput:
        """One replica step (see `Worker.advance`): the only call of the hot loop. The
        device is made current on the calling thread first (CUDA's current device is
        per thread, and a compiled graph calls this from its own thread)."""
        with self.lock:
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            return self._w().advance(step)

    def advance_packed(self, step: bytes) -> bytes:
        """`advance` of a pickled `StepInput`, answering a pickled `StepOutput`: the step
        graph's call. Bytes cross a compiled graph's shared-memory channel as a copy,
        where numpy arrays (prompts, KV slot ids) would be deserialized zero-copy: kept
        (a running request keeps its prompt), they pin the channel's buffer and the graph
        deadlocks when that buffer comes round again."""
        out = self.advance(pickle.loads(step))
        return pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)

    # ------------------------------------------------------------------ moves
    def _export(self, *args: Any) -> EntryPayload:
        (ticket,) = args
        with self.lock:
            return export_ticket(self._w().store, ticket)

    def import_ticket(self, payload: EntryPayload | None, ticket: MoveTicket) -> ImportResult:
        """Store a payload as `ticket`'s entry (`replica.ticket_io.import_ticket`)."""
        with self.lock:
            return import_ticket(self._w().store, payload, ticket)

    def release(self, release: Release) -> list[str]:
        """`Worker.apply_release`: what the store refused of it (empty: all done)."""
        with self.lock:
            return self._w().apply_release(release)

    def stop(self, request_id: int) -> bool:
        with self.lock:
            return self._w().stop(request_id)

    def cancel(self, request_id: int) -> bool:
        with self.lock:
            return self._w().cancel(request_id)

    # ------------------------------------------------------------------ views
    def holdings(self) -> tuple[list[int], Slots, list[int], Slots]:
        """What the store holds on the cache's behalf (state ids, KV slot ids; see
        `Worker.holdings`) and which of them it keeps on the host (`host_holdings`)."""
        with self.lock:
            worker = self._w()
            states, slots = worker.holdings()
            return (states, slots, *worker.host_holdings())

    def store_stats(self) -> dict[str, Any]:
        with self.lock:
            worker = self._w()
            return {
                "bytes_used": worker.store.bytes_used,
                "live_states": worker.store.live_states,
                "running": worker.num_running,
            }

    def tier_stats(self) -> dict[str, float]:
        """The store's host-tier holdings and copies between the tiers so far
        (`StateStore.tier_stats`)."""
        with self.lock:
            return self._w().store.tier_stats()

    def shutdown(self) -> None:
        with self.lock:
            if self.world > 1 and dist.is_initialized():
                dist.destroy_process_group()
