"""Prefill attention of several sequences over a token-row table: the pure-torch reference.

Several sequences' new tokens are packed one after another (variable length, as
FlashAttention's varlen API packs them): sequence s owns queries ``cu_q[s]:cu_q[s + 1]``
of the packed ``T``. Its keys and values live in rows of the shared KV pool,
``table[s, :lens[s]]`` oldest first: the ``lens[s] - n_s`` tokens it had consumed before
(a cache hit's rows read in place, earlier chunks) followed by its ``n_s`` new tokens,
whose rows the caller has already written. New query i of sequence s sits at position
``lens[s] - n_s + i`` and attends causally over the positions up to its own, never over
another sequence's rows. One call serves every sequence of one attention layer.
"""

from __future__ import annotations

import torch
from torch.nn.functional import scaled_dot_product_attention as sdpa

from .paged_attention import check_window


def paged_prefill_attention_ref(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    table: torch.Tensor,
    cu_q: torch.Tensor,
    lens: torch.Tensor,
    max_q: int,
    scale: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Causal attention of the packed queries q [T, H, hd] over their sequences' pool rows.

    k_pool, v_pool [KV, R, hd] (H % KV == 0); table [S, W] int64 row ids; cu_q [S + 1]
    int64 offsets of each sequence's queries in q (cu_q[0] = 0, cu_q[S] = T); lens [S]
    int64 keys of each sequence, its new tokens included (n_s <= lens[s] <= W); max_q: a
    host int >= every n_s (the padded query length; no host sync reads it from cu_q).
    Scores are scaled by ``scale`` (None: hd**-0.5). ``window`` (None: no window): a query
    at position p sees only the last ``window`` positions, itself included (keys k with
    p - window < k <= p). Returns [T, H, hd] in q's dtype.

    Pads each sequence's queries to max_q, gathers its W rows ([S, KV, W, hd] for K and
    V) and runs one masked SDPA: O(S * max_q * W) scores, the cost of each sequence alone
    when they are of similar lengths.
    """
    check_prefill_shapes(q, k_pool, v_pool, table, cu_q, lens, max_q)
    n_seq, width = table.shape
    total, n_heads, hd = q.shape
    device = q.device
    n_q = cu_q[1:] - cu_q[:-1]
    seq = torch.repeat_interleave(torch.arange(n_seq, device=device), n_q, output_size=total)
    slot = torch.arange(total, device=device) - cu_q[seq]
    padded = q.new_zeros(n_seq, max_q, n_heads, hd)
    padded[seq, slot] = q
    keys = k_pool[:, table].transpose(0, 1)
    values = v_pool[:, table].transpose(0, 1)
    position = (lens - n_q)[:, None] + torch.arange(max_q, device=device)[None, :]
    cols = torch.arange(width, device=device)[None, None, :]
    mask = cols <= position[:, :, None]
    if window is not None:
        check_window(window)
        mask = mask & (cols > position[:, :, None] - window)
    out = sdpa(
        padded.transpose(1, 2),
        keys,
        values,
        attn_mask=mask[:, None],
        enable_gqa=n_heads != k_pool.shape[0],
        scale=scale,
    )
    return out.transpose(1, 2)[seq, slot]


def check_prefill_shapes(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    table: torch.Tensor,
    cu_q: torch.Tensor,
    lens: torch.Tensor,
    max_q: int,
) -> None:
    """ValueError naming the first shape that disagrees with the contract (shapes only:
    the values of `table`, `cu_q` and `lens` stay on the device)."""
    if q.dim() != 3 or k_pool.dim() != 3 or k_pool.shape != v_pool.shape:
        raise ValueError(
            f"q must be [T, H, hd] and k_pool, v_pool one [KV, R, hd] shape, got "
            f"{tuple(q.shape)}, {tuple(k_pool.shape)}, {tuple(v_pool.shape)}"
        )
    if q.shape[2] != k_pool.shape[2] or q.shape[1] % k_pool.shape[0]:
        raise ValueError(
            f"q {tuple(q.shape)} does not fit the pool {tuple(k_pool.shape)}: head_dim "
            "must match and H must be a multiple of KV"
        )
    if table.dim() != 2 or lens.shape != (table.shape[0],):
        raise ValueError(
            f"table must be [S, W] and lens [S], got {tuple(table.shape)}, {tuple(lens.shape)}"
        )
    if cu_q.shape != (table.shape[0] + 1,):
        raise ValueError(f"cu_q must be [S + 1] for S = {table.shape[0]}, got {tuple(cu_q.shape)}")
    if q.shape[0] and max_q < 1:
        raise ValueError(f"max_q must be at least 1, got {max_q}")
