"""Log-probabilities OpenAI clients ask for (`logprobs`, `top_logprobs`, `echo`): of the
model's distribution, the log-softmax of the raw logits in float32 (before temperature,
top-k and top-p, as vLLM reports them by default), computed on the device for a whole
batch and read to the host in one transfer."""

from __future__ import annotations

import torch

from marconi_ray.protocol.results import Logprob


def token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probabilities of `tokens` under each row's distribution, and each row's `k`
    most likely tokens.

    Args:
        logits: [B, V] next-token logits.
        tokens: [B] long, the token whose log-probability each row reports.
        k: alternatives per row (0 <= k <= V).
    Returns:
        (logprob [B] float32, top ids [B, k] long, top logprobs [B, k] float32); the top
        are most likely first, ties toward the lower id (a stable sort), so the result
        depends on nothing but the logits.
    """
    if logits.dim() != 2 or tokens.shape != (logits.shape[0],):
        raise ValueError(
            f"need logits [B, V] and tokens [B], got {tuple(logits.shape)} and "
            f"{tuple(tokens.shape)}"
        )
    if not 0 <= k <= logits.shape[1]:
        raise ValueError(f"k must be in [0, {logits.shape[1]}], got {k}")
    lp = torch.log_softmax(logits.float(), dim=-1)
    chosen = lp.gather(1, tokens.to(torch.long)[:, None]).squeeze(1)
    if k == 0:
        empty = lp.new_empty(lp.shape[0], 0)
        return chosen, empty.to(torch.long), empty
    top_lp, top_ids = torch.sort(lp, dim=-1, descending=True, stable=True)
    return chosen, top_ids[:, :k], top_lp[:, :k]


def read_logprobs(logits: torch.Tensor, tokens: torch.Tensor, ks: list[int]) -> list[Logprob]:
    """`token_logprobs` of each row with its own number of alternatives `ks[row]`, read to
    the host in one transfer (ids and values packed in one float64 tensor: ids below 2**53
    are exact).

    Args:
        logits: [B, V]; tokens: [B] long; ks: B ints in [0, V].
    Returns:
        B `Logprob`s, row order.
    """
    if len(ks) != logits.shape[0]:
        raise ValueError(f"need one k per row: {len(ks)} for {logits.shape[0]} rows")
    k = max(ks, default=0)
    chosen, top_ids, top_lp = token_logprobs(logits, tokens, k)
    columns = [tokens.double()[:, None], chosen.double()[:, None], top_ids.double()]
    columns.append(top_lp.double())
    packed = torch.cat(columns, dim=1).tolist()
    out = []
    for row, kr in zip(packed, ks, strict=True):
        top = tuple((int(row[2 + j]), row[2 + k + j]) for j in range(kr))
        out.append(Logprob(int(row[0]), row[1], top))
    return out
