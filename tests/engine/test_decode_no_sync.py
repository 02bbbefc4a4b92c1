"""A decode step of the model has no host sync and no data-dependent shape, in every
family: run under a dispatch mode that fails on any op that makes a CUDA host wait for
the device (`.item()` / `int()` of a tensor, `.tolist()`, `.numpy()`, `nonzero`,
boolean indexing, `bincount`, ...), so it can be captured as a CUDA graph. The
worker's step around it reads the sampled tokens once (counted)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_helpers import prompts
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from marconi_ray.engine.model.layers.moe import MoE, route
from marconi_ray.engine.model.loader import load_model
from marconi_ray.engine.presets.model_presets import FAMILIES, MOE_HYBRIDS
from marconi_ray.engine.worker import Worker
from marconi_ray.protocol.orders import PrefillOrder, StepInput
from marconi_ray.protocol.sampling import SamplingParams

SYNC_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "bincount"}


class HostSync(AssertionError):
    pass


class _NoSyncOps(TorchDispatchMode):
    """Fails on every aten op that syncs a CUDA host (see `SYNC_OPS`, boolean indexing)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        bool_index = name == "index" and any(
            isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in (args[1] or ())
        )
        if name in SYNC_OPS or bool_index:
            raise HostSync(f"host sync: aten.{name}")
        return func(*args, **(kwargs or {}))


class _NoHostReads(TorchFunctionMode):
    """Fails on `.tolist()`, `.numpy()` and `.item()` (or, not `strict`, counts them)."""

    def __init__(self, strict: bool = True) -> None:
        super().__init__()
        self.strict = strict
        self.reads = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("tolist", "numpy", "item"):
            self.reads += 1
            if self.strict:
                raise HostSync(f"host read: Tensor.{func.__name__}")
        return func(*args, **(kwargs or {}))


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
    batch.extend(torch.as_tensor(worker.store.device_rows(slots)))
    ids = torch.tensor([s.output[-1] for s in worker._running])
    with _NoHostReads(), _NoSyncOps():
        logits = model.decode_batch(ids, batch)
    assert logits.shape == (len(batch), model.cfg.vocab_size)
    assert torch.isfinite(logits).all()


def test_the_sync_guard_catches_what_it_must():
    x = torch.arange(4)
    for bad in (lambda: int(x[0]), lambda: x.tolist(), lambda: x[x > 1], lambda: x.nonzero()):
        with pytest.raises(HostSync), _NoHostReads(), _NoSyncOps():
            bad()


def test_a_worker_step_reads_the_host_once(model_dirs):
    model = load_model(model_dirs["qwen3_5_text"])
    worker = _decoding(model, 4)
    reads = _NoHostReads(strict=False)
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
