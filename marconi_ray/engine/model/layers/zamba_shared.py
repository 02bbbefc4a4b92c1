"""Zamba2's shared transformer block: the weights one copy holds (`SharedWeights`) and
the call a hybrid layer makes with them (`SharedBlock`: its adapters, linear and KV).

Data flow (see `model_config.SharedBlockConfig`), x the residual stream [L, D] and e the
token embeddings [L, D]:

    h = input_norm([x, e])                        # RMSNorm over 2*D
    q, k, v = W_q h + B_q A_q h, ...              # per-layer LoRA adapters, optional
    a = o(attention(rope(q), rope(k), v))         # scores scaled by cfg.scale, o -> D
    n = pre_ff_norm(a)                            # RMSNorm over D, no residual
    g, u = gate_up(n) + B_gu A_gu n               # per-layer LoRA adapter
    out = linear(down(act(g) * u))                # per-layer D x D linear

Tensor parallelism: attention heads (q/k/v rows, o columns) and the MLP's gate and up
rows (down columns) split across ranks as in `Attention` and `MLP`; each adapter's down
projection A (D or 2*D -> rank) is replicated and its up projection B is split like the
projection it adds to, so a rank adds exactly its own rows and no communication is
added; o and down all-reduce; the per-layer linear is replicated (it reads the reduced
D-wide output). The KV of each hybrid layer is its own (`n_kv` heads of this rank).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar, Protocol

import torch
from torch import nn

from marconi_ray.engine.model.kv_buffer import KVBuffer
from marconi_ray.engine.model.layers.attention import PrefillKV, prefill_attention
from marconi_ray.engine.model.layers.linear import ParallelLinear, column, row
from marconi_ray.engine.model.layers.mlp import activation
from marconi_ray.engine.model.layers.norm import RMSNorm
from marconi_ray.engine.model.layers.rope import Rope
from marconi_ray.engine.model.layers.weights import WeightSpec
from marconi_ray.engine.model.model_config import AttentionConfig, SharedBlockConfig
from marconi_ray.engine.model.paged_kv import DecodeKV
from marconi_ray.engine.model.parallel import Segment, TPGroup


class _HasSpecs(Protocol):
    def weight_specs(self) -> dict[str, WeightSpec]: ...


def _specs(mods: Mapping[str, _HasSpecs]) -> dict[str, WeightSpec]:
    """The weight specs of named sub-modules, under their names."""
    return {f"{name}.{k}": v for name, mod in mods.items() for k, v in mod.weight_specs().items()}


class SharedWeights(nn.Module):
    """One copy of the shared block's weights (this rank's shard), read by every hybrid
    layer using it. `prefix` is the HF module holding them
    (`layers.{first layer using the copy}.shared_transformer`)."""

    def __init__(
        self,
        d_model: int,
        cfg: SharedBlockConfig,
        eps: float,
        prefix: str,
        tp: TPGroup,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        a, m = cfg.attention, cfg.mlp
        width = 2 * d_model if a.input_dim is None else a.input_dim
        q, kv = (Segment(a.n_heads * a.head_dim),), (Segment(a.n_kv_heads * a.head_dim),)
        attn = f"{prefix}.self_attn"
        self.input_norm = RMSNorm(width, eps, f"{prefix}.input_layernorm.weight", dtype)
        self.q = column(width, q, a.bias, f"{attn}.q_proj", tp, dtype)
        self.k = column(width, kv, a.bias, f"{attn}.k_proj", tp, dtype)
        self.v = column(width, kv, a.bias, f"{attn}.v_proj", tp, dtype)
        self.o = row(q, d_model, a.bias, f"{attn}.o_proj", tp, dtype)
        self.pre_ff_norm = RMSNorm(d_model, eps, f"{prefix}.pre_ff_layernorm.weight", dtype)
        ff = Segment(m.intermediate_size)
        mlp = f"{prefix}.feed_forward"
        self.gate_up = column(d_model, (ff, ff), m.bias, f"{mlp}.gate_up_proj", tp, dtype)
        self.down = row((ff,), d_model, m.bias, f"{mlp}.down_proj", tp, dtype)
        self.act = activation(m.activation)
        self.cfg = a
        self._rope: Rope | None = None

    def rope(self, device: torch.device) -> Rope | None:
        """The RoPE tables (None without RoPE), made on first use on `device`."""
        if self.cfg.rotary_dim and self._rope is None:
            self._rope = Rope(self.cfg.rotary_dim, self.cfg.rope_theta, device)
        return self._rope

    def weight_specs(self) -> dict[str, WeightSpec]:
        mods: dict[str, ParallelLinear | RMSNorm] = {
            "input_norm": self.input_norm,
            "q": self.q,
            "k": self.k,
            "v": self.v,
            "o": self.o,
            "pre_ff_norm": self.pre_ff_norm,
            "gate_up": self.gate_up,
            "down": self.down,
        }
        return _specs(mods)


class _Adapter(nn.Module):
    """LoRA adapter `B(A(x))`: A replicated, B split like the projection it adds to."""

    def __init__(
        self,
        d_in: int,
        rank: int,
        outs: Sequence[Segment],
        key: str,
        tp: TPGroup,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.down = column(d_in, (Segment(rank, False),), False, f"{key}.0", tp, dtype)
        self.up = column(rank, outs, False, f"{key}.1", tp, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.up(self.down(x))
        return out

    def weight_specs(self) -> dict[str, WeightSpec]:
        return _specs({"down": self.down, "up": self.up})


class SharedBlock(nn.Module):
    """The shared block as hybrid layer `layer` runs it: the `hybrid_index`-th hybrid
    layer, using copy `copy` of the shared weights (held by the model, passed to each
    call), whose HF module is `source` (`layers.{n}.shared_transformer`, which also holds
    this layer's adapters at list index `hybrid_index`).

    Exposes what the KV cache needs of an attention mixer: `cfg` (head_dim), `n_kv` and
    `empty_cache`.
    """

    KERNEL_OPS: ClassVar[tuple[str, ...]] = ("paged_decode_attention", "paged_prefill_attention")

    def __init__(
        self,
        d_model: int,
        cfg: SharedBlockConfig,
        layer: int,
        hybrid_index: int,
        copy: int,
        source: str,
        tp: TPGroup,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        a = cfg.attention
        self.cfg: AttentionConfig = a
        self.copy = copy
        self.dtype = dtype
        self.n_heads, self.n_kv = tp.local(a.n_heads), tp.local(a.n_kv_heads)
        width = 2 * d_model if a.input_dim is None else a.input_dim
        r, k = cfg.adapter_rank, hybrid_index
        self.qkv_adapters: nn.ModuleList | None = None
        if cfg.qkv_adapters:
            assert a.n_kv_heads == a.n_heads, "the k/v adapters are as wide as q's"
            heads = (Segment(a.n_heads * a.head_dim),)
            attn = f"{source}.self_attn"
            self.qkv_adapters = nn.ModuleList(
                _Adapter(width, r, heads, f"{attn}.linear_{n}_adapter_list.{k}", tp, dtype)
                for n in "qkv"
            )
        ff = Segment(cfg.mlp.intermediate_size)
        key = f"{source}.feed_forward.gate_up_proj_adapter_list.{k}"
        self.gate_up_adapter = _Adapter(d_model, r, (ff, ff), key, tp, dtype)
        full = (Segment(d_model, False),)
        self.linear = column(d_model, full, False, f"layers.{layer}.linear", tp, dtype)

    def empty_cache(self, device: torch.device) -> KVBuffer:
        return KVBuffer.empty(self.n_kv, self.cfg.head_dim, self.dtype, device)

    def _qkv(
        self, w: SharedWeights, x: torch.Tensor, emb: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x, emb [L, D] -> q [H, L, hd], k, v [KV, L, hd] (RoPE applied)."""
        h = w.input_norm(torch.cat([x, emb], dim=-1))
        q, k, v = w.q(h), w.k(h), w.v(h)
        if self.qkv_adapters is not None:
            aq, ak, av = self.qkv_adapters
            q, k, v = q + aq(h), k + ak(h), v + av(h)
        hd = self.cfg.head_dim
        q = q.view(-1, self.n_heads, hd).transpose(0, 1)
        k = k.view(-1, self.n_kv, hd).transpose(0, 1)
        v = v.view(-1, self.n_kv, hd).transpose(0, 1)
        rope = w.rope(x.device)
        if rope is not None:
            q, k = rope.apply(q, positions), rope.apply(k, positions)
        return q, k, v

    def _out(self, w: SharedWeights, attn: torch.Tensor) -> torch.Tensor:
        """attn [L, H*hd] -> o -> norm -> MLP with adapter -> linear: [L, D]."""
        n = w.pre_ff_norm(w.o(attn))
        gate, up = (w.gate_up(n) + self.gate_up_adapter(n)).chunk(2, dim=-1)
        out: torch.Tensor = self.linear(w.down(w.act(gate) * up))
        return out

    def prefill(
        self,
        w: SharedWeights,
        x: torch.Tensor,
        emb: torch.Tensor,
        positions: torch.Tensor,
        kv: PrefillKV,
    ) -> torch.Tensor:
        """x, emb [L, D] at absolute `positions` [L] (packed: every sequence's tokens in
        order); extends `kv`; returns [L, D]."""
        q, k, v = self._qkv(w, x, emb, positions)
        return self._out(w, prefill_attention(q, k, v, kv, self.cfg.scale))

    def decode(
        self,
        w: SharedWeights,
        x: torch.Tensor,
        emb: torch.Tensor,
        positions: torch.Tensor,
        kv: DecodeKV,
    ) -> torch.Tensor:
        """One new token per sequence: x, emb [B, D], positions [B]; `kv` stores the
        step's keys and values and attends (see `paged_kv`); returns [B, D]."""
        q, k, v = self._qkv(w, x, emb, positions)
        return self._out(w, kv.attend(q, k, v, self.cfg.scale))

    def weight_specs(self) -> dict[str, WeightSpec]:
        mods: dict[str, _HasSpecs] = {"gate_up_adapter": self.gate_up_adapter}
        mods["linear"] = self.linear
        for i, adapter in enumerate(self.qkv_adapters or ()):
            assert isinstance(adapter, _Adapter)
            mods[f"qkv_adapters.{i}"] = adapter
        return _specs(mods)
