"""The service's incremental `Detokenizer` against a whole decode, on real text.

It decodes a window of the latest ids per `add` instead of the whole output; the text it
releases (plus `finish`) must still be the tokenizer's decode of all the ids, and with
stop strings it must stop where the whole-decode reference below stops, at the same token.
Tokenizers: the presets' byte tokenizer and Llama-2's SentencePiece (as a transformers
tokenizer); texts: ShareGPT replies (unicode, code, emoji), random ids with invalid UTF-8
and special tokens, fed one id at a time and in random chunks; a special id at every
position of a window, characters split into byte tokens across adds, and stop strings
that end in a multi-byte character.
"""

from __future__ import annotations

import functools
import itertools
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest

from marconi_ray.engine.presets.byte_tokenizer import BYTE_OFFSET
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.protocol.model_files import load_tokenizer
from marconi_ray.serve.ingress.generation import REPLACEMENT, Detokenizer
from marconi_ray.traces.paths import data_path

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
    return feed(tokenizer, ids, stops, (rng.randint(1, 5) for _ in itertools.count()))


def feed(
    tokenizer: Any, ids: list[int], stops: tuple[str, ...], sizes: Iterator[int]
) -> tuple[str, int]:
    """The same in chunks of the given sizes."""
    detok = Detokenizer(tokenizer, stops)
    out, taken, at = [], 0, 0
    while at < len(ids):
        chunk = ids[at : at + next(sizes)]
        at += len(chunk)
        text, stopped, used = detok.add_many(chunk)
        out.append(text)
        taken += used
        if stopped:
            return "".join(out), taken
    return "".join(out) + detok.finish(), taken


def assert_streams_as_reference(
    tokenizer: Any, ids: list[int], stops: tuple[str, ...], rng: random.Random
) -> None:
    """`ids` fed one at a time (`add`), in chunks of 2 and of 3 (so that each id in turn
    starts a window) and in random chunks release the reference's text, taking as many
    tokens."""
    want = reference(tokenizer, ids, stops)
    for size in (1, 2, 3):
        assert feed(tokenizer, ids, stops, itertools.repeat(size)) == want, (ids, size)
    assert run(tokenizer, ids, stops, rng) == want, ids
    one, out, taken = Detokenizer(tokenizer, stops), "", 0
    for token in ids:
        text, stopped = one.add(token)
        out, taken = out + text, taken + 1
        if stopped:
            break
    else:
        out += one.finish()
    assert (out, taken) == want, ids


def prefix_stable(tokenizer: Any, ids: list[int]) -> bool:
    """Whether the decode of each prefix of `ids`, less a trailing U+FFFD, starts the
    decode of all of them (the `Detokenizer`'s contract holds for these ids)."""
    whole = tokenizer.decode(ids, skip_special_tokens=True)
    return all(
        whole.startswith(tokenizer.decode(ids[:n], skip_special_tokens=True).rstrip(REPLACEMENT))
        for n in range(1, len(ids))
    )


def byte_ids(tokenizer: Any, data: bytes) -> list[int]:
    """`data` as byte tokens, one id per byte."""
    return [byte_table(tokenizer)[b] for b in data]


@functools.cache
def byte_table(tokenizer: Any) -> list[int]:
    """The id of each byte value: Llama-2's byte-fallback pieces `<0xNN>`, else the byte
    tokenizer's `BYTE_OFFSET + byte`."""
    if "<0x41>" in tokenizer.get_vocab():
        return [tokenizer.convert_tokens_to_ids(f"<0x{b:02X}>") for b in range(256)]
    return [BYTE_OFFSET + b for b in range(256)]


class CountingTokenizer:
    """A tokenizer that records how many ids each `decode` gets."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.sizes: list[int] = []

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        self.sizes.append(len(ids))
        text: str = self.inner.decode(ids, skip_special_tokens=skip_special_tokens)
        return text


TEXT = "Hello there, caf\u00e9 \U0001f600 friend\nnew line"
CHARS = ("\u00e9", "\u20ac", "\U0001f600", "\u4e2d", "\u00df", " ", "x")


def mixed_ids(tokenizer: Any, rng: random.Random, pieces: int) -> list[int]:
    """Random ids: special ids, characters of 1 to 4 UTF-8 bytes as byte tokens, and the
    ids `TEXT` encodes to (words, spaces, pieces that continue a word)."""
    specials, words = tokenizer.all_special_ids, tokenizer.encode(TEXT, add_special_tokens=False)
    out: list[int] = []
    for _ in range(pieces):
        kind = rng.random()
        if kind < 0.25:
            out.append(rng.choice(specials))
        elif kind < 0.55:
            out += byte_ids(tokenizer, rng.choice(CHARS).encode())
        else:
            out.append(rng.choice(words))
    return out


@pytest.fixture(scope="module")
def byte_tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The presets' byte tokenizer (built here, no shared data)."""
    folder = make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("detok") / "tiny")
    return load_tokenizer(folder)


@pytest.fixture(scope="module")
def llama2_tok() -> Any:
    """Llama-2's SentencePiece tokenizer, from the shared data folder."""
    from transformers import LlamaTokenizer

    return LlamaTokenizer.from_pretrained(data_path("llama2_tokenizer").parent)


@pytest.fixture(
    params=["bytes", pytest.param("llama2", marks=pytest.mark.data("llama2_tokenizer"))]
)
def tok(request: pytest.FixtureRequest) -> Any:
    """Each tokenizer kind we ship, by itself (the byte one needs no shared data)."""
    return request.getfixturevalue("byte_tok" if request.param == "bytes" else "llama2_tok")


@pytest.fixture(scope="module")
def replies() -> list[str]:
    """ShareGPT replies with non-ASCII characters, and replies with code."""
    data = json.loads(data_path("sharegpt_head4000").read_text())
    out = [
        turn["value"] for conv in data for turn in conv["conversations"] if turn["from"] == "gpt"
    ]
    picked = [t for t in out if any(ord(c) > 127 for c in t)][: TEXTS // 2]
    return picked + [t for t in out if "```" in t][: TEXTS // 2]


@pytest.mark.data("sharegpt_head4000")
def test_released_text_is_the_whole_decode(tok: Any, replies: list[str]) -> None:
    rng = random.Random(7)
    vocab = len(tok)
    for reply in replies:
        ids = tok.encode(reply, add_special_tokens=False)[:MAX_IDS]
        assert run(tok, ids, (), rng) == reference(tok, ids, ())
        one = Detokenizer(tok)
        assert "".join(one.add(t)[0] for t in ids) + one.finish() == reference(tok, ids, ())[0]
    for _ in range(TEXTS):  # raw ids: bytes that are no UTF-8 on their own, special ids
        ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 60))]
        assert run(tok, ids, (), rng) == reference(tok, ids, ())


@pytest.mark.data("sharegpt_head4000")
def test_stop_strings_stop_at_the_same_token(tok: Any, replies: list[str]) -> None:
    rng = random.Random(11)
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


def test_a_special_id_at_every_window_position(tok: Any) -> None:
    """A special id (skipped by the decode) at each offset of a text, alone and twice in
    a row, with and without a stop string: a window that starts at it must not decode the
    next piece as the first of a text (SentencePiece drops that piece's leading space:
    'Hellothere' for 'Hello there')."""
    rng, base = random.Random(3), tok.encode(TEXT, add_special_tokens=False)
    for special, at, times in itertools.product(
        sorted(set(tok.all_special_ids)), range(len(base) + 1), (1, 2)
    ):
        ids = base[:at] + [special] * times + base[at:]
        for stops in ((), ("\u00e9 \U0001f600",)):
            assert_streams_as_reference(tok, ids, stops, rng)


def test_bytes_split_across_adds_with_special_ids(tok: Any) -> None:
    """Characters of 2 to 4 bytes sent as byte tokens (text incomplete between adds),
    mixed with special ids and word pieces: the released text is the whole decode for
    every stream whose decode is prefix-stable, and most are."""
    rng, stable = random.Random(5), 0
    for _ in range(150):
        ids = mixed_ids(tok, rng, rng.randint(1, 16))
        if prefix_stable(tok, ids):
            stable += 1
            assert_streams_as_reference(tok, ids, (), rng)
    assert stable >= 100


def test_stop_strings_ending_in_a_multibyte_character(tok: Any) -> None:
    """A stop string whose last character arrives as byte tokens: the text before it that
    the stop may start with is held (an incomplete character counts as no text, and does
    not shorten the hold), so the stream is the whole decode cut before the stop."""
    rng, cut = random.Random(9), 0
    for text, stop in [
        ("abx\u00e9 and more", "x\u00e9"),
        ("abx\u00e9", "bx\u00e9"),
        ("abx\u00e8 and x\u00e9", "x\u00e9"),
        ("one \u20ac 2\u20ac", " 2\u20ac"),
        ("smile x\U0001f600 now", "x\U0001f600"),
        ("\U0001f600\U0001f600 end", "\U0001f600 e"),
        ("\u4e2d\u4e2d", "\u4e2d"),
    ]:
        for ids in (byte_ids(tok, text.encode()), tok.encode(text, add_special_tokens=False)):
            assert tok.decode(ids, skip_special_tokens=True) == text
            assert_streams_as_reference(tok, ids, (stop, "\x00never"), rng)
            assert reference(tok, ids, (stop,))[0] == text[: text.find(stop)]
    for _ in range(150):  # random streams, stopped at a multi-byte character they show
        ids = mixed_ids(tok, rng, rng.randint(2, 16))
        whole = tok.decode(ids, skip_special_tokens=True)
        ends = [k for k, c in enumerate(whole) if ord(c) > 127 and c != REPLACEMENT]
        if not ends or not prefix_stable(tok, ids):
            continue
        end = rng.choice(ends)
        stops = (whole[max(0, end - rng.randint(0, 3)) : end + 1],)
        assert_streams_as_reference(tok, ids, stops, rng)
        cut += reference(tok, ids, stops)[1] < len(ids)
    assert cut >= 50


def test_a_run_of_special_ids_keeps_the_window_short(tok: Any) -> None:
    """300 end-of-sequence ids mid-output (`ignore_eos`): the text is the whole decode and
    no decode gets more than a few ids (skipped ids are left out of the window's context,
    so the window does not grow with them)."""
    words = tok.encode("Hello there friend", add_special_tokens=False)
    ids = words[:2] + [tok.eos_token_id] * 300 + words[2:]
    counting = CountingTokenizer(tok)
    detok = Detokenizer(counting)
    text = "".join(detok.add(t)[0] for t in ids) + detok.finish()
    assert text == tok.decode(ids, skip_special_tokens=True)
    assert max(counting.sizes) <= 4


def test_stop_xe_releases_ab_and_holds_x_only_while_e_may_follow(byte_tok: Any) -> None:
    """Stop 'x\u00e9' on 'abx\u00e9': 'a' and 'b' go out at once, 'x' is held while the
    first byte of '\u00e9' is pending, and the stop then ends the output at 'ab'; on
    'abx\u00e8' the held 'x' goes out with the '\u00e8' that rules the stop out."""
    stop = ("x\u00e9",)
    detok = Detokenizer(byte_tok, stop)
    released = [detok.add(t) for t in byte_ids(byte_tok, "abx\u00e9".encode())]
    assert released == [("a", False), ("b", False), ("", False), ("", False), ("", True)]
    detok = Detokenizer(byte_tok, stop)
    released = [detok.add(t) for t in byte_ids(byte_tok, "abx\u00e8".encode())]
    assert released == [("a", False), ("b", False), ("", False), ("", False), ("x\u00e8", False)]
    assert detok.finish() == ""
