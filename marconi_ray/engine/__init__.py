"""Torch inference engine for hybrid Attention+SSM models (no Ray).

`model/` (the hybrid decoder, its TP layers, config and loading), `store/` (the two-tier
state store), `presets/` (random-weight presets, `make_model`, the byte tokenizer), and at
the top the `Worker` (with its `Sequence`s and `Sampler`) and the `Engine` that pairs it
with a planner. The public names are imported lazily so that light modules here (e.g.
`presets.model_presets`, used by the CLI parser) do not pull in torch:

    from marconi_ray.engine import Engine, SamplingParams
    engine = Engine(model_dir, system="marconi", cache_bytes=2**30)
    result = engine.generate(prompt_tokens, SamplingParams(max_tokens=32, temperature=0))
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Engine": "marconi_ray.engine.engine",
    "GenerationResult": "marconi_ray.protocol.results",
    "Usage": "marconi_ray.protocol.results",
    "Timings": "marconi_ray.protocol.results",
    "SamplingParams": "marconi_ray.protocol.sampling",
    "HybridModel": "marconi_ray.engine.model.hybrid_model",
    "load_model": "marconi_ray.engine.model.loader",
    "StateStore": "marconi_ray.engine.store.state_store",
    "TPGroup": "marconi_ray.engine.model.parallel",
    "make_model": "marconi_ray.engine.presets.factory",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'marconi_ray.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
