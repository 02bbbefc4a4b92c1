"""The locally built byte tokenizer: round trips, id layout, offline AutoTokenizer load."""

from __future__ import annotations

from pathlib import Path

import pytest

from marconi_ray.engine.presets.byte_tokenizer import (
    BOS_ID,
    BYTE_OFFSET,
    BYTE_VOCAB_SIZE,
    EOS_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    TOKENIZER_FILES,
    build_byte_tokenizer,
    save_tokenizer,
)
from marconi_ray.protocol.model_files import load_tokenizer

TEXTS = [
    "",
    "hello world",
    "  leading spaces, tabs\t and\r\nnewlines\n",
    "héllo wörld, ñandú, Ελληνικά, 日本語",
    "emoji 😀🎉👩‍👩‍👧 and flags 🇫🇷",
    "\x00 control \x7f bytes",
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tokenizer(tmp_path_factory.mktemp("tok"), model_max_length=1234)


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_one_token_per_byte(text: str) -> None:
    tok = build_byte_tokenizer()
    ids = tok.encode(text).ids
    assert ids == [BYTE_OFFSET + b for b in text.encode("utf-8")]
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_special_ids_distinct_and_in_range() -> None:
    tok = build_byte_tokenizer()
    ids = [tok.token_to_id(t) for t in SPECIAL_TOKENS]
    assert ids == list(range(len(SPECIAL_TOKENS)))
    assert (PAD_ID, BOS_ID, EOS_ID) == (0, 1, 2)
    assert len(set(ids)) == len(ids)
    assert all(i is not None and i < BYTE_VOCAB_SIZE for i in ids)
    assert tok.get_vocab_size(with_added_tokens=True) == BYTE_VOCAB_SIZE == BYTE_OFFSET + 256


def test_special_token_text_is_one_id() -> None:
    tok = build_byte_tokenizer()
    assert tok.encode("<|user|>a").ids == [SPECIAL_TOKENS.index("<|user|>"), BYTE_OFFSET + 97]


def test_auto_tokenizer_loads_offline_and_matches(saved: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    assert {p.name for p in saved.iterdir()} >= set(TOKENIZER_FILES)
    hf = load_tokenizer(saved)
    assert isinstance(hf, PreTrainedTokenizerFast)
    assert (hf.pad_token_id, hf.bos_token_id, hf.eos_token_id) == (PAD_ID, BOS_ID, EOS_ID)
    assert hf.model_max_length == 1234
    raw = build_byte_tokenizer()
    for text in TEXTS:
        ids = hf.encode(text)
        assert ids == raw.encode(text).ids
        assert hf.decode(ids) == text


def test_chat_template(saved: Path) -> None:
    hf = load_tokenizer(saved)
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi 😀"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "bye"},
    ]
    text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|bos|><|system|>be brief<|end|><|user|>hi 😀<|end|>"
        "<|assistant|>hello<|end|><|user|>bye<|end|><|assistant|>"
    )
    no_prompt = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert no_prompt == text.removesuffix("<|assistant|>")
    ids = hf.apply_chat_template(messages[:2], tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if not isinstance(ids, list) else ids
    assert ids[0] == BOS_ID
    assert ids[-1] == SPECIAL_TOKENS.index("<|assistant|>")


def test_load_errors_name_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="nope"):
        load_tokenizer(missing)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="empty"):
        load_tokenizer(empty)
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(ValueError, match=r"file\.txt"):
        load_tokenizer(a_file)


def test_bad_model_max_length(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="model_max_length"):
        save_tokenizer(tmp_path, model_max_length=0)
