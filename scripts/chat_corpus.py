"""The `chat` model's corpus: ShareGPT conversations, rendered with the chat template of
`marconi_ray.engine.presets.byte_tokenizer`, split into training and held-out conversations.

Contract:
- A conversation is kept when its text is at least `MIN_ASCII` ASCII (the model is an
  English one; ShareGPT also holds Chinese, Korean, Japanese... conversations) and it has
  at least one user and one assistant turn. Roles: ShareGPT's `human` is `user`, `gpt`
  is `assistant`, `system` is `system`; turns of any other role (`bing`) are dropped.
- Held out: the conversations whose id hashes (`zlib.crc32`) into `HELD_OUT_PERCENT` of
  100 buckets, whatever file they come from; the rest train. Two files may hold the same
  id (the two ShareGPT samples overlap): it is kept once.
- `render(messages)` is exactly what the tokenizer's chat template renders for them (a
  test holds it), so training text and served prompts look alike.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

MIN_ASCII: Final = 0.97
HELD_OUT_PERCENT: Final = 2
ROLES: Final = {"human": "user", "gpt": "assistant", "system": "system"}
SHAREGPT_FILES: Final = (
    "ShareGPT_V3_unfiltered_cleaned_split.head4000.json",
    "ShareGPT_V3_unfiltered_cleaned_split.ge10rounds_from_first17671.json",
)


@dataclass(frozen=True)
class Conversation:
    """One conversation: its ShareGPT id and its `{"role", "content"}` messages."""

    id: str
    messages: tuple[dict[str, str], ...]

    @property
    def text(self) -> str:
        return "".join(m["content"] for m in self.messages)

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "messages": list(self.messages)}, ensure_ascii=False)


def render(messages: Iterable[dict[str, str]]) -> str:
    """The chat template's text for `messages` (no generation prompt)."""
    return "<|bos|>" + "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in messages)


def is_held_out(conversation_id: str) -> bool:
    return zlib.crc32(conversation_id.encode()) % 100 < HELD_OUT_PERCENT


def _ascii_share(text: str) -> float:
    return sum(c.isascii() for c in text) / max(1, len(text))


def parse(record: dict[str, object]) -> Conversation | None:
    """A ShareGPT record as a `Conversation`, or None when it is not kept (see above)."""
    turns = record.get("conversations")
    if not isinstance(turns, list):
        return None
    messages = tuple(
        {"role": ROLES[t["from"]], "content": t["value"]}
        for t in turns
        if isinstance(t, dict)
        and t.get("from") in ROLES
        and isinstance(t.get("value"), str)
        and t["value"].strip()
    )
    roles = {m["role"] for m in messages}
    conversation = Conversation(str(record.get("id", "")), messages)
    if {"user", "assistant"} - roles or _ascii_share(conversation.text) < MIN_ASCII:
        return None
    return conversation


def read_sharegpt(data_dir: Path, files: Sequence[str] = SHAREGPT_FILES) -> list[Conversation]:
    """The kept conversations of `files` under `data_dir`, in file order, each id once.

    FileNotFoundError naming the folder when none of the files is there."""
    paths = [data_dir / f for f in files if (data_dir / f).is_file()]
    if not paths:
        raise FileNotFoundError(f"{data_dir}: none of {list(files)} is there")
    seen: set[str] = set()
    out: list[Conversation] = []
    for path in paths:
        for record in json.loads(path.read_text()):
            conversation = parse(record)
            if conversation is not None and conversation.id not in seen:
                seen.add(conversation.id)
                out.append(conversation)
    return out


def split(conversations: Iterable[Conversation]) -> tuple[list[Conversation], list[Conversation]]:
    """(training, held out) by `is_held_out`."""
    train: list[Conversation] = []
    held: list[Conversation] = []
    for c in conversations:
        (held if is_held_out(c.id) else train).append(c)
    return train, held


def write_jsonl_gz(path: Path, conversations: Iterable[Conversation]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for c in conversations:
            f.write(c.to_json() + "\n")


def read_jsonl_gz(path: Path) -> Iterator[Conversation]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            yield Conversation(row["id"], tuple(row["messages"]))
