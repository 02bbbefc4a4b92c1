"""A checkpoint's generation defaults (`generation_config.json`) and its end-of-sequence
ids, read without torch.

Like vLLM's `--generation-config auto`: `temperature`, `top_p` and `top_k` become the
defaults of a request that does not set them, and `max_new_tokens` the default output
budget (at most the endpoint's own default: 16 for completions, the rest of the context
for chat). A value equal to transformers' `GenerationConfig` default (temperature 1.0,
top_p 1.0, top_k 50) is not applied, as vLLM reads only the non-default fields. Unlike
vLLM, a request's explicit `max_tokens` is not capped by `max_new_tokens`. Other fields
(`do_sample`, `repetition_penalty`, `min_p`...) are not applied: vLLM ignores
`do_sample` too, and the engine has no penalties.

Every id in `eos_token_id` (an int or a list, in `config.json` and in
`generation_config.json`) ends generation unless a request sets `ignore_eos`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from marconi_ray.protocol.model_files import read_config_json, read_json_object
from marconi_ray.protocol.sampling import is_int

GENERATION_CONFIG: Final = "generation_config.json"
_TRANSFORMERS_DEFAULTS: Final = {"temperature": 1.0, "top_p": 1.0, "top_k": 50}


@dataclass(frozen=True)
class GenerationDefaults:
    """What a checkpoint asks of requests that leave a setting out.

    Attributes:
        temperature, top_p, top_k: sampling defaults (None: the API's own default).
        max_tokens: default output budget from `max_new_tokens` (None: none).
        eos_token_ids: ids that end generation (config.json's, then the generation
            config's others), in order, without repeats.
    """

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def sampling(self) -> dict[str, float | int]:
        """The sampling fields that have a default, by request field name."""
        fields = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}
        return {name: value for name, value in fields.items() if value is not None}

    def budget(self, endpoint_default: int) -> int:
        """The output budget of a request that sets none: `endpoint_default`, or
        `max_tokens` when that is smaller."""
        return (
            endpoint_default if self.max_tokens is None else min(endpoint_default, self.max_tokens)
        )


def _eos_ids(raw: dict[str, Any], where: Path) -> tuple[int, ...]:
    value = raw.get("eos_token_id")
    values = value if isinstance(value, list) else [] if value is None else [value]
    if not all(is_int(v) and v >= 0 for v in values):
        raise ValueError(f"{where}: eos_token_id must be an id or a list of ids, got {value!r}")
    return tuple(values)


def _number(raw: dict[str, Any], key: str, where: Path, ok: Any) -> Any:
    value = raw.get(key)
    if value is None or value == _TRANSFORMERS_DEFAULTS.get(key):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
        raise ValueError(f"{where}: invalid {key} {value!r}")
    return value


def read_generation_defaults(model_dir: str | Path, vocab_size: int) -> GenerationDefaults:
    """The defaults of the checkpoint in `model_dir` (no `generation_config.json`: none
    but `config.json`'s end-of-sequence ids). ValueError naming the file and the key of
    a value that is not valid (an end-of-sequence id outside [0, `vocab_size`) too)."""
    folder = Path(model_dir)
    eos = list(_eos_ids(read_config_json(folder), folder / "config.json"))
    path = folder / GENERATION_CONFIG
    raw: dict[str, Any] = read_json_object(path) if path.is_file() else {}
    if raw:
        eos += [t for t in _eos_ids(raw, path) if t not in eos]
    bad = [t for t in eos if t >= vocab_size]
    if bad:
        raise ValueError(
            f"{folder}: eos_token_id {bad[0]} is outside the vocabulary [0, {vocab_size})"
        )
    temperature = _number(raw, "temperature", path, lambda v: math.isfinite(v) and v >= 0)
    top_p = _number(raw, "top_p", path, lambda v: 0 < v <= 1)
    top_k = _number(raw, "top_k", path, lambda v: is_int(v) and v >= -1)
    max_tokens = _number(raw, "max_new_tokens", path, lambda v: is_int(v) and v >= 1)
    return GenerationDefaults(
        None if temperature is None else float(temperature),
        None if top_p is None else float(top_p),
        top_k,
        max_tokens,
        tuple(eos),
    )
