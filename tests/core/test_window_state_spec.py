"""`ModelSpec.window_state`: a sliding-window layer's KV is kept with each checkpoint (W
positions' KV, the largest window for every windowed layer) beside its recurrent states,
never per token; the other attention layers' KV stays per token (none in RecurrentGemma,
the full layers' in LFM3)."""

from __future__ import annotations

from marconi_ray.core.model.layers import AttentionLayer, MLPLayer, RGLRULayer
from marconi_ray.core.model.model_spec import ModelSpec
from marconi_ray.core.model.presets import get_preset

D = 64
LRU = RGLRULayer(d_model=D, lru_width=D, n_heads=4, d_conv=4)
MLP = MLPLayer(d_model=D, d_ff=128, gated=True)


def _attn(window: int | None) -> AttentionLayer:
    return AttentionLayer(d_model=D, n_heads=4, n_kv_heads=1, head_dim=16, window=window)


def test_all_windowed_layers_put_their_window_in_the_state():
    spec = ModelSpec("w", (LRU, MLP, _attn(16), MLP, LRU, MLP), dtype_bytes=2)
    row = _attn(16).kv_bytes_per_token(2)
    assert spec.window_state == 16 and spec.kv_bytes_per_token == 0 and spec.kv_bytes(99) == 0
    assert spec.window_bytes == 16 * row
    assert spec.ssm_state_bytes == LRU.state_bytes(2) * 2 + LRU.conv_bytes(2) * 2 + 16 * row
    assert spec.ssm_bytes_by_part()["window"] == 16 * row
    assert spec.window_terms()[0].window == 16  # FLOPs still priced by the window


def test_the_largest_window_sizes_every_windowed_layer():
    spec = ModelSpec("w2", (LRU, _attn(8), _attn(16)), dtype_bytes=2)
    assert spec.window_state == 16
    assert spec.window_bytes == 16 * 2 * _attn(8).kv_bytes_per_token(2)


def test_beside_full_attention_only_the_windowed_layers_go_to_the_state():
    """LFM3's layout: the full layer's KV stays per token, the windowed one's is in the
    checkpoint."""
    spec = ModelSpec("mixed", (LRU, _attn(16), _attn(None)), dtype_bytes=2)
    row = _attn(16).kv_bytes_per_token(2)
    assert spec.window_state == 16 and spec.window_bytes == 16 * row
    assert spec.kv_bytes_per_token == _attn(None).kv_bytes_per_token(2) == row
    no_attention = ModelSpec("ssm", (LRU, MLP), dtype_bytes=2)
    assert no_attention.window_state is None and no_attention.kv_bytes_per_token == 0
    assert "window" not in no_attention.ssm_bytes_by_part()


def test_recurrentgemma_2b_checkpoints_hold_a_2048_token_window():
    spec = get_preset("recurrentgemma-2b")
    attn = [x for x in spec.layers if isinstance(x, AttentionLayer)]
    assert spec.window_state == 2048 and spec.kv_bytes_per_token == 0
    assert spec.window_bytes == 2048 * sum(x.kv_bytes_per_token(2) for x in attn)
    assert spec.window_bytes > 10 * spec.ssm_recurrent_bytes  # the window dominates
