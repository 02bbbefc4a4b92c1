"""`KVBuffer`: one sequence's keys and values at one attention layer, grown in place."""

from __future__ import annotations

import torch


class KVBuffer:
    """Keys and values `[n_kv_local, capacity, head_dim]`; positions `[:length]` are valid.

    Appends copy into spare capacity (doubling when full), so decoding n tokens costs
    O(n) copies in total, not O(n^2).
    """

    def __init__(self, k: torch.Tensor, v: torch.Tensor) -> None:
        if k.shape != v.shape or k.dim() != 3:
            raise ValueError(
                f"k and v must share a 3-d shape, got {tuple(k.shape)}, {tuple(v.shape)}"
            )
        self.k = k
        self.v = v
        self.length = k.shape[1]

    @classmethod
    def empty(
        cls, n_kv: int, head_dim: int, dtype: torch.dtype, device: torch.device, capacity: int = 0
    ) -> KVBuffer:
        k = torch.empty(n_kv, capacity, head_dim, dtype=dtype, device=device)
        buf = cls(k, torch.empty_like(k))
        buf.length = 0
        return buf

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Append `[n_kv_local, n, head_dim]` keys and values."""
        n = k.shape[1]
        need = self.length + n
        if need > self.k.shape[1]:
            cap = max(need, 2 * self.k.shape[1], 16)
            grown_k = self.k.new_empty(self.k.shape[0], cap, self.k.shape[2])
            grown_v = torch.empty_like(grown_k)
            grown_k[:, : self.length] = self.k[:, : self.length]
            grown_v[:, : self.length] = self.v[:, : self.length]
            self.k, self.v = grown_k, grown_v
        self.k[:, self.length : need] = k
        self.v[:, self.length : need] = v
        self.length = need

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`append`, then `view`: the keys and values of every position (a prefill's)."""
        self.append(k, v)
        return self.view()

    def view(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The valid keys and values, `[n_kv_local, length, head_dim]` each (views)."""
        return self.k[:, : self.length], self.v[:, : self.length]
