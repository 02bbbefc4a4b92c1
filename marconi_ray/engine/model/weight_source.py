"""Where checkpoint tensors are read from, one rank's slice at a time.

A `WeightSource` hands out this rank's rows of a split weight without materialising the
whole tensor: `SafetensorsSource` reads each slice through safetensors' `get_slice`
(only those bytes are copied out of the memory-mapped file), in the file's dtype (a
bfloat16 checkpoint stays bfloat16 until the parameter's own dtype is applied).
`StateDictSource` serves tensors already in memory (`narrow`, no copy). Both count the
bytes of the tensors they return in `bytes_read`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import torch
from safetensors import safe_open

INDEX_FILE: Final = "model.safetensors.index.json"


class WeightSource:
    """Checkpoint tensors by key. `where[key]` names the tensor's origin (a file) for
    error messages; `bytes_read` counts the bytes of every tensor `read` returned."""

    where: Mapping[str, str]
    bytes_read: int = 0

    def shape(self, key: str) -> tuple[int, ...]:
        """The whole tensor's shape (nothing is read)."""
        raise NotImplementedError

    def _read(self, key: str, dim: int | None, ranges: Sequence[tuple[int, int]]) -> torch.Tensor:
        raise NotImplementedError

    def read(
        self, key: str, dim: int | None = None, ranges: Sequence[tuple[int, int]] = ()
    ) -> torch.Tensor:
        """Tensor `key`, or only `ranges` of it along `dim` (concatenated in order)."""
        tensor = self._read(key, dim, ranges)
        self.bytes_read += tensor.numel() * tensor.element_size()
        return tensor


class StateDictSource(WeightSource):
    """Tensors already in memory (e.g. a transformers model's `state_dict()`)."""

    def __init__(self, weights: Mapping[str, torch.Tensor]) -> None:
        self.weights = weights
        self.where = dict.fromkeys(weights, "state dict")

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self.weights[key].shape)

    def _read(self, key: str, dim: int | None, ranges: Sequence[tuple[int, int]]) -> torch.Tensor:
        tensor = self.weights[key]
        if dim is None:
            return tensor
        parts = [tensor.narrow(dim, a, b - a) for a, b in ranges]
        return torch.cat(parts, dim=dim) if len(parts) > 1 else parts[0]


class SafetensorsSource(WeightSource):
    """The safetensors files of a checkpoint folder: those `model.safetensors.index.json`
    lists when it exists, else every `*.safetensors`. FileNotFoundError naming the folder
    when it has none, ValueError naming the index when it is malformed."""

    def __init__(self, model_dir: str | Path) -> None:
        folder = Path(model_dir)
        files = _weight_files(folder)
        self.handles: dict[str, Any] = {
            str(f): safe_open(str(f), framework="pt", device="cpu") for f in files
        }
        self.where = {
            key: name
            for name, handle in self.handles.items()
            for key in handle.keys()  # noqa: SIM118 - safe_open has no __iter__
        }

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self.handles[self.where[key]].get_slice(key).get_shape())

    def _read(self, key: str, dim: int | None, ranges: Sequence[tuple[int, int]]) -> torch.Tensor:
        handle = self.handles[self.where[key]]
        if dim is None:
            whole: torch.Tensor = handle.get_tensor(key)
            return whole
        view = handle.get_slice(key)
        lead = (slice(None),) * dim
        parts: list[torch.Tensor] = [view[(*lead, slice(a, b))] for a, b in ranges]
        return torch.cat(parts, dim=dim) if len(parts) > 1 else parts[0]


def _weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{index}: not a safetensors index ({exc!r})") from None
        return [model_dir / n for n in names]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {str(model_dir)!r}")
    return files
