"""The GPU path (CUDA + the Triton kernel set + SDPA): same logits as the CPU
reference path, and exact cache reuse on the device. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import GREEDY, prompts

from marconi_kernels import get_kernels, triton_unavailable
from marconi_ray.engine.engine import Engine
from marconi_ray.engine.loader import load_model

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
