"""A decode step of the model has no host sync and no data-dependent shape, in every
family: run under a dispatch mode that fails on any op that makes a CUDA host wait for
the device (`.item()` / `int()` of a tensor, `.tolist()`, `.numpy()`, `nonzero`,
boolean indexing, `bincount`, ...), so it can be captured as a CUDA graph. The
worker's step around it reads the sampled tokens once (counted). The counters are
benchmarks/host_syncs.py's, which engine_step_probe.py counts with."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from engine_helpers import prompts

from marconi_ray.engine.model.layers.moe import MoE, route
from marconi_ray.engine.model.loader import load_model
from marconi_ray.engine.presets.model_presets import FAMILIES, MOE_HYBRIDS
from marconi_ray.engine.worker import Worker
from marconi_ray.protocol.orders import PrefillOrder, StepInput
from marconi_ray.protocol.sampling import SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from host_syncs import HostReads, HostSync, SyncOps


def _decoding(model, n: int = 3) -> Worker:
    worker = Worker(model, max_batch=4)
    sp = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    orders = [
        PrefillOrder(r, np.asarray(p, np.int32), sp, 20)
        for r, p in enumerate(prompts(3, n, 12, model.cfg.vocab_size))
    ]
    worker.advance(StepInput(start=tuple(orders)))
    worker.advance(StepInput())
    return worker


@pytest.mark.parametrize("family", FAMILIES)
def test_the_models_decode_step_has_no_host_sync(model_dirs, family):
    model = load_model(model_dirs[family])
    worker = _decoding(model)
    batch = worker._batch
    slots = worker.store.alloc_slots(len(batch))
    window = None  # a model with sliding-window blocks: their rows too
    if worker.store.window is not None:
        window = torch.as_tensor(worker.store.alloc_window(len(batch)))
    batch.extend(torch.as_tensor(worker.store.device_rows(slots)), window)
    ids = torch.tensor([s.output[-1] for s in worker._running])
    with HostReads(strict=True), SyncOps(strict=True):
        logits = model.decode_batch(ids, batch)
    assert logits.shape == (len(batch), model.cfg.vocab_size)
    assert torch.isfinite(logits).all()


def test_the_sync_guard_catches_what_it_must():
    x = torch.arange(4)
    for bad in (lambda: int(x[0]), lambda: x.tolist(), lambda: x[x > 1], lambda: x.nonzero()):
        with pytest.raises(HostSync), HostReads(strict=True), SyncOps(strict=True):
            bad()


def test_a_worker_step_reads_the_host_once(model_dirs):
    model = load_model(model_dirs["qwen3_5_text"])
    worker = _decoding(model, 4)
    reads = HostReads()
    with reads:
        events = worker.advance(StepInput()).events
    assert len(events) == 4 and reads.reads == 1


@pytest.mark.parametrize("family", MOE_HYBRIDS)
def test_gathered_moe_dispatch_equals_grouped(model_dirs, family):
    model = load_model(model_dirs[family])
    moe = next(b.mixer for b in model.layers if isinstance(b.mixer, MoE))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, model.cfg.hidden_size, generator=g)
    assert moe.gathers(6) and not moe.gathers(10**6)

    logits = torch.nn.functional.linear(x.to(moe.router.dtype), moe.router)
    weights, experts = route(logits, moe.cfg, moe.selection_bias)
    h = x if moe.latent_in is None else torch.nn.functional.linear(x, moe.latent_in)
    got = moe._gathered(h, experts, weights.to(x.dtype))
    want = moe._grouped(h, experts, weights.to(x.dtype))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
