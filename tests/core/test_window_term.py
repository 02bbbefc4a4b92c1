"""Sliding-window attention in the cost model (`core.model.window_term`): its score/AV
FLOPs grow as n * min(n, W), not n * n, through the layer spec, the model spec, the cost
model the cache prices with and its snapshot."""

from __future__ import annotations

import pytest
from transformers import RecurrentGemmaConfig

from marconi_ray.core.cache import cache_codec
from marconi_ray.core.cache.prefix_cache import CacheConfig, PrefixCache
from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.core.model.hf.parse import spec_from_hf_config
from marconi_ray.core.model.layers import AttentionLayer, Mamba2Layer, MLPLayer
from marconi_ray.core.model.model_spec import ModelSpec
from marconi_ray.core.model.window_term import WindowTerm, group_windows
from marconi_ray.core.wire import pack

W = 16


def _spec() -> ModelSpec:
    full = AttentionLayer(64, 4, 2, 16)
    windowed = AttentionLayer(64, 4, 2, 16, window=W)
    ssm = Mamba2Layer(64, 4, 32, 1, 16, 4)
    return ModelSpec("m", (full, windowed, windowed, ssm, MLPLayer(64, 128, True)))


def test_a_windowed_layer_is_quadratic_to_its_window_then_linear() -> None:
    layer = AttentionLayer(64, 4, 2, 16, window=W)
    full = AttentionLayer(64, 4, 2, 16)
    assert layer.total_flops_coeffs() == (full.total_flops_coeffs()[0], 0.0)
    assert layer.window_term() == WindowTerm(4.0 * 64, W)
    assert layer.kv_elements_per_token() == full.kv_elements_per_token()  # every row kept
    term = layer.window_term()
    assert term is not None
    assert [term.pairs(n) for n in (0, 1, W - 1, W, W + 1, 3 * W)] == [
        0, 1, (W - 1) ** 2, W * W, (W + 1) * W, 3 * W * W,
    ]  # fmt: skip
    with pytest.raises(ValueError, match="window"):
        AttentionLayer(64, 4, 2, 16, window=0)


def test_the_model_spec_and_cost_model_price_windows_apart() -> None:
    spec = _spec()
    (term,) = spec.window_terms()
    assert term == WindowTerm(2 * 4.0 * 64, W)  # the two windowed layers, one window
    c1, c2 = spec.flops_coeffs()
    assert c2 == 4.0 * 64  # the full attention layer alone (Mamba-2 is linear)
    for n in (1, W, 5 * W + 3):
        assert spec.total_flops(n) == pytest.approx(
            c1 * n + c2 * n * n + term.coefficient * n * min(n, W)
        )
    cost = CostModel.from_spec(spec)
    assert cost.windows == (term,)
    for n_new, n_prefix in ((7, 0), (3, W - 2), (40, 2 * W), (1, 1000)):
        want = spec.total_flops(n_prefix + n_new) - spec.total_flops(n_prefix)
        assert cost.prefill_flops(n_new, n_prefix) == pytest.approx(want, rel=1e-12)
        assert spec.prefill_flops(n_new, n_prefix) == pytest.approx(want, rel=1e-12)
        by_kind = spec.prefill_flops_by_kind(n_new, n_prefix)
        assert sum(by_kind.values()) == pytest.approx(want, rel=1e-12)
    # past the window a windowed layer's next token costs the same at any depth
    windowed_only = CostModel(0.0, 0.0, 10, 100, (term,))
    assert windowed_only.prefill_flops(1, 10 * W) == windowed_only.prefill_flops(1, 1000 * W)
    assert windowed_only.prefill_flops(1, 2) < windowed_only.prefill_flops(1, W // 2)


def test_recurrent_gemma_has_no_quadratic_term_left() -> None:
    """All its attention is windowed: the cost model of its config holds a window term
    at `attention_window_size` and no n*n term."""
    raw = RecurrentGemmaConfig(
        hidden_size=64, num_attention_heads=4, num_hidden_layers=6, attention_window_size=32,
        intermediate_size=96, lru_width=64, vocab_size=300,
    ).to_dict()  # fmt: skip
    spec = spec_from_hf_config(raw)
    assert spec.flops_coeffs()[1] == 0.0
    assert [t.window for t in spec.window_terms()] == [32]


def test_window_terms_group_by_window() -> None:
    terms = [WindowTerm(1.0, 8), WindowTerm(2.0, 4), WindowTerm(3.0, 8)]
    assert group_windows(terms) == (WindowTerm(2.0, 4), WindowTerm(4.0, 8))
    with pytest.raises(ValueError, match="coefficient"):
        WindowTerm(-1.0, 8)


def test_a_snapshot_keeps_the_windows_and_an_older_one_has_none() -> None:
    cost = CostModel(1e3, 1.0, 10, 100, (WindowTerm(8.0, W),))
    cache = PrefixCache(cost, CacheConfig(20_000, "marconi", "flop_aware", 0.5))
    restored = cache_codec.loads(cache_codec.dumps(cache))
    assert restored.cost == cost
    record = cache_codec.to_record(cache, open_plans=False)
    del record["cost"]["windows"]  # type: ignore[index, union-attr]
    assert cache_codec.loads(pack(record)).cost.windows == ()
    record["cost"]["windows"] = [[8.0, 0]]  # type: ignore[index]
    with pytest.raises(ValueError, match=r"cache\.cost\.windows\[0\]\[1\]"):
        cache_codec.loads(pack(record))
