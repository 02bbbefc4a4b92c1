"""The static decode step a CUDA graph captures (`step_graphs`), run eagerly on CPU: a
batch padded to its bucket gives the tokens of the unpadded step (every family's mixers,
batches shrinking and growing, cached turns), its inputs keep their shapes and addresses
from step to step within a bucket, padded rows touch no member's KV or state, and it has
no host sync. The capture itself needs CUDA (`scripts/gpu_check.py`)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from engine_helpers import prompts

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.model.loader import load_model
from marconi_ray.engine.model.step_graphs import StepGraphs, buckets, captures
from marconi_ray.engine.worker import Worker
from marconi_ray.protocol.orders import PrefillOrder, StepInput
from marconi_ray.protocol.sampling import SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from host_syncs import HostReads, SyncOps


def test_buckets_and_modes():
    assert buckets(1) == [1] and buckets(8) == [1, 2, 4, 8] and buckets(6) == [1, 2, 4, 6]
    cpu = torch.device("cpu")
    assert not captures("auto", cpu) and not captures("off", cpu)
    assert captures("auto", torch.device("cuda")) and not captures("off", torch.device("cuda"))
    with pytest.raises(ValueError, match="'on' needs a CUDA device, got cpu"):
        captures("on", cpu)
    with pytest.raises(ValueError, match="must be one of auto, on, off, got 'yes'"):
        captures("yes", cpu)


def _static(engine: Engine) -> StepGraphs:
    graphs = StepGraphs(engine.model, engine.worker._batch, capture=False)
    engine.worker.graphs = graphs
    return graphs


@pytest.mark.parametrize(
    "family",
    ["nemotron_h", "qwen3_5", "jamba", "lfm2", "granitemoehybrid", "lfm3", "recurrent_gemma"],
)
def test_padded_static_steps_give_the_unpadded_tokens(model_dirs, family):
    static = Engine(model_dirs[family], "marconi", 50_000_000, max_batch=8)
    plain = Engine(model_dirs[family], "marconi", 50_000_000, max_batch=8)
    graphs = _static(static)
    seen: list[int] = []
    run = graphs._run
    graphs._run = lambda nb: (seen.append(nb), run(nb))[1]  # type: ignore[method-assign]
    vocab = static.config.vocab_size
    batch = prompts(4, 5, 20, vocab)
    sp = [
        SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, logprobs=1)
        for n in (3, 9, 5, 12, 7)
    ]  # the batch shrinks 5 -> 4 -> 3 -> 2 -> 1: buckets 8, 4, 4, 2, 1
    for turn in range(2):
        got, want = static.generate_many(batch, sp), plain.generate_many(batch, sp)
        assert [r.tokens for r in got] == [r.tokens for r in want]
        assert [r.usage.cached_tokens for r in got] == [r.usage.cached_tokens for r in want]
        for g, w in zip(got, want, strict=True):
            gl = [lp.logprob for lp in g.logprobs]
            assert gl == pytest.approx([lp.logprob for lp in w.logprobs], abs=1e-4)
        batch = [
            p + list(r.tokens) + prompts(9 + turn, 1, 6, vocab)[0]
            for p, r in zip(batch, got, strict=True)
        ]
    assert {8, 4, 2, 1} <= set(seen)
    assert any(r.usage.cached_tokens for r in got)
    static.store.check()


def test_the_static_inputs_keep_shape_and_address_within_a_bucket(model_dirs):
    model = load_model(model_dirs["nemotron_h"])
    worker = Worker(model, max_batch=8)
    graphs = StepGraphs(model, worker._batch, capture=False)
    worker.graphs = graphs
    fed: list[tuple] = []
    decode = model._decode

    def recorded(ids, positions, rows, kv):
        first = kv[model.attn_blocks[0]]
        conv, ssm = rows[model.ssm_blocks[0]]
        fed.append(
            tuple(
                (t.shape, t.data_ptr())
                for t in (ids, positions, first.table, first.lens, first.new, conv, ssm)
            )
        )
        return decode(ids, positions, rows, kv)

    model._decode = recorded  # type: ignore[method-assign]
    sp = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    orders = [
        PrefillOrder(r, np.asarray(p, np.int32), sp, 20)
        for r, p in enumerate(prompts(2, 3, 10, model.cfg.vocab_size))
    ]
    worker.advance(StepInput(start=tuple(orders)))
    for _ in range(3):
        worker.advance(StepInput())
    late = PrefillOrder(9, np.asarray(prompts(3, 1, 10, model.cfg.vocab_size)[0], np.int32), sp, 20)
    worker.advance(StepInput(start=(late,)))  # 3 -> 4 members: the same bucket
    worker.advance(StepInput())
    assert len(worker._running) == 4
    assert len(fed) >= 4 and len(set(fed)) == 1, "a step in bucket 4 changed its inputs"


def test_padding_touches_no_member_and_the_step_has_no_host_sync(model_dirs):
    model = load_model(model_dirs["nemotron_h"])
    worker = Worker(model, max_batch=8)
    graphs = StepGraphs(model, worker._batch, capture=False)
    sp = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    orders = [
        PrefillOrder(r, np.asarray(p, np.int32), sp, 20)
        for r, p in enumerate(prompts(5, 3, 12, model.cfg.vocab_size))
    ]
    worker.advance(StepInput(start=tuple(orders)))
    worker.advance(StepInput())
    batch = worker._batch
    pool = worker.store.device_kv
    held = np.flatnonzero(pool._held)
    before = {i: pool.k[i][:, held].clone() for i in model.attn_blocks}
    states = {i: batch.ssm[i][:3].clone() for i in model.ssm_blocks}
    slots = worker.store.alloc_slots(len(batch))
    new = torch.as_tensor(worker.store.device_rows(slots))
    batch.extend(new)
    ids = torch.tensor([s.output[-1] for s in worker._running])
    twin = [s.state.length for s in worker._running]
    with HostReads(strict=True), SyncOps(strict=True):  # the whole static step
        logits = graphs.decode(ids)
    assert logits.shape == (3, model.cfg.vocab_size) and torch.isfinite(logits).all()
    assert [s.state.length for s in worker._running] == [n + 1 for n in twin]
    for i in model.attn_blocks:  # members' old rows untouched; only the new rows written
        assert torch.equal(pool.k[i][:, held], before[i])
    assert all(not torch.equal(batch.ssm[i][:3], states[i]) for i in model.ssm_blocks)


def test_the_static_step_emits_the_hidden_rows_an_mtp_drafter_reads(tmp_path):
    """With an MTP drafter (the model's `emit_hidden`), the static step outputs the final
    normed hidden states and appends each member's row as the eager step does: the same
    rows, and the same drafts and tokens as without the static step."""
    from marconi_ray.engine.presets.factory import make_model
    from marconi_ray.engine.presets.mtp_weights import add_mtp_weights
    from marconi_ray.protocol.speculative import SpeculativeConfig

    folder = add_mtp_weights(make_model("tiny", "qwen3_next", tmp_path / "q"), seed=2)
    config = SpeculativeConfig(method="mtp", num_speculative_tokens=3, backoff=0)
    runs = []
    for static in (False, True):
        engine = Engine(folder, "marconi", 50_000_000, max_batch=4, speculative=config)
        assert engine.model.emit_hidden
        if static:
            _static(engine)
        batch = prompts(9, 3, 20, engine.config.vocab_size)
        params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (6, 9, 4)]
        results = engine.generate_many(batch, params)
        runs.append([(r.tokens, r.spec.drafted) for r in results])
    assert runs[0] == runs[1] and sum(d for _, d in runs[1]) > 0
    # the rows themselves: one eager step and one static step from equal states
    rows = []
    for static in (False, True):
        engine = Engine(folder, "marconi", 50_000_000, max_batch=4, speculative=config)
        worker = engine.worker
        for p in prompts(9, 2, 20, engine.config.vocab_size):
            engine.add_request(p, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
        seqs = list(worker._running)
        assert len(seqs) == 2
        for s in seqs:
            s.state.hidden.clear()
        if static:
            _static(engine)
        worker._decode(seqs)
        assert all(len(s.state.hidden) == 1 for s in seqs)
        rows.append([torch.cat([r for _, r in s.state.hidden]) for s in seqs])
    for eager, static_rows in zip(*rows, strict=True):
        torch.testing.assert_close(static_rows, eager)
