"""The service's incremental `Detokenizer` against a whole decode, on real text.

It decodes a window of the latest ids per `add` instead of the whole output; the text it
releases (plus `finish`) must still be the tokenizer's decode of all the ids, and with
stop strings it must stop where the whole-decode reference below stops, at the same token.
Tokenizers: the presets' byte tokenizer and Llama-2's SentencePiece (as a transformers
tokenizer); texts: ShareGPT replies (unicode, code, emoji), random ids with invalid UTF-8
and special tokens, fed one id at a time and in random chunks.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from marconi_ray.engine.factory import make_model
from marconi_ray.protocol.model_files import load_tokenizer
from marconi_ray.serve.ingress.generation import Detokenizer
from marconi_ray.traces.paths import default_data_dir
from marconi_ray.traces.tokenizer import LLAMA2_RELPATH

SHAREGPT = Path("sharegpt") / "ShareGPT_V3_unfiltered_cleaned_split.head4000.json"
TEXTS = 24
MAX_IDS = 160


def reference(tokenizer: Any, ids: list[int], stops: tuple[str, ...]) -> tuple[str, int]:
    """(the text a client gets, tokens taken): a whole decode after every id."""
    for n in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:n], skip_special_tokens=True)
        cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
        if cuts:
            return text[: min(cuts)], n
    return tokenizer.decode(ids, skip_special_tokens=True), len(ids)


def run(
    tokenizer: Any, ids: list[int], stops: tuple[str, ...], rng: random.Random
) -> tuple[str, int]:
    """The same through `Detokenizer.add_many`, in chunks of 1 to 5 ids."""
    detok = Detokenizer(tokenizer, stops)
    out, taken, at = [], 0, 0
    while at < len(ids):
        chunk = ids[at : at + rng.randint(1, 5)]
        at += len(chunk)
        text, stopped, used = detok.add_many(chunk)
        out.append(text)
        taken += used
        if stopped:
            return "".join(out), taken
    return "".join(out) + detok.finish(), taken


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    llama = default_data_dir() / LLAMA2_RELPATH
    if not llama.is_file():
        pytest.skip(f"shared data folder not found at {default_data_dir()}")
    from transformers import LlamaTokenizer

    byte_dir = make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("detok") / "tiny")
    return {
        "bytes": load_tokenizer(byte_dir),
        "llama2": LlamaTokenizer.from_pretrained(llama.parent),
    }


@pytest.fixture(scope="module")
def replies() -> list[str]:
    data = json.loads((default_data_dir() / SHAREGPT).read_text())
    out = [
        turn["value"] for conv in data for turn in conv["conversations"] if turn["from"] == "gpt"
    ]
    picked = [t for t in out if any(ord(c) > 127 for c in t)][: TEXTS // 2]
    return picked + [t for t in out if "```" in t][: TEXTS // 2]


@pytest.mark.parametrize("name", ["bytes", "llama2"])
def test_released_text_is_the_whole_decode(
    tokenizers: dict[str, Any], replies: list[str], name: str
) -> None:
    tok, rng = tokenizers[name], random.Random(7)
    vocab = len(tok)
    for reply in replies:
        ids = tok.encode(reply, add_special_tokens=False)[:MAX_IDS]
        assert run(tok, ids, (), rng) == reference(tok, ids, ())
        one = Detokenizer(tok)
        assert "".join(one.add(t)[0] for t in ids) + one.finish() == reference(tok, ids, ())[0]
    for _ in range(TEXTS):  # raw ids: bytes that are no UTF-8 on their own, special ids
        ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 60))]
        assert run(tok, ids, (), rng) == reference(tok, ids, ())


@pytest.mark.parametrize("name", ["bytes", "llama2"])
def test_stop_strings_stop_at_the_same_token(
    tokenizers: dict[str, Any], replies: list[str], name: str
) -> None:
    tok, rng = tokenizers[name], random.Random(11)
    stopped = 0
    for reply in replies:
        ids = tok.encode(reply, add_special_tokens=False)[:MAX_IDS]
        whole = tok.decode(ids, skip_special_tokens=True)
        at = rng.randrange(len(whole) // 2, len(whole)) if len(whole) > 8 else 0
        stops = (whole[at : at + rng.randint(1, 4)], "\x00never")
        got, want = run(tok, ids, stops, rng), reference(tok, ids, stops)
        assert got == want
        stopped += want[1] < len(ids) or want[0] != whole
    assert stopped >= len(replies) // 2  # the stops really cut most outputs
