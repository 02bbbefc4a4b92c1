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
from engine_helpers import GREEDY, make_small_jamba, prompts

from marconi_kernels import OPS, KernelSet, get_kernels
from marconi_ray.engine.engine import Engine
from marconi_ray.engine.model.hybrid_model import WARM_UP_LENGTHS
from marconi_ray.engine.model.loader import load_model
from marconi_ray.engine.model.prefill_part import PrefillPart
from marconi_ray.engine.model.seq_state import SeqState
from marconi_ray.engine.store.state_store import StateStore

pytestmark = pytest.mark.triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LOGIT_TOL = 2e-2 if DEVICE == "cuda" else 1e-4  # TF32 dots on GPU; exact fp32 in the interpreter
CONV = {"causal_conv1d", "causal_conv1d_update", "causal_conv1d_varlen"}
FAMILY_OPS = {
    "nemotron_h": {"ssd_chunk_scan", "ssd_chunk_scan_varlen", "mamba2_state_update", *CONV},
    "jamba": {"selective_scan", "selective_scan_varlen", "mamba1_state_update", *CONV},
    "qwen3_next": {"gated_delta_chunk", "gated_delta_chunk_varlen", "gated_delta_step", *CONV},
    "lfm2": CONV,  # the short conv is the causal conv alone (no activation)
    "recurrent_gemma": {"rglru_scan", "rglru_scan_varlen", "rglru_step", *CONV},
    "kimi_linear": {"kda_chunk", "kda_chunk_varlen", "kda_step", *CONV},  # MLA: torch
    "minimax": {"lightning_chunk", "lightning_chunk_varlen", "lightning_step"},  # no conv
    "xlstm": {"mlstm_chunk", "mlstm_chunk_varlen", "mlstm_step"},  # no conv
}
RESUMED = (
    "nemotron_h",
    "jamba",
    "qwen3_next",
    "lfm2",
    "recurrent_gemma",
    "kimi_linear",
    "minimax",
    "xlstm",
)
"""One family per recurrent kernel set (Mamba-2, Mamba-1, Gated DeltaNet, short conv,
RG-LRU, KDA, lightning attention, mLSTM): Bamba, FalconH1, Zamba2 and Granite run
NemotronH's Mamba-2 ops (`FAMILY_OPS`), and a kernel's states do not depend on the layers
around it (CI time: each resume is a Triton prefill in the interpreter)."""
FEW_DEPTHS = {"qwen3_next", "lfm2", "jamba", "recurrent_gemma", "kimi_linear"}
"""Families resumed at the fixed depths only (the Gated DeltaNet, KDA and Mamba-1
prefills are the slowest kernels in the interpreter, the short conv has nothing but the
conv to check, the RG-LRU's depths 1, 16, 39 and 40 cross its window of 16); NemotronH and
MiniMax add a random one (each resume is a Triton prefill in the interpreter; the
kernels' states at every depth are checked in tests/kernels)."""


@pytest.fixture(scope="module")
def interp_dirs(model_dirs, tmp_path_factory):
    """`model_dirs` with a smaller Jamba (4 dense layers, 2 of them Mamba-1): the tiny
    preset's (5 layers, 3 Mamba-1, experts) runs the same kernels at 2.5x the interpreter
    time, and the kernels' states do not depend on the layers around them."""
    return {**model_dirs, "jamba": make_small_jamba(tmp_path_factory.mktemp("jamba"))}


def counting(ks: KernelSet, calls: Counter[str]) -> KernelSet:
    """`ks` with every op wrapped to count its calls."""

    def wrap(op: str):
        fn = getattr(ks, op)

        def counted(*args, **kwargs):
            calls[op] += 1
            return fn(*args, **kwargs)

        return counted

    return dataclasses.replace(ks, **{op: wrap(op) for op in OPS})


@pytest.mark.parametrize(
    ("family", "checked_by"),
    [
        *((f, "nemotron_h") for f in ("bamba", "falcon_h1", "zamba2", "granitemoehybrid")),
        ("mamba2", "nemotron_h"),
        ("mamba", "jamba"),
        ("falcon_mamba", "jamba"),
        ("olmo_hybrid", "qwen3_next"),
        ("bailing_hybrid", "kimi_linear"),
        ("lfm3", "lfm2"),
    ],
)
def test_other_families_run_the_kernels_a_resumed_family_checks(model_dirs, family, checked_by):
    """What makes the Triton resume of NemotronH (Mamba-2), Jamba (Mamba-1), Qwen3-Next
    (Gated DeltaNet), Kimi Linear (KDA) and LFM2 (short conv) stand for these families:
    their recurrent mixers are the same class, declaring the same kernel ops (the pure
    SSMs have no attention, so no other op runs; OLMo's layout changes only the
    projections around the ops, Ling's only KDA's gate projections and bound, computed in
    torch before the ops; LFM3's short conv is LFM2's, its windowed attention
    RecurrentGemma's)."""
    model = load_model(model_dirs[family])
    ops = {op for i in model.ssm_blocks for op in type(model.ssm(i)).KERNEL_OPS}
    assert ops == FAMILY_OPS[checked_by]


@pytest.mark.parametrize("family", RESUMED)
def test_resume_from_every_checkpoint_equals_reference(interp_dirs, family):
    calls: Counter[str] = Counter()
    fast = load_model(
        interp_dirs[family], device=DEVICE, kernels=counting(get_kernels(DEVICE, "triton"), calls)
    )
    ref = load_model(interp_dirs[family], device=DEVICE, kernels=get_kernels(DEVICE, "ref"))
    ids = prompts(11, 1, 40, fast.cfg.vocab_size)[0]
    rng = np.random.default_rng(5)
    # chunk-aligned (16 is the tiny presets' chunk), interior, first and last depths, and
    # random extras but for FEW_DEPTHS
    extra = 0 if family in FEW_DEPTHS else 1
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
    # two depths resumed in one forward: the packed conv, and each part's scan from its state
    pair = [SeqState.resumed(ck, state) for ck in ckpts[:2]]
    fast.prefill_many(
        [PrefillPart(tensor[ck.depth :], r) for ck, r in zip(ckpts[:2], pair, strict=True)]
    )
    assert [fast.greedy(r, 4) for r in pair] == [scratch, scratch]
    assert set(calls) == FAMILY_OPS[family], calls
    declared = {op for i in fast.ssm_blocks for op in type(fast.ssm(i)).KERNEL_OPS}
    assert declared == set(calls)  # what `marconi-ray models` reports is what runs


@pytest.mark.parametrize("family", ["nemotron_h"])
def test_engine_multi_turn_on_triton_equals_reference(model_dirs, family):
    """Three turns through the Marconi cache on the Triton set give the uncached reference
    set's tokens (a model with no attention runs the same kernels less the attention's:
    the pure SSMs' cached turns are checked on the reference set, at a fifth of the
    interpreter's time)."""
    engine = Engine(model_dirs[family], "marconi", 50_000_000, device=DEVICE, kernels="triton")
    assert engine.model.kernels.name == "triton"
    assert all(b.startswith("triton:") for b in engine.model.kernels.backends.values())
    reference = Engine(model_dirs[family], "vanilla", device=DEVICE, kernels="ref")
    vocab = engine.config.vocab_size
    history = prompts(2, 1, 30, vocab)[0]
    for turn in range(3):
        got = engine.generate(history, GREEDY)
        assert got.tokens == reference.generate(history, GREEDY).tokens
        if turn:
            assert got.usage.cached_tokens > 0
        history += list(got.tokens) + prompts(10 + turn, 1, 9, vocab)[0]


def test_packed_prefill_on_the_pool_equals_reference(interp_dirs):
    """Three requests (one resuming after cached rows) prefilled in one forward on the
    pool: each attention layer is one Triton `paged_prefill_attention` call for all of
    them, and every part's logits, checkpoints and written KV equal the reference set's
    (LFM2: the short conv and attention, the quickest model in the interpreter)."""
    calls: Counter[str] = Counter()
    fast = load_model(
        interp_dirs["lfm2"], device=DEVICE, kernels=counting(get_kernels(DEVICE, "triton"), calls)
    )
    ref = load_model(interp_dirs["lfm2"], device=DEVICE, kernels=get_kernels(DEVICE, "ref"))
    vocab = ref.cfg.vocab_size
    ids = [torch.tensor(p, device=DEVICE) for p in prompts(12, 3, 20, vocab)]

    def run(model):
        store = StateStore(model)
        states = [SeqState(rows=torch.as_tensor(store.device_rows(store.alloc_slots(20))))
                  for _ in ids]  # fmt: skip
        rows = states[1].rows
        states[1].rows = rows[:7]
        model.prefill(ids[1][:7], states[1], (), store.device_kv)
        states[1].rows = rows
        parts = [PrefillPart(ids[0], states[0], (5, 20)), PrefillPart(ids[1][7:], states[1], (9,)),
                 PrefillPart(ids[2][:3], SeqState(rows=states[2].rows[:3]), (2,))]  # fmt: skip
        out = model.prefill_many(parts, store.device_kv)
        kv = [store.device_kv.k[i][:, p.state.rows] for i in model.attn_blocks for p in parts]
        return out, kv

    calls.clear()
    got, got_kv = run(fast)
    assert calls["paged_prefill_attention"] == len(fast.attn_blocks)
    want, want_kv = run(ref)
    for (ckpts, logits), (want_ckpts, want_logits) in zip(got, want, strict=True):
        assert (logits - want_logits).abs().max() < LOGIT_TOL
        assert [c.depth for c in ckpts] == [c.depth for c in want_ckpts]
        for c, w in zip(ckpts, want_ckpts, strict=True):
            assert all(torch.allclose(c.conv[i], w.conv[i], atol=1e-5) for i in fast.ssm_blocks)
    assert all(torch.allclose(g, w, atol=1e-5) for g, w in zip(got_kv, want_kv, strict=True))


def test_warm_up_runs_every_kernel_of_the_model(interp_dirs):
    """Warm-up prefills every length the Triton conv's block sizes need and decodes, then
    prefills two sequences in one forward and decodes once on a pool, so every op a model
    declares runs (LFM2: the conv, its step and its packed form, and attention's paged
    decode and packed prefill; the warm-up does not depend on the
    mixers, and each prefill of a Mamba layer costs seconds here)."""
    calls: Counter[str] = Counter()
    model = load_model(
        interp_dirs["lfm2"], device=DEVICE, kernels=counting(get_kernels(DEVICE, "triton"), calls)
    )
    assert model.warm_up() > 0
    assert set(calls) == {*FAMILY_OPS["lfm2"], "paged_decode_attention", "paged_prefill_attention"}
    assert calls["causal_conv1d"] == len(WARM_UP_LENGTHS) * len(model.ssm_blocks)
    assert calls["causal_conv1d_varlen"] == len(model.ssm_blocks)
    assert calls["paged_decode_attention"] == len(model.attn_blocks)
    assert calls["paged_prefill_attention"] == len(model.attn_blocks)
