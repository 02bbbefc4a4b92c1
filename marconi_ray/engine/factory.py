"""Random-weight hybrid checkpoints from a named preset: `make_model` and helpers.

`make_model` writes a folder that loads through the real loading path
(`AutoModelForCausalLM.from_pretrained(dir)`, `AutoTokenizer.from_pretrained(dir)`):
`config.json`, `generation_config.json`, `model.safetensors`, the byte tokenizer of
`marconi_ray.engine.tokenizer`, and `marconi.json` (preset, family, seed, dtype, parameter
count).

Logit separation: with the usual init (std 0.02) a random model's logits are nearly flat
(std ~0.02 * sqrt(hidden) across the vocab), so greedy decoding would flip on float
rounding. After the seeded init, the `lm_head` weight is redrawn from N(0, s^2) with
s = `LOGIT_STD / sqrt(hidden_size)`; the final RMSNorm leaves hidden states with RMS 1,
so the logits have std ~`LOGIT_STD` across the vocab. Only the rows of printable ASCII
bytes and newline stay random; every other row (special tokens, other bytes, the padding
of the model vocab past `BYTE_VOCAB_SIZE`) is zero, so its logit is exactly 0 while the
top printable logit is ~+2.5 std: greedy text is plain ASCII, which survives decoding and
re-encoding (multi-turn chat). Every build checks on a short random prompt that the std
over the tokenizer's ids at each position is >= `MIN_LOGIT_STD`.

Seeding: the whole build runs under `torch.random.fork_rng` seeded with `seed`, so the
same (preset, family, seed, dtype) gives bit-identical weights and the caller's global RNG
is left untouched.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

import torch

from marconi_ray.engine.model_presets import (
    BUILD_VERSION,
    DTYPE_NAMES,
    FAMILIES,
    PRESETS,
    ModelPreset,
    check_family,
    get_preset,
    preset_config,
)
from marconi_ray.engine.tokenizer import BYTE_OFFSET, BYTE_VOCAB_SIZE, save_tokenizer

__all__ = [
    "DTYPES",
    "FAMILIES",
    "PRESETS",
    "ModelPreset",
    "build_model",
    "check_logit_separation",
    "count_parameters",
    "get_preset",
    "make_model",
    "model_class",
    "preset_config",
    "read_record",
]

DTYPES: Final[Mapping[str, torch.dtype]] = MappingProxyType(
    {name: getattr(torch, name) for name in DTYPE_NAMES}
)
"""Weight dtypes `make_model` accepts, by name."""

LOGIT_STD: Final = 4.0
MIN_LOGIT_STD: Final = 1.0
CHECK_PROMPT_LEN: Final = 8
MARCONI_FILE: Final = "marconi.json"

_OUTPUT_FILES: Final = re.compile(
    r"(config\.json|generation_config\.json|marconi\.json|tokenizer\.json"
    r"|tokenizer_config\.json|special_tokens_map\.json|chat_template\.jinja"
    r"|model(-\d+-of-\d+)?\.safetensors|model\.safetensors\.index\.json)"
)


def model_class(family: str) -> Any:
    """The transformers `*ForCausalLM` class of `family` (ValueError naming a bad one)."""
    check_family(family)
    from transformers import BambaForCausalLM, NemotronHForCausalLM

    return NemotronHForCausalLM if family == "nemotron_h" else BambaForCausalLM


def count_parameters(preset: str, family: str) -> int:
    """Exact parameter count of `preset` as `family`, built on the meta device (no memory)."""
    config = preset_config(preset, family)
    with torch.device("meta"):
        model = model_class(family)(config)
    return sum(p.numel() for p in model.parameters())


def _check_dtype(dtype: str) -> torch.dtype:
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid dtypes: {list(DTYPES)}")
    return DTYPES[dtype]


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    return seed


def _is_previous_output(names: set[str]) -> bool:
    return MARCONI_FILE in names and all(_OUTPUT_FILES.fullmatch(n) for n in names)


def _check_out_dir(out: Path, overwrite: bool) -> None:
    """ValueError naming `out` unless it is absent, empty, a previous output, or `overwrite`."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"output path exists and is not a folder: {out}")
    names = {p.name for p in out.iterdir()} if out.exists() else set()
    if names and not overwrite and not _is_previous_output(names):
        raise ValueError(
            f"output folder {out} is not empty and is not a previous make-model output; "
            "pass overwrite=True (--overwrite) to write into it"
        )


def _remove_stale_outputs(out: Path) -> None:
    """Delete make-model output files of a previous build (e.g. old weight shards)."""
    if out.is_dir():
        for path in out.iterdir():
            if _OUTPUT_FILES.fullmatch(path.name) and path.is_file():
                path.unlink()


def _separate_logits(model: Any, hidden_size: int) -> None:
    """Redraw the lm_head weight so logits have std ~LOGIT_STD (see module docstring)."""
    head = model.get_output_embeddings().weight
    fresh = torch.randn(head.shape, dtype=torch.float32) * (LOGIT_STD / math.sqrt(hidden_size))
    # Only printable ASCII and newline keep a random row; every other id's logit is 0, far
    # below the largest of ~95 draws of N(0, LOGIT_STD^2), so greedy text is plain ASCII
    # (it round-trips through detokenize -> re-encode, which multi-turn chat relies on).
    keep = torch.zeros(head.shape[0], dtype=torch.bool)
    keep[BYTE_OFFSET + 32 : BYTE_OFFSET + 127] = True
    keep[BYTE_OFFSET + ord("\n")] = True
    fresh[~keep] = 0.0
    with torch.no_grad():
        head.copy_(fresh.to(head.dtype))


def check_logit_separation(model: Any) -> float:
    """Smallest per-position logit std over the tokenizer's ids on a random byte prompt.

    Raises RuntimeError when it is below `MIN_LOGIT_STD` (greedy decoding would not be
    robust to float rounding). Draws the prompt from torch's global RNG.
    """
    prompt = torch.randint(BYTE_OFFSET, BYTE_VOCAB_SIZE, (1, CHECK_PROMPT_LEN)).to(model.device)
    with torch.no_grad():
        logits = model(input_ids=prompt).logits[0, :, :BYTE_VOCAB_SIZE].float()
    min_std = float(logits.std(dim=-1).min())
    if not min_std >= MIN_LOGIT_STD:
        raise RuntimeError(f"random model logits too flat: std {min_std:.3f} < {MIN_LOGIT_STD}")
    return min_std


def build_model(
    preset: str, family: str, *, seed: int = 0, dtype: str = "float32", device: str = "cpu"
) -> Any:
    """The seeded random-weight model (eval mode, on `device`) with separated logits.

    Materialises every weight: callers guard large presets (see `make_model`). On a GPU,
    `device="cuda"` initialises a 7B model in seconds where the CPU needs minutes (its
    weights then come from the CUDA generator, so they differ from a CPU build's).
    """
    config = preset_config(preset, family)
    torch_dtype = _check_dtype(dtype)
    _check_seed(seed)
    from transformers import AutoModelForCausalLM

    auto: Any = AutoModelForCausalLM  # untyped in transformers
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device(device):
            model = auto.from_config(config, dtype=torch_dtype)
        _separate_logits(model, config.hidden_size)
        model.eval()
        check_logit_separation(model)
    return model


def make_model(
    preset: str,
    family: str,
    out_dir: str | Path,
    *,
    seed: int = 0,
    dtype: str = "float32",
    allow_large: bool = False,
    overwrite: bool = False,
) -> Path:
    """Build `preset` as `family` with random weights and save it to `out_dir`; return it.

    Everything is validated before anything is written: an unknown preset, family or
    dtype, a bad seed, a large preset without `allow_large`, or an `out_dir` that holds
    files other than a previous make-model output (unless `overwrite`) raise ValueError
    naming the value. A previous output in `out_dir` is replaced; with `overwrite`, files
    that are not make-model outputs are left in place.
    """
    spec = get_preset(preset)
    check_family(family)
    torch_dtype = _check_dtype(dtype)
    _check_seed(seed)
    if spec.large and not allow_large:
        n = count_parameters(preset, family)
        gb = n * torch_dtype.itemsize / 1e9
        raise ValueError(
            f"preset {preset!r} has {n:,} parameters (~{gb:.0f} GB in {dtype}); "
            "pass allow_large=True (--allow-large) to materialise it"
        )
    out = Path(out_dir)
    _check_out_dir(out, overwrite)

    model = build_model(preset, family, seed=seed, dtype=dtype)
    n_params = sum(p.numel() for p in model.parameters())
    _remove_stale_outputs(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    save_tokenizer(out, model_max_length=spec.max_position_embeddings)
    record = {
        "preset": preset,
        "family": family,
        "seed": seed,
        "dtype": dtype,
        "num_parameters": n_params,
        "logit_std": LOGIT_STD,
        "build_version": BUILD_VERSION,
    }
    (out / MARCONI_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return out


def read_record(model_dir: str | Path) -> dict[str, Any]:
    """The `marconi.json` record of a make-model folder (FileNotFoundError naming it)."""
    path = Path(model_dir) / MARCONI_FILE
    if not path.is_file():
        raise FileNotFoundError(f"not a make-model folder (no {MARCONI_FILE}): {path.parent}")
    record: dict[str, Any] = json.loads(path.read_text())
    return record
