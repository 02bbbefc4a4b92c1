"""`HybridModel`: the engine's tensor-parallel-ready hybrid decoder (one rank's shard).

Blocks follow `HybridConfig.blocks`; each is `x + mixer(norm(x))`. Embedding, final norm
and LM head are replicated on every rank; mixers are sharded (see `layers/`).

Contracts:
- `prefill(ids, state, emit_at)` consumes L tokens after `state.length` and returns the
  exact SSM states and logits after each absolute depth in `emit_at`, in one pass.
- `decode(ids, states)` consumes one token for each of B sequences at once.
Both update the given `SeqState`s in place (KV appended, SSM states replaced).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from marconi_kernels import KernelSet, get_kernels
from marconi_ray.engine.decode_batch import DecodeBatch
from marconi_ray.engine.layers.attention import Attention
from marconi_ray.engine.layers.fused_mlp import FusedGatedMLP
from marconi_ray.engine.layers.gated_deltanet import GatedDeltaNetMixer
from marconi_ray.engine.layers.mamba1 import Mamba1Mixer
from marconi_ray.engine.layers.mamba2 import Mamba2Mixer
from marconi_ray.engine.layers.mlp import MLP
from marconi_ray.engine.layers.moe import MoE
from marconi_ray.engine.layers.moe_layout import (
    GRANITE_MOE,
    JAMBA_MOE,
    NEMOTRON_H_MOE,
    QWEN_MOE,
    MoELayout,
)
from marconi_ray.engine.layers.norm import RMSNorm, rms_norm
from marconi_ray.engine.layers.weights import WeightSpec
from marconi_ray.engine.model_config import HybridConfig
from marconi_ray.engine.parallel import TPGroup
from marconi_ray.engine.seq_state import SeqState, StateCheckpoint


@dataclass(frozen=True)
class HFNames:
    """Checkpoint key layout of one family (keys below the model prefix); `moe` says where
    a mixture-of-experts block's weights are (see `MoELayout`)."""

    embed: str
    final_norm: str
    mixer_norm: str
    mlp_norm: str
    mixer: dict[str, str]
    mlp: str
    moe: MoELayout = QWEN_MOE
    fused_mlp: bool = False
    """The dense feed-forward is Granite's fused `input_linear` / `output_linear`."""


HF_NAMES = {
    "nemotron_h": HFNames(
        "embeddings.weight",
        "norm_f.weight",
        "norm",
        "norm",
        {"mamba2": "mixer", "attention": "mixer"},
        "mixer",
        NEMOTRON_H_MOE,
    ),
    "bamba": HFNames(
        "embed_tokens.weight",
        "final_layernorm.weight",
        "input_layernorm",
        "pre_ff_layernorm",
        {"mamba2": "mamba", "attention": "self_attn"},
        "feed_forward",
    ),
    "jamba": HFNames(
        "embed_tokens.weight",
        "final_layernorm.weight",
        "input_layernorm",
        "pre_ff_layernorm",
        {"mamba1": "mamba", "attention": "self_attn"},
        "feed_forward",
        JAMBA_MOE,
    ),
    "granitemoehybrid": HFNames(
        "embed_tokens.weight",
        "norm.weight",
        "input_layernorm",
        "post_attention_layernorm",
        {"mamba2": "mamba", "attention": "self_attn"},
        "shared_mlp",
        GRANITE_MOE,
        fused_mlp=True,
    ),
    **dict.fromkeys(
        ("qwen3_5_text", "qwen3_5", "qwen3_5_moe_text", "qwen3_5_moe", "qwen3_next"),
        HFNames(
            "embed_tokens.weight",
            "norm.weight",
            "input_layernorm",
            "post_attention_layernorm",
            {"gdn": "linear_attn", "attention": "self_attn"},
            "mlp",
        ),
    ),
}


Mixer = Attention | Mamba2Mixer | Mamba1Mixer | GatedDeltaNetMixer | MLP | FusedGatedMLP | MoE
SSMMixer = Mamba2Mixer | Mamba1Mixer | GatedDeltaNetMixer
FEED_FORWARD = ("mlp", "moe")


class Block(nn.Module):
    """`x + mixer(norm(x))` for one block kind."""

    mixer: Mixer

    def __init__(
        self, cfg: HybridConfig, index: int, tp: TPGroup, dtype: torch.dtype, kernels: KernelSet
    ) -> None:
        super().__init__()
        self.kind = cfg.blocks[index]
        names = HF_NAMES[cfg.family]
        layer = f"layers.{cfg.hf_layer[index]}"
        norm_key = names.mlp_norm if self.kind in FEED_FORWARD else names.mixer_norm
        self.norm = RMSNorm(
            cfg.hidden_size,
            cfg.norm_eps,
            f"{layer}.{norm_key}.weight",
            dtype,
            cfg.unit_offset_norms,
        )
        d = cfg.hidden_size
        mixer: Mixer
        if self.kind == "mlp":
            assert cfg.mlp is not None
            mlp = FusedGatedMLP if names.fused_mlp else MLP
            mixer = mlp(d, cfg.mlp, f"{layer}.{names.mlp}", tp, dtype)
        elif self.kind == "moe":
            assert cfg.moe is not None
            mixer = MoE(d, cfg.moe, layer, names.moe, tp, dtype)
        elif self.kind == "attention":
            assert cfg.attention is not None
            mixer = Attention(
                d,
                cfg.attention,
                f"{layer}.{names.mixer['attention']}",
                tp,
                dtype,
                cfg.norm_eps,
                cfg.unit_offset_norms,
            )
        elif self.kind == "gdn":
            assert cfg.gdn is not None
            mixer = GatedDeltaNetMixer(
                d, cfg.gdn, cfg.norm_eps, f"{layer}.{names.mixer['gdn']}", tp, dtype, kernels
            )
        elif self.kind == "mamba2":
            assert cfg.mamba2 is not None
            mixer = Mamba2Mixer(
                d, cfg.mamba2, cfg.norm_eps, f"{layer}.{names.mixer['mamba2']}", tp, dtype, kernels
            )
        else:
            assert cfg.mamba1 is not None
            mixer = Mamba1Mixer(
                d, cfg.mamba1, cfg.norm_eps, f"{layer}.{names.mixer['mamba1']}", tp, dtype, kernels
            )
        self.mixer = mixer

    def weight_specs(self) -> dict[str, WeightSpec]:
        out = {f"norm.{k}": v for k, v in self.norm.weight_specs().items()}
        out.update({f"mixer.{k}": v for k, v in self.mixer.weight_specs().items()})
        return out


WARM_UP_LENGTHS = (7, 32, 57, 140)
"""Prefill lengths of `HybridModel.warm_up`: one per token-block size the Triton conv picks."""


class HybridModel(nn.Module):
    """One tensor-parallel rank of a hybrid decoder. Parameters start uninitialised;
    fill them with `engine.loader.load_weights`."""

    def __init__(
        self,
        cfg: HybridConfig,
        tp: TPGroup | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        kernels: KernelSet | None = None,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.tp = tp or TPGroup()
        cfg.check_tp(self.tp.world)
        self.dtype = dtype
        self.device = torch.device(device)
        self.kernels = kernels or get_kernels(self.device)
        with torch.device(self.device):
            self.embed = nn.Parameter(
                torch.empty(cfg.vocab_size, cfg.hidden_size, dtype=dtype), requires_grad=False
            )
            self.blocks = nn.ModuleList(
                Block(cfg, i, self.tp, dtype, self.kernels) for i in range(len(cfg.blocks))
            )
            self.final_norm = RMSNorm(
                cfg.hidden_size,
                cfg.norm_eps,
                HF_NAMES[cfg.family].final_norm,
                dtype,
                cfg.unit_offset_norms,
            )
            self.lm_head = (
                self.embed
                if cfg.tie_embeddings
                else nn.Parameter(
                    torch.empty(cfg.vocab_size, cfg.hidden_size, dtype=dtype), requires_grad=False
                )
            )
        self.layers: list[Block] = list(self.blocks)  # type: ignore[arg-type]
        self.ssm_blocks = [i for i, b in enumerate(self.layers) if isinstance(b.mixer, SSMMixer)]
        self.attn_blocks = [i for i, b in enumerate(self.layers) if isinstance(b.mixer, Attention)]

    def attention(self, i: int) -> Attention:
        """The attention mixer of block `i`."""
        mixer = self.layers[i].mixer
        assert isinstance(mixer, Attention)
        return mixer

    def ssm(self, i: int) -> SSMMixer:
        """The recurrent (Mamba or Gated DeltaNet) mixer of block `i`."""
        mixer = self.layers[i].mixer
        assert isinstance(mixer, SSMMixer)
        return mixer

    def weight_specs(self) -> dict[str, WeightSpec]:
        """Local parameter name -> where it comes from in the HF checkpoint."""
        out = {"embed": WeightSpec(HF_NAMES[self.cfg.family].embed)}
        out.update({f"final_norm.{k}": v for k, v in self.final_norm.weight_specs().items()})
        if not self.cfg.tie_embeddings:
            out["lm_head"] = WeightSpec("lm_head.weight")
        for i, block in enumerate(self.layers):
            out.update({f"blocks.{i}.{k}": v for k, v in block.weight_specs().items()})
        return out

    # ------------------------------------------------------------------ states
    def new_state(self) -> SeqState:
        """The empty state of a sequence that has consumed nothing."""
        state = SeqState()
        for i in self.attn_blocks:
            state.kv[i] = self.attention(i).empty_cache(self.device)
        return state

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        norm = self.final_norm
        h = rms_norm(hidden, norm.weight, norm.eps, norm.unit_offset)
        logits = F.linear(h, self.lm_head).float()
        scale = self.cfg.scales.logits
        return logits if scale == 1.0 else logits * scale

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings [L, D], times the embedding multiplier."""
        x = F.embedding(ids.to(self.device), self.embed)
        scale = self.cfg.scales.embedding
        return x if scale == 1.0 else x * scale

    def _residual(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """x + h, the block output `h` times the residual multiplier."""
        scale = self.cfg.scales.residual
        return x + h if scale == 1.0 else x + h * scale

    # ------------------------------------------------------------------ forward
    @torch.inference_mode()
    def prefill(
        self, ids: torch.Tensor, state: SeqState, emit_at: Sequence[int] = ()
    ) -> list[StateCheckpoint]:
        """Consume `ids` [L] after `state.length` tokens, updating `state` in place.

        Args:
            emit_at: absolute depths d with state.length < d <= state.length + L, sorted;
                the SSM states and next-token logits after each are returned.
        Returns:
            one `StateCheckpoint` per depth in `emit_at`; `state.logits` is the last one.
        """
        n = ids.shape[0]
        start = state.length
        rel = [d - start for d in emit_at]
        if any(not 0 < r <= n for r in rel) or rel != sorted(set(rel)):
            raise ValueError(
                f"emit_at {list(emit_at)} must be sorted, distinct, in ({start}, {start + n}]"
            )
        x, conv_out, ssm_out = self._prefill_hidden(ids, state, rel)
        rows = torch.tensor([r - 1 for r in rel] + [n - 1], device=self.device)
        logits = self._logits(x.index_select(0, rows))
        state.length = start + n
        state.logits = logits[-1]
        return [
            StateCheckpoint(
                d,
                {i: conv_out[i][k] for i in self.ssm_blocks},
                {i: ssm_out[i][k] for i in self.ssm_blocks},
                logits[k],
            )
            for k, d in enumerate(emit_at)
        ]

    @torch.inference_mode()
    def decode(self, ids: torch.Tensor, states: Sequence[SeqState]) -> torch.Tensor:
        """Consume one token per sequence (ids [B]); returns next-token logits [B, V].
        SSM states are stacked for the step and written back (see `decode_batch` for the
        serving path, which keeps them in place)."""
        stacked = {
            i: (torch.stack([s.conv[i] for s in states]), torch.stack([s.ssm[i] for s in states]))
            for i in self.ssm_blocks
        }
        logits = self._decode(ids, states, stacked)
        for i, (conv, ssm) in stacked.items():
            for b, s in enumerate(states):
                s.conv[i], s.ssm[i] = conv[b], ssm[b]
        return logits

    def new_decode_batch(self, capacity: int) -> DecodeBatch:
        """A persistent decode batch of this rank's SSM state shapes (see `DecodeBatch`)."""
        return DecodeBatch(
            {i: self.ssm(i).empty_state(self.device) for i in self.ssm_blocks}, capacity
        )

    @torch.inference_mode()
    def decode_batch(self, ids: torch.Tensor, batch: DecodeBatch) -> torch.Tensor:
        """Consume one token per member of `batch` (ids [n], in row order); the SSM states
        are updated in place in the batch's rows. Returns next-token logits [n, V]."""
        rows = {i: batch.rows(i) for i in self.ssm_blocks}
        return self._decode(ids, batch.members, rows)

    def _decode(
        self,
        ids: torch.Tensor,
        states: Sequence[SeqState],
        ssm_rows: dict[int, tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """One decode step; `ssm_rows[i]` = (conv [B, C, K], ssm [B, ...]) of SSM block i,
        updated in place."""
        positions = torch.tensor([s.length for s in states], device=self.device)
        x = self._embed(ids)
        for i, block in enumerate(self.layers):
            h = block.norm(x)
            mixer = block.mixer
            if isinstance(mixer, Attention):
                h = mixer.decode(h, positions, [s.kv[i] for s in states])
            elif isinstance(mixer, SSMMixer):
                conv, ssm = ssm_rows[i]
                h = mixer.decode(h, conv, ssm)
            else:
                h = mixer(h)
            x = self._residual(x, h)
        logits = self._logits(x)
        for b, s in enumerate(states):
            s.length += 1
            s.logits = logits[b]
        return logits

    def _prefill_hidden(
        self, ids: torch.Tensor, state: SeqState, rel: Sequence[int]
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        """Run the blocks over `ids` after `state.length` tokens (updating `state`'s KV and
        SSM states). Returns the final hidden states [L, D] and, per SSM block, the conv
        and ssm states emitted at the relative positions `rel`."""
        start = state.length
        positions = torch.arange(start, start + ids.shape[0], device=self.device)
        x = self._embed(ids)
        conv_out: dict[int, torch.Tensor] = {}
        ssm_out: dict[int, torch.Tensor] = {}
        for i, block in enumerate(self.layers):
            h = block.norm(x)
            mixer = block.mixer
            if isinstance(mixer, Attention):
                h = mixer.prefill(h, positions, state.kv[i])
            elif isinstance(mixer, SSMMixer):
                h, conv, ssm, conv_e, ssm_e = mixer.prefill(
                    h, state.conv.get(i), state.ssm.get(i), rel
                )
                state.conv[i], state.ssm[i] = conv, ssm
                conv_out[i], ssm_out[i] = conv_e, ssm_e
            else:
                h = mixer(h)
            x = self._residual(x, h)
        return x, conv_out, ssm_out

    @torch.inference_mode()
    def warm_up(self) -> float:
        """Run every kernel on throwaway sequences (prefills of a few lengths that emit a
        state mid-chunk, then two decode steps), so Triton's JIT compilation (one variant
        per block size the lengths select) and autotuning happen at set-up, before health
        checks and collective timeouts can fire. Under tensor parallelism every rank must
        call it. Returns the seconds it took."""
        t0 = time.perf_counter()
        for n in sorted({min(self.cfg.max_position - 2, n) for n in WARM_UP_LENGTHS}):
            ids = torch.arange(n, device=self.device) % self.cfg.vocab_size
            state = self.new_state()
            self.prefill(ids, state, emit_at=[max(1, n // 2)])
            for _ in range(2):
                self.decode(ids[:1], [state])
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0

    @torch.inference_mode()
    def greedy(self, state: SeqState, n: int) -> list[int]:
        """The next `n` greedy tokens after `state` (which must hold logits), each decoded
        into `state` (for checks and tools; serving samples in the `Worker`)."""
        out: list[int] = []
        for _ in range(n):
            if state.logits is None:
                raise ValueError("the state has consumed no token: no logits to pick from")
            out.append(int(state.logits.argmax()))
            self.decode(torch.tensor([out[-1]], device=self.device), [state])
        return out

    @torch.inference_mode()
    def forward_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits [L, V] at every position of a fresh sequence (for validation)."""
        x, _, _ = self._prefill_hidden(ids, self.new_state(), ())
        return self._logits(x)
