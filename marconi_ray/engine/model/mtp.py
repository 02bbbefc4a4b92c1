"""`MTPHead`: the multi-token-prediction layers of Qwen3.5 / Qwen3-Next checkpoints
(`mtp.*`), one rank's shard, and `load_mtp`, which reads them.

What the layers compute (the checkpoint's layout; transformers does not run them, vLLM's
`Qwen3NextMTP` does): entry j pairs the token after position j, x_{j+1}, with the target
model's final normed hidden state at j, h_j:

    z_j = fc([norm_e(embed(x_{j+1})), norm_h(h_j)])          fc: 2D -> D, no bias
    z_j += attn(norm_1(z_j), position j)                    full gated attention, its own KV
    z_j += ffn(norm_2(z_j))                                 the model's MoE (or MLP)
    o_j = norm(z_j);  logits_j = lm_head(o_j)               predicts x_{j+2}

sharing the target's embedding and LM head. Drafting k tokens feeds the entries the
target has computed, then feeds each draft d_i with o of the entry before it (the
layers' own hidden state standing in for the target's). Heads and experts are split
across TP ranks as the target's are (attention's o and the FFN all-reduce); `fc` is
replicated, so every rank drafts the same tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from marconi_ray.engine.model.hybrid_model import HF_NAMES, HybridModel
from marconi_ray.engine.model.kv_buffer import KVBuffer
from marconi_ray.engine.model.layers.attention import Attention
from marconi_ray.engine.model.layers.linear import ParallelLinear, column
from marconi_ray.engine.model.layers.mlp import MLP
from marconi_ray.engine.model.layers.moe import MoE
from marconi_ray.engine.model.layers.norm import RMSNorm
from marconi_ray.engine.model.layers.weights import WeightSpec
from marconi_ray.engine.model.loader import load_tensor
from marconi_ray.engine.model.paged_kv import BufferDecode
from marconi_ray.engine.model.parallel import Segment
from marconi_ray.engine.model.weight_source import SafetensorsSource, WeightSource

MTP_PREFIX = "mtp."
"""The checkpoint prefix of the layers (`core.model.hf.families.MTP_PREFIX`)."""


class MTPLayer(nn.Module):
    """One decoder layer: gated full attention, then the feed-forward, each pre-normed."""

    def __init__(self, model: HybridModel, index: int) -> None:
        super().__init__()
        cfg, tp, dtype = model.cfg, model.tp, model.dtype
        names = HF_NAMES[cfg.family]
        layer = f"{MTP_PREFIX}layers.{index}"
        d, eps, off = cfg.hidden_size, cfg.norm_eps, cfg.unit_offset_norms
        assert cfg.attention is not None
        self.attn_norm = RMSNorm(d, eps, f"{layer}.{names.mixer_norm}.weight", dtype, off)
        self.attn = Attention(
            d, cfg.attention, f"{layer}.{names.mixer['attention']}", tp, dtype, eps, off
        )
        self.ffn_norm = RMSNorm(d, eps, f"{layer}.{names.mlp_norm}.weight", dtype, off)
        ffn: nn.Module
        if cfg.moe is not None:
            ffn = MoE(d, cfg.moe, layer, names.moe, tp, dtype)
        else:
            assert cfg.mlp is not None
            ffn = MLP(d, cfg.mlp, f"{layer}.{names.mlp}", tp, dtype)
        self.ffn = ffn

    def weight_specs(self) -> dict[str, WeightSpec]:
        out: dict[str, WeightSpec] = {}
        for name in ("attn_norm", "attn", "ffn_norm", "ffn"):
            module = getattr(self, name)
            out.update({f"{name}.{k}": v for k, v in module.weight_specs().items()})
        return out


class MTPHead(nn.Module):
    """The `mtp.*` layers of one rank (see the module docstring). Parameters start
    uninitialised: `load_mtp` fills them."""

    def __init__(self, model: HybridModel) -> None:
        super().__init__()
        cfg = model.cfg
        if cfg.mtp_layers < 1:
            raise ValueError(
                f"a {cfg.family} config with mtp_num_hidden_layers={cfg.mtp_layers} has no "
                "multi-token-prediction layers"
            )
        if cfg.attention is None:
            raise ValueError(f"{cfg.family} has no attention config for its MTP layers")
        d, eps, off, dtype = cfg.hidden_size, cfg.norm_eps, cfg.unit_offset_norms, model.dtype
        self.model = [model]
        """The target (in a list: not a sub-module, its weights are its own)."""
        with torch.device(model.device):
            self.norm_embedding = RMSNorm(
                d, eps, f"{MTP_PREFIX}pre_fc_norm_embedding.weight", dtype, off
            )
            self.norm_hidden = RMSNorm(d, eps, f"{MTP_PREFIX}pre_fc_norm_hidden.weight", dtype, off)
            self.fc: ParallelLinear = column(
                2 * d, (Segment(d, False),), False, f"{MTP_PREFIX}fc", model.tp, dtype
            )
            self.layers = nn.ModuleList(MTPLayer(model, i) for i in range(cfg.mtp_layers))
            self.norm = RMSNorm(d, eps, f"{MTP_PREFIX}norm.weight", dtype, off)

    @property
    def target(self) -> HybridModel:
        return self.model[0]

    def new_kv(self) -> list[KVBuffer]:
        """Empty keys and values of each layer's attention (one sequence)."""
        device = self.target.device
        return [layer.attn.empty_cache(device) for layer in self._layers()]

    def _layers(self) -> list[MTPLayer]:
        return list(self.layers)  # type: ignore[arg-type]

    def _inputs(self, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        emb = self.norm_embedding(self.target.embed_ids(ids))
        return self.fc(torch.cat([emb, self.norm_hidden(hidden)], dim=-1))

    @torch.inference_mode()
    def prefill(
        self,
        ids: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        kv: Sequence[KVBuffer],
        layer: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Entries of one sequence: ids [L] (x_{j+1}), hidden [L, D] (h_j), positions
        [L] (j, increasing, gaps allowed); appends their keys and values to `kv[layer]`.
        Returns (logits [L, V] float32, normed outputs o [L, D])."""
        lay = self._layers()[layer]
        z = self._inputs(ids, hidden)
        z = z + lay.attn.prefill(lay.attn_norm(z), positions.to(z.device), kv[layer])
        z = z + lay.ffn(lay.ffn_norm(z))
        out = self.norm(z)
        return self.target.project(out), out

    @torch.inference_mode()
    def decode(
        self,
        ids: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        kvs: Sequence[Sequence[KVBuffer]],
        layer: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One entry per sequence of a batch: ids [B], hidden [B, D], positions [B];
        `kvs[b]` is sequence b's buffers. Returns (logits [B, V], outputs [B, D])."""
        lay = self._layers()[layer]
        z = self._inputs(ids, hidden)
        kv = BufferDecode([own[layer] for own in kvs])
        z = z + lay.attn.decode(lay.attn_norm(z), positions.to(z.device), kv)
        z = z + lay.ffn(lay.ffn_norm(z))
        out = self.norm(z)
        return self.target.project(out), out

    def weight_specs(self) -> dict[str, WeightSpec]:
        """Local parameter name -> its checkpoint key (absolute: the layers sit beside
        the language model's prefix, not under it)."""
        out: dict[str, WeightSpec] = {}
        for name in ("norm_embedding", "norm_hidden", "fc", "norm"):
            module = getattr(self, name)
            out.update({f"{name}.{k}": v for k, v in module.weight_specs().items()})
        for i, lay in enumerate(self._layers()):
            out.update({f"layers.{i}.{k}": v for k, v in lay.weight_specs().items()})
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
        parts = [load_tensor(model, spec, key, source) for key in keys]
        tensor = torch.stack(parts) if spec.stack else parts[0]
        target = params[name]
        if tensor.shape != target.shape:
            raise ValueError(
                f"{source.where[keys[0]]}: weight {keys[0]!r} has shape {tuple(tensor.shape)} "
                f"after sharding, the MTP head expects {tuple(target.shape)} for {name}"
            )
        with torch.no_grad():
            target.copy_(tensor)
    if model.device.type == "cpu":
        for module in head.modules():
            if isinstance(module, ParallelLinear):
                module.use_column_major()
    return head.eval()
