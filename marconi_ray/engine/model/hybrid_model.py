"""`HybridModel`: the engine's tensor-parallel-ready hybrid decoder (one rank's shard).

Blocks follow `HybridConfig.blocks`; each is `x + mixer(norm(x))`, except that the blocks
of one residual group (`HybridConfig.residual_groups`: FalconH1's parallel attention and
Mamba-2) read one normed input and add the sum of their outputs, `x + sum_i mixer_i(norm(x))`;
under tensor parallelism the group's partial sums take one all-reduce; and Zamba2's
`shared_transformer` blocks, whose output is added to the next block's input (see
`layers/zamba_shared.py`; their shared weights are held once, in `HybridModel.shared`).
Each block keeps its own states (KV for attention, conv + SSM for Mamba) under its own
index. Embedding, final norm and LM head are replicated on every rank; mixers are sharded
(see `layers/`).

muP multipliers: embedding, residual and logit scales are applied in the forward
(`HybridConfig.scales`: the embedding table may be tied to the LM head, so neither can
absorb them); every other multiplier sits on a linear layer's input or output and is
folded into its weights at load (`ParallelLinear`), free at run time.

Contracts:
- `prefill(ids, state, emit_at)` consumes L tokens after `state.length` and returns the
  exact SSM states and logits after each absolute depth in `emit_at`, in one pass.
- `decode(ids, states)` consumes one token for each of B sequences at once.
Both update the given `SeqState`s in place (KV appended, SSM states replaced).

KV lives in one of two places (see `paged_kv`): a state's own `KVBuffer`s (the model's
standalone API above), or rows of a shared KV pool (the serving path: `prefill(...,
pool=)` over `state.rows`, and `decode_batch` over a pooled `DecodeBatch`, one attention
call per attention layer for the whole batch).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import nn
from torch.nn import functional as F

from marconi_kernels import KernelSet, get_kernels
from marconi_ray.engine.model.decode_batch import DecodeBatch
from marconi_ray.engine.model.layers.attention import Attention, PrefillKV
from marconi_ray.engine.model.layers.fused_mlp import FusedGatedMLP
from marconi_ray.engine.model.layers.gated_deltanet import GatedDeltaNetMixer
from marconi_ray.engine.model.layers.kda import KDAMixer
from marconi_ray.engine.model.layers.lightning import LightningMixer
from marconi_ray.engine.model.layers.linear import ParallelLinear, column_major
from marconi_ray.engine.model.layers.mamba1 import Mamba1Mixer
from marconi_ray.engine.model.layers.mamba2 import Mamba2Mixer
from marconi_ray.engine.model.layers.mla import MLAttention
from marconi_ray.engine.model.layers.mlp import MLP
from marconi_ray.engine.model.layers.mlstm import MLSTMMixer
from marconi_ray.engine.model.layers.moe import MoE
from marconi_ray.engine.model.layers.moe_layout import (
    GRANITE_MOE,
    JAMBA_MOE,
    KIMI_LINEAR_MOE,
    LFM2_MOE,
    NEMOTRON_H_MOE,
    QWEN_MOE,
    MoELayout,
)
from marconi_ray.engine.model.layers.norm import RMSNorm, rms_norm
from marconi_ray.engine.model.layers.packed import PackedPart
from marconi_ray.engine.model.layers.rglru import RGLRUMixer
from marconi_ray.engine.model.layers.short_conv import ShortConvMixer
from marconi_ray.engine.model.layers.sliding_attention import SlidingWindowAttention
from marconi_ray.engine.model.layers.weights import WeightSpec
from marconi_ray.engine.model.layers.zamba_shared import SharedBlock, SharedWeights
from marconi_ray.engine.model.model_config import FEED_FORWARD_KINDS, HybridConfig
from marconi_ray.engine.model.paged_kv import (
    BufferDecode,
    DecodeKV,
    KVRows,
    PackedPrefill,
    PackedRows,
    PagedPrefill,
    Pools,
    ScratchKV,
    SplitPools,
)
from marconi_ray.engine.model.parallel import TPGroup
from marconi_ray.engine.model.prefill_part import PrefillPart
from marconi_ray.engine.model.seq_state import SeqState, StateCheckpoint

PartFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""A mixer's prefill of part k: (k, its hidden rows, its embeddings, its positions)."""


@dataclass(frozen=True)
class HFNames:
    """Checkpoint key layout of one family (keys below the model prefix).

    `hybrid_sub`: the sub-module of a layer that also runs a shared block holding that
    layer's own mixer and norm (Zamba2's `mamba_decoder`); `shared`: the sub-module
    holding a copy of the shared block's weights (Zamba2's `shared_transformer`).
    `renames`: (engine suffix, checkpoint suffix) pairs for a family whose layers name
    their weights differently from the engine's layers (e.g. LFM2's `out_proj.weight` for
    attention's `o_proj.weight`); a block weight key ending with the first is read from
    the key ending with the second instead. `moe` says where a mixture-of-experts block's
    weights are (see `MoELayout`); `fused_mlp`: the dense feed-forward is Granite's fused
    `input_linear` / `output_linear`. `post_norms`: block kind -> the norm of a post-norm
    block of that kind (OLMo Hybrid's attention layers). `alternates`: (infix, alternate)
    pairs; a weight key
    the checkpoint lacks is read from the key with the infix replaced, when that one exists
    (Kimi Linear's own files keep the dense MLP under `.mlp.`, where transformers saves it
    under `.block_sparse_moe.`).
    """

    embed: str
    final_norm: str
    mixer_norm: str
    mlp_norm: str
    mixer: dict[str, str]
    mlp: str
    hybrid_sub: str = ""
    shared: str = ""
    renames: tuple[tuple[str, str], ...] = ()
    moe: MoELayout = QWEN_MOE
    fused_mlp: bool = False
    post_norms: Mapping[str, str] = field(default_factory=dict)
    alternates: tuple[tuple[str, str], ...] = ()

    def present(self, key: str, where: Mapping[str, str]) -> str:
        """`key`, or its first alternate (see `alternates`) that `where` holds when it
        does not hold `key` (`key` itself when none does)."""
        if key in where:
            return key
        for infix, alternate in self.alternates:
            other = key.replace(infix, alternate)
            if other != key and other in where:
                return other
        return key

    def checkpoint_key(self, key: str) -> str:
        """`key` with its suffix renamed per `renames` (unchanged when none matches)."""
        for engine, checkpoint in self.renames:
            if key.endswith("." + engine):
                return key[: -len(engine)] + checkpoint
        return key


HF_NAMES = {
    "nemotron_h": HFNames(
        "embeddings.weight",
        "norm_f.weight",
        "norm",
        "norm",
        {"mamba2": "mixer", "attention": "mixer"},
        "mixer",
        moe=NEMOTRON_H_MOE,
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
        moe=JAMBA_MOE,
    ),
    "granitemoehybrid": HFNames(
        "embed_tokens.weight",
        "norm.weight",
        "input_layernorm",
        "post_attention_layernorm",
        {"mamba2": "mamba", "attention": "self_attn"},
        "shared_mlp",
        moe=GRANITE_MOE,
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
    "falcon_h1": HFNames(
        "embed_tokens.weight",
        "final_layernorm.weight",
        "input_layernorm",
        "pre_ff_layernorm",
        {"mamba2": "mamba", "attention": "self_attn"},
        "feed_forward",
    ),
    "zamba2": HFNames(
        "embed_tokens.weight",
        "final_layernorm.weight",
        "input_layernorm",
        "input_layernorm",
        {"mamba2": "mamba"},
        "",
        hybrid_sub="mamba_decoder",
        shared="shared_transformer",
    ),
    **dict.fromkeys(
        ("lfm2", "lfm2_moe"),
        HFNames(
            "embed_tokens.weight",
            "embedding_norm.weight",
            "operator_norm",
            "ffn_norm",
            {"shortconv": "conv", "attention": "self_attn"},
            "feed_forward",
            renames=(
                ("o_proj.weight", "out_proj.weight"),
                ("q_norm.weight", "q_layernorm.weight"),
                ("k_norm.weight", "k_layernorm.weight"),
                ("gate_proj.weight", "w1.weight"),
                ("up_proj.weight", "w3.weight"),
                ("down_proj.weight", "w2.weight"),
            ),
            moe=LFM2_MOE,
        ),
    ),
    **{
        family: HFNames(
            "embeddings.weight", "norm_f.weight", "norm", "norm", {kind: "mixer"}, "mixer"
        )
        for family, kind in (("mamba", "mamba1"), ("falcon_mamba", "mamba1"), ("mamba2", "mamba2"))
    },
    # the checkpoints' names (transformers renames them at load: `attention_layer_norm`
    # is its input_layernorm, `feedforward_layer_norm` its post_attention_layernorm)
    "olmo_hybrid": HFNames(
        "embed_tokens.weight",
        "norm.weight",
        "attention_layer_norm",
        "feedforward_layer_norm",
        {"gdn": "linear_attn", "attention": "self_attn"},
        "mlp",
        post_norms={"attention": "feedforward_layer_norm", "mlp": "post_feedforward_layernorm"},
    ),
    "recurrent_gemma": HFNames(
        "embed_tokens.weight",
        "final_norm.weight",
        "temporal_pre_norm",
        "channel_pre_norm",
        {"rglru": "temporal_block", "swa": "temporal_block"},
        "mlp_block",
    ),
    "kimi_linear": HFNames(
        "embed_tokens.weight",
        "norm.weight",
        "input_layernorm",
        "post_attention_layernorm",
        {"kda": "self_attn", "mla": "self_attn"},
        "block_sparse_moe",
        renames=tuple(
            (f"experts.{{e}}.{ours}_proj.weight", f"experts.{{e}}.{theirs}.weight")
            for ours, theirs in (("gate", "w1"), ("up", "w3"), ("down", "w2"))
        ),
        moe=KIMI_LINEAR_MOE,
        alternates=((".block_sparse_moe.", ".mlp."),),
    ),
    **dict.fromkeys(
        ("lfm3", "lfm3_vl"),
        HFNames(
            "embed_tokens.weight",
            "embedding_norm.weight",
            "operator_norm",
            "ffn_norm",
            {"shortconv": "conv", "attention": "self_attn", "swa": "self_attn"},
            "feed_forward",
            renames=(  # the checkpoints' gate_proj is transformers' g_proj
                ("self_attn.g_proj.weight", "self_attn.gate_proj.weight"),
                ("gate_proj.weight", "w1.weight"),
                ("up_proj.weight", "w3.weight"),
                ("down_proj.weight", "w2.weight"),
            ),
            post_norms={
                **dict.fromkeys(("shortconv", "attention", "swa"), "post_operator_norm"),
                "mlp": "post_ffn_norm",
            },
        ),
    ),
    "minimax": HFNames(
        "embed_tokens.weight",
        "norm.weight",
        "input_layernorm",
        "post_attention_layernorm",
        {"lightning": "self_attn", "attention": "self_attn"},
        "block_sparse_moe",
        renames=(
            ("gate_proj.weight", "w1.weight"),
            ("up_proj.weight", "w3.weight"),
            ("down_proj.weight", "w2.weight"),
        ),
        moe=MoELayout(experts="block_sparse_moe.experts", router="block_sparse_moe.gate.weight"),
    ),
    # the checkpoints' names, which transformers' conversion renames at load (and back)
    "bailing_hybrid": HFNames(
        "word_embeddings.weight",
        "norm.weight",
        "input_layernorm",
        "post_attention_layernorm",
        {"kda": "attention", "mla": "attention"},
        "mlp",
        renames=(("o_proj.weight", "dense.weight"), ("o_proj.bias", "dense.bias")),
        moe=MoELayout(
            experts="mlp.experts",
            router="mlp.gate.weight",
            selection_bias="mlp.gate.expert_bias",
            shared="mlp.shared_experts",
            router_fp32=True,
        ),
    ),
    # xLSTM's layers are `blocks.{i}`, read through the alternates
    "xlstm": HFNames(
        "embeddings.weight",
        "out_norm.weight",
        "norm_mlstm",
        "norm_ffn",
        {"mlstm": "mlstm_layer"},
        "ffn",
        renames=(
            ("gate_proj.weight", "proj_up_gate.weight"),
            ("up_proj.weight", "proj_up.weight"),
            ("down_proj.weight", "proj_down.weight"),
        ),
        alternates=(("layers.", "blocks."),),
    ),
}


Mixer = (
    Attention
    | Mamba2Mixer
    | Mamba1Mixer
    | GatedDeltaNetMixer
    | ShortConvMixer
    | RGLRUMixer
    | LightningMixer
    | MLP
    | FusedGatedMLP
    | MoE
    | SharedBlock
    | KDAMixer
    | MLAttention
    | MLSTMMixer
)
SSMMixer = (
    Mamba2Mixer
    | Mamba1Mixer
    | GatedDeltaNetMixer
    | ShortConvMixer
    | RGLRUMixer
    | KDAMixer
    | LightningMixer
    | MLSTMMixer
)
KVMixer = Attention | SharedBlock | MLAttention
"""Mixers that keep a KV cache (one `KVBuffer` per sequence); `SlidingWindowAttention`
is an `Attention`."""


def _kv_shape(mixer: KVMixer) -> tuple[int, int]:
    """(this rank's KV heads, head_dim) of a KV mixer's pool tensors."""
    if isinstance(mixer, MLAttention):
        return mixer.kv_shape
    return mixer.n_kv, mixer.cfg.head_dim


class Block(nn.Module):
    """One block's mixer and, when it leads its residual group, the group's norm; a
    `shared_transformer` block has no norm (its mixer normalises its own 2*D input).

    `parallel`: the block is in a residual group of several blocks, so its output
    projection leaves the all-reduce to the model (attention and Mamba-2 only).
    """

    mixer: Mixer
    norm: RMSNorm | None

    def __init__(
        self,
        cfg: HybridConfig,
        index: int,
        tp: TPGroup,
        dtype: torch.dtype,
        kernels: KernelSet,
        leads: bool = True,
        parallel: bool = False,
    ) -> None:
        super().__init__()
        self.kind = cfg.blocks[index]
        self.post_norm = cfg.is_post_norm(index)
        self.names = names = HF_NAMES[cfg.family]
        layer = f"layers.{cfg.hf_layer[index]}"
        d = cfg.hidden_size
        self.norm: RMSNorm | None = None
        self.out_norm: RMSNorm | None = None
        mixer: Mixer
        if self.kind == "shared_transformer":
            assert cfg.shared is not None
            source = cfg.source_layer(index)
            self.mixer = SharedBlock(
                d,
                cfg.shared,
                cfg.hf_layer[index],
                cfg.layers_of("shared_transformer").index(index),
                cfg.shared_copies.index(source),
                f"layers.{source}.{names.shared}",
                tp,
                dtype,
            )
            return
        if cfg.hf_layer[index] in cfg.hybrid_layers:
            layer = f"{layer}.{names.hybrid_sub}"
        norm_key = names.mlp_norm if self.kind in FEED_FORWARD_KINDS else names.mixer_norm
        if self.post_norm:
            norm_key = names.post_norms[self.kind]
        if leads:
            self.norm = RMSNorm(
                cfg.hidden_size,
                cfg.norm_eps,
                f"{layer}.{norm_key}.weight",
                dtype,
                cfg.unit_offset_norms,
            )
        if cfg.sandwich_norm:
            out_key = f"{layer}.{names.post_norms[self.kind]}.weight"
            self.out_norm = RMSNorm(d, cfg.norm_eps, out_key, dtype, cfg.unit_offset_norms)
        assert not parallel or self.kind in ("attention", "mamba2"), self.kind
        reduce = not parallel
        if self.kind == "mlp":
            assert cfg.mlp is not None
            mlp = FusedGatedMLP if names.fused_mlp else MLP
            mixer = mlp(d, cfg.mlp, f"{layer}.{names.mlp}", tp, dtype)
        elif self.kind == "moe":
            assert cfg.moe is not None
            mixer = MoE(d, cfg.moe, layer, names.moe, tp, dtype, kernels)
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
                reduce,
            )
        elif self.kind == "gdn":
            assert cfg.gdn is not None
            mixer = GatedDeltaNetMixer(
                d, cfg.gdn, cfg.norm_eps, f"{layer}.{names.mixer['gdn']}", tp, dtype, kernels
            )
        elif self.kind == "shortconv":
            assert cfg.shortconv is not None
            mixer = ShortConvMixer(
                d, cfg.shortconv, f"{layer}.{names.mixer['shortconv']}", tp, dtype, kernels
            )
        elif self.kind == "rglru":
            assert cfg.rglru is not None
            prefix = f"{layer}.{names.mixer['rglru']}"
            mixer = RGLRUMixer(d, cfg.rglru, prefix, tp, dtype, kernels)
        elif self.kind == "swa":
            assert cfg.swa is not None
            prefix = f"{layer}.{names.mixer['swa']}"
            off = cfg.unit_offset_norms
            mixer = SlidingWindowAttention(d, cfg.swa, prefix, tp, dtype, cfg.norm_eps, off)
        elif self.kind == "kda":
            assert cfg.kda is not None
            mixer = KDAMixer(
                d, cfg.kda, cfg.norm_eps, f"{layer}.{names.mixer['kda']}", tp, dtype, kernels
            )
        elif self.kind == "mla":
            assert cfg.mla is not None
            mixer = MLAttention(d, cfg.mla, f"{layer}.{names.mixer['mla']}", tp, dtype)
        elif self.kind == "lightning":
            assert cfg.lightning is not None
            mixer = LightningMixer(
                d,
                cfg.lightning,
                cfg.hf_layer[index],
                f"{layer}.{names.mixer['lightning']}",
                tp,
                dtype,
                kernels,
            )
        elif self.kind == "mlstm":
            assert cfg.mlstm is not None
            prefix = f"{layer}.{names.mixer['mlstm']}"
            mixer = MLSTMMixer(d, cfg.mlstm, prefix, tp, dtype, kernels)
        elif self.kind == "mamba2":
            assert cfg.mamba2 is not None
            mixer = Mamba2Mixer(
                d,
                cfg.mamba2,
                cfg.norm_eps,
                f"{layer}.{names.mixer['mamba2']}",
                tp,
                dtype,
                kernels,
                reduce,
            )
        else:
            assert cfg.mamba1 is not None
            mixer = Mamba1Mixer(
                d, cfg.mamba1, cfg.norm_eps, f"{layer}.{names.mixer['mamba1']}", tp, dtype, kernels
            )
        self.mixer = mixer

    def weight_specs(self) -> dict[str, WeightSpec]:
        out = {} if self.norm is None else self.norm.weight_specs()
        out = {f"norm.{k}": v for k, v in out.items()}
        if self.out_norm is not None:
            out.update({f"out_norm.{k}": v for k, v in self.out_norm.weight_specs().items()})
        out.update({f"mixer.{k}": v for k, v in self.mixer.weight_specs().items()})
        return {k: replace(v, key=self.names.checkpoint_key(v.key)) for k, v in out.items()}


WARM_UP_LENGTHS = (7, 32, 57, 140)
"""Prefill lengths of `HybridModel.warm_up`: one per token-block size the Triton conv picks."""


class HybridModel(nn.Module):
    """One tensor-parallel rank of a hybrid decoder. Parameters start uninitialised;
    fill them with `engine.model.loader.load_weights`."""

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
            self.groups = cfg.residual_groups
            self.blocks = nn.ModuleList(
                Block(cfg, i, self.tp, dtype, self.kernels, i == g[0], len(g) > 1)
                for g in self.groups
                for i in g
            )
            names = HF_NAMES[cfg.family]
            self.shared = nn.ModuleList(
                SharedWeights(
                    cfg.hidden_size,
                    cfg.shared,
                    cfg.norm_eps,
                    f"layers.{src}.{names.shared}",
                    self.tp,
                    dtype,
                )
                for src in cfg.shared_copies
                if cfg.shared is not None
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
        self.emit_hidden = False
        """Append each forward's final normed hidden states to its sequences'
        `SeqState.hidden` (set by a worker whose drafter reads them)."""
        self.layers: list[Block] = list(self.blocks)  # type: ignore[arg-type]
        self.ssm_blocks = [i for i, b in enumerate(self.layers) if isinstance(b.mixer, SSMMixer)]
        self.attn_blocks = [i for i, b in enumerate(self.layers) if isinstance(b.mixer, KVMixer)]

    def use_column_major(self) -> None:
        """Store every linear layer's weight, and an untied LM head, column-major
        (`ParallelLinear.use_column_major`: faster few-row products on CPU); the values
        and every result are the same up to float rounding."""
        for module in self.modules():
            if isinstance(module, ParallelLinear):
                module.use_column_major()
        if not self.cfg.tie_embeddings and isinstance(self.lm_head, nn.Parameter):
            self.lm_head.data = column_major(self.lm_head.data)

    def kv_shapes(self) -> dict[int, tuple[int, int]]:
        """Attention block index -> (this rank's KV heads, head_dim): a KV pool's shapes."""
        return {i: _kv_shape(self.attention(i)) for i in self.attn_blocks}

    @property
    def window_blocks(self) -> list[int]:
        """The sliding-window attention blocks (their KV is held with each checkpoint
        and, served, in a pool of its own: `SplitPools`)."""
        return [i for i in self.attn_blocks if getattr(self.attention(i), "window", None)]

    @property
    def window_state(self) -> int | None:
        """W, the largest window of `window_blocks`, None without any
        (`core.model.model_spec.ModelSpec.window_state`): a pooled sequence then holds
        only its last W positions' rows of those blocks, and a checkpoint carries those
        positions' KV (`StateCheckpoint.window`)."""
        windows = [getattr(self.attention(i), "window", 0) for i in self.window_blocks]
        return max(windows) if windows else None

    def attention(self, i: int) -> KVMixer:
        """The KV-caching mixer (attention, or a Zamba2 shared block) of block `i`."""
        mixer = self.layers[i].mixer
        assert isinstance(mixer, KVMixer)
        return mixer

    def shared_weights(self, block: SharedBlock) -> SharedWeights:
        """The copy of the shared block's weights that `block` runs with."""
        weights = self.shared[block.copy]
        assert isinstance(weights, SharedWeights)
        return weights

    def ssm(self, i: int) -> SSMMixer:
        """The recurrent (Mamba, Gated DeltaNet or short-conv) mixer of block `i`."""
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
        for c, weights in enumerate(self.shared):
            assert isinstance(weights, SharedWeights)
            out.update({f"shared.{c}.{k}": v for k, v in weights.weight_specs().items()})
        return out

    def tied_repeats(self) -> tuple[str, ...]:
        """Checkpoint key prefixes (below the model prefix) that may repeat tied weights
        the model loads from elsewhere: the shared block of each hybrid layer that is not
        the first to use its copy."""
        shared = HF_NAMES[self.cfg.family].shared
        copies = set(self.cfg.shared_copies)
        return tuple(f"layers.{h}.{shared}." for h in self.cfg.hybrid_layers if h not in copies)

    # ------------------------------------------------------------------ states
    def new_state(self) -> SeqState:
        """The empty state of a sequence that has consumed nothing."""
        state = SeqState()
        for i in self.attn_blocks:
            state.kv[i] = self.attention(i).empty_cache(self.device)
        return state

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.project(self.normed(hidden))

    def normed(self, hidden: torch.Tensor) -> torch.Tensor:
        """The final norm of residual-stream rows [L, D]."""
        norm = self.final_norm
        return rms_norm(hidden, norm.weight, norm.eps, norm.unit_offset)

    def project(self, normed: torch.Tensor) -> torch.Tensor:
        """Logits [L, V] (float32, times the logit multiplier, soft-capped when the
        config caps them) of normed rows [L, D]."""
        logits = F.linear(normed, self.lm_head).float()
        scale = self.cfg.scales.logits
        logits = logits if scale == 1.0 else logits * scale
        cap = self.cfg.logits_soft_cap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def embed_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings [L, D] of ids [L], times the embedding multiplier."""
        return self._embed(ids)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings [L, D], times the embedding multiplier."""
        x = F.embedding(ids.to(self.device), self.embed)
        scale = self.cfg.scales.embedding
        return x if scale == 1.0 else x * scale

    def _residual(self, x: torch.Tensor, h: torch.Tensor, index: int) -> torch.Tensor:
        """alpha * x + h, the output `h` of block `index` times its beta and the residual
        multiplier (alpha, beta: `HybridConfig.residual_factors`, 1 unless MiniMax)."""
        alpha, beta = self.cfg.residual_factors(index)
        scale = self.cfg.scales.residual * beta
        x = x if alpha == 1.0 else x * alpha
        return x + h if scale == 1.0 else x + h * scale

    def _run_groups(
        self, x: torch.Tensor, run: Callable[[int, torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """The residual stream x [L, D] through every residual group: x + the sum over
        the group's blocks i of `run(i, norm(x))` (the block's mixer output, states
        updated by `run`), all-reduced once for a group of several blocks, whose output
        projections leave it to this sum (with `norm_residual`, norm(x) replaces x as the
        residual; see `_residual` for the factors); a post-norm block is
        x + norm(run(i, x)); a sandwich-normed block (LFM3) x + post(run(i, norm(x))).
        A Zamba2 shared block (a group of its own) is `run(i, x)` on
        the stream itself; its output e joins the next group's input but not the residual:
        x + sum_i run(i, norm(x + e))."""
        extra: torch.Tensor | None = None
        for group in self.groups:
            first = self.layers[group[0]]
            if isinstance(first.mixer, SharedBlock):
                extra = run(group[0], x)
                continue
            assert first.norm is not None
            if first.post_norm:  # a group of its own: x + norm(mixer(x))
                x = self._residual(x, first.norm(run(group[0], x)), group[0])
                continue
            h = first.norm(x if extra is None else x + extra)
            extra = None
            out = run(group[0], h)
            for i in group[1:]:
                out = out + run(i, h)
            if len(group) > 1:
                out = self.tp.all_reduce(out)
            if first.out_norm is not None:  # sandwich: x + post(mixer(norm(x)))
                out = first.out_norm(out)
            x = self._residual(h if self.cfg.norm_residual else x, out, group[0])
        return x

    # ------------------------------------------------------------------ forward
    @torch.inference_mode()
    def prefill(
        self,
        ids: torch.Tensor,
        state: SeqState,
        emit_at: Sequence[int] = (),
        pool: Pools | None = None,
    ) -> list[StateCheckpoint]:
        """Consume `ids` [L] after `state.length` tokens, updating `state` in place.

        Args:
            emit_at: absolute depths d with state.length < d <= state.length + L, sorted;
                the SSM states and next-token logits after each are returned.
            pool: the KV pool of a pooled state: `state.rows` must hold length + L rows
                (the caller allocated the new tokens' rows), whose K and V are written;
                with `SplitPools`, the windowed blocks' in `state.window_rows`, as long.
        Returns:
            one `StateCheckpoint` per depth in `emit_at`; `state.logits` is the last one.
        """
        return self._prefill(ids, state, emit_at, pool, every=False)[0]

    @torch.inference_mode()
    def prefill_scored(
        self,
        ids: torch.Tensor,
        state: SeqState,
        emit_at: Sequence[int] = (),
        pool: Pools | None = None,
    ) -> tuple[list[StateCheckpoint], torch.Tensor]:
        """`prefill`, also returning the next-token logits [L, V] (float32) at every
        position of the chunk (prompt log-probabilities); the same computation, one
        `lm_head` over all L rows instead of the emitted ones."""
        return self._prefill(ids, state, emit_at, pool, every=True)

    @torch.inference_mode()
    def prefill_many(
        self, parts: Sequence[PrefillPart], pool: Pools | None = None
    ) -> list[tuple[list[StateCheckpoint], torch.Tensor]]:
        """Several requests' chunks in one forward (each part as `prefill` would consume
        it; see `PrefillPart`): embeddings, norms, MLPs, MoE and the `lm_head` run once
        over the concatenated tokens, each attention and SSM mixer once per part on its
        own KV and states (the mixers' kernels take one sequence).

        Args:
            pool: as in `prefill`: every part's `state.rows` holds its length + L rows
                (and its `window_rows` with `SplitPools`).
        Returns:
            per part: (one `StateCheckpoint` per depth in its `emit_at`, its logits: [L, V]
            when `scored`, else the emitted depths' and the last position's
            [len(emit_at) + 1, V]); each `state.logits` is its last position's.
        """
        rels = [self._check_part(p, pool) for p in parts]
        x, conv_outs, ssm_outs = self._prefill_hidden_parts(parts, rels, pool)
        return self._part_results(parts, rels, x, conv_outs, ssm_outs)

    def _part_results(
        self,
        parts: Sequence[PrefillPart],
        rels: Sequence[Sequence[int]],
        x: torch.Tensor,
        conv_outs: Sequence[dict[int, torch.Tensor]],
        ssm_outs: Sequence[dict[int, torch.Tensor]],
    ) -> list[tuple[list[StateCheckpoint], torch.Tensor]]:
        """`prefill_many`'s results from the parts' final hidden rows x [sum L, D] and
        emitted SSM states; advances each part's state (length, logits, hidden rows)."""
        lens = [p.ids.shape[0] for p in parts]
        offsets = [sum(lens[:k]) for k in range(len(parts))]
        if self.emit_hidden:
            normed = self.normed(x)
            for p, off, n in zip(parts, offsets, lens, strict=True):
                p.state.hidden.append((p.state.length, normed[off : off + n]))
        picked = [
            off + r for p, rel, off, n in zip(parts, rels, offsets, lens, strict=True)
            if not p.scored for r in [*(r - 1 for r in rel), n - 1]
        ]  # fmt: skip
        selected = None
        if picked:
            selected = self._logits(x.index_select(0, torch.tensor(picked, device=self.device)))
        out = []
        k0 = 0
        for k, (p, rel, off, n) in enumerate(zip(parts, rels, offsets, lens, strict=True)):
            if p.scored:
                scores = self._logits(x if len(parts) == 1 else x[off : off + n])
                own = torch.tensor([r - 1 for r in rel] + [n - 1], device=self.device)
                logits = scores.index_select(0, own)
            else:
                assert selected is not None
                logits = selected[k0 : k0 + len(rel) + 1]
                k0 += len(rel) + 1
                scores = logits
            state = p.state
            state.length += n
            state.logits = logits[-1]
            ckpts = [
                StateCheckpoint(
                    d,
                    {i: conv_outs[k][i][j] for i in self.ssm_blocks},
                    {i: ssm_outs[k][i][j] for i in self.ssm_blocks},
                    logits[j],
                )
                for j, d in enumerate(p.emit_at)
            ]
            out.append((ckpts, scores))
        return out

    def _prefill(
        self,
        ids: torch.Tensor,
        state: SeqState,
        emit_at: Sequence[int],
        pool: Pools | None,
        every: bool,
    ) -> tuple[list[StateCheckpoint], torch.Tensor]:
        return self.prefill_many([PrefillPart(ids, state, tuple(emit_at), every)], pool)[0]

    def _check_part(self, part: PrefillPart, pool: Pools | None) -> list[int]:
        """The part's emit depths relative to its start; ValueError naming bad ones."""
        n, start = part.ids.shape[0], part.state.length
        rel = [d - start for d in part.emit_at]
        if any(not 0 < r <= n for r in rel) or rel != sorted(set(rel)):
            raise ValueError(
                f"emit_at {list(part.emit_at)} must be sorted, distinct, in ({start}, {start + n}]"
            )
        lists = [part.state.rows]
        if isinstance(pool, SplitPools):
            lists.append(part.state.window_rows)
        for rows in lists if pool is not None else []:
            if rows is None or len(rows) != start + n:
                have = None if rows is None else len(rows)
                raise ValueError(
                    f"a pooled prefill to depth {start + n} needs as many rows, got {have}"
                )
        return rel

    @torch.inference_mode()
    def decode(self, ids: torch.Tensor, states: Sequence[SeqState]) -> torch.Tensor:
        """Consume one token per sequence (ids [B]); returns next-token logits [B, V].
        SSM states are stacked for the step and written back (see `decode_batch` for the
        serving path, which keeps them in place)."""
        stacked = {
            i: (torch.stack([s.conv[i] for s in states]), torch.stack([s.ssm[i] for s in states]))
            for i in self.ssm_blocks
        }
        kv = {i: BufferDecode([s.kv[i] for s in states]) for i in self.attn_blocks}
        positions = torch.tensor([s.length for s in states], device=self.device)
        logits = self._decode(ids, positions, stacked, kv, list(states))
        for b, s in enumerate(states):
            s.length += 1
            s.logits = logits[b]
        for i, (conv, ssm) in stacked.items():
            for b, s in enumerate(states):
                s.conv[i], s.ssm[i] = conv[b], ssm[b]
        return logits

    def new_decode_batch(self, capacity: int, pool: Pools | None = None) -> DecodeBatch:
        """A persistent decode batch of this rank's SSM state shapes, its members' KV in
        `pool` (None: in their own buffers; `SplitPools`: two row tables); see
        `DecodeBatch`."""
        split = pool if isinstance(pool, SplitPools) else None
        return DecodeBatch(
            {i: self.ssm(i).empty_state(self.device) for i in self.ssm_blocks},
            capacity,
            pool if not isinstance(pool, SplitPools) else pool.token,
            self.device,
            None if split is None else split.window,
            () if split is None else tuple(sorted(split.blocks)),
        )

    @torch.inference_mode()
    def decode_batch(self, ids: torch.Tensor, batch: DecodeBatch) -> torch.Tensor:
        """Consume one token per member of `batch` (ids [n], in row order); the SSM states
        are updated in place in the batch's rows. Returns next-token logits [n, V].

        A pooled batch (`batch.pool`) must have been `extend`ed with the step's rows; its
        members' `logits` are not set (the step returns them). An unpooled batch's
        members append to their own `KVBuffer`s and keep their logits."""
        rows, kv, positions = self._batch_inputs(batch)
        logits = self._decode(ids, positions, rows, kv, batch.members)
        self._batch_done(batch, logits)
        return logits

    def _batch_inputs(
        self, batch: DecodeBatch
    ) -> tuple[dict[int, tuple[torch.Tensor, torch.Tensor]], dict[int, DecodeKV], torch.Tensor]:
        """A decode batch's step inputs: its SSM rows, each attention block's KV (paged
        over the pool, or the members' own buffers) and its members' positions [n]."""
        rows = {i: batch.rows(i) for i in self.ssm_blocks}
        kv: dict[int, DecodeKV]
        if batch.pool is None:
            kv = {i: BufferDecode([s.kv[i] for s in batch.members]) for i in self.attn_blocks}
            positions = torch.tensor([s.length for s in batch.members], device=self.device)
            return rows, kv, positions
        attend = self.kernels.paged_decode_attention
        kv = {i: batch.decode_kv(i, attend) for i in self.attn_blocks}
        return rows, kv, batch.positions()

    def _batch_done(self, batch: DecodeBatch, logits: torch.Tensor) -> None:
        """After a decode batch's step: every member one token longer; a pooled batch
        advances its lengths, an unpooled one's members keep their logits."""
        for s in batch.members:
            s.length += 1
        if batch.pool is None:
            for b, s in enumerate(batch.members):
                s.logits = logits[b]
        else:
            batch.advance()

    @torch.inference_mode()
    def decode_and_prefill(
        self, ids: torch.Tensor, batch: DecodeBatch, parts: Sequence[PrefillPart]
    ) -> tuple[torch.Tensor, list[tuple[list[StateCheckpoint], torch.Tensor]]]:
        """`decode_batch(ids, batch)` and `prefill_many(parts, batch.pool)` in one forward
        (a decode step batched with speculative verifications): embeddings, norms, MLPs,
        MoE and the `lm_head` run once over the batch's rows and the parts' tokens; each
        mixer runs its decode kernel over the batch (in place in its rows) and its
        prefill once per part. The same results as the two calls, up to float rounding.
        The batch must be pooled, extended with the step's rows, and hold none of the
        parts' states."""
        if batch.pool is None:
            raise ValueError("decode_and_prefill needs a pooled decode batch")
        pool: Pools = batch.pool
        if batch.window_pool is not None:
            pool = SplitPools(batch.pool, batch.window_pool, batch.window_blocks)
        rels = [self._check_part(p, pool) for p in parts]
        rows, kv, positions = self._batch_inputs(batch)
        emb_d = self._embed(ids)
        decode = self._decode_runner(emb_d, positions, rows, kv)
        emb_p, prefill, conv_outs, ssm_outs = self._parts_runner(parts, rels, pool)
        n = emb_d.shape[0]

        def run(i: int, h: torch.Tensor) -> torch.Tensor:
            mixer = self.layers[i].mixer
            if not isinstance(mixer, (SharedBlock, Attention, MLAttention, SSMMixer)):
                out: torch.Tensor = mixer(h)  # an MLP or MoE: every row at once
                return out
            return torch.cat([decode(i, h[:n]), prefill(i, h[n:])])

        x = self._run_groups(torch.cat([emb_d, emb_p]), run)
        logits = self._decode_logits(x[:n], batch.members)
        self._batch_done(batch, logits)
        return logits, self._part_results(parts, rels, x[n:], conv_outs, ssm_outs)

    def _decode(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        ssm_rows: dict[int, tuple[torch.Tensor, torch.Tensor]],
        kv: Mapping[int, DecodeKV],
        states: Sequence[SeqState] = (),
    ) -> torch.Tensor:
        """One decode step at `positions` [B]; `ssm_rows[i]` = (conv [B, C, K], ssm
        [B, ...]) of SSM block i, updated in place; `kv[i]`: attention block i's KV.
        With `emit_hidden`, row b's normed hidden state joins `states[b].hidden` (the
        step's sequences, before their length advances)."""
        emb = self._embed(ids)
        x = self._run_groups(emb, self._decode_runner(emb, positions, ssm_rows, kv))
        return self._decode_logits(x, states)

    def _decode_normed(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        ssm_rows: dict[int, tuple[torch.Tensor, torch.Tensor]],
        kv: Mapping[int, DecodeKV],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`_decode`'s step returning (logits [B, V], final normed hidden states [B, D]),
        appending nothing (a static step's outputs: `step_graphs`)."""
        emb = self._embed(ids)
        normed = self.normed(
            self._run_groups(emb, self._decode_runner(emb, positions, ssm_rows, kv))
        )
        return self.project(normed), normed

    def _decode_runner(
        self,
        emb: torch.Tensor,
        positions: torch.Tensor,
        ssm_rows: dict[int, tuple[torch.Tensor, torch.Tensor]],
        kv: Mapping[int, DecodeKV],
    ) -> Callable[[int, torch.Tensor], torch.Tensor]:
        """`_run_groups`' `run` of a decode step (see `_decode`)."""

        def run(i: int, h: torch.Tensor) -> torch.Tensor:
            mixer = self.layers[i].mixer
            if isinstance(mixer, SharedBlock):
                return mixer.decode(self.shared_weights(mixer), h, emb, positions, kv[i])
            if isinstance(mixer, (Attention, MLAttention)):
                return mixer.decode(h, positions, kv[i])
            if isinstance(mixer, SSMMixer):
                conv, ssm = ssm_rows[i]
                return mixer.decode(h, conv, ssm)
            out: torch.Tensor = mixer(h)  # an MLP or MoE
            return out

        return run

    def _decode_logits(self, x: torch.Tensor, states: Sequence[SeqState]) -> torch.Tensor:
        """A decode step's logits [B, V] from its final hidden rows x [B, D]; with
        `emit_hidden`, row b's normed hidden state joins `states[b].hidden`."""
        if not (self.emit_hidden and states):
            return self._logits(x)
        normed = self.normed(x)
        self.keep_hidden(normed, states)
        return self.project(normed)

    @staticmethod
    def keep_hidden(normed: torch.Tensor, states: Sequence[SeqState]) -> None:
        """Append row b of a decode step's normed hidden states [B, D] to
        `states[b].hidden` at its position (before its length advances)."""
        for b, s in enumerate(states):
            s.hidden.append((s.length, normed[b : b + 1]))

    def _prefill_hidden(
        self,
        ids: torch.Tensor,
        state: SeqState,
        rel: Sequence[int],
        pool: Pools | None = None,
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        """Run the blocks over `ids` after `state.length` tokens (updating `state`'s KV and
        SSM states; with `pool`, writing the KV into `state.rows`). Returns the final
        hidden states [L, D] and, per SSM block, the states emitted at the positions
        `rel` (relative, 1-based) as stacked tensors."""
        x, conv, ssm = self._prefill_hidden_parts([PrefillPart(ids, state)], [list(rel)], pool)
        return x, conv[0], ssm[0]

    def _prefill_hidden_parts(
        self,
        parts: Sequence[PrefillPart],
        rels: Sequence[Sequence[int]],
        pool: Pools | None,
    ) -> tuple[torch.Tensor, list[dict[int, torch.Tensor]], list[dict[int, torch.Tensor]]]:
        """`_prefill_hidden` of several parts in one pass over the blocks: hidden states
        [sum L, D] (the parts' tokens in order) and each part's emitted SSM states."""
        emb, run, conv_outs, ssm_outs = self._parts_runner(parts, rels, pool)
        x = self._run_groups(emb, run)
        return x, conv_outs, ssm_outs

    def _parts_runner(
        self,
        parts: Sequence[PrefillPart],
        rels: Sequence[Sequence[int]],
        pool: Pools | None,
    ) -> tuple[
        torch.Tensor,
        Callable[[int, torch.Tensor], torch.Tensor],
        list[dict[int, torch.Tensor]],
        list[dict[int, torch.Tensor]],
    ]:
        """The parts' embeddings [sum L, D], `_run_groups`' `run` over their rows (every
        mixer once over all the parts' rows; updates their states), and the per-part dicts
        the run fills with the SSM states emitted at `rels`.

        Each SSM mixer runs `prefill_packed` (row-wise work once, one varlen conv and
        scan call for all the parts); each attention layer, on a pool, one
        `paged_prefill_attention` call for all the parts (`PackedPrefill`), and one SDPA
        per part on `KVBuffer`s."""
        lens = [p.ids.shape[0] for p in parts]
        bounds = [(sum(lens[:k]), sum(lens[: k + 1])) for k in range(len(parts))]
        ranges = [
            torch.arange(p.state.length, p.state.length + n, device=self.device)
            for p, n in zip(parts, lens, strict=True)
        ]
        one_part = len(parts) == 1
        ids = parts[0].ids if one_part else torch.cat([p.ids for p in parts])
        positions = ranges[0] if one_part else torch.cat(ranges)
        conv_outs: list[dict[int, torch.Tensor]] = [{} for _ in parts]
        ssm_outs: list[dict[int, torch.Tensor]] = [{} for _ in parts]
        emb = self._embed(ids)
        packed, part_kv = self._prefill_kv(parts, lens, pool)

        def each(h: torch.Tensor, one: PartFn) -> torch.Tensor:
            if one_part:
                return one(0, h, emb, positions)
            outs = [one(k, h[a:b], emb[a:b], positions[a:b]) for k, (a, b) in enumerate(bounds)]
            return torch.cat(outs)

        def run(i: int, h: torch.Tensor) -> torch.Tensor:
            mixer = self.layers[i].mixer
            if isinstance(mixer, SharedBlock):
                weights = self.shared_weights(mixer)
                if packed is not None:
                    return mixer.prefill(weights, h, emb, positions, packed(i))
                return each(
                    h, lambda k, hk, ek, pk: mixer.prefill(weights, hk, ek, pk, part_kv(i, k))
                )
            if isinstance(mixer, (Attention, MLAttention)):
                if packed is not None:
                    return mixer.prefill(h, positions, packed(i))
                return each(h, lambda k, hk, _, pk: mixer.prefill(hk, pk, part_kv(i, k)))
            if isinstance(mixer, SSMMixer):
                packed_parts = [
                    PackedPart(a, b, p.state.conv.get(i), p.state.ssm.get(i), tuple(rel))
                    for p, (a, b), rel in zip(parts, bounds, rels, strict=True)
                ]
                y, outs = mixer.prefill_packed(h, packed_parts)
                for p, st, conv_e, ssm_e in zip(parts, outs, conv_outs, ssm_outs, strict=True):
                    p.state.conv[i], p.state.ssm[i] = st.conv, st.ssm
                    conv_e[i], ssm_e[i] = st.conv_emitted, st.ssm_emitted
                return y
            out: torch.Tensor = mixer(h)  # an MLP or MoE: all the parts' tokens at once
            return out

        return emb, run, conv_outs, ssm_outs

    def _prefill_kv(
        self, parts: Sequence[PrefillPart], lens: Sequence[int], pool: Pools | None
    ) -> tuple[Callable[[int], PackedPrefill] | None, Callable[[int, int], PrefillKV]]:
        """(packed, part): packed(i) is attention block i's `PackedPrefill` of every part
        (one call for all of them), None when the parts run one at a time (no pool, or a
        single part, which keeps its SDPA path); part(i, k) is block i's KV of part k.
        With `SplitPools` the windowed blocks read their pool through the parts'
        `window_rows` (a layout of their own)."""
        if pool is None:
            return None, lambda i, k: parts[k].state.kv[i]
        split = pool if isinstance(pool, SplitPools) else None

        def rows_of(windowed: bool) -> list[torch.Tensor]:
            out = [p.state.window_rows if windowed else p.state.rows for p in parts]
            assert all(r is not None for r in out)
            return out  # type: ignore[return-value]

        rows = {False: rows_of(False)}
        if split is not None:
            rows[True] = rows_of(True)

        def where(i: int) -> tuple[KVRows, bool]:
            if split is None:
                return pool, False  # type: ignore[return-value]
            return split.of(i), i in split.blocks

        def part(i: int, k: int) -> PrefillKV:
            start = parts[k].state.length
            kv, windowed = where(i)
            mine = rows[windowed][k]
            return PagedPrefill(kv.k[i], kv.v[i], mine[:start], mine[start:])

        if len(parts) == 1:
            return None, part
        layouts = {w: PackedRows.of(r, lens) for w, r in rows.items()}
        attend = self.kernels.paged_prefill_attention

        def packed(i: int) -> PackedPrefill:
            kv, windowed = where(i)
            return PackedPrefill(kv.k[i], kv.v[i], layouts[windowed], attend)

        return packed, part

    @torch.inference_mode()
    def warm_up(self) -> float:
        """Run every kernel on throwaway sequences (prefills of a few lengths that emit a
        state mid-chunk, then two decode steps; then a pooled prefill of two sequences in
        one forward and a pooled decode step, the serving path's paged attention), so
        Triton's JIT compilation (one variant per block size the lengths select) and
        autotuning happen at set-up, before health checks and collective timeouts can
        fire. Under tensor parallelism every rank must call it. Returns the seconds it
        took."""
        t0 = time.perf_counter()
        lengths = sorted({min(self.cfg.max_position - 2, n) for n in WARM_UP_LENGTHS})
        for n in lengths:
            ids = torch.arange(n, device=self.device) % self.cfg.vocab_size
            state = self.new_state()
            self.prefill(ids, state, emit_at=[max(1, n // 2)])
            for _ in range(2):
                self.decode(ids[:1], [state])
        n = lengths[0]
        pool = ScratchKV(self.kv_shapes(), 2 * n + 1, self.dtype, self.device)
        rows = torch.arange(2 * n + 1, device=self.device)
        ids = torch.arange(n, device=self.device) % self.cfg.vocab_size
        state = SeqState(rows=rows[:n])
        self.prefill_many(
            [PrefillPart(ids, state), PrefillPart(ids, SeqState(rows=rows[n : 2 * n]))], pool
        )
        batch = self.new_decode_batch(1, pool)
        batch.join(state)
        batch.extend(rows[2 * n :])
        self.decode_batch(torch.zeros(1, dtype=torch.long, device=self.device), batch)
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
