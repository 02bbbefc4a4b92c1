"""The GPU path (CUDA + the Triton kernel set + SDPA): same logits as the CPU
reference path, and exact cache reuse on the device. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import GREEDY, prompts

from marconi_kernels import get_kernels, triton_unavailable
from marconi_ray.engine.engine import Engine
from marconi_ray.engine.model.loader import load_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize("family", ["nemotron_h", "bamba", "jamba"])
def test_cuda_logits_match_cpu_reference(model_dirs, family):
    cpu = load_model(model_dirs[family])
    gpu = load_model(model_dirs[family], device="cuda")
    if triton_unavailable("cuda") is None:
        assert gpu.kernels.name == "triton"
    ids = torch.tensor(prompts(1, 1, 80, cpu.cfg.vocab_size)[0])
    want = cpu.forward_logits(ids)
    got = gpu.forward_logits(ids).cpu()
    assert (got - want).abs().max().item() <= 1e-3


def test_cuda_engine_reuse_is_exact(model_dirs):
    engine = Engine(
        model_dirs["nemotron_h"], system="marconi", cache_bytes=50_000_000, device="cuda"
    )
    reference = Engine(model_dirs["nemotron_h"], system="vanilla", device="cuda")
    history = prompts(2, 1, 60, engine.config.vocab_size)[0]
    for turn in range(3):
        got = engine.generate(history, GREEDY)
        assert got.tokens == reference.generate(history, GREEDY).tokens
        if turn:
            assert got.usage.cached_tokens > 0
        history += list(got.tokens) + prompts(10 + turn, 1, 20, engine.config.vocab_size)[0]


def test_ref_kernels_run_on_cuda(model_dirs):
    model = load_model(
        model_dirs["bamba"], device="cuda", kernels=get_kernels("cuda", prefer="ref")
    )
    ids = torch.tensor(prompts(3, 1, 40, model.cfg.vocab_size)[0])
    cpu = load_model(model_dirs["bamba"])
    assert (model.forward_logits(ids).cpu() - cpu.forward_logits(ids)).abs().max().item() <= 1e-3


def test_cuda_host_tier_round_trip_under_reuse(model_dirs):
    """On CUDA a demotion is queued on the copy stream into pinned memory; the device rows
    it leaves are handed out again right away (pending until its event) and overwritten
    while it may still be in flight; the hit read from the host, and after a promotion,
    still equals what was stored, and the resumed tokens equal an uncached run's."""
    from marconi_ray.engine.worker import Worker
    from marconi_ray.protocol.orders import Move, Release

    model = load_model(model_dirs["nemotron_h"], device="cuda")
    ids = prompts(4, 1, 40, model.cfg.vocab_size)[0]
    uncached = model.new_state()
    model.prefill(torch.tensor(ids), uncached)
    want = model.greedy(uncached, 4)
    worker = Worker(model)
    store = worker.store
    state = model.new_state()
    (ckpt,) = model.prefill(torch.tensor(ids[:32]), state, [32])
    sid = store.put_state(ckpt)
    slots = store.alloc_slots(32)
    store.write_kv(slots, state, 0)
    worker.release(Release(moves=(Move(True, (sid,), slots),)))
    store.check()
    other = store.alloc_slots(store.device_kv.capacity)  # every row, the pending ones too
    noise = model.new_state()
    model.prefill(torch.tensor(prompts(5, 1, len(other), model.cfg.vocab_size)[0]), noise)
    store.write_kv(other, noise, 0)
    for promote in (False, True):
        if promote:
            worker.release(Release(moves=(Move(False, (sid,), slots),)))
            assert store.host_slots == 0
        hit = store.load(slots, sid, 32)
        for i, buf in state.kv.items():
            assert torch.equal(hit.kv[i].view()[0], buf.view()[0])
            assert torch.equal(hit.kv[i].view()[1], buf.view()[1])
        model.prefill(torch.tensor(ids[32:]), hit)
        assert model.greedy(hit, 4) == want
        store.check()
    stats = store.tier_stats()
    torch.cuda.synchronize()
    assert store.tier_stats()["seconds_to_host"] > 0 and stats["moves_to_device"] == 1
