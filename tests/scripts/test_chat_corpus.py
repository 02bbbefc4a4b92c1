"""The chat model's corpus rules (`scripts/chat_corpus.py`): roles mapped, other roles and
non-English conversations dropped, a held-out split fixed by the id alone, one copy per id,
and a missing data folder named in the error."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from chat_corpus import (
    Conversation,
    is_held_out,
    parse,
    read_jsonl_gz,
    read_sharegpt,
    render,
    split,
    write_jsonl_gz,
)


def _record(cid: str, *turns: tuple[str, str]) -> dict:
    return {"id": cid, "conversations": [{"from": f, "value": v} for f, v in turns]}


def test_roles_are_mapped_and_other_roles_dropped():
    c = parse(
        _record("a", ("system", "Be brief."), ("human", "Hi"), ("bing", "x"), ("gpt", "Hello"))
    )
    assert c is not None
    assert [m["role"] for m in c.messages] == ["system", "user", "assistant"]
    assert (
        render(c.messages)
        == "<|bos|><|system|>Be brief.<|end|><|user|>Hi<|end|><|assistant|>Hello<|end|>"
    )


def test_non_english_and_one_sided_conversations_are_dropped():
    assert (
        parse(_record("b", ("human", "你好，今天天气怎么样？"), ("gpt", "今天天气很好。"))) is None
    )
    assert parse(_record("c", ("human", "Hi"))) is None
    assert parse(_record("d", ("human", "Hi"), ("gpt", "   "))) is None


def test_the_split_depends_on_the_id_only_and_ids_are_kept_once(tmp_path: Path):
    ids = [f"conv-{i}" for i in range(2000)]
    held = [i for i in ids if is_held_out(i)]
    assert 0 < len(held) < 100  # about 2 in 100
    records = [_record(i, ("human", "Hi"), ("gpt", "Hello")) for i in ids]
    (tmp_path / "one.json").write_text(json.dumps(records[:1200]))
    (tmp_path / "two.json").write_text(json.dumps(records[1000:]))
    conversations = read_sharegpt(tmp_path, ("one.json", "two.json", "absent.json"))
    assert [c.id for c in conversations] == ids
    train, held_out = split(conversations)
    assert [c.id for c in held_out] == held and len(train) + len(held) == len(ids)


def test_conversations_round_trip_and_a_missing_folder_is_named(tmp_path: Path):
    rows = [
        Conversation(
            "x", ({"role": "user", "content": "é?"}, {"role": "assistant", "content": "ok"})
        )
    ]
    write_jsonl_gz(tmp_path / "c.jsonl.gz", rows)
    assert list(read_jsonl_gz(tmp_path / "c.jsonl.gz")) == rows
    with pytest.raises(FileNotFoundError, match="nowhere"):
        read_sharegpt(tmp_path / "nowhere")
