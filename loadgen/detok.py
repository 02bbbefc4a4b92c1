"""Token ids -> text with the trace's tokenizer (text prompt mode, for vLLM/SGLang).

The trace tokenizers (:mod:`marconi_ray.traces.tokenizer`) only encode, so this loads the
same model files for decoding: a SentencePiece ``.model`` file (default: Llama-2's in the
shared data folder) or a Hugging Face folder with ``tokenizer.json``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from marconi_ray.traces.paths import default_data_dir, require_file
from marconi_ray.traces.tokenizer import LLAMA2_RELPATH

Detokenize = Callable[[Sequence[int]], str]


def load_detokenizer(path: str | os.PathLike[str] | None = None) -> Detokenize:
    """A decode function for the tokenizer at ``path`` (None: the default Llama-2 model).

    FileNotFoundError naming a missing default model; ValueError naming a path that is not
    a tokenizer.
    """
    p = require_file(default_data_dir() / LLAMA2_RELPATH) if path is None else Path(path)
    if p.is_file() and p.suffix == ".model":
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(p))
        return lambda ids: str(sp.decode([int(t) for t in ids]))
    folder = p.parent if p.is_file() and p.name == "tokenizer.json" else p
    if (folder / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        return lambda ids: str(tok.decode([int(t) for t in ids]))
    raise ValueError(f"not a tokenizer: {p} (expected a .model file or a tokenizer.json folder)")
