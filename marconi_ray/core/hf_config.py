"""Build a `ModelSpec` from a Hugging Face `config.json` dict (no transformers import).

`spec_from_hf_config` dispatches on `config["model_type"]` through `HF_PARSERS`, an
immutable registry of one parser per supported hybrid family (see `hf_families`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final

from marconi_ray.core import hf_families
from marconi_ray.core.model_spec import ModelSpec
from marconi_ray.core.spec_checks import require_positive

HfParser = Callable[[Mapping[str, object], int, str], ModelSpec]
"""(config dict, dtype_bytes, name) -> ModelSpec."""

HF_PARSERS: Final[Mapping[str, HfParser]] = MappingProxyType(
    {
        "nemotron_h": hf_families.parse_nemotron_h,
        "bamba": hf_families.parse_bamba,
        "jamba": hf_families.parse_jamba,
        "zamba2": hf_families.parse_zamba2,
        "falcon_h1": hf_families.parse_falcon_h1,
        "granitemoehybrid": hf_families.parse_granitemoehybrid,
    }
)


def supported_model_types() -> tuple[str, ...]:
    """The model_type values `spec_from_hf_config` accepts, sorted."""
    return tuple(sorted(HF_PARSERS))


def spec_from_hf_config(
    config: Mapping[str, object], dtype_bytes: int = 2, name: str | None = None
) -> ModelSpec:
    """Parse a HF config dict into a `ModelSpec`.

    Args:
        config: the parsed `config.json` or `PretrainedConfig.to_dict()`. Keys it lacks take
            the defaults of the family's transformers config class.
        dtype_bytes: bytes per element of the cached KV and SSM states (2 for fp16/bf16).
        name: spec name; defaults to the config's `_name_or_path`, else its model_type.

    Raises:
        ValueError: config is not a mapping, model_type is missing or unsupported (the
            message lists the supported ones), a required key is missing or null, or a
            value has the wrong type or an invalid size; the message names the key.
    """
    if not isinstance(config, Mapping):
        raise ValueError(f"config must be a mapping, got {type(config).__name__}")
    require_positive("dtype_bytes", dtype_bytes)
    if "model_type" not in config:
        raise ValueError("config is missing required key 'model_type'")
    model_type = config["model_type"]
    parser = HF_PARSERS.get(model_type) if isinstance(model_type, str) else None
    if parser is None:
        supported = ", ".join(supported_model_types())
        raise ValueError(f"unsupported model_type {model_type!r}; supported: {supported}")
    if name is None:
        path = config.get("_name_or_path")
        name = path if isinstance(path, str) and path else str(model_type)
    return parser(config, dtype_bytes, name)
