"""LFM3 (`lfm3`: short convs, sliding-window and full attention with their own RoPE,
per-head attention gates, sandwich norms; tiny preset swa, conv, conv, full, conv with a
window of 16): the engine's logits and greedy tokens against transformers on the same
random fp32 weights, cached turns, resumption at the window edges and odd depths,
batched decode, the cached bytes against the cost model, and that every layer kind and
LFM3-specific piece moves the logits (so the comparisons can see them)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from engine_helpers import GREEDY, hf_model, prompts
from family_checks import (
    PROMPT_LEN,
    check_batched_decode,
    check_greedy_and_second_turn,
    check_logits_equal_transformers,
    check_resume_at_depths,
)

from marconi_kernels import OPS
from marconi_ray.core.model.hf.parse import spec_from_hf_config
from marconi_ray.engine.engine import Engine
from marconi_ray.engine.model.hybrid_model import HybridModel
from marconi_ray.engine.model.layers.attention import Attention
from marconi_ray.engine.model.layers.rope import Rope
from marconi_ray.engine.model.layers.short_conv import ShortConvMixer
from marconi_ray.engine.model.layers.sliding_attention import SlidingWindowAttention
from marconi_ray.engine.model.loader import load_model, read_config
from marconi_ray.engine.model.seq_state import SeqState, StateCheckpoint
from marconi_ray.engine.store.state_store import StateStore

FAMILY = "lfm3"
W = 16
"""The tiny preset's sliding_window."""
DEPTHS = (1, 2, 3, 7, W - 1, W, W + 1, 2 * W - 1, 2 * W + 1, 47, 101, 299, 300)
MIN_CHANGED = 0.2
"""Least share of greedy positions a broken piece must change (see `test_every_piece_matters`)."""


def test_tiny_preset_mixes_conv_window_and_full_attention(model_dirs):
    model = load_model(model_dirs[FAMILY])
    assert model.cfg.pattern == "W-C-C-*-C-"
    assert model.cfg.sandwich_norm
    assert model.cfg.swa is not None and model.cfg.swa.window == W
    assert model.cfg.attention is not None and model.cfg.attention.rope_type == "proportional"
    assert isinstance(model.layers[0].mixer, SlidingWindowAttention)
    assert type(model.layers[6].mixer) is Attention
    assert all(isinstance(model.ssm(i), ShortConvMixer) for i in model.ssm_blocks)
    assert all(block.out_norm is not None for block in model.layers)


def test_logits_equal_transformers(model_dirs):
    """See `family_checks.check_logits_equal_transformers` (300 tokens, many windows)."""
    check_logits_equal_transformers(model_dirs[FAMILY])


def test_greedy_and_second_turn_equal_transformers(model_dirs):
    """See `family_checks.check_greedy_and_second_turn`."""
    check_greedy_and_second_turn(model_dirs[FAMILY])


def _states_shaped(model: HybridModel, ck: StateCheckpoint, resumed: SeqState) -> None:
    """A short conv's checkpoint is its window [D, K] (zero before the first token) and
    an empty ssm; both attention layers keep every KV row."""
    cfg = model.cfg.shortconv
    assert cfg is not None
    for i in model.ssm_blocks:
        assert ck.conv[i].shape == (model.cfg.hidden_size, cfg.d_conv)
        assert ck.ssm[i].numel() == 0
        assert bool((ck.conv[i][:, : max(0, cfg.d_conv - ck.depth)] == 0).all()), ck.depth
    for i in model.attn_blocks:
        assert resumed.kv[i].view()[0].shape[1] == ck.depth


def test_resume_at_window_edges_and_odd_depths_equals_uncached(model_dirs):
    """See `family_checks.check_resume_at_depths`, at `DEPTHS` (1, W - 1, W, W + 1, odd)."""
    check_resume_at_depths(model_dirs[FAMILY], on_checkpoint=_states_shaped, depths=DEPTHS)


def test_batched_decode_equals_each_sequence_alone(model_dirs):
    """See `family_checks.check_batched_decode` (lengths 9, 21, 40: below, across and
    past the window)."""
    check_batched_decode(model_dirs[FAMILY])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_bytes_equal_the_cost_model(model_dirs, dtype):
    """The store prices a token's KV (the full layer's: the windowed layer's is in each
    checkpoint) and a checkpoint's conv windows and attention window as the cost model
    does, and the tensors take that."""
    _, raw = read_config(model_dirs[FAMILY])
    model = load_model(model_dirs[FAMILY], dtype=dtype)
    store = StateStore(model)
    elem = torch.empty((), dtype=dtype).element_size()
    spec = spec_from_hf_config(raw, dtype_bytes=elem, state_dtype_bytes=4)
    assert store.kv_bytes_per_token == spec.kv_bytes_per_token == 1 * (2 * 2 * 16) * elem
    assert spec.window_bytes == W * (2 * 2 * 16) * elem
    assert store.state_bytes == spec.ssm_state_bytes
    state = model.new_state()
    ckpt = model.prefill(torch.arange(7, 30), state, [W + 1])[0].with_window_of(state, W)
    held = store._states[store.put_state(ckpt)]
    window = [t for kv in held.window.values() for t in kv]
    real = sum(
        t.numel() * t.element_size() for t in (*held.conv.values(), *held.ssm.values(), *window)
    )
    assert real == spec.ssm_state_bytes


def _zero_writes(kind: str) -> Callable[[HybridModel], None]:
    """Zero the output projection's weights of every block of `kind` (its sandwich norm
    then writes 0; the last conv keeps its bias, the logit lift)."""

    def apply(model: HybridModel) -> None:
        for block in model.layers:
            if block.kind != kind:
                continue
            mixer = block.mixer
            out = getattr(mixer, "out_proj", None) or getattr(mixer, "o", None)
            out = out if out is not None else mixer.down
            out.weight.zero_()

    return apply


def _no_gates(model: HybridModel) -> None:
    for block in model.layers:
        if isinstance(block.mixer, Attention):
            block.mixer.g = None


def _no_post_norms(model: HybridModel) -> None:
    for block in model.layers:
        block.out_norm = None


def _default_rope(model: HybridModel) -> None:
    for block in model.layers:
        mixer = block.mixer
        if type(mixer) is Attention:
            cfg = mixer.cfg
            mixer.rope = Rope(cfg.rotary_dim, cfg.rope_theta, torch.device("cpu"))


def _no_window(model: HybridModel) -> None:
    for block in model.layers:
        if isinstance(block.mixer, SlidingWindowAttention):
            block.mixer.window = 10**6


@pytest.mark.parametrize(
    "broken",
    [
        _zero_writes("shortconv"),
        _zero_writes("swa"),
        _zero_writes("attention"),
        _zero_writes("mlp"),
        _no_gates,
        _no_post_norms,
        _default_rope,
        _no_window,
    ],
    ids=["conv", "swa", "full", "mlp", "gates", "sandwich", "rope", "window"],
)
def test_every_piece_matters(model_dirs, broken):
    """The tiny preset's argmax tokens over a 300-token prompt move at >= `MIN_CHANGED`
    of the positions when a layer kind writes nothing, the gates, sandwich norms or the
    window are dropped, or the full attention's proportional RoPE is read as a partial
    default one: what `test_logits_equal_transformers` compares depends on each."""
    ids = torch.tensor(prompts(30, 1, PROMPT_LEN, 512)[0])
    model = load_model(model_dirs[FAMILY])
    want = model.forward_logits(ids).argmax(-1)
    broken(model)
    got = model.forward_logits(ids).argmax(-1)
    assert (got != want).float().mean().item() >= MIN_CHANGED


def test_checkpoint_gate_name(model_dirs):
    """The checkpoint names the attention gate `self_attn.gate_proj` (transformers renames
    it `g_proj` on load); the engine reads the same weights from there."""
    model = load_model(model_dirs[FAMILY])
    hf = hf_model(model_dirs[FAMILY])
    for i, layer in ((0, 0), (6, 3)):
        mixer = model.layers[i].mixer
        assert isinstance(mixer, Attention) and mixer.g is not None
        key = model.layers[i].weight_specs()["mixer.g.weight"].key
        assert key.endswith(f"layers.{layer}.self_attn.gate_proj.weight")
        assert torch.equal(mixer.g.weight, hf.model.layers[layer].self_attn.g_proj.weight)


@pytest.fixture(scope="module")
def vl_dir(model_dirs, tmp_path_factory) -> Path:
    """An LFM3-VL checkpoint (written by transformers) whose language model and LM head
    are the tiny LFM3 preset's, beside a two-layer vision tower and its projector."""
    from transformers import Lfm3Config, Lfm3VlConfig, Lfm3VlForConditionalGeneration

    text = Lfm3Config.from_pretrained(model_dirs[FAMILY])
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    }
    config = Lfm3VlConfig(
        text_config=text.to_dict(),
        vision_config=vision,
        projector_hidden_size=32,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    vl = Lfm3VlForConditionalGeneration(config).eval()
    src = hf_model(model_dirs[FAMILY])
    vl.model.language_model.load_state_dict(src.model.state_dict())
    vl.lm_head.load_state_dict(src.lm_head.state_dict())
    out = tmp_path_factory.mktemp("lfm3_vl")
    vl.save_pretrained(out)
    return out


def test_vl_checkpoint_serves_its_language_model(model_dirs, vl_dir):
    """The LFM3-VL checkpoint's language model (under model.language_model., the vision
    tower and projector skipped) gives the text model's logits, and transformers' VL
    model's on text alone."""
    from transformers import Lfm3VlForConditionalGeneration

    model = load_model(vl_dir)
    assert model.cfg.family == "lfm3_vl" and model.cfg.pattern == "W-C-C-*-C-"
    ids = prompts(35, 1, 120, model.cfg.vocab_size)[0]
    got = model.forward_logits(torch.tensor(ids))
    text = load_model(model_dirs[FAMILY]).forward_logits(torch.tensor(ids))
    torch.testing.assert_close(got, text, atol=0, rtol=0)
    vl = Lfm3VlForConditionalGeneration.from_pretrained(vl_dir).eval()
    with torch.no_grad():
        want = vl(input_ids=torch.tensor([ids])).logits[0]
    assert (got - want).abs().max().item() <= 1e-3


@pytest.mark.triton
def test_engine_on_triton_kernels_equals_reference(model_dirs):
    """Three turns on the "triton" set (pooled windowed and full decode and prefill
    attention, the short convs) give the reference engine's tokens, with cache hits;
    every op runs through the set."""
    calls: Counter[str] = Counter()
    engine = Engine(model_dirs[FAMILY], "marconi", 50_000_000, kernels="triton")
    model = engine.model
    assert model.kernels.name == "triton"

    def counted(op: str):
        fn = getattr(model.kernels, op)

        def run(*args, **kwargs):
            calls[op] += 1
            return fn(*args, **kwargs)

        return run

    model.kernels = dataclasses.replace(model.kernels, **{op: counted(op) for op in OPS})
    for i in model.ssm_blocks:
        model.ssm(i).kernels = model.kernels
    reference = Engine(model_dirs[FAMILY], "vanilla", kernels="ref")
    history = prompts(2, 1, 24, engine.config.vocab_size)[0]
    for turn in range(3):
        got = engine.generate(history, GREEDY)
        assert got.tokens == reference.generate(history, GREEDY).tokens
        if turn:
            assert got.usage.cached_tokens > 0
        history += list(got.tokens) + prompts(10 + turn, 1, 5, engine.config.vocab_size)[0]
    assert {"causal_conv1d", "causal_conv1d_update", "paged_decode_attention"} <= set(calls)
