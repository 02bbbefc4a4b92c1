"""Held-out bits per byte of a causal LM on chat conversations.

`bits_per_byte` scores each conversation's rendered tokens (see `chat_corpus.render`) in
consecutive windows of at most `window` tokens, each window on its own (no carried
state), and divides the summed negative log-likelihood of every predicted token, in bits
(the role and end tokens included), by the UTF-8 bytes of the messages' contents. So a
lower figure is better, the template's own tokens only add to it, and a model that knows
nothing (uniform over a vocabulary of V ids) scores log2(V) bits per token.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from chat_corpus import Conversation, render


@torch.no_grad()
def bits_per_byte(
    model: Any, tokenizer: Any, conversations: Iterable[Conversation], window: int = 512
) -> float:
    """Held-out bits per byte (see the module docstring); `model(input_ids).logits` is
    `[1, T, V]`; `tokenizer.encode(text, add_special_tokens=False)` gives the ids."""
    if window < 2:
        raise ValueError(f"window must be >= 2 tokens, got {window}")
    nats = 0.0
    n_bytes = 0
    for conversation in conversations:
        ids = tokenizer.encode(render(conversation.messages), add_special_tokens=False)
        n_bytes += sum(len(m["content"].encode()) for m in conversation.messages)
        for start in range(0, len(ids) - 1, window):
            chunk = torch.tensor([ids[start : start + window + 1]])
            if chunk.shape[1] < 2:
                continue
            logits = model(input_ids=chunk[:, :-1]).logits.float()
            nats += torch.nn.functional.cross_entropy(
                logits[0], chunk[0, 1:], reduction="sum"
            ).item()
    if not n_bytes:
        raise ValueError("no conversation text to score")
    return nats / math.log(2) / n_bytes
