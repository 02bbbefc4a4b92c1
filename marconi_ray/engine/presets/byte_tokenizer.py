"""A byte-level tokenizer that is built locally (no download), and its save/load helpers.

Id layout (fixed, part of the contract; model vocabularies must be >= `BYTE_VOCAB_SIZE`):

- 0..6: special tokens, in the order of `SPECIAL_TOKENS`: `<|pad|>` = 0, `<|bos|>` = 1,
  `<|eos|>` = 2 (the transformers defaults for pad/bos/eos), then the chat tokens
  `<|user|>` = 3, `<|assistant|>` = 4, `<|system|>` = 5, `<|end|>` = 6.
- 7..262: the 256 byte values, id = `BYTE_OFFSET + byte`.

Text is encoded as its UTF-8 bytes, one token per byte: no merges, no normalisation, no
automatically added special tokens, so decode(encode(s)) == s for every string s. The
tokenizer is a `tokenizers` BPE model with an empty merge list over the GPT-2 byte-to-unicode
alphabet, with a ByteLevel pre-tokenizer (no regex split, no prefix space) and decoder.
Special-token strings that occur literally in the text are matched as special tokens.

A chat turn is `<|role|>content<|end|>`; a rendered conversation starts with `<|bos|>` and,
with `add_generation_prompt`, ends with `<|assistant|>`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

PAD_TOKEN: Final = "<|pad|>"
BOS_TOKEN: Final = "<|bos|>"
EOS_TOKEN: Final = "<|eos|>"
USER_TOKEN: Final = "<|user|>"
ASSISTANT_TOKEN: Final = "<|assistant|>"
SYSTEM_TOKEN: Final = "<|system|>"
END_TOKEN: Final = "<|end|>"

SPECIAL_TOKENS: Final = (
    PAD_TOKEN,
    BOS_TOKEN,
    EOS_TOKEN,
    USER_TOKEN,
    ASSISTANT_TOKEN,
    SYSTEM_TOKEN,
    END_TOKEN,
)
"""Special tokens in id order: `SPECIAL_TOKENS[i]` has id i."""

PAD_ID: Final = SPECIAL_TOKENS.index(PAD_TOKEN)
BOS_ID: Final = SPECIAL_TOKENS.index(BOS_TOKEN)
EOS_ID: Final = SPECIAL_TOKENS.index(EOS_TOKEN)
END_ID: Final = SPECIAL_TOKENS.index(END_TOKEN)
BYTE_OFFSET: Final = len(SPECIAL_TOKENS)
BYTE_VOCAB_SIZE: Final = BYTE_OFFSET + 256
"""Number of ids the tokenizer uses (ids are 0..BYTE_VOCAB_SIZE-1)."""

DEFAULT_MODEL_MAX_LENGTH: Final = 4096
TOKENIZER_FILES: Final = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _jinja_text(text: str) -> str:
    """`text` as a Jinja string literal."""
    escaped = text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")
    return f"'{escaped}'"


TOOLS_PREAMBLE: Final = (
    "# Tools\n\nYou may call one or more functions. Their signatures are within "
    "<tools></tools>:\n<tools>"
)
TOOLS_INSTRUCTION: Final = (
    "\n</tools>\n\nFor each function call, reply with a JSON object of the function's name "
    "and arguments within <tool_call></tool_call> tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)

CHAT_TEMPLATE: Final = (
    "{{- bos_token -}}"
    "{%- set ns = namespace(first=0) -%}"
    "{%- if tools -%}"
    "{{- '<|system|>' -}}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{{- messages[0]['content'] + '\\n\\n' -}}{%- set ns.first = 1 -%}"
    "{%- endif -%}"
    "{{- " + _jinja_text(TOOLS_PREAMBLE) + " -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- " + _jinja_text(TOOLS_INSTRUCTION) + " + '<|end|>' -}}"
    "{%- endif -%}"
    "{%- for message in messages[ns.first:] -%}"
    "{%- if message['role'] == 'assistant' and message.get('tool_calls') -%}"
    "{{- '<|assistant|>' + (message['content'] or '') -}}"
    "{%- for call in message['tool_calls'] -%}"
    "{%- if not loop.first or message['content'] -%}{{- '\\n' -}}{%- endif -%}"
    "{%- set f = call['function'] -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + f['name'] + '\", \"arguments\": ' -}}"
    "{%- if f['arguments'] is string -%}{{- f['arguments'] -}}"
    "{%- else -%}{{- f['arguments'] | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|end|>' -}}"
    "{%- elif message['role'] in ('system', 'user', 'assistant') -%}"
    "{{- '<|' + message['role'] + '|>' + message['content'] + '<|end|>' -}}"
    "{%- elif message['role'] == 'tool' -%}"
    "{%- if loop.first or loop.previtem['role'] != 'tool' -%}{{- '<|user|>' -}}"
    "{%- else -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_response>\\n' + message['content'] + '\\n</tool_response>' -}}"
    "{%- if loop.last or loop.nextitem['role'] != 'tool' -%}{{- '<|end|>' -}}{%- endif -%}"
    "{%- else -%}"
    "{{- raise_exception('unknown chat role: ' + message['role']) -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>' -}}{%- endif -%}"
)
"""Jinja chat template: `<|bos|>` then `<|role|>content<|end|>` per message. With
`tools`, a system turn first lists them (`TOOLS_PREAMBLE`, one JSON object per line,
`TOOLS_INSTRUCTION`; a leading system message's text comes before them); an assistant's
tool calls are Hermes blocks (`<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`,
newline-separated, after its content); consecutive tool results form one user turn of
`<tool_response>` blocks. A conversation without tools renders as it always has."""


def _byte_to_unicode() -> list[str]:
    """The GPT-2 printable stand-in character for each byte value 0..255 (index = byte).

    Printable Latin-1 bytes map to themselves; the other 68 bytes map, in increasing byte
    order, to code points 256, 257, ... This is the alphabet of the ByteLevel pre-tokenizer.
    """
    printable = (
        set(range(ord("!"), ord("~") + 1))
        | set(range(ord("¡"), ord("¬") + 1))
        | set(range(ord("®"), ord("ÿ") + 1))
    )
    chars: list[str] = []
    extra = 0
    for byte in range(256):
        if byte in printable:
            chars.append(chr(byte))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def build_byte_tokenizer() -> Tokenizer:
    """A new byte-level `tokenizers.Tokenizer` with the id layout in the module docstring."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for byte, char in enumerate(_byte_to_unicode()):
        vocab[char] = BYTE_OFFSET + byte
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(tok, special=True) for tok in SPECIAL_TOKENS])
    if tokenizer.get_vocab_size(with_added_tokens=True) != BYTE_VOCAB_SIZE:
        raise AssertionError("byte tokenizer vocabulary has the wrong size")
    return tokenizer


def tokenizer_config(model_max_length: int = DEFAULT_MODEL_MAX_LENGTH) -> dict[str, Any]:
    """The `tokenizer_config.json` content for `PreTrainedTokenizerFast`."""
    if isinstance(model_max_length, bool) or not isinstance(model_max_length, int):
        raise ValueError(f"model_max_length must be an int, got {model_max_length!r}")
    if model_max_length < 1:
        raise ValueError(f"model_max_length must be >= 1, got {model_max_length}")
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "additional_special_tokens": [USER_TOKEN, ASSISTANT_TOKEN, SYSTEM_TOKEN, END_TOKEN],
        "model_max_length": model_max_length,
        "padding_side": "left",
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
        "chat_template": CHAT_TEMPLATE,
    }


def save_tokenizer(out_dir: str | Path, model_max_length: int = DEFAULT_MODEL_MAX_LENGTH) -> Path:
    """Write `TOKENIZER_FILES` into `out_dir` (created if needed); return the folder.

    The folder then loads with `transformers.AutoTokenizer.from_pretrained(out_dir,
    local_files_only=True)` as a `PreTrainedTokenizerFast` with a chat template.
    """
    config = tokenizer_config(model_max_length)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    build_byte_tokenizer().save(str(out / "tokenizer.json"))
    special_map = {
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "additional_special_tokens": list(config["additional_special_tokens"]),
    }
    for name, content in (
        ("tokenizer_config.json", config),
        ("special_tokens_map.json", special_map),
    ):
        (out / name).write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n")
    return out
