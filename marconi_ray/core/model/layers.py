"""Per-layer FLOP and byte models of the blocks a hybrid (Attention + SSM) LLM is made of.

Contract shared by every layer spec:
- `total_flops_coeffs()` returns `(c1, c2)` such that running the layer over a full sequence
  of n tokens from scratch costs exactly `c1*n + c2*n*n` FLOPs (one multiply-add = 2 FLOPs).
  Only attention has a quadratic term; following the Marconi paper (Appendix A) it counts
  the full, non-causal n x n score and AV products (4*n*n*width).
- `kv_bytes_per_token(dtype_bytes)`: bytes of cached K and V per token (attention only).
- `state_bytes(dtype_bytes)` / `conv_bytes(dtype_bytes)`: bytes of one cached recurrent
  state and of one cached conv state (SSM layers only). Layers without such state return 0.
- `window_term()`: a sliding-window attention's score/AV FLOPs, `c*n*min(n, W)`, kept
  apart from the coefficients (None for every other layer).
- `kind` is one of `LAYER_KINDS`, so callers can sum FLOPs and bytes by kind.

All dimensions are ints > 0 (ValueError naming the bad one otherwise). Norms, biases,
residual adds, RoPE and activations outside the SSM are not counted (they are O(n*D) and
small next to the matrix products), exactly as the paper's formulas omit them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Final

from marconi_ray.core.model.spec_checks import require_non_negative, require_positive
from marconi_ray.core.model.window_term import WindowTerm

KIND_ATTENTION: Final = "attention"
KIND_SSM: Final = "ssm"
KIND_MLP: Final = "mlp"
KIND_LINEAR: Final = "linear"
LAYER_KINDS: Final[tuple[str, ...]] = (KIND_ATTENTION, KIND_SSM, KIND_MLP, KIND_LINEAR)
"""`linear` is glue outside the three block types (e.g. Zamba2's per-block projection and
LoRA adapters of its shared blocks); it holds no cached state."""


class LayerSpec(ABC):
    """Base of every layer spec: FLOP coefficients plus (zero by default) cached-state bytes."""

    kind: ClassVar[str]

    @abstractmethod
    def total_flops_coeffs(self) -> tuple[float, float]:
        """(c1, c2): FLOPs over a from-scratch sequence of n tokens are c1*n + c2*n*n."""

    def kv_elements_per_token(self) -> int:
        """Cached K and V elements per token; 0 for layers without a KV cache."""
        return 0

    def state_elements(self) -> int:
        """Elements of one cached recurrent (SSM) state; 0 for layers without one."""
        return 0

    def conv_elements(self) -> int:
        """Elements of one cached conv1d state; 0 for layers without one."""
        return 0

    def window_term(self) -> WindowTerm | None:
        """FLOPs that grow with a sliding window rather than with n*n (windowed
        attention); None for every other layer."""
        return None

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes of cached K and V per token."""
        require_positive("dtype_bytes", dtype_bytes)
        return self.kv_elements_per_token() * dtype_bytes

    def state_bytes(self, dtype_bytes: int) -> int:
        """Bytes of one cached recurrent (SSM) state."""
        require_positive("dtype_bytes", dtype_bytes)
        return self.state_elements() * dtype_bytes

    def conv_bytes(self, dtype_bytes: int) -> int:
        """Bytes of one cached conv1d state."""
        require_positive("dtype_bytes", dtype_bytes)
        return self.conv_elements() * dtype_bytes


def mlp_flops_per_token(d_model: int, d_ff: int, gated: bool) -> int:
    """FLOPs per token of a dense MLP: 2 matrices (4*D*F) or 3 when gated (6*D*F)."""
    return (6 if gated else 4) * d_model * d_ff


@dataclass(frozen=True)
class AttentionLayer(LayerSpec):
    """Multi-head / grouped-query self-attention.

    Per token: Q projection 2*Din*(H*hd), K and V 2*2*Din*(Hkv*hd), output 2*(H*hd)*D;
    over n tokens the scores and AV add 4*n*n*(H*hd). With MHA and H*hd = D = Din this is
    the paper's 8*L*D^2 + 4*L^2*D. KV bytes per token: 2*Hkv*hd*dtype_bytes (4*D in fp16
    for MHA, as in the paper).

    Attributes:
        d_model: residual width D (output of the O projection).
        n_heads: query heads H.
        n_kv_heads: key/value heads Hkv (== H for MHA); must divide H.
        head_dim: hd, width of one head.
        input_dim: width Din the Q/K/V projections read; None means d_model (Zamba2's
            shared blocks read the 2*D concatenation of hidden state and embeddings).
        output_gate: the Q projection also emits a sigmoid gate of width H*hd (Qwen3.5,
            Qwen3-Next): it costs another 2*Din*(H*hd) per token.
        window: a sliding window of this many keys per query (RecurrentGemma, LFM3): its
            scores and AV cost 4*n*min(n, window)*(H*hd), a `window_term`, not a quadratic
            coefficient. When every KV layer of the model is windowed its KV is priced as
            part of each checkpoint (`ModelSpec.window_state`), else per token like full
            attention's.
        head_gate: a separate projection gives one sigmoid gate per head (LFM3's g_proj):
            another 2*Din*H per token.
    """

    kind: ClassVar[str] = KIND_ATTENTION
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    input_dim: int | None = None
    output_gate: bool = False
    window: int | None = None
    head_gate: bool = False

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "n_kv_heads", "head_dim"):
            require_positive(name, getattr(self, name))
        if self.window is not None:
            require_positive("window", self.window)
        if self.input_dim is not None:
            require_positive("input_dim", self.input_dim)
        if self.n_heads % self.n_kv_heads != 0:
            raise ValueError(f"n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}")

    def total_flops_coeffs(self) -> tuple[float, float]:
        d_in = self.d_model if self.input_dim is None else self.input_dim
        q_width = self.n_heads * self.head_dim
        kv_width = self.n_kv_heads * self.head_dim
        q_proj = 2 * d_in * q_width * (2 if self.output_gate else 1)
        c1 = q_proj + 2 * 2 * d_in * kv_width + 2 * q_width * self.d_model
        c1 += 2 * d_in * self.n_heads if self.head_gate else 0
        return float(c1), 0.0 if self.window is not None else float(4 * q_width)

    def window_term(self) -> WindowTerm | None:
        if self.window is None:
            return None
        return WindowTerm(float(4 * self.n_heads * self.head_dim), self.window)

    def kv_elements_per_token(self) -> int:
        return 2 * self.n_kv_heads * self.head_dim


@dataclass(frozen=True)
class MLPLayer(LayerSpec):
    """Dense feed-forward block D -> F -> D; gated (SwiGLU-style) adds a third matrix.

    FLOPs per token 4*D*F (plain) or 6*D*F (gated); with F = 4*D plain is the paper's
    16*L*D^2.
    """

    kind: ClassVar[str] = KIND_MLP
    d_model: int
    d_ff: int
    gated: bool

    def __post_init__(self) -> None:
        require_positive("d_model", self.d_model)
        require_positive("d_ff", self.d_ff)

    def total_flops_coeffs(self) -> tuple[float, float]:
        return float(mlp_flops_per_token(self.d_model, self.d_ff, self.gated)), 0.0


@dataclass(frozen=True)
class MoELayer(LayerSpec):
    """Mixture-of-experts feed-forward block; only the `top_k` routed experts run per token.

    Per token: router 2*D*E, plus top_k experts of width d_ff, plus `n_shared_experts`
    always-on experts of width shared_d_ff (all gated or all plain, per `gated`). With
    `latent_dim` (NemotronH) the routed experts run at that width between two extra
    projections D -> latent -> D. `shared_expert_gate` (Qwen3.5-MoE, Qwen3-Next) adds the
    shared expert's D -> 1 sigmoid gate, 2*D.
    """

    kind: ClassVar[str] = KIND_MLP
    d_model: int
    d_ff: int
    n_experts: int
    top_k: int
    gated: bool
    n_shared_experts: int = 0
    shared_d_ff: int = 0
    latent_dim: int | None = None
    shared_expert_gate: bool = False

    def __post_init__(self) -> None:
        for name in ("d_model", "d_ff", "n_experts", "top_k"):
            require_positive(name, getattr(self, name))
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k={self.top_k} exceeds n_experts={self.n_experts}")
        require_non_negative("n_shared_experts", self.n_shared_experts)
        if self.n_shared_experts > 0:
            require_positive("shared_d_ff", self.shared_d_ff)
        if self.latent_dim is not None:
            require_positive("latent_dim", self.latent_dim)

    def total_flops_coeffs(self) -> tuple[float, float]:
        router = 2 * self.d_model * self.n_experts
        expert_width = self.d_model if self.latent_dim is None else self.latent_dim
        latent_proj = 0 if self.latent_dim is None else 2 * 2 * self.d_model * self.latent_dim
        routed = self.top_k * mlp_flops_per_token(expert_width, self.d_ff, self.gated)
        shared = 0
        if self.n_shared_experts > 0:
            shared = self.n_shared_experts * mlp_flops_per_token(
                self.d_model, self.shared_d_ff, self.gated
            )
        gate = 2 * self.d_model if self.shared_expert_gate else 0
        return float(router + latent_proj + routed + shared + gate), 0.0


@dataclass(frozen=True)
class LinearLayer(LayerSpec):
    """A bare projection d_in -> d_out (2*d_in*d_out FLOPs per token), kind `linear`."""

    kind: ClassVar[str] = KIND_LINEAR
    d_in: int
    d_out: int

    def __post_init__(self) -> None:
        require_positive("d_in", self.d_in)
        require_positive("d_out", self.d_out)

    def total_flops_coeffs(self) -> tuple[float, float]:
        return float(2 * self.d_in * self.d_out), 0.0


@dataclass(frozen=True)
class Mamba2Sizes:
    """A Mamba-2 (SSD) mixer's sizes and the widths derived from them: the one description
    that the cost model's `Mamba2Layer` and the HF architecture's `hf.arch.Mamba2Config`
    (what the engine's mixer is built from) both read.

    d_inner = n_heads*head_dim (the scan's channels); the depthwise conv runs over x, B and
    C: conv_dim = d_inner + 2*n_groups*d_state channels, each keeping d_conv columns.
    `check` raises ValueError naming the first bad size (every size an int > 0, n_groups
    dividing n_heads); `Mamba2Layer` runs it on construction, so a `ModelSpec` that builds
    has checked every Mamba-2 block of its architecture.
    """

    n_heads: int
    head_dim: int
    n_groups: int
    d_state: int
    d_conv: int

    def check(self) -> None:
        for name in ("n_heads", "head_dim", "n_groups", "d_state", "d_conv"):
            require_positive(name, getattr(self, name))
        if self.n_heads % self.n_groups != 0:
            raise ValueError(f"n_groups={self.n_groups} must divide n_heads={self.n_heads}")

    @property
    def d_inner(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.n_groups * self.d_state


@dataclass(frozen=True)
class Mamba2Layer(LayerSpec):
    """Mamba-2 (SSD) mixer, as in NemotronH, Bamba, Zamba2, FalconH1 and GraniteMoeHybrid.

    With d_inner and conv_dim as `Mamba2Sizes` derives them, FLOPs per token: in_proj
    2*D*(2*d_inner + 2*G*N + H), depthwise conv 2*conv_dim*d_conv, scan 8*d_inner*N
    (16*D*N when d_inner = 2*D, as in the paper), gating/norm/skip 5*d_inner, out_proj
    2*d_inner*D.
    Cached state: recurrent n_heads*head_dim*d_state elements, conv conv_dim*d_conv
    elements (transformers keeps d_conv columns of conv input).
    """

    kind: ClassVar[str] = KIND_SSM
    d_model: int
    n_heads: int
    head_dim: int
    n_groups: int
    d_state: int
    d_conv: int

    def __post_init__(self) -> None:
        require_positive("d_model", self.d_model)
        self.sizes.check()

    @property
    def sizes(self) -> Mamba2Sizes:
        return Mamba2Sizes(self.n_heads, self.head_dim, self.n_groups, self.d_state, self.d_conv)

    @property
    def d_inner(self) -> int:
        return self.sizes.d_inner

    @property
    def conv_dim(self) -> int:
        return self.sizes.conv_dim

    def total_flops_coeffs(self) -> tuple[float, float]:
        d, di, n = self.d_model, self.d_inner, self.d_state
        in_proj = 2 * d * (2 * di + 2 * self.n_groups * n + self.n_heads)
        conv = 2 * self.conv_dim * self.d_conv
        c1 = in_proj + conv + 8 * di * n + 5 * di + 2 * di * d
        return float(c1), 0.0

    def state_elements(self) -> int:
        return self.d_inner * self.d_state

    def conv_elements(self) -> int:
        return self.conv_dim * self.d_conv


@dataclass(frozen=True)
class GatedDeltaNetLayer(LayerSpec):
    """Gated DeltaNet linear attention (Qwen3.5, Qwen3-Next).

    With key_dim = Hk*dk, value_dim = Hv*dv and conv_dim = 2*key_dim + value_dim, FLOPs per
    token: input projections 2*D*(conv_dim + value_dim + 2*Hv) (q, k, v, the gate z, and
    beta and the decay per value head), depthwise conv 2*conv_dim*d_conv, the delta rule
    8*Hv*dk*dv (per value head: read k^T S, write k (x) delta, decay S, read q^T S: about
    four multiply-adds per state element), gated norm 5*value_dim, out_proj
    2*value_dim*D. Cached state: recurrent Hv*dk*dv elements, conv conv_dim*d_conv.
    """

    kind: ClassVar[str] = KIND_SSM
    d_model: int
    n_k_heads: int
    n_v_heads: int
    head_k_dim: int
    head_v_dim: int
    d_conv: int

    def __post_init__(self) -> None:
        for name in ("d_model", "n_k_heads", "n_v_heads", "head_k_dim", "head_v_dim", "d_conv"):
            require_positive(name, getattr(self, name))
        if self.n_v_heads % self.n_k_heads:
            raise ValueError(f"n_k_heads={self.n_k_heads} must divide n_v_heads={self.n_v_heads}")

    @property
    def value_dim(self) -> int:
        return self.n_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.n_k_heads * self.head_k_dim + self.value_dim

    def total_flops_coeffs(self) -> tuple[float, float]:
        d, vd = self.d_model, self.value_dim
        in_proj = 2 * d * (self.conv_dim + vd + 2 * self.n_v_heads)
        conv = 2 * self.conv_dim * self.d_conv
        rule = 8 * self.n_v_heads * self.head_k_dim * self.head_v_dim
        return float(in_proj + conv + rule + 5 * vd + 2 * vd * d), 0.0

    def state_elements(self) -> int:
        return self.n_v_heads * self.head_k_dim * self.head_v_dim

    def conv_elements(self) -> int:
        return self.conv_dim * self.d_conv


@dataclass(frozen=True)
class ShortConvLayer(LayerSpec):
    """LFM2's gated short convolution: in_proj D -> 3D (B, C, x), y = C * conv(B * x) with
    a depthwise causal conv of kernel d_conv, out_proj D -> D.

    FLOPs per token: 2 x the weights a token multiplies, in_proj 2*D*3D, conv 2*D*d_conv,
    out_proj 2*D*D, i.e. 8*D^2 + 2*D*d_conv (the two elementwise gates, 2*D, are not
    counted, like norms). Cached state: the conv window only, D*d_conv elements (the last
    d_conv inputs, as transformers caches them); no recurrent state.
    """

    kind: ClassVar[str] = KIND_SSM
    d_model: int
    d_conv: int

    def __post_init__(self) -> None:
        require_positive("d_model", self.d_model)
        require_positive("d_conv", self.d_conv)

    def total_flops_coeffs(self) -> tuple[float, float]:
        d = self.d_model
        return float(2 * d * 3 * d + 2 * d * self.d_conv + 2 * d * d), 0.0

    def conv_elements(self) -> int:
        return self.d_model * self.d_conv


@dataclass(frozen=True)
class RGLRULayer(LayerSpec):
    """RecurrentGemma's recurrent block: linear_x and linear_y D -> W, a depthwise causal
    conv of kernel d_conv, the RG-LRU (block-diagonal input and recurrence gates of
    n_heads blocks of W / n_heads), linear_out W -> D.

    FLOPs per token: linear_x + linear_y 2*2*D*W, conv 2*W*d_conv, the two gates
    2*2*W*(W / n_heads), linear_out 2*W*D (the elementwise recurrence, normalisation and
    output gate, O(W), are not counted, like norms). Cached state: the LRU state, W
    elements, and the conv window, W*d_conv elements (the last d_conv conv inputs, as the
    engine keeps them).
    """

    kind: ClassVar[str] = KIND_SSM
    d_model: int
    lru_width: int
    n_heads: int
    d_conv: int

    def __post_init__(self) -> None:
        for name in ("d_model", "lru_width", "n_heads", "d_conv"):
            require_positive(name, getattr(self, name))
        if self.lru_width % self.n_heads:
            raise ValueError(f"n_heads={self.n_heads} must divide lru_width={self.lru_width}")

    def total_flops_coeffs(self) -> tuple[float, float]:
        d, w = self.d_model, self.lru_width
        gates = 2 * 2 * w * (w // self.n_heads)
        return float(2 * 2 * d * w + 2 * w * self.d_conv + gates + 2 * w * d), 0.0

    def state_elements(self) -> int:
        return self.lru_width

    def conv_elements(self) -> int:
        return self.lru_width * self.d_conv


@dataclass(frozen=True)
class Mamba1Layer(LayerSpec):
    """Mamba-1 (selective scan) mixer, as in Jamba.

    FLOPs per token: in_proj 2*D*2*d_inner, depthwise conv 2*d_inner*d_conv, x_proj
    2*d_inner*(dt_rank + 2*N), dt_proj 2*dt_rank*d_inner, scan 8*d_inner*N, gating/skip
    5*d_inner, out_proj 2*d_inner*D. Cached state: recurrent d_inner*N elements, conv
    d_inner*d_conv elements.
    """

    kind: ClassVar[str] = KIND_SSM
    d_model: int
    d_inner: int
    d_state: int
    d_conv: int
    dt_rank: int

    def __post_init__(self) -> None:
        for name in ("d_model", "d_inner", "d_state", "d_conv", "dt_rank"):
            require_positive(name, getattr(self, name))

    def total_flops_coeffs(self) -> tuple[float, float]:
        d, di, n, r = self.d_model, self.d_inner, self.d_state, self.dt_rank
        c1 = (
            2 * d * 2 * di
            + 2 * di * self.d_conv
            + 2 * di * (r + 2 * n)
            + 2 * r * di
            + 8 * di * n
            + 5 * di
            + 2 * di * d
        )
        return float(c1), 0.0

    def state_elements(self) -> int:
        return self.d_inner * self.d_state

    def conv_elements(self) -> int:
        return self.d_inner * self.d_conv


@dataclass(frozen=True)
class PaperSSMLayer(LayerSpec):
    """The SSM layer exactly as the Marconi paper's Appendix A counts it.

    FLOPs 12*L*D^2 + 16*L*D*N + 10*L*D; recurrent state D*N elements (2*D*N bytes in
    fp16); conv state conv_channels*d_conv elements (about 6% of the total in the 7B model).
    """

    kind: ClassVar[str] = KIND_SSM
    d_model: int
    d_state: int
    conv_channels: int
    d_conv: int

    def __post_init__(self) -> None:
        for name in ("d_model", "d_state", "conv_channels", "d_conv"):
            require_positive(name, getattr(self, name))

    def total_flops_coeffs(self) -> tuple[float, float]:
        d, n = self.d_model, self.d_state
        return float(12 * d * d + 16 * d * n + 10 * d), 0.0

    def state_elements(self) -> int:
        return self.d_model * self.d_state

    def conv_elements(self) -> int:
        return self.conv_channels * self.d_conv
