"""Sampled text from the presets is printable ASCII: no U+FFFD, and it round-trips.

The factory's random models used to give every non-printable id (special tokens, bytes
0x80-0xFF that are no UTF-8 on their own, ids past the tokenizer) a logit of 0, only ~2.5
std below the top printable one: greedy never picked them, but sampling at the API's
default temperature 1 did, in ~40% of 64-token replies, and a lone byte >= 0x80 decodes as
U+FFFD. Also pins what the service's `Detokenizer` does with a byte sequence that is not
(or not yet) valid UTF-8.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.presets.byte_tokenizer import BYTE_OFFSET, BYTE_VOCAB_SIZE
from marconi_ray.engine.presets.factory import (
    LIFT_CHANNEL,
    MAX_STRAY_PROB,
    MAX_TEMPERATURE,
    PRINTABLE_IDS,
    build_model,
    check_logit_separation,
    make_model,
    read_record,
)
from marconi_ray.engine.presets.model_presets import BUILD_VERSION
from marconi_ray.engine.sampler import SamplingParams
from marconi_ray.protocol.model_files import load_tokenizer
from marconi_ray.serve.ingress.generation import REPLACEMENT, Detokenizer

CHECKED = ("nemotron_h", "bamba", "qwen3_5", "qwen3_next")
"""Families whose sampled text is checked: the MLP-bias lift and the last-mixer lift (last
attention output bias, dense multimodal and fused MoE), not every variant of a lift (CI
time)."""
LIFTED = (*CHECKED, "granitemoehybrid", "lfm2_moe")
"""Families whose non-printable probability is bounded directly, the tiny and the small
preset: also Granite's lift through its muP multipliers (by attention in tiny, by Mamba-2
in small) and LFM2's (last short-conv output bias), whose sampled text is not run (CI
time); Jamba's and NemotronH-MoE's last Mamba output bias are left to the check every
build runs."""
SEEDS = 64
MAX_TOKENS = 64
PRINTABLE = frozenset(PRINTABLE_IDS)


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("no_fffd")
    return {fam: make_model("tiny", fam, root / fam) for fam in CHECKED}


@pytest.fixture(scope="module")
def engines(tiny_dirs: dict[str, Path]) -> dict[str, Engine]:
    return {
        fam: Engine(d, system="vanilla", cache_bytes=50_000_000, max_batch=SEEDS)
        for fam, d in tiny_dirs.items()
    }


def _service_text(tokenizer: Any, ids: list[int]) -> str:
    """The text a client gets: the service's incremental detokenizer, then its finish."""
    detok = Detokenizer(tokenizer)
    return "".join(detok.add(t)[0] for t in ids) + detok.finish()


@pytest.mark.parametrize("temperature", [0.0, 1.0, MAX_TEMPERATURE])
@pytest.mark.parametrize("family", CHECKED)
def test_sampled_chat_replies_are_ascii_and_round_trip(
    engines: dict[str, Engine], family: str, temperature: float
) -> None:
    engine = engines[family]
    tok = engine.tokenizer
    messages = [{"role": "user", "content": "Tell me a story about a caf\u00e9 \U0001f600."}]
    out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt = [int(t) for t in (out["input_ids"] if hasattr(out, "keys") else out)]
    params = [
        SamplingParams(max_tokens=MAX_TOKENS, temperature=temperature, seed=s) for s in range(SEEDS)
    ]
    results = engine.generate_many([prompt] * SEEDS, params)
    replies = set()
    for seed, result in enumerate(results):
        ids = list(result.tokens)
        text = _service_text(tok, ids)
        assert REPLACEMENT not in text, (seed, text, ids)
        assert sorted(set(ids) - PRINTABLE) == [], (seed, ids)
        assert all(c == "\n" or " " <= c <= "~" for c in text), (seed, text)
        # Multi-turn chat sends the text back: it must encode to the very same ids, so
        # the next turn's prompt extends this turn's prompt + reply (a prefix-cache hit).
        assert tok.encode(text, add_special_tokens=False) == ids, (seed, text)
        turn = [*messages, {"role": "assistant", "content": text}]
        out = tok.apply_chat_template(turn, tokenize=True)
        rendered = [int(t) for t in (out["input_ids"] if hasattr(out, "keys") else out)]
        assert rendered[: len(prompt) + len(ids)] == prompt + ids, (seed, text)
        assert result.finish_reason == "length"
        replies.add(text)
    if temperature > 0:
        assert len(replies) > SEEDS // 2  # sampling still varies with the seed


@pytest.mark.parametrize("family", LIFTED)
@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_non_printable_ids_negligible_at_max_temperature(preset: str, family: str) -> None:
    model = build_model(preset, family, seed=1)
    g = torch.Generator().manual_seed(4)
    prompt = torch.randint(BYTE_OFFSET, BYTE_VOCAB_SIZE, (2, 48), generator=g)
    with torch.no_grad():
        logits = model(input_ids=prompt).logits.double()
    keep = torch.zeros(logits.shape[-1], dtype=torch.bool)
    keep[list(PRINTABLE_IDS)] = True
    for temperature in (1.0, MAX_TEMPERATURE):
        probs = torch.softmax(logits / temperature, dim=-1)
        assert float(probs[..., ~keep].sum(-1).max()) <= MAX_STRAY_PROB
    assert bool(keep[logits.argmax(-1)].all())  # greedy stays printable
    assert bool((logits[..., ~keep] == 0).all())  # every other id: logit exactly 0


def test_build_check_rejects_reachable_non_printable_ids() -> None:
    model = build_model("tiny", "nemotron_h", seed=2)
    assert check_logit_separation(model) >= 1.0
    with torch.no_grad():  # no lift: the printable logits sit around 0, as they used to
        model.get_output_embeddings().weight[:, LIFT_CHANNEL] = 0.0
    with pytest.raises(RuntimeError, match="non-printable"):
        check_logit_separation(model)


def test_record_has_the_current_build_version(tiny_dirs: dict[str, Path]) -> None:
    for fam, folder in tiny_dirs.items():
        assert read_record(folder)["build_version"] == BUILD_VERSION >= 3, fam


# ------------------------------------------------------------------ Detokenizer


@pytest.fixture(scope="module")
def tok(tiny_dirs: dict[str, Path]) -> Any:
    return load_tokenizer(tiny_dirs["nemotron_h"])


def _ids(data: bytes) -> list[int]:
    return [BYTE_OFFSET + b for b in data]


def test_detokenizer_holds_a_character_until_its_last_byte(tok: Any) -> None:
    detok = Detokenizer(tok)
    released = [detok.add(t) for t in _ids("a\U0001f600b".encode())]
    texts = ["a", "", "", "", "\U0001f600", "b"]
    assert released == [(t, False) for t in texts]
    assert detok.finish() == ""


def test_detokenizer_releases_an_invalid_byte_once_text_follows(tok: Any) -> None:
    detok = Detokenizer(tok)
    # A lone continuation byte never becomes valid, but any trailing U+FFFD is held back.
    assert detok.add(BYTE_OFFSET + 0x80) == ("", False)
    assert detok.add(BYTE_OFFSET + ord("x")) == (REPLACEMENT + "x", False)


def test_detokenizer_finish_releases_an_unfinished_sequence_as_u_fffd(tok: Any) -> None:
    # Decided behaviour: the whole text always equals the tokenizer's decode of the ids;
    # an output cut inside a character (max_tokens) ends with U+FFFD rather than losing
    # tokens silently. The factory's presets never get here (see the tests above).
    ids = _ids("caf\u00e9".encode())[:-1]
    detok = Detokenizer(tok)
    assert "".join(detok.add(t)[0] for t in ids) == "caf"
    assert detok.finish() == REPLACEMENT
    assert tok.decode(ids, skip_special_tokens=True) == "caf" + REPLACEMENT
