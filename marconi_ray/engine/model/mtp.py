"""`MTPHead`: the multi-token-prediction layers of Qwen3.5 / Qwen3-Next and NemotronH
(Nemotron 3) checkpoints (`mtp.*`), one rank's shard, and `load_mtp`, which reads them.

What the layers compute (the checkpoints' layout; transformers does not run them, vLLM's
`Qwen3NextMTP` and `NemotronHMTP` do): entry j pairs the token after position j, x_{j+1},
with the target model's final normed hidden state at j, h_j:

    z_j = fc([norm_e(embed(x_{j+1})), norm_h(h_j)])          fc: 2D -> D, no bias
    z_j += block(norm_b(z_j))  for each block of a step      attention (its own KV), MoE, MLP
    o_j = norm(z_j);  logits_j = lm_head(o_j)                predicts x_{j+2}

sharing the target's embedding and LM head. A Qwen step is one decoder layer (gated
attention, then the model's MoE or MLP); a NemotronH step is `mtp_layers_block_type`'s
layers, one block each, the fusion in the first and the final norm in the last
(`MTP_KEYS`). Drafting k tokens feeds the entries the target has computed, then feeds
each draft d_i with o of the entry before it (the layers' own output standing in for the
target's hidden state). Only the first step drafts. Heads and experts are split across
TP ranks as the target's are (attention's o and the feed-forward all-reduce); `fc` is
replicated, so every rank drafts the same tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from marconi_ray.engine.model.hybrid_model import HF_NAMES, HybridModel
from marconi_ray.engine.model.kv_buffer import KVBuffer
from marconi_ray.engine.model.layers.attention import Attention
from marconi_ray.engine.model.layers.fused_mlp import FusedGatedMLP
from marconi_ray.engine.model.layers.linear import ParallelLinear, column
from marconi_ray.engine.model.layers.mlp import MLP
from marconi_ray.engine.model.layers.moe import MoE
from marconi_ray.engine.model.layers.norm import RMSNorm
from marconi_ray.engine.model.layers.weights import WeightSpec
from marconi_ray.engine.model.loader import copy_param
from marconi_ray.engine.model.paged_kv import BufferDecode
from marconi_ray.engine.model.parallel import Segment
from marconi_ray.engine.model.weight_source import SafetensorsSource, WeightSource

MTP_PREFIX = "mtp."
"""The checkpoint prefix of the layers (`core.model.hf.families.MTP_PREFIX`)."""


@dataclass(frozen=True)
class MTPKeys:
    """Where a family's MTP weights are. `{last}` is the step's last HF layer.

    Attributes:
        embed_norm, hidden_norm, fc: the fusion's norms' weights and projection's prefix.
        final_norm: the output norm's weight.
        layer_per_block: each block of a step is its own HF layer (NemotronH) instead of
            the step being one layer holding them all (Qwen).
    """

    embed_norm: str
    hidden_norm: str
    fc: str
    final_norm: str
    layer_per_block: bool


QWEN_MTP = MTPKeys(
    "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.fc",
    "mtp.norm.weight", layer_per_block=False,
)  # fmt: skip
NEMOTRON_H_MTP = MTPKeys(
    "mtp.layers.0.enorm.weight", "mtp.layers.0.hnorm.weight", "mtp.layers.0.eh_proj",
    "mtp.layers.{last}.final_layernorm.weight", layer_per_block=True,
)  # fmt: skip
MTP_KEYS: dict[str, MTPKeys] = {
    "nemotron_h": NEMOTRON_H_MTP,
    **{
        f: QWEN_MTP
        for f in ("qwen3_5_text", "qwen3_5", "qwen3_5_moe_text", "qwen3_5_moe", "qwen3_next")
    },
}
"""Family -> its MTP key layout (the families whose checkpoints carry MTP layers)."""


class MTPBlock(nn.Module):
    """One pre-normed residual block of a step: attention, MoE or MLP."""

    def __init__(self, model: HybridModel, kind: str, layer: str) -> None:
        super().__init__()
        cfg, tp, dtype = model.cfg, model.tp, model.dtype
        names = HF_NAMES[cfg.family]
        d, eps, off = cfg.hidden_size, cfg.norm_eps, cfg.unit_offset_norms
        norm_key = names.mixer_norm if kind == "attention" else names.mlp_norm
        self.kind = kind
        self.norm = RMSNorm(d, eps, f"{layer}.{norm_key}.weight", dtype, off)
        mixer: nn.Module
        if kind == "attention" and cfg.attention is not None:
            prefix = f"{layer}.{names.mixer['attention']}"
            mixer = Attention(d, cfg.attention, prefix, tp, dtype, eps, off)
        elif kind == "moe" and cfg.moe is not None:
            mixer = MoE(d, cfg.moe, layer, names.moe, tp, dtype, model.kernels)
        elif kind == "mlp" and cfg.mlp is not None:
            mlp = FusedGatedMLP if names.fused_mlp else MLP
            mixer = mlp(d, cfg.mlp, f"{layer}.{names.mlp}", tp, dtype)
        else:
            raise ValueError(
                f"{cfg.family} MTP block {kind!r} has no config of its kind in the model"
            )
        self.mixer = mixer

    def weight_specs(self) -> dict[str, WeightSpec]:
        out = {f"norm.{k}": v for k, v in self.norm.weight_specs().items()}
        out.update({f"mixer.{k}": v for k, v in self.mixer.weight_specs().items()})
        return out


class MTPHead(nn.Module):
    """The first MTP step's layers of one rank (see the module docstring). Parameters
    start uninitialised: `load_mtp` fills them. ValueError naming the family for a model
    without MTP layers."""

    def __init__(self, model: HybridModel) -> None:
        super().__init__()
        cfg = model.cfg
        keys = MTP_KEYS.get(cfg.family)
        if cfg.mtp_layers < 1 or keys is None or not cfg.mtp_blocks:
            raise ValueError(
                f"a {cfg.family} config with mtp_layers={cfg.mtp_layers} has no "
                "multi-token-prediction layers"
            )
        d, eps, off, dtype = cfg.hidden_size, cfg.norm_eps, cfg.unit_offset_norms, model.dtype
        self.model = [model]
        """The target (in a list: not a sub-module, its weights are its own)."""
        kinds = cfg.mtp_blocks
        layers = [
            f"{MTP_PREFIX}layers.{i if keys.layer_per_block else 0}" for i in range(len(kinds))
        ]
        last = len(kinds) - 1 if keys.layer_per_block else 0
        with torch.device(model.device):
            self.norm_embedding = RMSNorm(d, eps, keys.embed_norm, dtype, off)
            self.norm_hidden = RMSNorm(d, eps, keys.hidden_norm, dtype, off)
            self.fc: ParallelLinear = column(
                2 * d, (Segment(d, False),), False, keys.fc, model.tp, dtype
            )
            self.blocks = nn.ModuleList(
                MTPBlock(model, kind, layer) for kind, layer in zip(kinds, layers, strict=True)
            )
            self.norm = RMSNorm(d, eps, keys.final_norm.format(last=last), dtype, off)
        self.attn_blocks = [i for i, k in enumerate(kinds) if k == "attention"]

    @property
    def target(self) -> HybridModel:
        return self.model[0]

    def new_kv(self) -> list[KVBuffer]:
        """Empty keys and values of each attention block (one sequence), in order."""
        device = self.target.device
        out = []
        for i in self.attn_blocks:
            attn = self._block(i).mixer
            assert isinstance(attn, Attention)
            out.append(attn.empty_cache(device))
        return out

    def _block(self, i: int) -> MTPBlock:
        block = self.blocks[i]
        assert isinstance(block, MTPBlock)
        return block

    def _inputs(self, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        emb = self.norm_embedding(self.target.embed_ids(ids))
        return self.fc(torch.cat([emb, self.norm_hidden(hidden)], dim=-1))

    def _run(
        self, z: torch.Tensor, attend: Callable[[Attention, torch.Tensor, int], torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """z through every block (attention by `attend(mixer, normed, k)` for the k-th
        attention block), then the final norm: (logits, outputs)."""
        k = 0
        for i in range(len(self.blocks)):
            block = self._block(i)
            h = block.norm(z)
            if isinstance(block.mixer, Attention):
                z = z + attend(block.mixer, h, k)
                k += 1
            else:
                z = z + block.mixer(h)
        out = self.norm(z)
        return self.target.project(out), out

    @torch.inference_mode()
    def prefill(
        self,
        ids: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        kv: Sequence[KVBuffer],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Entries of one sequence: ids [L] (x_{j+1}), hidden [L, D] (h_j), positions
        [L] (j, increasing, gaps allowed); appends their keys and values to `kv` (one
        buffer per attention block). Returns (logits [L, V] float32, outputs o [L, D])."""
        pos = positions.to(self.target.device)
        return self._run(self._inputs(ids, hidden), lambda attn, h, k: attn.prefill(h, pos, kv[k]))

    @torch.inference_mode()
    def decode(
        self,
        ids: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        kvs: Sequence[Sequence[KVBuffer]],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One entry per sequence of a batch: ids [B], hidden [B, D], positions [B];
        `kvs[b]` is sequence b's buffers. Returns (logits [B, V], outputs [B, D])."""
        pos = positions.to(self.target.device)
        return self._run(
            self._inputs(ids, hidden),
            lambda attn, h, k: attn.decode(h, pos, BufferDecode([own[k] for own in kvs])),
        )

    def weight_specs(self) -> dict[str, WeightSpec]:
        """Local parameter name -> its checkpoint key (absolute: the layers sit beside
        the language model's prefix, not under it)."""
        out: dict[str, WeightSpec] = {}
        for name in ("norm_embedding", "norm_hidden", "fc", "norm"):
            module = getattr(self, name)
            out.update({f"{name}.{k}": v for k, v in module.weight_specs().items()})
        for i in range(len(self.blocks)):
            specs = self._block(i).weight_specs()
            out.update({f"blocks.{i}.{k}": v for k, v in specs.items()})
        return out


def load_mtp(
    model: HybridModel, model_dir: str | Path, source: WeightSource | None = None
) -> MTPHead:
    """This rank's `MTPHead` of the checkpoint in `model_dir` (the target's folder),
    each weight's slice copied as the target's are. ValueError naming the folder when
    its config has no MTP layers or its checkpoint lacks their weights."""
    head = MTPHead(model)
    source = source or SafetensorsSource(model_dir)
    if not any(k.startswith(MTP_PREFIX) for k in source.where):
        raise ValueError(
            f"{str(model_dir)!r}: config.json names {model.cfg.mtp_layers} MTP layer(s) but "
            f"the checkpoint has no {MTP_PREFIX}* weights"
        )
    params = dict(head.named_parameters())
    for name, spec in head.weight_specs().items():
        keys = list(spec.checkpoint_keys())
        copy_param(model, params[name], name, spec, keys, source, "the MTP head")
    if model.device.type == "cpu":
        for module in head.modules():
            if isinstance(module, ParallelLinear):
                module.use_column_major()
    return head.eval()
