"""`marconi-loadgen agent`: SWE-bench trajectories as tool-calling conversations (the bash
block a `bash` tool call, the observation its `tool` result) or as recorded text; replayed
through the official `openai` client against the app in process on the packaged `chat`
model: with live history, every turn finds the whole previous turn (prompt and the
model's own constrained call) cached, in the tool form as in the flat one."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from loadgen import cli
from loadgen.agent import replay, summarize, write_agent_run
from loadgen.agent_conversations import COMMAND_CHARS, conversation
from marconi_ray.engine.engine import Engine
from marconi_ray.serve.ingress.api import build_app
from marconi_ray.serve.ingress.local_backend import LocalBackend
from marconi_ray.serve.ingress.prepare import ServedModel
from marconi_ray.serve.model_source import resolve_model
from marconi_ray.traces.paths import default_data_dir
from marconi_ray.traces.swebench import TRAJ_DIR, load_messages, trajectory_files

torch.set_num_threads(1)

TRAJECTORY = [
    {"role": "system", "content": "You are a helpful assistant that can run bash."},
    {"role": "user", "content": "Fix the failing test in the repository."},
    {"role": "assistant", "content": "THOUGHT: look around.\n\n```bash\nls\n```"},
    {"role": "user", "content": "<returncode>0</returncode>\n<output>setup.py src</output>"},
    {"role": "assistant", "content": "I forgot the block."},
    {"role": "user", "content": "Please always provide EXACTLY ONE action in a bash block."},
    {"role": "assistant", "content": "```bash\ncat setup.py\n```"},
    {"role": "user", "content": "<returncode>0</returncode>\n<output>import x</output>"},
    {"role": "assistant", "content": "THOUGHT: done.\n```bash\necho done\n```"},
]


def test_the_tool_form_turns_bash_blocks_into_calls_and_observations_into_results() -> None:
    conv = conversation(3, TRAJECTORY, "tools")
    m = conv.messages
    assert conv.turns == (2, 4, 6, 8)
    assert m[2]["content"] == "THOUGHT: look around."
    (call,) = m[2]["tool_calls"]
    assert call["function"] == {"name": "bash", "arguments": json.dumps({"command": "ls"})}
    assert m[3] == {"role": "tool", "tool_call_id": call["id"], "content": TRAJECTORY[3]["content"]}
    # an assistant message without a block stays text, and so does the warning after it
    assert m[4] == {"role": "assistant", "content": "I forgot the block."}
    assert m[5]["role"] == "user"
    assert m[6]["content"] is None and m[7]["tool_call_id"] == m[6]["tool_calls"][0]["id"]
    flat = conversation(3, TRAJECTORY, "flat")
    assert flat.turns == conv.turns
    assert [x["content"] for x in flat.messages] == [x["content"] for x in TRAJECTORY]
    cut = conversation(3, TRAJECTORY, "flat", max_chars=5)
    assert all(len(x["content"]) <= 5 for x in cut.messages)
    assert cut.request(1) == list(cut.messages[:4])


def test_live_history_answers_the_model_s_own_call() -> None:
    conv = conversation(0, TRAJECTORY, "tools")
    sent = conv.request(0)
    reply = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_model", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    ]}  # fmt: skip
    nxt = conv.next_request(sent, 0, reply)
    assert nxt[:2] == sent and nxt[2] is reply
    assert nxt[3]["role"] == "tool" and nxt[3]["tool_call_id"] == "call_model"
    with pytest.raises(ValueError, match="made no call"):
        conv.next_request(sent, 0, {"role": "assistant", "content": "no call"})
    with pytest.raises(ValueError, match="form 'xml'"):
        conversation(0, TRAJECTORY, "xml")
    with pytest.raises(ValueError, match="no assistant message"):
        conversation(0, TRAJECTORY[:2], "tools")


@pytest.mark.data("swebench")
def test_every_shared_trajectory_converts_with_each_result_answering_its_call() -> None:
    files = trajectory_files(default_data_dir() / TRAJ_DIR)
    calls = 0
    for i, path in enumerate(files):
        conv = conversation(i, load_messages(path), "tools")
        open_call = None
        for m in conv.messages:
            if m["role"] == "tool":
                assert m["tool_call_id"] == open_call
                open_call = None
            if m.get("tool_calls"):
                open_call = m["tool_calls"][0]["id"]
                json.loads(m["tool_calls"][0]["function"]["arguments"])
                calls += 1
        assert len(conv.turns) == len(conversation(i, load_messages(path), "flat").turns)
    assert calls > 1000


@pytest.fixture
def app() -> Iterator[Any]:
    """The app over a fresh engine (its `LocalBackend` belongs to one event loop: the
    one a test's replay runs)."""
    model_dir = resolve_model("chat")
    engine = Engine(model_dir, system="marconi", cache_bytes=200_000_000, max_batch=8)
    yield build_app(LocalBackend(engine), ServedModel.load(model_dir, "chat"))


def _replay(app: Any, history: str) -> list[Any]:
    async def main() -> list[Any]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as http:
            convs = [conversation(s, TRAJECTORY, f) for f in ("tools", "flat") for s in (0, 1)]
            return await replay(
                "http://agent", "chat", convs, 128, history, 2, http_client=http, progress=False
            )

    return asyncio.run(main())


def test_live_agent_turns_find_the_whole_previous_turn_cached(app: Any, tmp_path: Path) -> None:
    records = _replay(app, "live")
    assert all(r.error is None for r in records), [r.error for r in records if r.error]
    assert len(records) == 2 * 2 * 4
    tools = [r for r in records if r.form == "tools"]
    assert all(r.tool_calls == 1 for r in tools)  # every turn forced one bash call
    by = {(r.form, r.session_id, r.turn): r for r in records}
    for r in records:
        if r.turn:
            before = by[(r.form, r.session_id, r.turn - 1)]
            assert r.cached_tokens == before.prompt_tokens + before.completion_tokens, r
    summary = write_agent_run(records, tmp_path)
    assert summary["tools"]["by_turn"]["3"]["previous_turn_cached"] == 1.0
    assert summary["tools"]["token_hit_rate"] > 0.5
    assert (tmp_path / "agent_cached_by_turn.png").stat().st_size > 0
    assert "| 3 |" in (tmp_path / "agent_turns.md").read_text()


def test_trace_agent_turns_send_the_recorded_history(app: Any) -> None:
    records = _replay(app, "trace")
    assert all(r.error is None for r in records)
    tools = summarize(records)["tools"]
    assert tools["turns_served"] == 8 and tools["by_turn"]["3"]["cached_tokens"] > 0


def test_the_cli_refuses_bad_values_naming_them(tmp_path: Path, capsys: Any) -> None:
    base = ["agent", "--url", "http://127.0.0.1:1", "--out", str(tmp_path)]
    assert cli.main([*base, "--forms", "xml"]) == 2
    assert "xml" in capsys.readouterr().err
    assert cli.main([*base, "--sessions", "0"]) == 2
    assert "--sessions" in capsys.readouterr().err
    assert cli.main(["agent", "--url", "http://10.0.0.1:8000", "--out", str(tmp_path)]) == 2
    assert "10.0.0.1" in capsys.readouterr().err
    assert COMMAND_CHARS < 100
