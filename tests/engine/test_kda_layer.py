"""The engine's KDA mixer against transformers' `KimiLinearDeltaAttention` on the same
random weights: a prefill, decode steps, resuming from a state emitted mid-prefill, and
two tensor-parallel shards summing to the whole layer."""

from __future__ import annotations

import pytest
import torch
from kimi_helpers import load_shard, randomize, tiny_config

from marconi_kernels import get_kernels
from marconi_ray.engine.model.layers.kda import KDAMixer
from marconi_ray.engine.model.model_config import KDAConfig
from marconi_ray.engine.model.parallel import TPGroup

kl = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")

L, STEPS = 37, 3
TOL = 2e-5


def _layers(tp: TPGroup | None = None):
    tp = tp or TPGroup()
    config = tiny_config()
    ref = kl.KimiLinearDeltaAttention(config, 0).eval()
    weights = randomize(ref, seed=5)
    cfg = KDAConfig(config.linear_num_heads, config.linear_head_dim, 4, chunk_size=16)
    mixer = KDAMixer(
        config.hidden_size, cfg, config.rms_norm_eps, "self_attn", tp, torch.float32,
        get_kernels("cpu", "ref"),
    )  # fmt: skip
    load_shard(mixer, weights, "self_attn", tp)
    return config, ref, mixer


def _hf_run(ref, config, x):
    """transformers' layer over x [1, n, D] token by token after a prefill of the first L
    (its cached path: the chunked prefill, then the recurrent step)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    with torch.no_grad():
        outs = [ref(x[:, :L], cache=cache)]
        for t in range(L, x.shape[1]):
            outs.append(ref(x[:, t : t + 1], cache=cache))
    return torch.cat(outs, dim=1)[0]


def test_prefill_and_decode_equal_transformers():
    config, ref, mixer = _layers()
    x = torch.randn(1, L + STEPS, config.hidden_size, generator=torch.Generator().manual_seed(1))
    want = _hf_run(ref, config, x)
    y, conv, ssm, _, _ = mixer.prefill(x[0, :L], None, None)
    torch.testing.assert_close(y, want[:L], atol=TOL, rtol=0)
    conv, ssm = conv[None].clone(), ssm[None].clone()
    for t in range(L, L + STEPS):
        out = mixer.decode(x[0, t : t + 1], conv, ssm)
        torch.testing.assert_close(out[0], want[t], atol=TOL, rtol=0)


@pytest.mark.parametrize("depth", [1, 3, 4, 16, 17, 30])
def test_resume_from_an_emitted_state(depth):
    config, _, mixer = _layers()
    x = torch.randn(L, config.hidden_size, generator=torch.Generator().manual_seed(2))
    y, conv, ssm, conv_e, ssm_e = mixer.prefill(x, None, None, emit_at=[depth])
    y2, conv2, ssm2, _, _ = mixer.prefill(x[depth:], conv_e[0], ssm_e[0])
    torch.testing.assert_close(y2, y[depth:], atol=TOL, rtol=0)
    torch.testing.assert_close(conv2, conv, atol=0, rtol=0)
    torch.testing.assert_close(ssm2, ssm, atol=TOL, rtol=0)
    assert ssm.dtype == torch.float32 and ssm.shape == (4, 8, 8) and conv.shape == (96, 4)


def test_two_shards_sum_to_the_whole_layer():
    """Each of two ranks holds 2 of the 4 heads (their projections, conv channels, gates
    and states); the partial o_proj products of both sum to the one-rank output."""
    config, _, whole = _layers()
    x = torch.randn(20, config.hidden_size, generator=torch.Generator().manual_seed(3))
    want = whole.prefill(x, None, None)[0]
    total = torch.zeros_like(want)
    for rank in range(2):
        _, _, shard = _layers(TPGroup(rank, 2))
        shard.o_proj.tp = TPGroup()  # the partial product, all-reduced here by the sum
        y, conv, ssm, _, _ = shard.prefill(x, None, None)
        assert ssm.shape == (2, 8, 8) and conv.shape == (48, 4)
        total += y
    torch.testing.assert_close(total, want, atol=TOL, rtol=0)


def test_packed_parts_equal_each_part_alone():
    """Two sequences' prefills in one call (the varlen conv and KDA), one resuming from
    states, emitting at its own depths, equal each run alone."""
    from marconi_ray.engine.model.layers.packed import PackedPart

    config, _, mixer = _layers()
    x = torch.randn(30, config.hidden_size, generator=torch.Generator().manual_seed(6))
    _, conv0, ssm0, _, _ = mixer.prefill(x[20:], None, None)
    y, outs = mixer.prefill_packed(
        x[:20], [PackedPart(0, 7, emit_at=(3, 7)), PackedPart(7, 20, conv0, ssm0, (1, 13))]
    )
    alone = [mixer.prefill(x[:7], None, None, (3, 7)), mixer.prefill(x[7:20], conv0, ssm0, (1, 13))]
    for (ya, conv, ssm, conv_e, ssm_e), out, rows in zip(
        alone, outs, (slice(0, 7), slice(7, 20)), strict=True
    ):
        torch.testing.assert_close(y[rows], ya, atol=TOL, rtol=0)
        torch.testing.assert_close(out.conv, conv, atol=0, rtol=0)
        torch.testing.assert_close(out.ssm, ssm, atol=TOL, rtol=0)
        torch.testing.assert_close(out.conv_emitted, conv_e, atol=0, rtol=0)
        torch.testing.assert_close(out.ssm_emitted, ssm_e, atol=TOL, rtol=0)
