"""What the control plane reads of a model folder, without torch: its `config.json` as a
dict, its weights' dtype, its tokenizer, and the byte size of each dtype a deployment may
run in."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

END_OF_TURN: Final = "<|end|>"
"""The token that ends a chat turn in our presets' template (and the packaged `chat`
model's): when a tokenizer has it, chat requests stop at it."""

DTYPE_BYTES: Final = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes per element of the model dtypes a deployment may use (`ServeConfig.dtype`)."""


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in file `path`; ValueError naming the file when it is not valid JSON
    or not an object."""
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return raw


def read_config_json(model_dir: str | Path) -> dict[str, Any]:
    """`model_dir/config.json` as a dict; FileNotFoundError naming the folder when it is
    missing, ValueError naming the file when it is not a JSON object."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in model directory {str(model_dir)!r}")
    return read_json_object(path)


def checkpoint_dtype(model_dir: str | Path) -> str:
    """The dtype a checkpoint's weights are stored in: `config.json`'s `dtype` (or the
    older `torch_dtype`) when it is one of `DTYPE_BYTES`, else `float32`."""
    raw = read_config_json(model_dir)
    value = raw.get("dtype", raw.get("torch_dtype"))
    name = str(value).removeprefix("torch.")
    return name if name in DTYPE_BYTES else "float32"


def load_tokenizer(model_dir: str | Path) -> Any:
    """The folder's fast tokenizer (`tokenizer.json` + `tokenizer_config.json`: special
    tokens, chat template), never downloaded. transformers' `PreTrainedTokenizerFast`
    rather than `AutoTokenizer`, which imports torch for its model mappings: the ingress
    tokenizes without loading torch.

    Raises FileNotFoundError naming the path when the folder or its `tokenizer.json` is
    missing, and ValueError when `model_dir` is not a folder.
    """
    path = Path(model_dir)
    if not path.exists():
        raise FileNotFoundError(f"tokenizer folder not found: {path}")
    if not path.is_dir():
        raise ValueError(f"tokenizer path is not a folder: {path}")
    if not (path / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer.json in {path}")
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
