"""MiniMax (lightning attention + softmax attention + MoE, post-norm residuals with
alpha / beta factors): the engine against transformers on the same random fp32 weights,
through the real serving path (`Engine` with the Marconi cache), resumption from
lightning states at any depth, batched decode, the lightning mixer alone against
transformers' `MiniMaxLightningAttention` (prefill, then cached decode, slopes of every
layer), its tensor-parallel shard, and the store's bytes against the cost model."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import pytest
import torch
from family_checks import (
    check_batched_decode,
    check_greedy_and_second_turn,
    check_resume_at_depths,
)

from marconi_kernels import get_kernels
from marconi_ray.core.model.hf.parse import spec_from_hf_config
from marconi_ray.engine.model.hybrid_model import HybridModel
from marconi_ray.engine.model.layers.lightning import LightningMixer
from marconi_ray.engine.model.loader import load_model, read_config
from marconi_ray.engine.model.model_config import LightningConfig
from marconi_ray.engine.model.parallel import TPGroup
from marconi_ray.engine.model.seq_state import SeqState, StateCheckpoint
from marconi_ray.engine.presets.minimax_presets import MINIMAX_FACTORS
from marconi_ray.engine.store.state_store import StateStore


def test_greedy_and_cached_second_turn_equal_transformers(model_dirs):
    """See `family_checks.check_greedy_and_second_turn`; the store holds what the cost
    model prices: float32 lightning states of heads * head_dim^2 and no conv state."""
    engine = check_greedy_and_second_turn(model_dirs["minimax"])
    cfg = engine.config
    assert {"lightning", "attention", "moe"} <= set(cfg.blocks)
    assert cfg.norm_residual and set(cfg.residual_alpha) == {
        MINIMAX_FACTORS[f"{k}_alpha_factor"] for k in ("full_attn", "linear_attn", "mlp")
    }
    raw = read_config(model_dirs["minimax"])[1]
    spec = spec_from_hf_config(raw, dtype_bytes=4, state_dtype_bytes=4)
    assert cfg.lightning is not None
    n = len(cfg.layers_of("lightning"))
    assert engine.store.state_bytes == spec.ssm_state_bytes
    assert spec.ssm_state_bytes == n * cfg.lightning.n_heads * cfg.lightning.head_dim**2 * 4
    assert engine.store.kv_bytes_per_token == spec.kv_bytes_per_token


@pytest.mark.parametrize("kind", ["lightning", "attention", "moe", "factors"])
def test_every_part_of_the_preset_moves_the_tokens(model_dirs, kind):
    """The tiny preset's blocks write a real share of the (post-norm) residual stream
    (`minimax_lift.balance_writes`), so the comparisons with transformers above would
    see a broken lightning layer, softmax attention, MoE or residual factor: dropping
    any of them changes the greedy token at many positions of a 120-token prompt."""
    model = load_model(model_dirs["minimax"])
    ids = torch.randint(3, 250, (120,), generator=torch.Generator().manual_seed(8))
    want = model.forward_logits(ids).argmax(-1)
    with torch.no_grad():
        if kind == "factors":
            model.cfg = dataclasses.replace(model.cfg, residual_alpha=(), residual_beta=())
        for i, block in enumerate(model.layers):
            mixer = block.mixer
            if kind == "lightning" and isinstance(mixer, LightningMixer):
                mixer.out_proj.weight.zero_()
            elif kind == "attention" and model.cfg.blocks[i] == "attention":
                mixer.o.weight.zero_()
            elif kind == "moe" and model.cfg.blocks[i] == "moe":
                mixer.w_down.zero_()
    changed = (model.forward_logits(ids).argmax(-1) != want).float().mean().item()
    assert changed > 0.05, changed


def _lightning_state_only(model: HybridModel, ck: StateCheckpoint, resumed: SeqState) -> None:
    """A lightning checkpoint is one float32 [heads, hd, hd] state per layer (no conv),
    and the store keeps exactly those bytes."""
    lc = model.cfg.lightning
    assert lc is not None
    for i in model.ssm_blocks:
        assert ck.conv[i].numel() == 0
        assert ck.ssm[i].shape == (lc.n_heads, lc.head_dim, lc.head_dim)
        assert ck.ssm[i].dtype == torch.float32
    store = StateStore(model)
    held = store._states[store.put_state(ck)]
    real = sum(t.numel() * t.element_size() for t in (*held.conv.values(), *held.ssm.values()))
    assert real == store.state_bytes


def test_resume_from_states_at_any_depth_equals_uncached(model_dirs):
    """Resuming from KV slices and lightning states at odd depths and the chunk edges
    (see `family_checks.check_resume_at_depths`)."""
    check_resume_at_depths(model_dirs["minimax"], on_checkpoint=_lightning_state_only)


def test_batched_decode_equals_one_sequence_at_a_time(model_dirs):
    """See `family_checks.check_batched_decode`."""
    model = check_batched_decode(model_dirs["minimax"])
    assert any(isinstance(model.ssm(i), LightningMixer) for i in model.ssm_blocks)


def _hf_lightning(layer: int, n_layers: int = 4, heads: int = 4, head_dim: int = 8):
    """transformers' `MiniMaxLightningAttention` of HF layer `layer` (random weights,
    its own chunk of 16 tokens) and the matching `LightningConfig`."""
    import transformers
    from transformers.models.minimax.modeling_minimax import MiniMaxLightningAttention

    config = transformers.MiniMaxConfig(
        hidden_size=48,
        num_attention_heads=heads,
        head_dim=head_dim,
        num_hidden_layers=n_layers,
        layer_types=["linear_attention"] * n_layers,
        block_size=16,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(layer)
        hf = MiniMaxLightningAttention(config, layer).eval()
        for p in hf.parameters():
            torch.nn.init.normal_(p, std=0.2)
    return hf, LightningConfig(heads, head_dim, n_layers)


def _mixer(hf, cfg: LightningConfig, layer: int, tp: TPGroup | None = None) -> LightningMixer:
    """A (shard of the) engine mixer holding `hf`'s weights."""
    tp = tp or TPGroup()
    mixer = LightningMixer(48, cfg, layer, "x", tp, torch.float32, get_kernels("cpu", "ref"))
    heads = slice(*(i * cfg.head_dim for i in tp.part(cfg.n_heads)))
    rows3 = slice(*(3 * i * cfg.head_dim for i in tp.part(cfg.n_heads)))
    with torch.no_grad():
        mixer.qkv_proj.weight.copy_(hf.qkv_proj.weight[rows3])
        mixer.output_gate.weight.copy_(hf.output_gate.weight[heads])
        mixer.norm_weight.copy_(hf.norm.weight[heads])
        mixer.out_proj.weight.copy_(hf.out_proj.weight[:, heads])
    return mixer


@pytest.mark.parametrize("layer", [0, 2, 3])
def test_mixer_equals_transformers_prefill_and_cached_decode(layer):
    """The mixer's prefill (emitting a state mid-chunk) and its decode from the final
    state equal transformers' block-wise prefill and cached token-by-token path, for the
    first, a middle and the last layer (whose slopes are ~1e-5 of the first's)."""
    from transformers.models.minimax.modeling_minimax import MiniMaxCache

    hf, cfg = _hf_lightning(layer)
    mixer = _mixer(hf, cfg, layer)
    g = torch.Generator().manual_seed(layer)
    x = torch.randn(1, 45, 48, generator=g)
    cache = MiniMaxCache()
    with torch.no_grad():
        want, _ = hf(x[:, :40], None, None, cache=cache)
        want_state = cache.linear_cache[layer][0].clone()
        want_step, _ = hf(x[:, 40:], None, None, cache=cache)
    y, _, ssm, _, emitted = mixer.prefill(x[0, :40], None, None, emit_at=[23])
    torch.testing.assert_close(y, want[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ssm, want_state, atol=1e-5, rtol=1e-5)
    conv = torch.zeros(1, 0, 0)
    state = ssm[None].clone()
    steps = torch.cat([mixer.decode(x[:, t], conv, state) for t in range(40, 45)])
    torch.testing.assert_close(steps, want_step[0], atol=1e-5, rtol=1e-5)
    _, _, mid, _, _ = mixer.prefill(x[0, :23], None, None)
    torch.testing.assert_close(emitted[0], mid, atol=1e-6, rtol=1e-6)


def test_shard_splits_heads_and_norms_over_all_of_them():
    """A rank's shard holds half the heads (q/k/v rows of its heads, its gate and norm
    channels, out_proj's columns) and those heads' slopes; with the sum of squares of the
    other half added (what the all-reduce brings), its output plus the other rank's is
    the whole layer's."""
    hf, cfg = _hf_lightning(1)
    whole = _mixer(hf, cfg, 1)
    x = torch.randn(30, 48, generator=torch.Generator().manual_seed(3))
    want, *_ = whole.prefill(x, None, None)

    class Summed(TPGroup):
        """Rank r of 2 whose all-reduce adds the other rank's value (`other[...]`)."""

        other: ClassVar[dict[str, torch.Tensor]] = {}

        def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
            peer = self.other.get(f"{1 - self.rank}:{t.shape[-1]}")
            self.other[f"{self.rank}:{t.shape[-1]}"] = t.clone()
            return t if peer is None else t.add_(peer)

    shards = [_mixer(hf, cfg, 1, Summed(r, 2)) for r in (0, 1)]
    for r, shard in enumerate(shards):
        assert shard.heads == cfg.n_heads // 2
        assert shard.qkv_proj.weight.shape == (3 * cfg.width // 2, 48)
        assert shard.out_proj.weight.shape == (48, cfg.width // 2)
        torch.testing.assert_close(shard.slope, whole.slope[2 * r : 2 * r + 2])
    # the ranks run in turn, each all-reduce adding what the other rank's last run
    # recorded: from the third run on, every partial sum a rank adds is right
    ys = [shards[r % 2].prefill(x, None, None)[0] for r in range(4)]
    torch.testing.assert_close(ys[2], want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ys[3], want, atol=1e-5, rtol=1e-5)
    assert (ys[0] - want).abs().max() > 1e-3  # alone, a rank's norm misses half the heads
