"""Decode attention over a token-row table: the pure-torch reference.

One new query token per sequence attends over its keys and values, which live in rows of
a shared pool (the engine's KV pool: row r of every attention block is one token's K and
V). ``table[b, :lens[b]]`` are sequence b's rows, oldest first; the rest of the row is
padding (any valid row index) and is masked out. One call serves the whole batch of one
attention layer, whatever the sequences' lengths: no per-sequence launch, no host sync.
"""

from __future__ import annotations

import torch
from torch.nn.functional import scaled_dot_product_attention as sdpa


def paged_decode_attention_ref(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    table: torch.Tensor,
    lens: torch.Tensor,
    scale: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Attention of q [B, H, hd] over the pool rows of each sequence.

    k_pool, v_pool [KV, R, hd] (H % KV == 0: query head h reads KV head h // (H / KV));
    table [B, W] int64 row ids; lens [B] int64 with 1 <= lens[b] <= W. Scores are scaled
    by ``scale`` (None: hd**-0.5). ``window`` (None: no window): the query, at position
    lens[b] - 1, sees only the last ``window`` positions, itself included (columns
    j > lens[b] - 1 - window). Returns [B, H, hd] in q's dtype. Gathers the W rows of
    every sequence ([B, KV, W, hd] each for K and V) and runs one masked SDPA.
    """
    check_paged_shapes(q, k_pool, v_pool, table, lens)
    keys = k_pool[:, table].transpose(0, 1)
    values = v_pool[:, table].transpose(0, 1)
    width = table.shape[1]
    cols = torch.arange(width, device=q.device)[None, :]
    mask = cols < lens[:, None]
    if window is not None:
        check_window(window)
        mask = mask & (cols >= lens[:, None] - window)
    out = sdpa(
        q[:, :, None],
        keys,
        values,
        attn_mask=mask[:, None, None, :],
        enable_gqa=q.shape[1] != k_pool.shape[0],
        scale=scale,
    )
    return out[:, :, 0]


def check_window(window: int | None) -> None:
    """ValueError unless `window` is None or an int >= 1."""
    if window is not None and (
        isinstance(window, bool) or not isinstance(window, int) or window < 1
    ):
        raise ValueError(f"window must be None or an int >= 1, got {window!r}")


def check_paged_shapes(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    table: torch.Tensor,
    lens: torch.Tensor,
) -> None:
    """ValueError naming the first shape that disagrees with the contract (shapes only:
    the values of `table` and `lens` stay on the device)."""
    if q.dim() != 3 or k_pool.dim() != 3 or k_pool.shape != v_pool.shape:
        raise ValueError(
            f"q must be [B, H, hd] and k_pool, v_pool one [KV, R, hd] shape, got "
            f"{tuple(q.shape)}, {tuple(k_pool.shape)}, {tuple(v_pool.shape)}"
        )
    if q.shape[2] != k_pool.shape[2] or q.shape[1] % k_pool.shape[0]:
        raise ValueError(
            f"q {tuple(q.shape)} does not fit the pool {tuple(k_pool.shape)}: head_dim "
            "must match and H must be a multiple of KV"
        )
    if table.dim() != 2 or table.shape[0] != q.shape[0] or lens.shape != (q.shape[0],):
        raise ValueError(
            f"table must be [B, W] and lens [B] for B = {q.shape[0]}, got "
            f"{tuple(table.shape)}, {tuple(lens.shape)}"
        )
