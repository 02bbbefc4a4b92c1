"""SWE-bench agent trajectories as the conversations an agent framework sends: tool calls
(`tools` form) or the recorded text (`flat` form).

A mini-swe-agent trajectory is `system`, `user` (the task), then `assistant` messages (a
THOUGHT and one ```bash block) each answered by a `user` observation. In the `tools` form
an assistant message with a bash block becomes its THOUGHT as `content` (null when there
is none) plus one call of the `bash` tool (`BASH_TOOL`) whose `command` is the block; the
observation after it becomes the `tool` message answering that call. An assistant message
without a block (a format error the agent was warned about) stays text, and so does the
warning after it. The `flat` form is the messages as recorded.

Turn k of a conversation sends the messages before its k-th assistant message (the agent
framework's request) and records that message as the reply. `max_chars` cuts every
message's text to that many characters (an agent's own output truncation), so long
sessions fit a small model's context.

History (`Conversation.next_request`): `trace` sends the recorded messages whatever the
model answered; `live` puts the model's own replies in their place (in the `tools` form
the observation then answers the reply's call), as an agent's history grows.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]
FORMS = ("tools", "flat")
HISTORIES = ("live", "trace")
COMMAND_CHARS = 48
"""The longest command the replayed `bash` tool takes (so a forced call of a
random-weight model ends within a turn's token budget)."""

BASH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run one bash command in the repository and return its output.",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {
                    "type": "string",
                    "maxLength": COMMAND_CHARS,
                    "description": "The command.",
                }
            },
            "required": ["command"],
            "additionalProperties": False,
        },
    },
}
_BLOCK = re.compile(r"```bash\s*\n(.*?)\n?```", re.DOTALL)


@dataclass(frozen=True)
class Conversation:
    """One trajectory in one form: its messages and the index of every assistant
    message (turn k sends `messages[: turns[k]]`)."""

    session_id: int
    form: str
    messages: tuple[Message, ...]
    turns: tuple[int, ...]

    def request(self, k: int) -> list[Message]:
        """The messages turn k sends with `trace` history."""
        return list(self.messages[: self.turns[k]])

    def next_request(self, sent: list[Message], k: int, reply: Message) -> list[Message]:
        """Turn k + 1's messages with `live` history: turn k's (`sent`), the model's
        `reply` to them, then the recorded messages up to the next assistant message (an
        observation answering a tool call answers the reply's first call). ValueError
        when the recorded observation answers a call and the reply made none."""
        calls = reply.get("tool_calls") or []
        between = self.messages[self.turns[k] + 1 : self.turns[k + 1]]
        out = [*sent, reply]
        for m in between:
            if m["role"] == "tool":
                if not calls:
                    raise ValueError(f"session {self.session_id} turn {k}: the reply made no call")
                m = {**m, "tool_call_id": calls[0]["id"]}
            out.append(m)
        return out


def _cut(text: str, max_chars: int | None) -> str:
    return text if max_chars is None else text[:max_chars]


def _tool_form(messages: list[Message], max_chars: int | None) -> list[Message]:
    out: list[Message] = []
    answering: str | None = None  # the id of the call the next observation answers
    for i, m in enumerate(messages):
        role, text = m["role"], _cut(str(m["content"]), max_chars)
        if role == "assistant":
            block = _BLOCK.search(str(m["content"]))
            answering = None
            if block is None:
                out.append({"role": "assistant", "content": text})
                continue
            answering = f"call_{i}"
            thought = _cut(str(m["content"])[: block.start()].strip(), max_chars)
            arguments = json.dumps({"command": _cut(block.group(1), max_chars)})
            function = {"name": "bash", "arguments": arguments}
            call = {"id": answering, "type": "function", "function": function}
            out.append({"role": "assistant", "content": thought or None, "tool_calls": [call]})
        elif role == "user" and answering is not None:
            out.append({"role": "tool", "tool_call_id": answering, "content": text})
            answering = None
        else:
            out.append({"role": role, "content": text})
    return out


def conversation(
    session_id: int, messages: list[Message], form: str, max_chars: int | None = None
) -> Conversation:
    """`messages` (a trajectory's) in `form` (`FORMS`); ValueError naming a bad form or a
    trajectory without an assistant message."""
    if form not in FORMS:
        raise ValueError(f"form {form!r} is not one of {', '.join(FORMS)}")
    if max_chars is not None and max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    if form == "tools":
        shaped = _tool_form(messages, max_chars)
    else:
        shaped = [
            {"role": m["role"], "content": _cut(str(m["content"]), max_chars)} for m in messages
        ]
    turns = tuple(i for i, m in enumerate(shaped) if m["role"] == "assistant")
    if not turns:
        raise ValueError(f"trajectory {session_id} has no assistant message")
    return Conversation(session_id, form, tuple(shaped), turns)
