"""Several requests prefilled in one forward (`HybridModel.prefill_many`): each part's
logits, checkpoints at its exact depths and final states equal its own prefill's (to
float noise: the shared matmuls run over more rows), in every family, pooled (some parts
resuming from a cached depth) and scored."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from engine_helpers import prompts

from marconi_ray.engine.model.loader import load_model
from marconi_ray.engine.model.paged_kv import SplitPools
from marconi_ray.engine.model.prefill_part import PrefillPart
from marconi_ray.engine.model.seq_state import SeqState
from marconi_ray.engine.presets.model_presets import FAMILIES
from marconi_ray.engine.store.state_store import StateStore

ATOL = 1e-4


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a.float(), b.float(), atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_parts_in_one_forward_equal_their_own_prefills(model_dirs, family):
    model = load_model(model_dirs[family])
    vocab = model.cfg.vocab_size
    seqs = [
        torch.tensor(p)
        for p in (prompts(6, 1, 17, vocab) + prompts(7, 1, 9, vocab) + prompts(8, 1, 23, vocab))
    ]
    emits = [(5, 17), (9,), (4, 11)]
    scored = [False, True, False]
    alone = []
    for ids, emit, sc in zip(seqs, emits, scored, strict=True):
        st = model.new_state()
        fn = model.prefill_scored if sc else model.prefill
        res = fn(ids, st, list(emit))
        ckpts, logits = res if sc else (res, None)
        alone.append((st, ckpts, logits))
    states = [model.new_state() for _ in seqs]
    parts = [
        PrefillPart(i, s, e, sc) for i, s, e, sc in zip(seqs, states, emits, scored, strict=True)
    ]
    together = model.prefill_many(parts)
    for (st, ckpts, logits), (got_ckpts, got_logits), state, ids in zip(
        alone, together, states, seqs, strict=True
    ):
        assert state.length == st.length == len(ids)
        assert _close(state.logits, st.logits)
        assert [c.depth for c in got_ckpts] == [c.depth for c in ckpts]
        for c, g in zip(ckpts, got_ckpts, strict=True):
            assert _close(c.logits, g.logits)
            for i in model.ssm_blocks:
                assert _close(c.conv[i], g.conv[i]) and _close(c.ssm[i], g.ssm[i])
        for i in model.ssm_blocks:
            assert _close(state.ssm[i], st.ssm[i]) and _close(state.conv[i], st.conv[i])
        if logits is not None:
            assert got_logits.shape == (len(ids), vocab) and _close(got_logits, logits)


def test_pooled_parts_resume_from_their_depths(model_dirs):
    model = load_model(model_dirs["nemotron_h"])
    store = StateStore(model)
    vocab = model.cfg.vocab_size
    a, b = (torch.tensor(p) for p in prompts(3, 2, 20, vocab))

    def pooled(n: int) -> SeqState:
        rows = torch.as_tensor(store.device_rows(store.alloc_slots(n)))
        return SeqState(rows=rows)

    # b resumes after a first chunk of 8 tokens; a starts fresh; both in one forward
    want_a, want_b = model.new_state(), model.new_state()
    model.prefill(a, want_a)
    model.prefill(b, want_b)
    sa, sb = pooled(20), pooled(20)
    sb.rows, rest = sb.rows[:8], sb.rows[8:]
    model.prefill(b[:8], sb, (), store.device_kv)
    sb.rows = torch.cat([sb.rows, rest])
    model.prefill_many([PrefillPart(a, sa), PrefillPart(b[8:], sb, (20,))], store.device_kv)
    assert _close(sa.logits, want_a.logits) and _close(sb.logits, want_b.logits)
    with pytest.raises(ValueError, match="needs as many rows"):
        model.prefill_many([PrefillPart(a, pooled(3))], store.device_kv)
    with pytest.raises(ValueError, match="emit_at"):
        model.prefill_many([PrefillPart(a, model.new_state(), (30,))])


def _pooled_state(store: StateStore, n: int, rows: torch.Tensor | None = None) -> SeqState:
    if rows is None:
        rows = torch.as_tensor(store.device_rows(store.alloc_slots(n)))
    window = None  # a model with windowed blocks keeps their KV in rows of its own
    if store.window is not None:
        window = torch.as_tensor(store.alloc_window(n))
    return SeqState(rows=rows, window_rows=window)


def _block_kv(store: StateStore, i: int, state: SeqState) -> torch.Tensor:
    """Block i's keys of `state`'s rows, from whichever pool holds them."""
    pools = store.pools
    if isinstance(pools, SplitPools) and i in pools.blocks:
        return pools.window.k[i][:, state.window_rows]
    return store.device_kv.k[i][:, state.rows]


@pytest.mark.parametrize("family", FAMILIES)
def test_pooled_parts_share_one_attention_call_and_equal_their_own_prefills(model_dirs, family):
    """On the pool, each attention layer reads and writes every part's rows in one
    `paged_prefill_attention` call (a fresh part, one resuming after 8 cached rows, a
    one-token part): the logits, checkpoints, final states and the K/V written to the
    pool rows equal each part prefilled alone on its own rows."""
    calls: list[int] = []
    model = load_model(model_dirs[family])
    attend = model.kernels.paged_prefill_attention

    def counted(*args, **kwargs):
        calls.append(args[0].shape[0])
        return attend(*args, **kwargs)

    model.kernels = dataclasses.replace(model.kernels, paged_prefill_attention=counted)
    store = StateStore(model)
    vocab = model.cfg.vocab_size
    a, b, c = (torch.tensor(p) for p in prompts(11, 3, 21, vocab))
    c = c[:1]
    emits = [(4, 21), (12, 21), (1,)]

    def run(together: bool):
        sa, sb, sc = _pooled_state(store, 21), _pooled_state(store, 21), _pooled_state(store, 1)
        sb_rows, sb_window = sb.rows, sb.window_rows
        sb.rows = sb_rows[:8]
        sb.window_rows = None if sb_window is None else sb_window[:8]
        model.prefill(b[:8], sb, (), store.pools)  # b's first 8 tokens: a cached prefix
        sb.rows, sb.window_rows = sb_rows, sb_window
        parts = [PrefillPart(a, sa, emits[0]), PrefillPart(b[8:], sb, emits[1]),
                 PrefillPart(c, sc, emits[2])]  # fmt: skip
        if together:
            results = model.prefill_many(parts, store.pools)
        else:
            results = [model.prefill_many([p], store.pools)[0] for p in parts]
        kv = {i: [_block_kv(store, i, s).clone() for s in (sa, sb, sc)] for i in model.attn_blocks}
        return [sa, sb, sc], results, kv

    want_states, want, want_kv = run(False)
    assert calls == []  # a single part keeps its own SDPA path
    got_states, got, got_kv = run(True)
    # every attention layer declaring the kernel (MLA attends over latents in torch)
    paged = [
        i
        for i in model.attn_blocks
        if "paged_prefill_attention" in type(model.attention(i)).KERNEL_OPS
    ]
    assert calls == [21 + 13 + 1] * len(paged)
    for s, w in zip(got_states, want_states, strict=True):
        assert s.length == w.length and _close(s.logits, w.logits)
        for i in model.ssm_blocks:
            assert _close(s.ssm[i], w.ssm[i]) and _close(s.conv[i], w.conv[i])
    for (ckpts, logits), (want_ckpts, want_logits) in zip(got, want, strict=True):
        assert [x.depth for x in ckpts] == [x.depth for x in want_ckpts]
        assert _close(logits, want_logits)
        for x, y in zip(ckpts, want_ckpts, strict=True):
            assert all(_close(x.ssm[i], y.ssm[i]) for i in model.ssm_blocks)
    for i in model.attn_blocks:
        assert all(_close(g, w) for g, w in zip(got_kv[i], want_kv[i], strict=True))
