"""Multi-token-prediction drafting (`engine.model.mtp`, `engine.spec.mtp`): the
checkpoint's `mtp.*` layers draft from the target's hidden states.

- The config's `mtp_num_hidden_layers` is read; the main model's loader skips `mtp.*`
  (a released Qwen3.5 / Qwen3-Next checkpoint carries them) and its outputs are unchanged.
- The drafter's incremental drafts (cursor KV, hidden rows fed as the target computes
  them, rolled back after each verification) equal `propose_ref`'s from scratch, at
  every proposal, with drafts accepted at varied depths.
- Greedy tokens and cached tokens per turn are identical with `mtp` on and off, over
  multi-turn conversations with cache hits.
- A family without MTP layers, or a checkpoint without their weights, is refused by name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.model.loader import load_model, read_config
from marconi_ray.engine.model.mtp import load_mtp
from marconi_ray.engine.model.seq_state import SeqState
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.engine.presets.mtp_weights import add_mtp_weights
from marconi_ray.engine.spec.drafters import OracleDrafter
from marconi_ray.engine.spec.mtp import (
    MTPDrafter,
    MTPRequest,
    entries_ref,
    propose_ref,
    trim_pending,
)
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.protocol.speculative import SpeculativeConfig

MTP_FAMILIES = ("qwen3_next", "qwen3_5", "qwen3_5_moe_text", "nemotron_h_moe", "nemotron_h")
GREEDY = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
MTP = SpeculativeConfig(method="mtp", num_speculative_tokens=3, backoff=0)


@pytest.fixture(scope="module")
def mtp_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mtp")
    return {f: add_mtp_weights(make_model("tiny", f, root / f), seed=5) for f in MTP_FAMILIES}


def test_the_config_names_the_layers_and_the_model_loads_without_them(
    tmp_path: Path,
) -> None:
    folder = make_model("tiny", "qwen3_5", tmp_path / "m")
    ids = torch.arange(7, 40)
    before = load_model(folder).forward_logits(ids)
    assert read_config(folder)[0].mtp_layers == 0
    add_mtp_weights(folder, seed=1)
    raw = json.loads((folder / "config.json").read_text())
    assert raw["text_config"]["mtp_num_hidden_layers"] == 1  # multimodal: the text config
    assert read_config(folder)[0].mtp_layers == 1
    assert torch.equal(load_model(folder).forward_logits(ids), before)
    with pytest.raises(ValueError, match="no MTP layers"):
        add_mtp_weights(make_model("tiny", "bamba", tmp_path / "b"))
    nemotron = add_mtp_weights(make_model("tiny", "nemotron_h_moe", tmp_path / "n"))
    raw = json.loads((nemotron / "config.json").read_text())
    assert raw["num_nextn_predict_layers"] == 1
    assert raw["mtp_layers_block_type"] == ["full_attention", "moe"]
    assert read_config(nemotron)[0].mtp_blocks == ("attention", "moe")
    raw["mtp_layers_block_type"] = ["full_attention", "mlp"]  # no dense MLP layer to copy
    (nemotron / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=r"mtp_layers_block_type uses \['mlp'\]"):
        read_config(nemotron)


def test_a_checkpoint_without_mtp_weights_or_layers_is_refused(tmp_path: Path) -> None:
    folder = make_model("tiny", "qwen3_next", tmp_path / "q")
    with pytest.raises(ValueError, match="mtp_layers=0"):
        load_mtp(load_model(folder), folder)
    raw = json.loads((folder / "config.json").read_text())
    raw["mtp_num_hidden_layers"] = 1
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=r"no mtp\.\* weights"):
        Engine(folder, speculative=MTP)


class _Steered(MTPDrafter):
    """Runs the MTP drafter (its cursor fed and rolled back as in serving) and records
    its drafts, but hands the worker an oracle's, so verifications keep drafts at varied
    depths and the hidden rows are cut at every accepted length."""

    def __init__(self, base: MTPDrafter, oracle: OracleDrafter) -> None:
        super().__init__(base.head)
        self.oracle = oracle
        self.seen: list[tuple[list[int], list[int]]] = []

    def propose_many(self, asks: Any) -> list[list[int]]:
        mine = super().propose_many(asks)
        self.seen += [(a.tokens.tolist(), d) for a, d in zip(asks, mine, strict=True) if d]
        for a in asks:  # the cursor holds the exact entries, as from scratch
            ids, hidden = entries_ref(self.head, a.tokens.tolist())
            kv = self.head.new_kv()
            self.head.prefill(ids, hidden, torch.arange(len(ids)), kv)
            keys, values = a.cursor.kv[0].view()
            want_k, want_v = kv[0].view()
            assert keys.shape == want_k.shape, (keys.shape, want_k.shape)
            torch.testing.assert_close(keys, want_k, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(values, want_v, rtol=1e-4, atol=1e-5)
        return [self.oracle.propose(a.tokens, a.k) for a in asks]


@pytest.mark.parametrize("family", MTP_FAMILIES)
def test_incremental_drafts_equal_the_reference(mtp_dirs: dict[str, Path], family: str) -> None:
    folder = mtp_dirs[family]
    prompts = [[7 + (i * 13 + j * 5) % 250 for j in range(25 + 9 * i)] for i in range(2)]
    plain = Engine(folder, system="vanilla")
    want = {tuple(p): list(plain.generate(p, GREEDY).tokens) for p in prompts}
    spec = Engine(folder, system="vanilla", speculative=MTP)
    base = spec.worker.drafter
    assert isinstance(base, MTPDrafter) and spec.worker.model.emit_hidden
    steered = _Steered(base, OracleDrafter(want, 0.5, vocab=263))
    spec.worker.drafter = steered
    got = spec.generate_many(prompts, [GREEDY] * 2)
    assert [list(r.tokens) for r in got] == [want[tuple(p)] for p in prompts]
    kept = [r.spec.accepted for r in got]
    assert all(0 < k < r.spec.drafted for k, r in zip(kept, got, strict=True))
    assert len(steered.seen) >= 8
    for tokens, drafts in steered.seen:
        assert drafts == propose_ref(base.head, tokens, len(drafts)), len(tokens)


def test_a_cursor_holds_exact_entries_only(mtp_dirs: dict[str, Path]) -> None:
    """After a proposal the cursor's KV covers the consumed positions (the drafts' entries
    are dropped); trimmed rows leave a gap the next proposal tolerates."""
    folder = mtp_dirs["qwen3_next"]
    model = load_model(folder)
    drafter = MTPDrafter(load_mtp(model, folder))
    model.emit_hidden = True
    state = model.new_state()
    prompt = torch.arange(10, 40)
    model.prefill(prompt, state)
    assert [(p, len(r)) for p, r in state.hidden] == [(0, 30)]
    nxt = int(torch.argmax(state.logits))
    tokens = np.asarray([*prompt.tolist(), nxt])
    cursor = drafter.cursor()
    (drafts,) = drafter.propose_many([MTPRequest(cursor, state, tokens, 4)])
    assert len(drafts) == 4 and cursor.kv[0].length == 30 and cursor.fed_to == 30
    assert state.hidden == []
    assert drafts == propose_ref(drafter.head, tokens.tolist(), 4)
    # nothing new computed: the same drafts, from the last exact entry kept
    assert drafter.propose_many([MTPRequest(cursor, state, tokens, 4)]) == [drafts]
    assert cursor.kv[0].length == 30
    # the next position's row not computed yet: nothing to draft from
    longer = np.asarray([*tokens.tolist(), drafts[0]])
    assert drafter.propose_many([MTPRequest(cursor, state, longer, 4)]) == [[]]


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5", "nemotron_h_moe"])
def test_greedy_and_cached_tokens_are_identical_with_mtp(
    mtp_dirs: dict[str, Path], family: str
) -> None:
    folder = mtp_dirs[family]
    rng = np.random.default_rng(4)
    motif = rng.integers(7, 200, 9).tolist()

    def conversation(engine: Engine) -> list[tuple[Any, ...]]:
        history, out = motif * 3, []
        for _ in range(3):
            r = engine.generate(history, GREEDY)
            out.append((r.tokens, r.usage.cached_tokens, r.spec.drafted))
            history = history + list(r.tokens) + motif[:4]
        return out

    plain = Engine(folder, system="marconi", cache_bytes=50_000_000)
    spec = Engine(folder, system="marconi", cache_bytes=50_000_000, speculative=MTP)
    without, with_mtp = conversation(plain), conversation(spec)
    assert [r[:2] for r in with_mtp] == [r[:2] for r in without]
    assert any(cached for _, cached, _ in with_mtp[1:])
    assert sum(d for *_, d in with_mtp) > 0
    spec.store.check()
    assert spec.store.device_kv.held == plain.store.device_kv.held
    assert spec.cache.bytes_used == plain.cache.bytes_used


def test_a_sequence_not_drafting_keeps_a_bounded_tail_of_hidden_chunks() -> None:
    state = SeqState()
    state.hidden = [(p, torch.zeros(1, 4)) for p in range(300)]
    trim_pending(state, 256)
    assert [p for p, _ in state.hidden] == list(range(44, 300))
    trim_pending(state, 256)
    assert len(state.hidden) == 256
    trim_pending(state, 0)
    assert state.hidden == []
