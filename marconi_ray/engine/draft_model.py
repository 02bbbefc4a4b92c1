"""`draft:MODEL` speculation: a small model drafting for a bigger one with the same
tokenizer (`DraftModelDrafter`), and `drafter_for`, what the engine and the serve shards
build a config's drafter with."""

from __future__ import annotations

from pathlib import Path

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.spec.drafters import Drafter, Tokens
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.protocol.speculative import DRAFT_PREFIX, SpeculativeConfig

DRAFT_CACHE_BYTES = 1 << 28


class DraftModelDrafter:
    """A small model's greedy continuation: an in-process `Engine` over its folder, its
    own Marconi cache keeping each sequence's state after its last decoded token, so a
    proposal prefills only the tokens since the previous one (the target's accepted
    tokens) and decodes k. Pure in its arguments (greedy), so every TP rank's copy
    proposes the same. ValueError at construction when its vocabulary is larger than
    the target's `vocab` (it must share the target's tokenizer)."""

    def __init__(self, model_dir: str | Path, vocab: int) -> None:
        self.engine = Engine(model_dir, system="marconi", cache_bytes=DRAFT_CACHE_BYTES)
        mine = self.engine.config.vocab_size
        if mine > vocab:
            raise ValueError(
                f"draft model {str(model_dir)!r} has {mine} token ids, more than the "
                f"target's {vocab}: it must share the target's tokenizer"
            )

    def propose(self, tokens: Tokens, k: int) -> list[int]:
        params = SamplingParams(max_tokens=k, temperature=0.0, ignore_eos=True)
        return list(self.engine.generate([int(t) for t in tokens], params).tokens)


def drafter_for(config: SpeculativeConfig | None, vocab: int) -> Drafter | None:
    """The draft model of a `draft:PATH` config (None for any other: the worker builds
    those itself)."""
    if config is None or not config.method.startswith(DRAFT_PREFIX):
        return None
    return DraftModelDrafter(config.method[len(DRAFT_PREFIX) :], vocab)
