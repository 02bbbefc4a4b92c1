"""ModelSpec and layer specs: the paper's Appendix A numbers, FLOP identities, validation."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from marconi_ray.core.model.layers import (
    LAYER_KINDS,
    AttentionLayer,
    LinearLayer,
    Mamba1Layer,
    Mamba2Layer,
    MLPLayer,
    MoELayer,
    PaperSSMLayer,
)
from marconi_ray.core.model.model_spec import ModelSpec
from marconi_ray.core.model.presets import PRESETS, get_preset, paper_7b

D = 4096
N = 128
LENGTHS = [1, 7, 100, 1000, 4096, 10_000, 32_768]


@pytest.fixture(scope="module")
def paper() -> ModelSpec:
    return paper_7b()


# ---- the paper's Appendix A --------------------------------------------------------------


def test_paper_layer_mix(paper: ModelSpec) -> None:
    assert (paper.n_attention, paper.n_ssm, paper.n_mlp) == (4, 24, 28)
    assert len(paper.layers) == 56
    assert paper.dtype_bytes == 2
    assert paper.vocab_size == 32000
    assert get_preset("paper-7b") == paper
    assert "paper-7b" in PRESETS


@pytest.mark.parametrize("n", LENGTHS)
def test_paper_flops_per_kind_match_appendix_a(paper: ModelSpec, n: int) -> None:
    by_kind = paper.prefill_flops_by_kind(n)
    assert by_kind["attention"] == 4 * (8 * n * D**2 + 4 * n**2 * D)
    assert by_kind["mlp"] == 28 * (16 * n * D**2)
    assert by_kind["ssm"] == 24 * (12 * n * D**2 + 16 * n * D * N + 10 * n * D)
    assert by_kind["linear"] == 0
    assert set(by_kind) == set(LAYER_KINDS)
    assert sum(by_kind.values()) == paper.prefill_flops(n) == paper.total_flops(n)


@pytest.mark.parametrize("n_prefix", [0, 1, 500, 9000])
def test_paper_flops_by_kind_after_prefix(paper: ModelSpec, n_prefix: int) -> None:
    n = 777
    by_kind = paper.prefill_flops_by_kind(n, n_prefix)
    end = n_prefix + n
    assert by_kind["attention"] == 4 * (8 * n * D**2 + 4 * (end**2 - n_prefix**2) * D)
    assert by_kind["ssm"] == 24 * (12 * n * D**2 + 16 * n * D * N + 10 * n * D)
    # Artifact bug 2: the MLP FLOPs saved over a prefix subtract the prefix's MLP FLOPs
    # (not its attention FLOPs), so they are exactly those of the n new tokens.
    assert by_kind["mlp"] == 28 * 16 * n * D**2
    assert sum(by_kind.values()) == pytest.approx(paper.prefill_flops(n, n_prefix), rel=1e-12)


def test_paper_state_sizes(paper: ModelSpec) -> None:
    ssm = next(x for x in paper.layers if isinstance(x, PaperSSMLayer))
    attn = next(x for x in paper.layers if isinstance(x, AttentionLayer))
    assert ssm.state_bytes(2) == 2 * D * N == 1024 * 1024  # 1 MiB per SSM layer
    assert attn.kv_bytes_per_token(2) == 4 * D == 16 * 1024  # 16 KiB per token per layer
    assert paper.kv_bytes_per_token == 4 * 4 * D
    assert paper.kv_bytes(10) == 10 * 4 * 4 * D
    parts = paper.ssm_bytes_by_part()
    assert parts == {"recurrent": 24 * 2 * D * N, "conv": 24 * (2 * D + 2 * N) * 4 * 2}
    conv_share = paper.ssm_conv_bytes / paper.ssm_state_bytes
    assert 0.060 < conv_share < 0.062  # paper: conv is 6.1% of the SSM state
    assert paper.ssm_state_bytes == paper.ssm_recurrent_bytes + paper.ssm_conv_bytes
    assert 26e6 < paper.ssm_state_bytes < 28e6  # ~27 MB per checkpoint
    # one checkpoint weighs as much as ~400 tokens of KV (docs/ARCHITECTURE.md)
    assert 350 < paper.ssm_state_bytes / paper.kv_bytes_per_token < 450


def test_paper_ssm_flop_efficiency_grows_linearly(paper: ModelSpec) -> None:
    """Per SSM layer: (12LD^2 + 16LDN + 10LD) / 2DN = L * (6D/N + 8 + 5/N) ~ 200 L."""
    per_token = 6 * D / N + 8 + 5 / N
    for n in LENGTHS:
        per_layer_flops = paper.prefill_flops_by_kind(n)["ssm"] / 24
        eff = per_layer_flops / (2 * D * N)
        assert eff == pytest.approx(n * per_token, rel=1e-12)
        assert 199 * n < eff < 201 * n


def test_paper_attention_efficiency_is_near_constant(paper: ModelSpec) -> None:
    """Per attention layer: (8LD^2 + 4L^2 D) / 4LD = 2D + L."""
    for n in LENGTHS:
        eff = paper.prefill_flops_by_kind(n)["attention"] / 4 / (n * 4 * D)
        assert eff == pytest.approx(2 * D + n, rel=1e-12)


def test_flop_efficiency_helper(paper: ModelSpec) -> None:
    n, p = 1000, 300
    expected = paper.prefill_flops(n, p) / (n * paper.kv_bytes_per_token + paper.ssm_state_bytes)
    assert paper.flop_efficiency(n, p) == pytest.approx(expected, rel=1e-12)
    kv_only = paper.prefill_flops(n, p) / (n * paper.kv_bytes_per_token)
    assert paper.flop_efficiency(n, p, with_state=False) == pytest.approx(kv_only, rel=1e-12)
    assert paper.flop_efficiency(0, p, with_state=False) == 0.0
    assert paper.flop_efficiency(10_000) > paper.flop_efficiency(100)


# ---- FLOP identities ---------------------------------------------------------------------


@given(st.integers(0, 200_000), st.integers(0, 200_000))
def test_prefill_is_difference_of_totals(n_new: int, n_prefix: int) -> None:
    spec = paper_7b()
    expected = spec.total_flops(n_prefix + n_new) - spec.total_flops(n_prefix)
    assert spec.prefill_flops(n_new, n_prefix) == pytest.approx(expected, rel=1e-9, abs=1.0)


@given(st.integers(0, 100_000), st.integers(0, 100_000))
def test_prefill_is_additive(a: int, b: int) -> None:
    spec = paper_7b()
    split = spec.prefill_flops(a, 0) + spec.prefill_flops(b, a)
    assert split == pytest.approx(spec.prefill_flops(a + b, 0), rel=1e-12, abs=1.0)


def test_flops_coeffs_are_the_polynomial(paper: ModelSpec) -> None:
    c1, c2 = paper.flops_coeffs()
    assert c2 == 4 * 4 * D
    for n in LENGTHS:
        assert paper.total_flops(n) == c1 * n + c2 * n * n
    assert paper.total_flops(0) == 0.0
    assert paper.prefill_flops(0, 1234) == 0.0


# ---- layer formulas ----------------------------------------------------------------------


def test_mha_attention_matches_paper_formula() -> None:
    c1, c2 = AttentionLayer(256, 8, 8, 32).total_flops_coeffs()
    assert (c1, c2) == (8 * 256**2, 4 * 256)


def test_gqa_reduces_kv_bytes_and_projection_flops() -> None:
    mha = AttentionLayer(512, 16, 16, 32)
    gqa = AttentionLayer(512, 16, 4, 32)
    assert mha.kv_bytes_per_token(2) == 2 * 16 * 32 * 2
    assert mha.kv_bytes_per_token(2) / gqa.kv_bytes_per_token(2) == 16 / 4
    assert gqa.total_flops_coeffs()[0] < mha.total_flops_coeffs()[0]
    assert gqa.total_flops_coeffs()[1] == mha.total_flops_coeffs()[1]


def test_attention_input_dim() -> None:
    c1, _ = AttentionLayer(64, 4, 4, 32, input_dim=128).total_flops_coeffs()
    assert c1 == 2 * 128 * 128 + 4 * 128 * 128 + 2 * 128 * 64


def test_mlp_plain_and_gated() -> None:
    plain = MLPLayer(1024, 4096, gated=False)
    gated = MLPLayer(1024, 4096, gated=True)
    assert plain.total_flops_coeffs() == (16 * 1024**2, 0.0)
    assert gated.total_flops_coeffs()[0] == 1.5 * plain.total_flops_coeffs()[0]
    assert plain.kv_bytes_per_token(2) == plain.state_bytes(2) == plain.conv_bytes(2) == 0


def test_moe_counts_only_top_k_experts() -> None:
    d, f = 256, 512
    moe8 = MoELayer(d, f, n_experts=8, top_k=2, gated=True)
    moe64 = MoELayer(d, f, n_experts=64, top_k=2, gated=True)
    dense = MLPLayer(d, f, gated=True).total_flops_coeffs()[0]
    assert moe8.total_flops_coeffs()[0] == 2 * d * 8 + 2 * dense
    assert moe64.total_flops_coeffs()[0] - moe8.total_flops_coeffs()[0] == 2 * d * (64 - 8)
    shared = MoELayer(d, f, 8, 2, gated=False, n_shared_experts=1, shared_d_ff=128)
    assert shared.total_flops_coeffs()[0] == 2 * d * 8 + 2 * 4 * d * f + 4 * d * 128
    latent = MoELayer(d, f, 8, 2, gated=False, latent_dim=64)
    assert latent.total_flops_coeffs()[0] == 2 * d * 8 + 4 * d * 64 + 2 * 4 * 64 * f


def test_mamba2_formula_and_paper_terms() -> None:
    d, n = 512, 64
    layer = Mamba2Layer(d, n_heads=16, head_dim=64, n_groups=1, d_state=n, d_conv=4)
    di, conv_dim = 2 * d, 2 * d + 2 * n
    assert (layer.d_inner, layer.conv_dim) == (di, conv_dim)
    c1, c2 = layer.total_flops_coeffs()
    paper_terms = 12 * d**2 + 16 * d * n + 10 * d
    extra = 2 * d * (2 * n + 16) + 2 * conv_dim * 4
    assert (c1, c2) == (paper_terms + extra, 0.0)
    assert layer.state_bytes(2) == 16 * 64 * n * 2
    assert layer.conv_bytes(2) == conv_dim * 4 * 2
    assert layer.kv_bytes_per_token(2) == 0


def test_mamba1_formula() -> None:
    d, di, n, k, r = 64, 128, 16, 4, 4
    layer = Mamba1Layer(d, di, n, k, r)
    expected = 4 * d * di + 2 * di * k + 2 * di * (r + 2 * n) + 2 * r * di
    expected += 8 * di * n + 5 * di + 2 * di * d
    assert layer.total_flops_coeffs() == (expected, 0.0)
    assert layer.state_bytes(4) == di * n * 4
    assert layer.conv_bytes(4) == di * k * 4


def test_linear_layer_kind_and_flops() -> None:
    spec = ModelSpec("t", (LinearLayer(8, 16), MLPLayer(8, 32, gated=False)))
    assert spec.prefill_flops_by_kind(10)["linear"] == 10 * 2 * 8 * 16
    assert spec.count("linear") == 1
    assert (spec.n_attention, spec.n_ssm, spec.n_mlp) == (0, 0, 1)
    assert spec.ssm_state_bytes == spec.kv_bytes_per_token == 0


def test_dtype_bytes_scales_state(paper: ModelSpec) -> None:
    fp32 = dataclasses.replace(paper, dtype_bytes=4)
    assert fp32.kv_bytes_per_token == 2 * paper.kv_bytes_per_token
    assert fp32.ssm_state_bytes == 2 * paper.ssm_state_bytes
    assert fp32.flops_coeffs() == paper.flops_coeffs()


def test_spec_is_hashable_and_picklable(paper: ModelSpec) -> None:
    clone = pickle.loads(pickle.dumps(paper))
    assert clone == paper and hash(clone) == hash(paper)
    assert clone.flops_coeffs() == paper.flops_coeffs()
    assert ModelSpec("x", [MLPLayer(4, 8, gated=False)]).layers == (MLPLayer(4, 8, False),)  # type: ignore[arg-type]


# ---- validation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda s: s.total_flops(-1), "n"),
        (lambda s: s.prefill_flops(-5), "n_new"),
        (lambda s: s.prefill_flops(5, -1), "n_prefix"),
        (lambda s: s.prefill_flops_by_kind(1, -2), "n_prefix"),
        (lambda s: s.kv_bytes(-3), "n_tokens"),
        (lambda s: s.prefill_flops(1.5), "n_new"),
        (lambda s: s.prefill_flops(True), "n_new"),
        (lambda s: s.count("conv"), "conv"),
    ],
)
def test_bad_token_counts_raise(paper: ModelSpec, call: object, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        call(paper)  # type: ignore[operator]


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda: AttentionLayer(0, 4, 4, 16), "d_model"),
        (lambda: AttentionLayer(64, 4, 3, 16), "n_kv_heads"),
        (lambda: AttentionLayer(64, 4, 4, -16), "head_dim"),
        (lambda: AttentionLayer(64, 4, 4, 16, input_dim=0), "input_dim"),
        (lambda: MLPLayer(64, 0, gated=True), "d_ff"),
        (lambda: MoELayer(64, 64, 4, 5, gated=True), "top_k"),
        (lambda: MoELayer(64, 64, 4, 2, gated=True, n_shared_experts=1), "shared_d_ff"),
        (lambda: MoELayer(64, 64, 4, 2, gated=True, n_shared_experts=-1), "n_shared_experts"),
        (lambda: Mamba2Layer(64, 8, 16, 3, 16, 4), "n_groups"),
        (lambda: Mamba2Layer(64, 8, 16, 1, 0, 4), "d_state"),
        (lambda: Mamba1Layer(64, 128, 16, 4, 0), "dt_rank"),
        (lambda: PaperSSMLayer(64, 16, 0, 4), "conv_channels"),
        (lambda: LinearLayer(64, 0), "d_out"),
        (lambda: ModelSpec("", (MLPLayer(4, 8, False),)), "name"),
        (lambda: ModelSpec("x", ()), "layers"),
        (lambda: ModelSpec("x", (MLPLayer(4, 8, False),), dtype_bytes=0), "dtype_bytes"),
        (lambda: ModelSpec("x", (MLPLayer(4, 8, False),), vocab_size=-1), "vocab_size"),
        (lambda: ModelSpec("x", (MLPLayer(4, 8, False),), max_position=0), "max_position"),
        (lambda: ModelSpec("x", ("mlp",)), "layers"),  # type: ignore[arg-type]
        (lambda: MLPLayer(4, 8, False).kv_bytes_per_token(0), "dtype_bytes"),
        (lambda: get_preset("paper-70b"), "paper-70b"),
    ],
)
def test_bad_specs_raise(make: object, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        make()  # type: ignore[operator]


def test_recurrent_states_priced_at_their_own_dtype() -> None:
    """`state_dtype_bytes` prices only the recurrent states apart (fp32 states beside a
    bf16 cache); conv states and KV stay at `dtype_bytes`; a bad value is named."""
    layers = (AttentionLayer(64, 4, 2, 16), Mamba2Layer(64, 4, 32, 2, 16, 4))
    bf16 = ModelSpec("m", layers, dtype_bytes=2)
    mixed = ModelSpec("m", layers, dtype_bytes=2, state_dtype_bytes=4)
    assert mixed.ssm_recurrent_bytes == 2 * bf16.ssm_recurrent_bytes
    assert mixed.ssm_conv_bytes == bf16.ssm_conv_bytes
    assert mixed.kv_bytes_per_token == bf16.kv_bytes_per_token
    with pytest.raises(ValueError, match="state_dtype_bytes"):
        ModelSpec("m", layers, state_dtype_bytes=0)
