"""A cache entry moved between two engines' caches (`export_prefix` / `import_prefix`,
`engine.store.entry_io`): the receiver's next turn hits the moved entry and its tokens
equal an uncached engine's, in every family; a payload that arrives corrupt, short, for
other tokens or from another model is refused and changes nothing; the receiver's store
holds exactly what its tree accounts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.presets.model_presets import FAMILIES
from marconi_ray.engine.store.checksum import checksum
from marconi_ray.engine.store.entry_io import EntryPayload, TransferError
from marconi_ray.protocol.sampling import SamplingParams

PARAMS = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def _accounted(engine: Engine) -> None:
    engine.store.check()
    assert engine.store.bytes_used == engine.cache.bytes_used
    states, slots = engine.cache.referenced()
    assert set(engine.store.state_ids()) == states
    assert set(engine.store.used_slots().tolist()) == slots


def _chat(engine: Engine, seed: int, n: int = 24) -> list[int]:
    rng = np.random.default_rng(seed)
    return rng.integers(3, engine.config.vocab_size, n).tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_a_moved_entry_serves_the_next_turn_exactly(model_dirs, family):
    source = Engine(model_dirs[family], system="marconi")
    receiver = Engine(model_dirs[family], system="marconi")
    reference = Engine(model_dirs[family], system="vanilla")
    chat = _chat(source, 1)
    first = source.generate(chat, PARAMS)
    history = chat + list(first.tokens)
    payload = source.export_prefix(history)
    assert payload is not None and payload.meta.kv_from == 0
    depth = payload.meta.depth
    assert depth > len(chat)  # the state after the last decoded token
    _accounted(source)  # the export's pin is gone, nothing leaked
    assert receiver.import_prefix(payload) == depth
    _accounted(receiver)
    assert receiver.cache.stats.requests == 0  # an import is not a request
    follow = history + _chat(source, 2, 6)
    got = receiver.generate(follow, PARAMS)
    assert got.usage.cached_tokens == depth
    assert got.tokens == reference.generate(follow, PARAMS).tokens
    _accounted(receiver)


@pytest.mark.parametrize("family", ["nemotron_h", "recurrent_gemma", "lfm3"])
def test_an_entry_extends_what_the_receiver_holds(model_dirs, family):
    """The receiver served the first turn itself; the source served the second: only
    the KV past the receiver's hit travels, and the third turn hits the moved entry."""
    source = Engine(model_dirs[family], system="marconi")
    receiver = Engine(model_dirs[family], system="marconi")
    reference = Engine(model_dirs[family], system="vanilla")
    chat = _chat(source, 3)
    one = receiver.generate(chat, PARAMS)
    turn2 = chat + list(one.tokens) + _chat(source, 4, 5)
    source.generate(chat, PARAMS)
    two = source.generate(turn2, PARAMS)
    history = turn2 + list(two.tokens)
    held = receiver.held_prefix(history)
    assert held == len(chat) + len(one.tokens)
    payload = source.export_prefix(history, kv_from=held)
    assert payload is not None
    full = source.export_prefix(history)
    assert full is not None
    kv_saved = held * source.store.kv_bytes_per_token  # RecurrentGemma: no per-token KV
    assert payload.meta.nbytes == full.meta.nbytes - kv_saved
    assert receiver.import_prefix(payload) == len(history)
    _accounted(receiver)
    turn3 = history + _chat(source, 5, 4)
    got = receiver.generate(turn3, PARAMS)
    assert got.usage.cached_tokens == len(history)
    assert got.tokens == reference.generate(turn3, PARAMS).tokens


def _flipped(payload: EntryPayload, group: str, at: int) -> EntryPayload:
    tensors = {g: t.clone() for g, t in payload.tensors.items()}
    raw = tensors[group].view(torch.uint8)
    raw[at] ^= 0x10
    return EntryPayload(payload.meta, tensors)


def _short(payload: EntryPayload, group: str) -> EntryPayload:
    tensors = dict(payload.tensors)
    tensors[group] = tensors[group][:-1].clone()
    return EntryPayload(payload.meta, tensors)


def test_a_bad_payload_is_refused_and_changes_nothing(model_dirs):
    source = Engine(model_dirs["nemotron_h"], system="marconi")
    receiver = Engine(model_dirs["nemotron_h"], system="marconi")
    other = Engine(model_dirs["mamba2"], system="marconi")
    reference = Engine(model_dirs["nemotron_h"], system="vanilla")
    chat = _chat(source, 6)
    receiver.generate(_chat(source, 7), PARAMS)  # something for the refusal to keep
    history = chat + list(source.generate(chat, PARAMS).tokens)
    payload = source.export_prefix(history)
    assert payload is not None
    groups = sorted(payload.tensors)
    assert "float32" in groups
    before = (receiver.store.bytes_used, receiver.cache.bytes_used, receiver.cache.node_count)
    bad = [_flipped(payload, g, 3) for g in groups] + [_short(payload, g) for g in groups]
    bad.append(EntryPayload(payload.meta, {}))
    for p in bad:
        with pytest.raises(TransferError):
            receiver.import_prefix(p)
        _accounted(receiver)
        assert (
            receiver.store.bytes_used,
            receiver.cache.bytes_used,
            receiver.cache.node_count,
        ) == before
        assert receiver.cache.open_plans == 0
    with pytest.raises(TransferError, match="layout"):
        other.import_prefix(payload)
    assert other.cache.bytes_used == 0 and other.store.bytes_used == 0
    # refused, the receiver recomputes: exact, no hit
    follow = history + _chat(source, 8, 3)
    got = receiver.generate(follow, PARAMS)
    assert got.usage.cached_tokens == 0
    assert got.tokens == reference.generate(follow, PARAMS).tokens


def test_nothing_to_move(model_dirs):
    source = Engine(model_dirs["nemotron_h"], system="marconi")
    chat = _chat(source, 9)
    assert source.export_prefix(chat) is None  # an empty cache has no entry
    history = chat + list(source.generate(chat, PARAMS).tokens)
    assert source.export_prefix(history, kv_from=len(history)) is None
    payload = source.export_prefix(history)
    assert payload is not None
    assert source.import_prefix(payload) == 0  # it holds that entry already
    _accounted(source)


def test_checksum_tells_flips_moves_and_truncation_apart():
    t = torch.arange(1000, dtype=torch.float32)
    base = checksum(t)
    assert base == checksum(t.clone())
    flipped = t.clone()
    flipped.view(torch.int32)[10] ^= 1
    swapped = t.clone()
    swapped[[3, 4]] = swapped[[4, 3]]
    assert checksum(flipped) != base
    assert checksum(swapped)[1] == base[1] and checksum(swapped) != base
    assert checksum(t[:-1])[0] == base[0] - 4
    half = torch.arange(7, dtype=torch.bfloat16)  # 14 bytes: padded to a word
    assert checksum(half)[0] == 14
    assert checksum(t[::2]) == checksum(t[::2].contiguous())
