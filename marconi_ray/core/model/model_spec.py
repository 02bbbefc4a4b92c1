"""A hybrid LLM as the cache sees it: its layers -> prefill FLOPs and cached-state bytes.

The FLOPs to prefill a full sequence of n tokens from scratch are the quadratic
`total_flops(n) = c1*n + c2*n*n` (summed over layers, see `layers.py`). Prefilling `n_new`
tokens after a cached prefix of `n_prefix` tokens costs `total(n_prefix + n_new) -
total(n_prefix)`, so the FLOPs a cached prefix of P tokens saves are `prefill_flops(P)`.
Embedding lookup and the LM head are not counted: prefill computes logits for the last
token only, a per-request constant that caching cannot save.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

from marconi_ray.core.model.layers import (
    KIND_ATTENTION,
    KIND_MLP,
    KIND_SSM,
    LAYER_KINDS,
    LayerSpec,
)
from marconi_ray.core.model.spec_checks import require_non_negative, require_positive
from marconi_ray.core.model.window_term import WindowTerm, group_windows


def _require_tokens(name: str, value: int) -> None:
    """Raise ValueError unless `value` is a non-negative integer token count."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")


@dataclass(frozen=True)
class ModelSpec:
    """Layer mix and dtype of one model; all FLOPs are floats, all bytes ints.

    Attributes:
        name: human-readable model name (non-empty).
        layers: the layers in execution order (a list is converted to a tuple).
        dtype_bytes: bytes per element of cached KV and SSM states (2 for fp16/bf16).
        state_dtype_bytes: bytes per element of the cached recurrent states when they
            are kept at another precision than the rest (4: fp32, as the engine keeps
            them, so a resumed state is exactly the one that was captured); None means
            `dtype_bytes`. Conv states and KV stay at `dtype_bytes`.
        vocab_size: vocabulary size (0 when unknown); informational.
        max_position: context limit in tokens, None when unknown; informational.
    """

    name: str
    layers: tuple[LayerSpec, ...]
    dtype_bytes: int = 2
    vocab_size: int = 0
    max_position: int | None = None
    state_dtype_bytes: int | None = None
    _coeffs: tuple[float, float] = field(init=False, repr=False, compare=False)
    _windows: tuple[WindowTerm, ...] = field(init=False, repr=False, compare=False)
    _coeffs_by_kind: tuple[tuple[str, float, float], ...] = field(
        init=False, repr=False, compare=False
    )
    _kv_bytes_per_token: int = field(init=False, repr=False, compare=False)
    _ssm_recurrent_bytes: int = field(init=False, repr=False, compare=False)
    _ssm_conv_bytes: int = field(init=False, repr=False, compare=False)
    _window_bytes: int = field(init=False, repr=False, compare=False)
    _window_state: int | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty str, got {self.name!r}")
        layers = tuple(self.layers)
        if not layers:
            raise ValueError(f"layers must be non-empty, got {self.layers!r}")
        for i, layer in enumerate(layers):
            if not isinstance(layer, LayerSpec):
                raise ValueError(f"layers[{i}] is not a LayerSpec: {layer!r}")
            if layer.kind not in LAYER_KINDS:
                raise ValueError(f"layers[{i}] has unknown kind {layer.kind!r}")
        require_positive("dtype_bytes", self.dtype_bytes)
        if self.state_dtype_bytes is not None:
            require_positive("state_dtype_bytes", self.state_dtype_bytes)
        require_non_negative("vocab_size", self.vocab_size)
        if self.max_position is not None:
            require_positive("max_position", self.max_position)
        by_kind = {kind: [0.0, 0.0] for kind in LAYER_KINDS}
        for layer in layers:
            c1, c2 = layer.total_flops_coeffs()
            by_kind[layer.kind][0] += c1
            by_kind[layer.kind][1] += c2
        sets = object.__setattr__
        windowed = [t for t in (x.window_term() for x in layers) if t is not None]
        sets(self, "_windows", group_windows(windowed))
        sets(self, "layers", layers)
        sets(self, "_coeffs_by_kind", tuple((k, v[0], v[1]) for k, v in by_kind.items()))
        sets(
            self,
            "_coeffs",
            (sum(v[0] for v in by_kind.values()), sum(v[1] for v in by_kind.values())),
        )
        d = self.dtype_bytes
        in_windows = [_window(x) is not None for x in layers]
        sizes = [w for x in layers if (w := _window(x)) is not None]
        window_state = max(sizes) if sizes else None
        sets(self, "_window_state", window_state)
        per_token = [x.kv_bytes_per_token(d) for x in layers]
        kv = sum(b for b, w in zip(per_token, in_windows, strict=True) if not w)
        sets(self, "_kv_bytes_per_token", kv)
        in_window = sum(b for b, w in zip(per_token, in_windows, strict=True) if w)
        sets(self, "_window_bytes", (window_state or 0) * in_window)
        ds = d if self.state_dtype_bytes is None else self.state_dtype_bytes
        sets(self, "_ssm_recurrent_bytes", sum(x.state_bytes(ds) for x in layers))
        sets(self, "_ssm_conv_bytes", sum(x.conv_bytes(d) for x in layers))

    # ---- FLOPs -------------------------------------------------------------------------

    def flops_coeffs(self) -> tuple[float, float]:
        """(c1, c2) summed over layers: `total_flops(n) == c1*n + c2*n*n` plus the
        `window_terms` (cached)."""
        return self._coeffs

    def window_terms(self) -> tuple[WindowTerm, ...]:
        """The sliding-window attention FLOPs, one term per window (none without such
        layers): each adds `coefficient * n * min(n, window)` to `total_flops(n)`."""
        return self._windows

    def total_flops(self, n: int) -> float:
        """FLOPs to prefill n tokens from scratch (n >= 0)."""
        _require_tokens("n", n)
        c1, c2 = self._coeffs
        return c1 * n + c2 * n * n + sum(t.coefficient * t.pairs(n) for t in self._windows)

    def prefill_flops(self, n_new: int, n_prefix: int = 0) -> float:
        """FLOPs to prefill `n_new` tokens after a cached prefix of `n_prefix` tokens.

        Equals `total_flops(n_prefix + n_new) - total_flops(n_prefix)`, computed without
        the cancellation.
        """
        _require_tokens("n_new", n_new)
        _require_tokens("n_prefix", n_prefix)
        c1, c2 = self._coeffs
        return c1 * n_new + c2 * n_new * (2 * n_prefix + n_new) + self._windowed(n_new, n_prefix)

    def _windowed(self, n_new: int, n_prefix: int) -> float:
        """The window terms' FLOPs of `n_new` tokens after `n_prefix` (exact ints first)."""
        end = n_prefix + n_new
        return sum(t.coefficient * (t.pairs(end) - t.pairs(n_prefix)) for t in self._windows)

    def prefill_flops_by_kind(self, n_new: int, n_prefix: int = 0) -> dict[str, float]:
        """`prefill_flops` split by layer kind; has a key for every kind in `LAYER_KINDS`."""
        _require_tokens("n_new", n_new)
        _require_tokens("n_prefix", n_prefix)
        quad = n_new * (2 * n_prefix + n_new)
        out = {k: c1 * n_new + c2 * quad for k, c1, c2 in self._coeffs_by_kind}
        out[KIND_ATTENTION] += self._windowed(n_new, n_prefix)
        return out

    # ---- bytes -------------------------------------------------------------------------

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token summed over the attention layers without a window (a
        windowed layer's KV is in each checkpoint: `window_state`)."""
        return self._kv_bytes_per_token

    def kv_bytes(self, n_tokens: int) -> int:
        """KV bytes of `n_tokens` tokens over all attention layers."""
        _require_tokens("n_tokens", n_tokens)
        return self._kv_bytes_per_token * int(n_tokens)

    @property
    def ssm_recurrent_bytes(self) -> int:
        """Bytes of the recurrent SSM states of one checkpoint, over all SSM layers."""
        return self._ssm_recurrent_bytes

    @property
    def ssm_conv_bytes(self) -> int:
        """Bytes of the conv1d states of one checkpoint, over all SSM layers."""
        return self._ssm_conv_bytes

    @property
    def window_state(self) -> int | None:
        """W, the largest window of the model's sliding-window attention layers, or None
        without any. Resuming at depth p needs only such a layer's KV of positions
        p - W .. p - 1, and a hybrid resumes only from a state at exactly p: that KV is
        all-or-nothing and updated in place like a recurrent state. So a checkpoint holds
        its window (the last W positions' KV of every windowed layer, zero-padded below
        W) beside its recurrent states, counted in `ssm_state_bytes`, and the cache admits
        and evicts it as one; `kv_bytes_per_token` counts the other attention layers only
        (none in RecurrentGemma, the full ones in LFM3)."""
        return self._window_state

    @property
    def window_bytes(self) -> int:
        """Bytes of one checkpoint's window (0 unless `window_state`): W positions'
        KV over the windowed layers, the largest window for all of them."""
        return self._window_bytes

    @property
    def ssm_state_bytes(self) -> int:
        """Bytes of one checkpoint: recurrent + conv states over all SSM layers, and the
        window with a `window_state`."""
        return self._ssm_recurrent_bytes + self._ssm_conv_bytes + self._window_bytes

    def ssm_bytes_by_part(self) -> dict[str, int]:
        """One checkpoint's bytes split into {"recurrent": ..., "conv": ...} (and
        "window" with a `window_state`)."""
        parts = {"recurrent": self._ssm_recurrent_bytes, "conv": self._ssm_conv_bytes}
        if self._window_bytes:
            parts["window"] = self._window_bytes
        return parts

    # ---- layer counts ------------------------------------------------------------------

    def count(self, kind: str) -> int:
        """Number of layers of `kind` (one of `LAYER_KINDS`)."""
        if kind not in LAYER_KINDS:
            raise ValueError(f"unknown layer kind {kind!r}; expected one of {LAYER_KINDS}")
        return sum(1 for layer in self.layers if layer.kind == kind)

    @property
    def n_attention(self) -> int:
        return self.count(KIND_ATTENTION)

    @property
    def n_ssm(self) -> int:
        return self.count(KIND_SSM)

    @property
    def n_mlp(self) -> int:
        """Dense MLP and MoE layers."""
        return self.count(KIND_MLP)

    # ---- efficiency --------------------------------------------------------------------

    def flop_efficiency(self, n_tokens: int, n_prefix: int = 0, with_state: bool = True) -> float:
        """FLOPs per byte of a cache entry covering tokens n_prefix .. n_prefix + n_tokens.

        FLOPs: `prefill_flops(n_tokens, n_prefix)` (what a hit on the entry saves over a hit
        on its prefix). Bytes: the KV of its `n_tokens` tokens plus, when `with_state`, one
        SSM checkpoint. Returns 0.0 when the entry holds no bytes.
        """
        freed = self.kv_bytes(n_tokens) + (self.ssm_state_bytes if with_state else 0)
        if freed == 0:
            return 0.0
        return self.prefill_flops(n_tokens, n_prefix) / freed


def _window(layer: LayerSpec) -> int | None:
    """A layer's sliding window (an `AttentionLayer`'s), None without one."""
    window = getattr(layer, "window", None)
    return None if window is None else int(window)
