"""The two-tier cache end to end in the `Engine`: a device budget of a few requests and a
large host tier, multi-turn conversations served partly from host-tier states and KV,
outputs equal to an uncached engine's in every family, and the store's tiers equal to the
tree's after every request."""

from __future__ import annotations

import numpy as np
import pytest

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.presets.model_presets import FAMILIES
from marconi_ray.protocol.sampling import SamplingParams

PARAMS = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
HOST_BYTES = 10**8


def _two_tier_engine(model_dir, turns_kept: float) -> Engine:
    """A Marconi engine whose device tier holds about `turns_kept` requests' bytes, with
    a large host tier whose placement demotes every device victim (`lru`): at the default
    clock, flop-aware placement finds no demotion of a tiny model worth its copy."""
    probe = Engine(model_dir, system="vanilla").store
    device_bytes = int(turns_kept * (40 * probe.kv_bytes_per_token + 2 * probe.state_bytes))
    return Engine(
        model_dir,
        system="marconi",
        cache_bytes=device_bytes,
        host_cache_bytes=HOST_BYTES,
        host_placement="lru",
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_conversations_served_from_the_host_tier_are_exact(model_dirs, family):
    # a pure SSM (Mamba, xLSTM) has no KV, and RecurrentGemma's window is in its states:
    # 1.5 "turns" would be three states, enough for both chats' last states, and nothing
    # would come back from the host; one turn is two states
    no_token_kv = Engine(model_dirs[family], system="vanilla").store.kv_bytes_per_token == 0
    turns = 1.0 if no_token_kv else 1.5
    engine = _two_tier_engine(model_dirs[family], turns_kept=turns)
    reference = Engine(model_dirs[family], system="vanilla")
    rng = np.random.default_rng(8)
    vocab = engine.config.vocab_size
    chats = [rng.integers(3, vocab, 20).tolist() for _ in range(2)]
    for turn in range(3):
        for chat in chats:
            got = engine.generate(chat, PARAMS)
            assert got.tokens == reference.generate(chat, PARAMS).tokens, (turn, chat)
            chat += [*got.tokens, *rng.integers(3, vocab, 5).tolist()]
            store, cache = engine.store, engine.cache
            store.check()
            assert store.bytes_used == cache.bytes_used
            assert store.host_bytes_used == cache.bytes_by_tier()["host"]
            host_states, host_slots = cache.referenced_on_host()
            assert set(store.host_state_ids()) == host_states
            assert set(store.host_slot_ids().tolist()) == host_slots
    stats = engine.cache.stats
    assert stats.host_hit_tokens > 0 and stats.demotions > 0 and stats.promotions > 0
    moved = engine.store.tier_stats()
    assert moved["moves_to_host"] > 0 and moved["bytes_to_device"] > 0
