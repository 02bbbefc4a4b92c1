"""RecurrentGemma (`recurrent_gemma`: RG-LRU recurrent blocks and sliding-window
attention, tiny preset R, R, W, R with a window of 16): the engine against transformers
on the same random fp32 weights through the real serving path, resumption from the
states at depths around the window (1, W - 1, W, W + 1, odd depths, multiples), batched
decode, the logits themselves (soft cap, bfloat16 embedding normaliser), the cached
bytes against the cost model, and the Triton kernel set (interpreter on CPU) serving a
multi-turn conversation on the KV pool."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch
from engine_helpers import GREEDY, hf_logits, hf_model, prompts
from family_checks import (
    NEW_TOKENS,
    PROMPT_LEN,
    check_batched_decode,
    check_greedy_and_second_turn,
    check_resume_at_depths,
    hf_greedy,
)

from marconi_kernels import OPS
from marconi_ray.core.model.hf.parse import spec_from_hf_config
from marconi_ray.engine.engine import Engine
from marconi_ray.engine.model.hybrid_model import HybridModel
from marconi_ray.engine.model.layers.rglru import RGLRUMixer
from marconi_ray.engine.model.layers.sliding_attention import SlidingWindowAttention
from marconi_ray.engine.model.loader import load_model, read_config
from marconi_ray.engine.model.parallel import TPGroup
from marconi_ray.engine.model.seq_state import SeqState, StateCheckpoint
from marconi_ray.engine.store.state_store import StateStore
from marconi_ray.protocol.sampling import SamplingParams

FAMILY = "recurrent_gemma"
W = 16
"""The tiny preset's attention_window_size."""
LONG = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
DEPTHS = (1, 2, 3, W - 1, W, W + 1, 2 * W - 1, 2 * W + 1, 47, 64, 101, 299, 300)


def test_tiny_preset_is_recurrent_and_windowed(model_dirs):
    model = load_model(model_dirs[FAMILY])
    assert model.cfg.pattern == "R-R-W-R-"
    assert model.cfg.swa is not None and model.cfg.swa.window == W
    assert isinstance(model.layers[4].mixer, SlidingWindowAttention)
    assert all(isinstance(model.ssm(i), RGLRUMixer) for i in model.ssm_blocks)


def test_logits_equal_transformers(model_dirs):
    """Every position's logits (soft-capped, embeddings scaled by the bfloat16
    sqrt(hidden)) over 100 tokens, six windows."""
    model = load_model(model_dirs[FAMILY])
    ids = prompts(7, 1, 100, model.cfg.vocab_size)[0]
    want = hf_logits(hf_model(model_dirs[FAMILY]), ids)
    got = model.forward_logits(torch.tensor(ids))
    torch.testing.assert_close(got, want, atol=2e-4, rtol=0)


def test_greedy_and_two_cached_turns_equal_transformers(model_dirs):
    """See `family_checks.check_greedy_and_second_turn`; then a third turn extending the
    second is served from the cache too and still equals transformers."""
    engine = check_greedy_and_second_turn(model_dirs[FAMILY])
    vocab = engine.config.vocab_size
    first = prompts(31, 1, PROMPT_LEN, vocab)[0]
    second = first + list(engine.generate(first, LONG).tokens) + prompts(32, 1, 40, vocab)[0]
    third = second + list(engine.generate(second, LONG).tokens) + prompts(34, 1, 21, vocab)[0]
    out = engine.generate(third, LONG)
    assert out.usage.cached_tokens == len(second) + NEW_TOKENS
    assert list(out.tokens) == hf_greedy(hf_model(model_dirs[FAMILY]), third, NEW_TOKENS)
    assert engine.store.bytes_used == engine.cache.bytes_used


def _states_shaped(model: HybridModel, ck: StateCheckpoint, resumed: SeqState) -> None:
    """An RG-LRU checkpoint is the conv window [lru_width, K] (zero before the first
    token) and the float32 LRU state [lru_width]; the model's own (unpooled) state keeps
    every KV row (`test_window_state` resumes from the window alone)."""
    cfg = model.cfg.rglru
    assert cfg is not None
    for i in model.ssm_blocks:
        assert ck.conv[i].shape == (cfg.lru_width, cfg.d_conv)
        assert ck.ssm[i].shape == (cfg.lru_width,) and ck.ssm[i].dtype == torch.float32
        assert bool((ck.conv[i][:, : max(0, cfg.d_conv - ck.depth)] == 0).all()), ck.depth
    for i in model.attn_blocks:
        assert resumed.kv[i].view()[0].shape[1] == ck.depth


def test_resume_at_window_edges_and_odd_depths_equals_uncached(model_dirs):
    """See `family_checks.check_resume_at_depths`, at `DEPTHS`."""
    check_resume_at_depths(model_dirs[FAMILY], on_checkpoint=_states_shaped, depths=DEPTHS)


def test_batched_decode_equals_each_sequence_alone(model_dirs):
    """See `family_checks.check_batched_decode` (lengths 9, 21, 40: below, across and
    past the window)."""
    check_batched_decode(model_dirs[FAMILY])


def test_the_cache_prices_the_window_not_a_square(model_dirs):
    """The engine's cache and a coordinator's planner price the windowed attention
    layers' FLOPs as n * min(n, W) (`core.model.window_term`), not n * n: a token past the
    window costs the same at any depth."""
    from marconi_ray.engine.engine import Engine

    engine = Engine(model_dirs[FAMILY], system="marconi", cache_bytes=10**7)
    cost = engine.cache.cost
    assert [t.window for t in cost.windows] == [W] and cost.flops_quadratic == 0.0
    assert (
        cost.prefill_flops(1, W) == cost.prefill_flops(1, 10 * W) == cost.prefill_flops(1, 100 * W)
    )
    assert cost.prefill_flops(1, 2) < cost.prefill_flops(1, W // 2)  # below W: it grows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_bytes_equal_the_cost_model(model_dirs, dtype):
    """The store prices a token's KV and a checkpoint's states as the cost model does,
    and that is what the tensors it holds take."""
    _, raw = read_config(model_dirs[FAMILY])
    model = load_model(model_dirs[FAMILY], dtype=dtype)
    store = StateStore(model)
    elem = torch.empty((), dtype=dtype).element_size()
    spec = spec_from_hf_config(raw, dtype_bytes=elem, state_dtype_bytes=4)
    assert store.kv_bytes_per_token == spec.kv_bytes_per_token
    assert store.state_bytes == spec.ssm_state_bytes
    state = model.new_state()
    ckpt = model.prefill(torch.arange(7, 30), state, [W + 1])[0].with_window_of(state, W)
    held = store._states[store.put_state(ckpt)]
    window = [t for kv in held.window.values() for t in kv]
    real = sum(
        t.numel() * t.element_size() for t in (*held.conv.values(), *held.ssm.values(), *window)
    )
    assert real == spec.ssm_state_bytes


@pytest.mark.triton
def test_engine_on_triton_kernels_equals_reference(model_dirs):
    """Three turns on the "triton" set (pooled windowed decode and prefill attention,
    the RG-LRU scan and step, the conv) give the reference engine's tokens, with cache
    hits; every op runs through the set."""
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
    want = {"rglru_scan", "rglru_step", "causal_conv1d", "causal_conv1d_update"}
    assert want | {"paged_decode_attention"} <= set(calls), calls


@pytest.mark.slow
def test_tp2_equals_tp1(model_dirs):
    """Two gloo ranks (gate blocks, conv and LRU channels, attention heads split): every
    position's logits over 45 tokens, and a conversation through the engine (cache hits,
    pooled windowed attention) with the tokens, hits and store bytes of one rank's half
    as at TP 1."""
    from test_tensor_parallel import _engine_job, _logits_job, run_tp2

    path = str(model_dirs[FAMILY])
    ids = prompts(19, 1, 45, 300)[0]
    out = run_tp2([("logits", _logits_job, (path, ids)), ("engine", _engine_job, (path, 10**8, 3))])
    want = load_model(path).forward_logits(torch.tensor(ids))
    for got in out["logits"]:
        assert (torch.from_numpy(got) - want).abs().max().item() <= 1e-4
    one = _engine_job(path, 10**8, 3, TPGroup())
    for rank in out["engine"]:
        assert [(r["tokens"], r["cached"]) for r in rank["requests"]] == [
            (r["tokens"], r["cached"]) for r in one["requests"]
        ]
        assert any(r["cached"] for r in rank["requests"])
        assert 2 * rank["state_bytes"] == one["state_bytes"]
        assert 2 * rank["kv_bytes_per_token"] == one["kv_bytes_per_token"]


def test_tp2_shard_layout_and_odd_heads_refused(model_dirs):
    """A rank-0-of-2 shard (no process group: nothing communicates before a forward)
    keeps half of the gate blocks with their channels: linear_x / linear_y rows, the conv,
    Lambda and the LRU state over lru_width / 2 channels, linear_out's input columns;
    the windowed attention half of the query and KV heads. Three gate blocks are refused
    by name."""
    cfg = read_config(model_dirs[FAMILY])[0]
    lru = cfg.rglru
    assert lru is not None and cfg.swa is not None
    shard = HybridModel(cfg, TPGroup(0, 2))
    mixer = shard.ssm(shard.ssm_blocks[0])
    assert isinstance(mixer, RGLRUMixer)
    half = lru.lru_width // 2
    assert mixer.heads == lru.n_heads // 2 and mixer.channels == half
    assert mixer.input_gate_weight.shape == (lru.n_heads // 2, lru.block_width, lru.block_width)
    assert mixer.linear_x.weight.shape == (half, cfg.hidden_size)
    assert mixer.linear_out.weight.shape == (cfg.hidden_size, half)
    conv, ssm = mixer.empty_state(torch.device("cpu"))
    assert conv.shape == (half, lru.d_conv) and ssm.shape == (half,)
    attn = shard.attention(shard.attn_blocks[0])
    assert (attn.n_heads, attn.n_kv) == (2, 1)
    odd = dataclasses.replace(cfg, rglru=dataclasses.replace(lru, n_heads=3, lru_width=48))
    with pytest.raises(ValueError, match="RG-LRU gate blocks"):
        odd.check_tp(2)
