"""Torch inference engine for hybrid Attention+SSM models (no Ray).

Model, weight loading, state store, runner, sampling and tokenizer. The public names are
imported lazily so that light modules here (e.g. `model_presets`, used by the CLI parser)
do not pull in torch:

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
    "SamplingParams": "marconi_ray.engine.sampling",
    "HybridModel": "marconi_ray.engine.model",
    "load_model": "marconi_ray.engine.loader",
    "StateStore": "marconi_ray.engine.state_store",
    "TPGroup": "marconi_ray.engine.parallel",
    "make_model": "marconi_ray.engine.factory",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'marconi_ray.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
