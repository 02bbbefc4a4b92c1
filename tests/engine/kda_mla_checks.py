"""Checks that Kimi Linear and Ling 3.0 (`bailing_hybrid`), the two KDA + MLA families,
run alike: a packed prefill on the KV pool against one part at a time, and tp 2 against
tp 1 through the served engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from engine_helpers import prompts
from test_tensor_parallel import run_tp2

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.model.loader import load_model, read_config
from marconi_ray.engine.model.parallel import TPGroup
from marconi_ray.engine.model.prefill_part import PrefillPart
from marconi_ray.engine.model.seq_state import SeqState
from marconi_ray.engine.store.state_store import StateStore
from marconi_ray.protocol.sampling import SamplingParams


def check_packed_prefill_on_the_pool(model_dir: Path) -> None:
    """Three requests (one resuming after 7 cached rows, so its RoPE positions start at
    7) prefilled in one forward on the pool (MLA over each part's own rows, KDA varlen)
    give the logits, KDA checkpoints and latent rows of each prefilled alone."""
    model = load_model(model_dir)
    ids = [torch.tensor(p) for p in prompts(12, 3, 20, model.cfg.vocab_size)]

    def run(together: bool):
        store = StateStore(model)
        states = [SeqState(rows=torch.as_tensor(store.device_rows(store.alloc_slots(20))))
                  for _ in ids]  # fmt: skip
        rows = states[1].rows
        states[1].rows = rows[:7]
        model.prefill(ids[1][:7], states[1], (), store.device_kv)
        states[1].rows = rows
        parts = [PrefillPart(ids[0], states[0], (5, 20)), PrefillPart(ids[1][7:], states[1], (9,)),
                 PrefillPart(ids[2][:3], SeqState(rows=states[2].rows[:3]), (2,))]  # fmt: skip
        if together:
            out = model.prefill_many(parts, store.device_kv)
        else:
            out = [model.prefill_many([p], store.device_kv)[0] for p in parts]
        kv = [store.device_kv.k[i][:, p.state.rows] for i in model.attn_blocks for p in parts]
        return out, kv

    got, got_kv = run(True)
    want, want_kv = run(False)
    for (ckpts, logits), (want_ckpts, want_logits) in zip(got, want, strict=True):
        torch.testing.assert_close(logits, want_logits, atol=1e-4, rtol=0)
        for c, w in zip(ckpts, want_ckpts, strict=True):
            for i in model.ssm_blocks:
                torch.testing.assert_close(c.ssm[i], w.ssm[i], atol=1e-5, rtol=0)
    for g, w in zip(got_kv, want_kv, strict=True):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=0)


def tp_job(model_dir: str, ids: list[int], tp: TPGroup) -> dict[str, Any]:
    """Logits of a prompt and greedy tokens of the served engine on one rank."""
    model = load_model(model_dir, tp=tp)
    logits = model.forward_logits(torch.tensor(ids)).numpy()
    engine = Engine(model_dir, system="marconi", cache_bytes=10**7, tp=tp)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    first = engine.generate(ids, params)
    second = engine.generate(ids + list(first.tokens) + ids[:9], params)
    return {
        "logits": logits,
        "tokens": [list(first.tokens), list(second.tokens)],
        "cached": second.usage.cached_tokens,
    }


def check_tp2_equals_tp1(model_dir: Path) -> None:
    """Two ranks give the one-rank logits of a 70-token prompt and the greedy tokens of
    two turns, the second served from the cache."""
    ids = prompts(77, 1, 70, read_config(model_dir)[0].vocab_size)[0]
    ranks = run_tp2([("tp2", tp_job, (str(model_dir), ids))])["tp2"]
    want = tp_job(str(model_dir), ids, TPGroup())
    for got in ranks:
        np.testing.assert_allclose(got["logits"], want["logits"], atol=1e-4, rtol=0)
        assert got["tokens"] == want["tokens"]
        assert got["cached"] == want["cached"] == len(ids) + 12
