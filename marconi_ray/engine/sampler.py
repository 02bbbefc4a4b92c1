"""Per-request sampling settings (`SamplingParams`) and the batched `Sampler`.

Sampling order for a row with temperature > 0: divide the logits by the temperature, keep
the `top_k` highest (ties broken toward the lower id), renormalise, keep the nucleus (the
smallest set of highest-probability tokens whose mass is >= `top_p`; the top token is
always kept), renormalise, then draw one token by inverse CDF with one uniform number from
the row's generator. Temperature 0 is greedy argmax (ties: the lowest id).

A row whose generator is seeded (`make_generator(seed, device)`) is reproducible: the same
logits and the same generator state give the same token, whatever the other rows are. A
None generator draws from torch's default generator for the logits' device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from marconi_ray.protocol.sampling import SamplingParams, is_int


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator | None:
    """A generator on `device` seeded with `seed`, or None (default RNG) when seed is None."""
    if seed is None:
        return None
    if not is_int(seed) or seed < 0:
        raise ValueError(f"seed must be None or an int >= 0, got {seed!r}")
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


class Sampler:
    """Picks one token per row of a logits batch; stateless (state lives in generators)."""

    def sample(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None],
    ) -> torch.Tensor:
        """Token ids [B] (long, on the logits' device) for `logits` [B, V].

        `params[i]` and `generators[i]` belong to row i; a generator must live on the
        logits' device (`make_generator(seed, logits.device)`). ValueError when the shapes
        or lengths disagree.
        """
        if logits.dim() != 2 or logits.shape[1] == 0:
            raise ValueError(
                f"logits must have shape [B, V] with V >= 1, got {tuple(logits.shape)}"
            )
        batch = logits.shape[0]
        if len(params) != batch or len(generators) != batch:
            raise ValueError(
                f"need one SamplingParams and one generator per row: {batch} rows, "
                f"{len(params)} params, {len(generators)} generators"
            )
        out = torch.empty(batch, dtype=torch.long, device=logits.device)
        greedy = [i for i, p in enumerate(params) if p.greedy]
        if greedy:
            rows = torch.tensor(greedy, device=logits.device)
            out[rows] = torch.argmax(logits[rows], dim=-1)
        random_rows = [i for i, p in enumerate(params) if not p.greedy]
        if random_rows:
            rows = torch.tensor(random_rows, device=logits.device)
            picked = self._sample_rows(
                logits[rows],
                [params[i] for i in random_rows],
                [generators[i] for i in random_rows],
            )
            out[rows] = picked
        return out

    @staticmethod
    def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        """The distribution [L, V] (float64) each row of logits [L, V] is sampled from
        under `params` (temperature > 0): temperature, then top-k, then top-p, as
        `sample` applies them (speculative acceptance compares drafts against it)."""
        rows = logits.shape[0]
        probs, order = Sampler._sorted_probs(logits, [params] * rows)
        return torch.zeros_like(probs).scatter_(1, order, probs)

    @staticmethod
    def _sorted_probs(
        logits: torch.Tensor, params: Sequence[SamplingParams]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(probabilities in descending-logit order after temperature, top-k and top-p,
        the order: token ids [B, V])."""
        device = logits.device
        vocab = logits.shape[1]
        temps = torch.tensor([p.temperature for p in params], device=device, dtype=torch.float64)
        scaled = logits.to(torch.float64) / temps[:, None]
        # Descending, stable: equal logits keep id order, so cuts favour lower ids.
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True, stable=True)
        ranks = torch.arange(vocab, device=device)
        ks = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=device)
        sorted_logits = sorted_logits.masked_fill(ranks[None, :] >= ks[:, None], -math.inf)
        probs = torch.softmax(sorted_logits, dim=-1)
        top_ps = torch.tensor([p.top_p for p in params], device=device, dtype=torch.float64)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        outside = (mass_before >= top_ps[:, None]) & (top_ps[:, None] < 1.0)
        outside[:, 0] = False
        return probs.masked_fill(outside, 0.0), order

    @staticmethod
    def _sample_rows(
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None],
    ) -> torch.Tensor:
        device = logits.device
        probs, order = Sampler._sorted_probs(logits, params)
        cdf = torch.cumsum(probs, dim=-1)
        uniforms = torch.cat(
            [torch.rand(1, generator=g, device=device, dtype=torch.float64) for g in generators]
        )
        targets = uniforms * cdf[:, -1]
        picked_rank = torch.searchsorted(cdf, targets[:, None], right=True).squeeze(1)
        last_kept = (probs > 0).sum(dim=-1) - 1
        picked_rank = torch.minimum(picked_rank, last_kept)
        return order.gather(1, picked_rank[:, None]).squeeze(1)
