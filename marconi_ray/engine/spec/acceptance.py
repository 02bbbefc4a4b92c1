"""Which drafted tokens a verified step keeps, and the token after them.

Given the target model's next-token logits at the k + 1 positions of a verified step
(after the last sampled token, then after each draft) and the k drafts:
- temperature 0: drafts are kept while each equals the argmax at its position (ties: the
  lowest id, as the `Sampler`); the token after them is the argmax where the first
  mismatch was, or after the last draft. The output is exactly what decoding without
  speculation gives.
- temperature > 0: speculative sampling with a drafter that proposes one token (a point
  mass q = 1 on draft d): d is kept with probability p(d), p being the request's
  distribution at that position after temperature, top-k and top-p (`Sampler.
  probabilities`); at the first rejection the token is drawn from p with d removed
  (renormalised), and after k kept drafts from p at the last position. Every output
  token is then distributed exactly as p, as without speculation.

Returns the emitted tokens: the m kept drafts, then one more (m + 1 in all, 0 <= m <= k).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from marconi_ray.engine.sampler import Sampler
from marconi_ray.protocol.sampling import SamplingParams


def accept_drafts(
    logits: torch.Tensor,
    drafts: Sequence[int],
    params: SamplingParams,
    generator: torch.Generator | None,
) -> list[int]:
    """The emitted tokens for logits [k + 1, V] and `drafts` (k); see the module
    docstring. ValueError when the shapes disagree."""
    k = len(drafts)
    if logits.dim() != 2 or logits.shape[0] != k + 1:
        raise ValueError(f"need logits [k + 1, V] for {k} drafts, got {tuple(logits.shape)}")
    if params.greedy:
        return accept_greedy(torch.argmax(logits, dim=-1).tolist(), drafts)
    probs = Sampler.probabilities(logits, params)
    device = logits.device
    uniforms = torch.rand(k + 1, generator=generator, device=device, dtype=torch.float64)
    chosen = probs[torch.arange(k, device=device), torch.as_tensor(list(drafts), device=device)]
    keep = (uniforms[:k] < chosen).tolist() if k else []
    out: list[int] = []
    for j, d in enumerate(drafts):
        if not keep[j]:
            residual = probs[j].clone()
            residual[d] = 0.0
            return [*out, _draw(residual, uniforms[k])]
        out.append(d)
    return [*out, _draw(probs[k], uniforms[k])]


def accept_greedy(best: Sequence[int], drafts: Sequence[int]) -> list[int]:
    """The temperature-0 emitted tokens given the argmax `best` at each of the k + 1
    positions (so a caller can take the argmax of many sequences' logits in one read)."""
    out: list[int] = []
    for j, d in enumerate(drafts):
        if d != best[j]:
            return [*out, best[j]]
        out.append(d)
    return [*out, best[len(drafts)]]


def _draw(probs: torch.Tensor, uniform: torch.Tensor) -> int:
    """Inverse-CDF draw from unnormalised `probs` [V] with one uniform number."""
    cdf = torch.cumsum(probs, dim=0)
    target = uniform * cdf[-1]
    index = int(torch.searchsorted(cdf, target.reshape(1), right=True))
    last = int(torch.nonzero(probs > 0)[-1])
    return min(index, last)
