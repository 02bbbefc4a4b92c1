"""A tiny hybrid checkpoint shaped like one from the Hugging Face Hub, for the tests of
serving a model by its id: bfloat16 weights in sharded safetensors with an index, the
real Llama-2 tokenizer (from the shared data folder, see its PROVENANCE.md) as
`tokenizer.json`, a `chat_template.jinja`, and a place in a local Hugging Face cache
(`models--ORG--NAME/snapshots/<commit>/` + `refs/main`).

The factory's tiny model has a 512-id byte vocabulary; the checkpoint widens it to
Llama-2's 32000 ids. The factory's byte ids (7 + byte) move to Llama's byte-fallback ids
(3 + byte, `<0x41>` = "A"), so the model still writes printable ASCII, now as Llama
tokens; every other `lm_head` row is zero (its logit stays far below the printable ones)
and every other embedding row is small and random.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Final

import torch
from safetensors.torch import load_file, save_file

from marconi_ray.engine.presets.byte_tokenizer import BYTE_OFFSET
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.traces.paths import data_path, require_file

VOCAB: Final = 32000
"""Llama-2's vocabulary: unk 0, bos 1, eos 2, bytes 3..258 (`<0x00>`..`<0xFF>`)."""
LLAMA_BYTE0: Final = 3
COMMIT: Final = "0123456789abcdef0123456789abcdef01234567"
CHAT_TEMPLATE: Final = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}<<SYS>>\n{{ message['content'] }}\n<</SYS>>\n\n"
    "{% elif message['role'] == 'user' %}[INST] {{ message['content'] }} [/INST]"
    "{% else %} {{ message['content'] }}{{ eos_token }}{% endif %}"
    "{% endfor %}"
)


def llama_tokenizer_file() -> Path:
    """The shared Llama-2 SentencePiece model (`../shared/data`, or `MARCONI_DATA_DIR`)."""
    return require_file(data_path("llama2_tokenizer"))


def _widen(rows: torch.Tensor, zero_rest: bool, seed: int) -> torch.Tensor:
    """`rows` (the factory vocabulary) as Llama rows: specials 0..2 kept, byte ids moved
    to Llama's byte-fallback ids, the rest zero (`zero_rest`) or N(0, 0.02)."""
    gen = torch.Generator().manual_seed(seed)
    out = torch.randn(VOCAB, rows.shape[1], generator=gen).mul_(0.02).to(rows.dtype)
    if zero_rest:
        out.zero_()
    out[:LLAMA_BYTE0] = rows[:LLAMA_BYTE0]
    out[LLAMA_BYTE0 : LLAMA_BYTE0 + 256] = rows[BYTE_OFFSET : BYTE_OFFSET + 256]
    return out


def save_sharded(weights: dict[str, torch.Tensor], out: Path, shards: int) -> None:
    """`weights` as `shards` safetensors files plus `model.safetensors.index.json`."""
    keys = sorted(weights)
    per = -(-len(keys) // shards)
    weight_map: dict[str, str] = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: weights[k].contiguous() for k in keys[i * per : (i + 1) * per]}
        save_file(part, str(out / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
    total = sum(t.numel() * t.element_size() for t in weights.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def save_llama_tokenizer(out: Path) -> None:
    """`tokenizer.json` + `tokenizer_config.json` converted from the Llama-2 model, and
    `chat_template.jinja`."""
    from transformers import LlamaTokenizer

    staging = out / ".sentencepiece"
    staging.mkdir()
    shutil.copy(llama_tokenizer_file(), staging / "tokenizer.model")
    LlamaTokenizer.from_pretrained(str(staging)).save_pretrained(str(out))
    shutil.rmtree(staging)
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)


def build_checkpoint(
    out: Path, family: str = "nemotron_h", shards: int = 3, tokenizer: bool = True
) -> Path:
    """The tiny `family` model as a bfloat16 Llama-vocabulary checkpoint in `out`,
    sharded into `shards` files (see the module docstring); returns `out`."""
    base = make_model("tiny", family, out.parent / f".{out.name}-base", dtype="bfloat16")
    config: dict[str, Any] = json.loads((base / "config.json").read_text())
    weights = load_file(str(base / "model.safetensors"))
    old = int(config["vocab_size"])
    for key, tensor in weights.items():
        if tensor.ndim == 2 and tensor.shape[0] == old:
            weights[key] = _widen(tensor, zero_rest=key.endswith("lm_head.weight"), seed=1)
    config.update(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    out.mkdir(parents=True)
    save_sharded(weights, out, shards)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    shutil.rmtree(base)
    if tokenizer:
        save_llama_tokenizer(out)
    return out


def write_generation_config(folder: Path, **fields: Any) -> None:
    """`folder/generation_config.json` holding `fields`."""
    (folder / "generation_config.json").write_text(json.dumps(fields, indent=2))


def place_in_hub_cache(folder: Path, cache: Path, repo_id: str, commit: str = COMMIT) -> Path:
    """Copy `folder` into the Hugging Face cache `cache` as `repo_id` at `commit` (the
    `main` ref points at it); returns the snapshot folder."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    shutil.copytree(folder, snapshot)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot
