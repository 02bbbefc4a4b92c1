"""xLSTM (mLSTM layers + gated feed-forwards, no attention, no KV): the engine against
transformers on the same random fp32 weights, through the real serving path (`Engine`
with the Marconi cache), resumption from mLSTM states at any depth, batched decode, the
mLSTM mixer alone against transformers' `xLSTMLayer` (prefill, its states, cached
decode), its tensor-parallel shard, and the store's bytes against the cost model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_helpers import hf_model, prompts
from family_checks import (
    NEW_TOKENS,
    PROMPT_LEN,
    check_batched_decode,
    check_greedy_and_second_turn,
    check_logits_equal_transformers,
    check_resume_at_depths,
    hf_greedy,
)

from marconi_kernels import get_kernels
from marconi_kernels.mlstm import mlstm_state_size, pack_mlstm_state
from marconi_ray.core.model.hf.parse import spec_from_hf_config
from marconi_ray.engine.engine import Engine
from marconi_ray.engine.model.hybrid_model import HybridModel
from marconi_ray.engine.model.layers.mlstm import MLSTMMixer
from marconi_ray.engine.model.loader import load_model, read_config
from marconi_ray.engine.model.model_config import MLSTMConfig
from marconi_ray.engine.model.parallel import TPGroup
from marconi_ray.engine.model.seq_state import SeqState, StateCheckpoint
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.engine.store.state_store import StateStore
from marconi_ray.protocol.sampling import SamplingParams

ODD_DEPTHS = (1, 7, 15, 16, 17, 63, 64, 65, 129, 255, 300)
"""Odd depths, the chunk edges of the engine (64) and of transformers' preset (16)."""


@pytest.fixture(scope="module")
def xlstm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny xLSTM checkpoint (5 blocks, hidden 128, 4 heads)."""
    return make_model("tiny", "xlstm", tmp_path_factory.mktemp("xlstm") / "tiny")


def test_greedy_and_cached_second_turn_equal_transformers(xlstm_dir):
    """See `family_checks.check_greedy_and_second_turn`; the model keeps no KV and the
    store holds what the cost model prices: per layer and head C, n and m in float32."""
    engine = check_greedy_and_second_turn(xlstm_dir)
    cfg = engine.config
    assert set(cfg.blocks) == {"mlstm", "mlp"} and engine.model.attn_blocks == []
    assert cfg.mlstm is not None and cfg.logits_soft_cap == 200.0
    raw = read_config(xlstm_dir)[1]
    spec = spec_from_hf_config(raw, dtype_bytes=4, state_dtype_bytes=4)
    m = cfg.mlstm
    per_layer = m.n_heads * (m.qk_head_dim * m.v_head_dim + m.qk_head_dim + 1) * 4
    assert engine.store.state_bytes == spec.ssm_state_bytes == 5 * per_layer
    assert spec.kv_bytes_per_token == 0


def test_two_more_cached_turns_equal_transformers(xlstm_dir):
    """A 300-token first turn and two more turns, each extending the whole conversation:
    every later turn is served from the cached state of the one before (its cached
    tokens reported) and its greedy tokens equal transformers' on the whole history."""
    ref = hf_model(xlstm_dir)
    engine = Engine(xlstm_dir, system="marconi", cache_bytes=10**8)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    vocab = engine.config.vocab_size
    history = prompts(51, 1, PROMPT_LEN, vocab)[0]
    cached = 0
    for turn in range(3):
        out = engine.generate(history, params)
        assert out.usage.cached_tokens == cached, turn
        assert list(out.tokens) == hf_greedy(ref, history, NEW_TOKENS), turn
        history = history + list(out.tokens)
        cached = len(history)
        history += prompts(52 + turn, 1, 25, vocab)[0]


def test_logits_equal_transformers(xlstm_dir):
    """See `family_checks.check_logits_equal_transformers` (soft-capped logits)."""
    check_logits_equal_transformers(xlstm_dir)


@pytest.mark.parametrize("part", ["mlstm", "ffn", "gates"])
def test_every_part_of_the_preset_moves_the_tokens(xlstm_dir, part):
    """The tiny preset's mLSTM layers, feed-forwards and gates all matter (transformers'
    init zeroes the gates; the preset redraws them), so the comparisons with transformers
    would see a broken one: dropping any changes the greedy token at many positions."""
    model = load_model(xlstm_dir)
    ids = torch.randint(3, 250, (120,), generator=torch.Generator().manual_seed(8))
    want = model.forward_logits(ids).argmax(-1)
    with torch.no_grad():
        for i, block in enumerate(model.layers):
            mixer = block.mixer
            if part == "mlstm" and isinstance(mixer, MLSTMMixer):
                mixer.out_proj.weight.zero_()
            elif part == "gates" and isinstance(mixer, MLSTMMixer):
                mixer.igate_preact.weight.zero_()
                mixer.fgate_preact.weight.zero_()
            elif part == "ffn" and model.cfg.blocks[i] == "mlp":
                for p in mixer.parameters():
                    p.zero_()
    changed = (model.forward_logits(ids).argmax(-1) != want).float().mean().item()
    assert changed > 0.05, changed


def _mlstm_state_only(model: HybridModel, ck: StateCheckpoint, resumed: SeqState) -> None:
    """An xLSTM checkpoint is one float32 [heads, P] packed state per layer (no conv),
    and the store keeps exactly those bytes."""
    m = model.cfg.mlstm
    assert m is not None
    for i in model.ssm_blocks:
        assert ck.conv[i].numel() == 0
        assert ck.ssm[i].shape == (m.n_heads, mlstm_state_size(m.qk_head_dim, m.v_head_dim))
        assert ck.ssm[i].dtype == torch.float32
    store = StateStore(model)
    held = store._states[store.put_state(ck)]
    real = sum(t.numel() * t.element_size() for t in (*held.conv.values(), *held.ssm.values()))
    assert real == store.state_bytes


def test_resume_from_states_at_any_depth_equals_uncached(xlstm_dir):
    """Resuming from mLSTM states alone at odd depths and the chunk edges (see
    `family_checks.check_resume_at_depths`)."""
    model = check_resume_at_depths(xlstm_dir, on_checkpoint=_mlstm_state_only, depths=ODD_DEPTHS)
    assert model.kv_shapes() == {}


def test_batched_decode_equals_one_sequence_at_a_time(xlstm_dir):
    """See `family_checks.check_batched_decode`."""
    model = check_batched_decode(xlstm_dir)
    assert all(isinstance(model.ssm(i), MLSTMMixer) for i in model.ssm_blocks)


D = 128


def _hf_layer(heads: int = 4):
    """transformers' `xLSTMLayer` (random weights, its own chunk of 16 tokens, gates wide
    enough for the soft cap to bend) and the matching `MLSTMConfig`."""
    import transformers
    from transformers.models.xlstm.modeling_xlstm import xLSTMLayer

    config = transformers.xLSTMConfig(hidden_size=D, num_heads=heads, chunk_size=16)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        hf = xLSTMLayer(config).eval()
        for name, p in hf.named_parameters():
            std = 1.0 if "igate" in name or "fgate" in name else 0.1
            torch.nn.init.normal_(p, std=std)
    cfg = MLSTMConfig(heads, D // 2 // heads, D // heads, 15.0, 1e-6, 1e-6)
    return hf, cfg


def _mixer(hf, cfg: MLSTMConfig, tp: TPGroup | None = None) -> MLSTMMixer:
    """A (shard of the) engine mixer holding `hf`'s weights."""
    tp = tp or TPGroup()
    mixer = MLSTMMixer(D, cfg, "x", tp, torch.float32, get_kernels("cpu", "ref"))
    qk = slice(*(i * cfg.qk_head_dim for i in tp.part(cfg.n_heads)))
    v = slice(*(i * cfg.v_head_dim for i in tp.part(cfg.n_heads)))
    heads = slice(*tp.part(cfg.n_heads))
    with torch.no_grad():
        for name, rows in (("q", qk), ("k", qk), ("v", v), ("ogate_preact", v)):
            getattr(mixer, name).weight.copy_(getattr(hf, name).weight[rows])
        for name in ("igate_preact", "fgate_preact"):
            getattr(mixer, name).weight.copy_(getattr(hf, name).weight[heads])
            getattr(mixer, name).bias.copy_(getattr(hf, name).bias[heads])
        mixer.norm_weight.copy_(hf.multihead_norm.weight[v])
        mixer.out_proj.weight.copy_(hf.out_proj.weight[:, v])
    return mixer


def test_mixer_equals_transformers_prefill_states_and_cached_decode():
    """The mixer's prefill (emitting a state mid-chunk), its final (C, n, m) and its
    decode from that state equal transformers' chunkwise + recurrent prefill, its state
    and its cached token-by-token path."""
    hf, cfg = _hf_layer()
    mixer = _mixer(hf, cfg)
    x = torch.randn(1, 45, D, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, (C, n, m) = hf(x[:, :40])
        state = (C.clone(), n.clone(), m.clone())
        want_steps = []
        for t in range(40, 45):
            y, state = hf(x[:, t : t + 1], state)
            want_steps.append(y[0, 0])
    y, _, ssm, _, emitted = mixer.prefill(x[0, :40], None, None, emit_at=[23])
    torch.testing.assert_close(y, want[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ssm, pack_mlstm_state(C, n, m.squeeze(-1))[0], atol=1e-5, rtol=1e-5)
    conv = torch.zeros(1, 0, 0)
    rows = ssm[None].clone()
    steps = torch.cat([mixer.decode(x[:, t], conv, rows) for t in range(40, 45)])
    torch.testing.assert_close(steps, torch.stack(want_steps), atol=1e-5, rtol=1e-5)
    _, _, mid, _, _ = mixer.prefill(x[0, :23], None, None)
    torch.testing.assert_close(emitted[0], mid, atol=1e-6, rtol=1e-6)


def test_shard_splits_heads_and_its_outputs_sum_to_the_layer():
    """A rank's shard holds half the heads (q/k/v/gate rows of its heads, its norm
    channels, out_proj's columns) and half the state; the norm spans one head, so the
    two ranks' partial outputs (before out_proj's all-reduce) sum to the whole layer's,
    in prefill and in decode."""
    hf, cfg = _hf_layer()
    whole = _mixer(hf, cfg)
    x = torch.randn(30, D, generator=torch.Generator().manual_seed(3))
    want, _, want_ssm, _, _ = whole.prefill(x, None, None)

    class Alone(TPGroup):
        """Rank r of 2 whose all-reduce leaves its partial sum as it is."""

        def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
            return x

    shards = [_mixer(hf, cfg, Alone(r, 2)) for r in (0, 1)]
    ys, ssms = [], []
    for shard in shards:
        assert shard.heads == cfg.n_heads // 2
        assert shard.q.weight.shape == (cfg.qk_width // 2, D)
        assert shard.out_proj.weight.shape == (D, cfg.v_width // 2)
        y, _, ssm, _, _ = shard.prefill(x, None, None)
        ys.append(y)
        ssms.append(ssm)
    torch.testing.assert_close(ys[0] + ys[1], want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat(ssms), want_ssm)
    step = torch.randn(1, D, generator=torch.Generator().manual_seed(4))
    conv = torch.zeros(1, 0, 0)
    want_step = whole.decode(step, conv, want_ssm[None].clone())
    parts = [s.decode(step, conv, ssm[None].clone()) for s, ssm in zip(shards, ssms, strict=True)]
    torch.testing.assert_close(parts[0] + parts[1], want_step, atol=1e-5, rtol=1e-5)
