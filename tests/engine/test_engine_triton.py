"""The engine end to end on the "triton" kernel set (under TRITON_INTERPRET=1 on CPU
without a GPU): logits, prefill emitting checkpoints at arbitrary depths, resume from each,
greedy decode and multi-turn cache reuse all equal the reference backend's. Every op the
model calls goes through the requested set (counted), so a silent fallback fails."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest
import torch
from engine_helpers import GREEDY, prompts

from marconi_kernels import OPS, KernelSet, get_kernels
from marconi_ray.engine.engine import Engine
from marconi_ray.engine.loader import load_model
from marconi_ray.engine.seq_state import SeqState

pytestmark = pytest.mark.triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LOGIT_TOL = 2e-2 if DEVICE == "cuda" else 1e-4  # TF32 dots on GPU; exact fp32 in the interpreter
CONV = {"causal_conv1d", "causal_conv1d_update"}
FAMILY_OPS = {
    "nemotron_h": {"ssd_chunk_scan", "mamba2_state_update", *CONV},
    "bamba": {"ssd_chunk_scan", "mamba2_state_update", *CONV},
    "jamba": {"selective_scan", "mamba1_state_update", *CONV},
    "qwen3_next": {"gated_delta_chunk", "gated_delta_step", *CONV},
    "lfm2": CONV,  # the short conv is the causal conv alone (no activation)
}
FEW_DEPTHS = {"qwen3_next", "lfm2", "bamba"}
"""Families resumed at the fixed depths only: the Gated DeltaNet prefill is the slowest
kernel in the interpreter, the short conv has nothing but the conv to check, and Bamba
runs the Mamba-2 kernels NemotronH already checks at random depths too (CI time)."""


def counting(ks: KernelSet, calls: Counter[str]) -> KernelSet:
    """`ks` with every op wrapped to count its calls."""

    def wrap(op: str):
        fn = getattr(ks, op)

        def counted(*args, **kwargs):
            calls[op] += 1
            return fn(*args, **kwargs)

        return counted

    return dataclasses.replace(ks, **{op: wrap(op) for op in OPS})


@pytest.mark.parametrize("family", sorted(FAMILY_OPS))
def test_resume_from_every_checkpoint_equals_reference(model_dirs, family):
    calls: Counter[str] = Counter()
    fast = load_model(
        model_dirs[family], device=DEVICE, kernels=counting(get_kernels(DEVICE, "triton"), calls)
    )
    ref = load_model(model_dirs[family], device=DEVICE, kernels=get_kernels(DEVICE, "ref"))
    ids = prompts(11, 1, 40, fast.cfg.vocab_size)[0]
    rng = np.random.default_rng(5)
    # chunk-aligned (16 is the tiny presets' chunk), interior, first and last depths, and
    # random extras but for FEW_DEPTHS
    extra = 0 if family in FEW_DEPTHS else 3
    depths = sorted({1, 16, 39, 40, *rng.integers(2, 40, extra).tolist()})
    tensor = torch.tensor(ids, device=DEVICE)
    diff = (fast.forward_logits(tensor) - ref.forward_logits(tensor)).abs().max().item()
    assert diff <= LOGIT_TOL

    state = fast.new_state()
    ckpts = fast.prefill(tensor, state, depths)
    ref_state = ref.new_state()
    ref.prefill(tensor, ref_state)
    scratch = ref.greedy(ref_state, 4)
    assert fast.greedy(state, 4) == scratch
    for ck in ckpts:
        resumed = SeqState.resumed(ck, state)
        if ck.depth < len(ids):
            fast.prefill(tensor[ck.depth :], resumed)
        assert fast.greedy(resumed, 4) == scratch, ck.depth
    assert set(calls) == FAMILY_OPS[family], calls
    declared = {op for i in fast.ssm_blocks for op in type(fast.ssm(i)).KERNEL_OPS}
    assert declared == set(calls)  # what `marconi-ray models` reports is what runs


def test_engine_multi_turn_on_triton_equals_reference(model_dirs):
    engine = Engine(
        model_dirs["nemotron_h"], "marconi", 50_000_000, device=DEVICE, kernels="triton"
    )
    assert engine.model.kernels.name == "triton"
    assert all(b.startswith("triton:") for b in engine.model.kernels.backends.values())
    reference = Engine(model_dirs["nemotron_h"], "vanilla", device=DEVICE, kernels="ref")
    vocab = engine.config.vocab_size
    history = prompts(2, 1, 30, vocab)[0]
    for turn in range(3):
        got = engine.generate(history, GREEDY)
        assert got.tokens == reference.generate(history, GREEDY).tokens
        if turn:
            assert got.usage.cached_tokens > 0
        history += list(got.tokens) + prompts(10 + turn, 1, 9, vocab)[0]


def test_warm_up_runs_every_kernel_of_the_model(model_dirs):
    calls: Counter[str] = Counter()
    model = load_model(
        model_dirs["jamba"], device=DEVICE, kernels=counting(get_kernels(DEVICE, "triton"), calls)
    )
    assert model.warm_up() > 0
    assert set(calls) == FAMILY_OPS["jamba"]
