"""Tokenizers for trace building: SentencePiece ``.model`` files or HF ``tokenizer.json``.

Every tokenizer has a stable ``fingerprint`` (sha256 of its model file bytes) so that
tokenized traces can be cached on disk and invalidated when the tokenizer changes.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Protocol, runtime_checkable

from marconi_ray.traces.paths import default_data_dir, require_file

LLAMA2_RELPATH = Path("tokenizers") / "llama2" / "tokenizer.model"
_BOS_CANDIDATES = ("<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>", "<|endoftext|>")


@runtime_checkable
class Tokenizer(Protocol):
    """Text -> token ids. ``encode(text, bos)`` prepends the BOS id when ``bos`` is true
    (and the tokenizer has one)."""

    @property
    def name(self) -> str: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def fingerprint(self) -> str: ...

    def encode(self, text: str, bos: bool) -> list[int]: ...


def _sha256_files(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()


class SentencePieceTokenizer:
    """A SentencePiece model file (e.g. Llama-2's ``tokenizer.model``)."""

    def __init__(self, model_file: str | os.PathLike[str]) -> None:
        import sentencepiece as spm

        self._path = require_file(model_file)
        self._sp = spm.SentencePieceProcessor(model_file=str(self._path))
        self._bos = int(self._sp.bos_id())
        self._fp = _sha256_files(self._path)

    @property
    def name(self) -> str:
        return f"sentencepiece:{self._path.parent.name}/{self._path.name}"

    @property
    def vocab_size(self) -> int:
        return int(self._sp.get_piece_size())

    @property
    def fingerprint(self) -> str:
        return self._fp

    def encode(self, text: str, bos: bool) -> list[int]:
        ids: list[int] = self._sp.encode(text)
        return [self._bos, *ids] if bos and self._bos >= 0 else ids


def _hf_bos_token(folder: Path, added: list[str]) -> str | None:
    config = folder / "tokenizer_config.json"
    if config.is_file():
        tok = json.loads(config.read_text(encoding="utf-8")).get("bos_token")
        if isinstance(tok, dict):
            tok = tok.get("content")
        if isinstance(tok, str):
            return tok
    return next((c for c in _BOS_CANDIDATES if c in added), None)


class HFTokenizer:
    """A Hugging Face ``tokenizers`` folder holding ``tokenizer.json``.

    The BOS token is ``bos_token`` of ``tokenizer_config.json`` if present, else the first
    well-known BOS among the special tokens; without one, ``bos=True`` adds nothing.
    """

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        from tokenizers import Tokenizer as _HF

        self._dir = Path(folder)
        tok_file = require_file(self._dir / "tokenizer.json")
        self._tok = _HF.from_file(str(tok_file))
        added = [t.content for t in self._tok.get_added_tokens_decoder().values() if t.special]
        bos_text = _hf_bos_token(self._dir, added)
        self._bos = self._tok.token_to_id(bos_text) if bos_text else None
        extra = [p for p in (self._dir / "tokenizer_config.json",) if p.is_file()]
        self._fp = _sha256_files(tok_file, *extra)

    @property
    def name(self) -> str:
        return f"hf:{self._dir.name}"

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    @property
    def fingerprint(self) -> str:
        return self._fp

    def encode(self, text: str, bos: bool) -> list[int]:
        ids: list[int] = self._tok.encode(text, add_special_tokens=False).ids
        return [self._bos, *ids] if bos and self._bos is not None else ids


def load_tokenizer(path: str | os.PathLike[str] | None = None) -> Tokenizer:
    """Load a tokenizer.

    None -> Llama-2 SentencePiece at ``<data>/tokenizers/llama2/tokenizer.model``;
    a ``.model`` file -> SentencePiece; a folder with ``tokenizer.json`` -> HF tokenizers.
    A missing default model raises FileNotFoundError; anything else raises ValueError
    naming the path.
    """
    if path is None:
        return SentencePieceTokenizer(require_file(default_data_dir() / LLAMA2_RELPATH))
    p = Path(path)
    if p.is_file() and p.suffix == ".model":
        return SentencePieceTokenizer(p)
    if p.is_dir() and (p / "tokenizer.json").is_file():
        return HFTokenizer(p)
    if p.is_file() and p.name == "tokenizer.json":
        return HFTokenizer(p.parent)
    raise ValueError(
        f"not a tokenizer: {p} (expected a SentencePiece .model file or a folder with "
        "tokenizer.json)"
    )
