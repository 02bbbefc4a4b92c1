"""Sessions from the packaged `sample` trace: prefix extension, id mapping, prompts."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from loadgen.sessions import (
    PromptSpec,
    Reply,
    build_sessions,
    map_ids,
    max_tokens,
    next_prompt,
)
from marconi_ray.traces.registry import load_trace
from marconi_ray.traces.trace import Request, Trace


@pytest.fixture(scope="module")
def sample():
    return build_sessions(load_trace("sample"), 5)


def test_sample_turns_extend_their_predecessor(sample):
    assert len(sample.sessions) == 5 and sample.non_extending_turns == 0
    for s in sample.sessions:
        assert s.turns[0].new_ids == s.turns[0].input_ids and s.turns[0].think_s == 0.0
        for prev, turn in itertools.pairwise(s.turns):
            assert turn.extends and turn.think_s >= 0
            assert turn.input_ids == prev.input_ids + prev.output_ids + turn.new_ids
            assert len(turn.new_ids) > 0


def test_non_extending_turn_is_counted():
    a = np.array([5, 6, 7], np.int32)
    reqs = [
        Request(0, 0, 0.0, a, np.array([8], np.int32)),
        Request(0, 1, 2.0, np.array([9, 9], np.int32), np.array([1], np.int32)),
    ]
    ss = build_sessions(Trace("t", tuple(reqs)))
    turn = ss.sessions[0].turns[1]
    assert ss.non_extending_turns == 1 and not turn.extends
    assert turn.new_ids == (9, 9) and turn.think_s == 2.0


def test_map_ids_range_and_determinism():
    ids = list(range(0, 40_000, 7))
    mapped = map_ids(ids, 264)
    assert min(mapped) >= 7 and max(mapped) <= 262 and mapped == map_ids(ids, 264)
    assert map_ids([0, 256, 3], 264) == [7, 7, 10]
    assert map_ids([5, 40_000], None) == [5, 40_000]
    with pytest.raises(ValueError, match="8"):
        map_ids([1], 8)


def test_trace_history_sends_the_trace_input(sample):
    spec = PromptSpec("trace", "tokens", vocab_size=264)
    turns = sample.sessions[0].turns
    p0 = next_prompt(turns[0], None, None, spec)
    p1 = next_prompt(turns[1], p0, Reply((7, 8), "", 2), spec)
    assert p1.ids == tuple(map_ids(turns[1].input_ids, 264)) and p1.n_tokens == len(p1.ids)
    assert all(7 <= t < 263 for t in p1.ids)


def test_live_history_appends_the_actual_reply(sample):
    spec = PromptSpec("live", "tokens", vocab_size=264)
    turns = sample.sessions[0].turns
    p0 = next_prompt(turns[0], None, None, spec)
    assert p0.ids == tuple(map_ids(turns[0].input_ids, 264))
    reply = Reply((100, 101, 102), "abc", 3)
    p1 = next_prompt(turns[1], p0, reply, spec)
    assert p0.ids is not None
    assert p1.ids == (*p0.ids, 100, 101, 102, *map_ids(turns[1].new_ids, 264))
    # a server without token ids: nothing appended, still a prefix extension
    p1_bare = next_prompt(turns[1], p0, Reply((), "abc", 3), spec)
    assert p1_bare.ids == p0.ids + tuple(map_ids(turns[1].new_ids, 264))


def test_text_mode_detokenizes():
    def detok(ids):
        return "".join(chr(97 + t % 26) for t in ids)

    spec = PromptSpec("live", "text", detokenize=detok)
    reqs = [
        Request(0, 0, 0.0, np.array([0, 1], np.int32), np.array([2], np.int32)),
        Request(0, 1, 1.0, np.array([0, 1, 2, 3], np.int32), np.array([4], np.int32)),
    ]
    turns = build_sessions(Trace("t", tuple(reqs))).sessions[0].turns
    p0 = next_prompt(turns[0], None, None, spec)
    p1 = next_prompt(turns[1], p0, Reply((), " reply", 2), spec)
    assert p0.text == "ab" and p1.text == "ab reply" + "d" and p1.n_tokens == 2 + 2 + 1
    with pytest.raises(ValueError, match="detokenizer"):
        PromptSpec("live", "text")
    with pytest.raises(ValueError, match="'bogus'"):
        PromptSpec("bogus", "tokens")


def test_max_tokens_caps_and_floors(sample):
    turn = sample.sessions[0].turns[0]
    assert max_tokens(turn, 4) == 4
    assert max_tokens(turn, 10_000) == len(turn.output_ids)
    empty = build_sessions(Trace("t", (Request(0, 0, 0.0, np.array([1], np.int32)),)))
    assert max_tokens(empty.sessions[0].turns[0], 8) == 1
