"""The packaged `chat` model (trained by `scripts/train_chat.py`): it is found by name,
fits the package budget, has learnt the held-out conversations shipped beside it (bits
per byte under a bound that an untrained model of the same shape fails), answers in the
words of those conversations where an untrained one does not, is served by the engine
exactly as transformers runs it, and reports cached tokens on a later turn.

Everything here reads only files the package ships (no `../shared`).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from chat_corpus import read_jsonl_gz, render
from chat_eval import bits_per_byte

from marconi_ray.engine.engine import Engine
from marconi_ray.protocol.model_files import load_tokenizer
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve import model_source
from marconi_ray.serve.model_source import default_model_name, resolve_model

BPB_BOUND = 2.6
"""Held-out bits per byte the trained model must beat; uniform guessing over the 4,096-id
vocabulary is about 3.5 on this text."""
LEXICON_SHARE = 0.6
"""Share of a reply's words that must be words of the held-out conversations."""
QUESTION = "Hello! Can you explain what a computer program is?"
SCORED = 6
"""Held-out conversations scored here (the training log scores all that are shipped)."""


@pytest.fixture(scope="module")
def chat_dir() -> Path:
    return resolve_model("chat")


@pytest.fixture(scope="module")
def hf_models(chat_dir: Path):
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(str(chat_dir), dtype=torch.float32).eval()
    torch.manual_seed(1)
    untrained = AutoModelForCausalLM.from_config(trained.config).float().eval()
    return trained, untrained


@pytest.fixture(scope="module")
def held_out(chat_dir: Path):
    return list(read_jsonl_gz(chat_dir / "heldout_sample.jsonl.gz"))


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


def _greedy(model, prompt_ids: list[int], n: int) -> list[int]:
    """`n` greedy ids after `prompt_ids`, by transformers' forward (no cache)."""
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        for _ in range(n):
            nxt = model(input_ids=ids).logits[0, -1].argmax()
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    return ids[0, len(prompt_ids) :].tolist()


def _prompt(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def _reply(model, tokenizer, prompt_ids: list[int], n: int = 40) -> str:
    return tokenizer.decode(_greedy(model, prompt_ids, n), skip_special_tokens=True)


def test_chat_resolves_to_the_packaged_folder_within_budget(chat_dir: Path):
    assert chat_dir.parent.name == "data" and chat_dir.parent.parent.name == "marconi_ray"
    assert default_model_name("chat") == "chat"
    assert (chat_dir / "model.safetensors").stat().st_size <= 20 * 2**20
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "train_log.json"):
        assert (chat_dir / name).is_file(), name


def test_a_packaged_model_without_its_files_is_a_clear_error(monkeypatch, tmp_path: Path):
    monkeypatch.setattr(model_source, "PACKAGED_MODELS", {"gone": "no-such-folder"})
    with pytest.raises(ValueError, match=r"packaged model 'gone'.*has no config\.json"):
        resolve_model("gone", tmp_path)


def test_the_chat_template_renders_what_training_saw(chat_dir: Path, held_out):
    tokenizer = load_tokenizer(chat_dir)
    messages = list(held_out[0].messages)
    assert tokenizer.apply_chat_template(messages, tokenize=False) == render(messages)


def test_held_out_bits_per_byte_beat_a_bound_an_untrained_model_fails(
    chat_dir: Path, hf_models, held_out
):
    trained, untrained = hf_models
    tokenizer = load_tokenizer(chat_dir)
    sample = held_out[:SCORED]
    bpb = bits_per_byte(trained, tokenizer, sample, window=256)
    random_bpb = bits_per_byte(untrained, tokenizer, sample, window=256)
    assert bpb < BPB_BOUND <= random_bpb, (bpb, random_bpb)


def test_replies_use_the_words_of_real_conversations(chat_dir: Path, hf_models, held_out):
    trained, untrained = hf_models
    tokenizer = load_tokenizer(chat_dir)
    lexicon = {w for c in held_out for w in _words(c.text)}
    prompt = _prompt(tokenizer, [{"role": "user", "content": QUESTION}])
    shares = []
    for model in (trained, untrained):
        words = _words(_reply(model, tokenizer, prompt))
        shares.append(sum(w in lexicon for w in words) / max(1, len(words)))
    assert shares[0] >= LEXICON_SHARE > shares[1], shares


def test_the_engine_serves_it_as_transformers_runs_it_and_caches_the_next_turn(
    chat_dir: Path, hf_models
):
    trained, _ = hf_models
    engine = Engine(chat_dir)
    tokenizer = engine.tokenizer
    first = _prompt(tokenizer, [{"role": "user", "content": QUESTION}])
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    got = engine.generate(first, greedy)
    assert list(got.tokens) == _greedy(trained, first, 12)
    turn = tokenizer.encode("<|end|><|user|>Thanks!<|end|><|assistant|>", add_special_tokens=False)
    again = engine.generate([*first, *got.tokens, *turn], greedy)
    assert again.usage.cached_tokens >= len(first)
