"""Constrained decoding in the batched sampler: a grammar matcher per constrained
request (llguidance's `LLMatcher`), the step's token masks computed on the host for all
of them at once, sent to the device in one copy and applied to their logits rows before
sampling; the sampled tokens (already read to the host by the step's one transfer)
advance the matchers.

Contract: a constrained row can only sample a token its grammar allows at that point;
a request ends (`stopped`) once its grammar can take no more tokens. Unconstrained rows
and the logits used for log-probabilities are left as they are. The masks are a pure
function of each matcher's state, so every tensor-parallel rank, advancing its matchers
with the broadcast tokens, agrees with rank 0 on when a request stops.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llguidance.hf
import llguidance.torch as llt
import torch
from llguidance import LLExecutor, LLMatcher

from marconi_ray.protocol.model_files import END_OF_TURN, load_tokenizer

BITS = 32


def bitmask_words(vocab: int) -> int:
    """int32 words of one row's bitmask over `vocab` tokens."""
    return (vocab + BITS - 1) // BITS


def expand_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """Allowed-token mask [N, vocab] (bool) of `bitmask` [N, ceil(vocab / 32)] (int32;
    bit j of word w allows token 32 * w + j), in tensor ops on its device (the bit
    values are made there too: no host-to-device copy per step)."""
    one = torch.ones(BITS, dtype=torch.int32, device=bitmask.device)
    bits = one << torch.arange(BITS, dtype=torch.int32, device=bitmask.device)  # 1 << 31 < 0
    return (bitmask.unsqueeze(-1) & bits).ne(0).reshape(bitmask.shape[0], -1)[:, :vocab]


def expand_bitmask_ref(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """`expand_bitmask`, one token at a time (the reference its test compares with)."""
    out = torch.zeros(bitmask.shape[0], vocab, dtype=torch.bool)
    for row in range(bitmask.shape[0]):
        for token in range(vocab):
            word = int(bitmask[row, token // BITS]) & 0xFFFFFFFF
            out[row, token] = bool((word >> (token % BITS)) & 1)
    return out


class GrammarTokenizer:
    """The tokenizer as llguidance sees it (token id -> bytes), built on first use from
    the model folder's tokenizer (about a second for a 150k vocabulary, so only servers
    that get a constrained request pay it), for a model of `vocab` logits (ids past the
    tokenizer's are never allowed). Where a grammar may end or go on, it allows the
    end-of-turn token (`<|end|>`, what a chat turn stops at and the next turn's template
    writes) when the tokenizer has one, else the model's end-of-sequence ids."""

    def __init__(self, model_dir: str | Path, vocab: int, eos_ids: Sequence[int]) -> None:
        self.model_dir = Path(model_dir)
        self.vocab = vocab
        self.eos_ids = [int(t) for t in eos_ids]
        self._tokenizer: Any = None

    @classmethod
    def built(cls, tokenizer: Any, vocab: int) -> GrammarTokenizer:
        """One around an llguidance `LLTokenizer` already built (benchmarks, tests)."""
        out = cls("", vocab, ())
        out._tokenizer = tokenizer
        return out

    def get(self) -> Any:
        if self._tokenizer is None:
            hf = load_tokenizer(self.model_dir)
            vocab = hf.get_vocab()
            eos = [vocab[END_OF_TURN]] if END_OF_TURN in vocab else self.eos_ids
            eos = eos or hf.eos_token_id
            self._tokenizer = llguidance.hf.from_tokenizer(hf, n_vocab=self.vocab, eos_token=eos)
        return self._tokenizer


class GrammarMasks:
    """Matchers for constrained requests and the per-step masking of their rows.

    Args:
        tokenizer: the model's `GrammarTokenizer`.
        threads: host threads computing one step's masks together.
    """

    def __init__(self, tokenizer: GrammarTokenizer, threads: int = 1) -> None:
        self.tokenizer = tokenizer
        self.threads = max(1, threads)
        self._executor: Any = None
        self._host: torch.Tensor | None = None

    @classmethod
    def of(cls, model: Any, tokenizer_dir: str | Path) -> GrammarMasks:
        """Masks for `model` (a `HybridModel`: its logits' width and end-of-sequence ids)
        with the tokenizer in `tokenizer_dir`, on torch's host threads."""
        cfg = model.cfg
        tokenizer = GrammarTokenizer(tokenizer_dir, cfg.vocab_size, cfg.eos_token_ids)
        return cls(tokenizer, torch.get_num_threads())

    def matcher(self, grammar: str, prefix: Sequence[int] = ()) -> Any:
        """A matcher at the start of `grammar`, past the tokens of `prefix`; ValueError
        with llguidance's message when the grammar is invalid or refuses the prefix."""
        m = LLMatcher(self.tokenizer.get(), grammar, log_level=0)
        if prefix and not m.is_error():
            m.consume_tokens(list(prefix))
        if m.is_error():
            raise ValueError(f"grammar: {m.get_error()}")
        return m

    def mask(self, logits: torch.Tensor, rows: Sequence[int], matchers: Sequence[Any]) -> None:
        """Set to -inf, in place, the tokens each matcher forbids in its row of logits
        [B, V]: one host fill of all the rows' bitmasks, one host-to-device copy, one
        masked fill. (The host buffer is reused by the next step: its copy has landed
        by then, since the step's tokens were read to the host in between.)"""
        vocab = logits.shape[1]
        n = len(rows)
        words = bitmask_words(vocab)
        if self._host is None or self._host.shape[0] < n or self._host.shape[1] != words:
            pin = logits.device.type == "cuda"
            self._host = torch.empty((n, words), dtype=torch.int32, pin_memory=pin)
        host = self._host[:n]
        if self.threads == 1 or n == 1:  # a thread pool's hand-off costs more than it saves
            for i, m in enumerate(matchers):
                llt.fill_next_token_bitmask(m, host, i)
        else:
            if self._executor is None:
                self._executor = LLExecutor(num_threads=self.threads)
            llt.fill_next_token_bitmask_par(
                self._executor, [(m, i) for i, m in enumerate(matchers)], host
            )
        device_mask = host.to(logits.device, non_blocking=True)
        forbidden = ~expand_bitmask(device_mask, vocab)
        if n == logits.shape[0]:  # every row constrained: in place, no gather
            logits.masked_fill_(forbidden, float("-inf"))
            return
        index = torch.as_tensor(list(rows), device=logits.device)
        logits[index] = logits[index].masked_fill(forbidden, float("-inf"))

    def mask_drafts(self, logits: torch.Tensor, matcher: Any, drafts: Sequence[int]) -> None:
        """Set to -inf, in place, the tokens the grammar forbids at each verified
        position: row i of logits [len(drafts) + 1, V] by `matcher`'s state after
        drafts[:i] (each a token the grammar accepts: `valid_drafts`). The matcher is
        left as it was. Rows after the grammar completes allow everything (the sequence
        stops at the token completing it)."""
        vocab = logits.shape[1]
        host = torch.full((len(drafts) + 1, bitmask_words(vocab)), -1, dtype=torch.int32)
        llt.fill_next_token_bitmask(matcher, host, 0)
        consumed = 0
        for i, t in enumerate(drafts):
            if not matcher.consume_token(t):
                matcher.rollback(consumed)
                raise RuntimeError(f"grammar refused draft token {t}: validate drafts first")
            consumed += 1
            if matcher.is_stopped():
                break
            llt.fill_next_token_bitmask(matcher, host, i + 1)
        matcher.rollback(consumed)
        forbidden = ~expand_bitmask(host.to(logits.device), vocab)
        logits.masked_fill_(forbidden, float("-inf"))

    @staticmethod
    def valid_drafts(matcher: Any, drafts: Sequence[int]) -> int:
        """How many of `drafts`, in order, the grammar accepts from `matcher`'s state."""
        return int(matcher.validate_tokens(list(drafts))) if drafts else 0

    @staticmethod
    def advance(matcher: Any, token: int) -> bool:
        """Feed `token` to `matcher`; whether the grammar is now complete (no token can
        follow). RuntimeError when the grammar refuses it (a masked row never samples
        such a token: this is a broken invariant, not bad input)."""
        if not matcher.consume_token(token):
            raise RuntimeError(f"grammar refused sampled token {token}: {matcher.get_error()}")
        return bool(matcher.is_stopped())
