"""`MoELayout`: where one family keeps a mixture-of-experts block's weights.

Keys are relative to the HF decoder layer (`layers.{i}`). Two expert layouts exist in
the checkpoints transformers 5.x saves:

- `per_expert`: one key per expert and projection, `{experts}.{e}.gate_proj.weight`
  [I, D], `up_proj` [I, D] and `down_proj` [D, I] (ungated experts have no gate_proj);
  Qwen3.5-MoE, Qwen3-Next, NemotronH (whose experts read the latent width instead of D
  when the block has latent projections) and Jamba.
- `fused`: Granite 4.0-H's 3-D tensors, `{experts}.input_linear.weight` [E, 2I, D] (the
  gate's I rows, then the up projection's) and `{experts}.output_linear.weight` [E, D, I].

The shared expert is an MLP at `shared` (`gate_proj` / `up_proj` / `down_proj`), or with
`shared_fused` Granite's `input_linear` [2S, D] (gate rows, then up) and `output_linear`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

EXPERT_LAYOUTS: Final = ("per_expert", "fused")


@dataclass(frozen=True)
class MoELayout:
    """Checkpoint keys of one family's MoE block, relative to the decoder layer.

    Attributes:
        experts: prefix of the routed experts' weights (see the module docstring).
        router: the router's [E, D] weight.
        selection_bias: the router's [E] selection bias (read only when the config has one).
        expert_layout: "per_expert" or "fused".
        shared: prefix of the shared expert's projections.
        shared_fused: the shared expert's gate and up projections are one `input_linear`.
        shared_gate: the shared expert's D -> 1 sigmoid gate (read when the config has one).
        latent_in, latent_out: the D -> latent and latent -> D projections around the
            routed experts (read when the config has a latent width).
        router_fp32: the router weight is kept, and its logits computed, in float32
            whatever the model's dtype (NemotronH keeps `gate.weight` in float32).
    """

    experts: str
    router: str
    selection_bias: str = ""
    expert_layout: str = "per_expert"
    shared: str = ""
    shared_fused: bool = False
    shared_gate: str = ""
    latent_in: str = ""
    latent_out: str = ""
    router_fp32: bool = False

    def __post_init__(self) -> None:
        if self.expert_layout not in EXPERT_LAYOUTS:
            raise ValueError(
                f"unknown expert layout {self.expert_layout!r}; known: {list(EXPERT_LAYOUTS)}"
            )


QWEN_MOE: Final = MoELayout(
    experts="mlp.experts",
    router="mlp.gate.weight",
    selection_bias="mlp.gate.e_score_correction_bias",
    shared="mlp.shared_expert",
    shared_gate="mlp.shared_expert_gate.weight",
)
NEMOTRON_H_MOE: Final = MoELayout(
    experts="mixer.experts",
    router="mixer.gate.weight",
    selection_bias="mixer.gate.e_score_correction_bias",
    shared="mixer.shared_experts",
    latent_in="mixer.fc1_latent_proj.weight",
    latent_out="mixer.fc2_latent_proj.weight",
    router_fp32=True,
)
JAMBA_MOE: Final = MoELayout(experts="feed_forward.experts", router="feed_forward.router.weight")
GRANITE_MOE: Final = MoELayout(
    experts="block_sparse_moe",
    router="block_sparse_moe.router.layer.weight",
    expert_layout="fused",
    shared="shared_mlp",
    shared_fused=True,
)
LFM2_MOE: Final = MoELayout(
    experts="feed_forward.experts",
    router="feed_forward.gate.weight",
    selection_bias="feed_forward.expert_bias",
)
"""LFM2-MoE: per-expert `w1` / `w3` / `w2` (the family's `HFNames.renames` map the
engine's gate / up / down names onto them), the selection bias beside the router."""
KIMI_LINEAR_MOE: Final = MoELayout(
    experts="block_sparse_moe.experts",
    router="block_sparse_moe.gate.weight",
    selection_bias="block_sparse_moe.gate.e_score_correction_bias",
    shared="block_sparse_moe.shared_experts",
    router_fp32=True,
)
"""Kimi Linear: per-expert `w1` / `w3` / `w2` (renamed like LFM2-MoE's), DeepSeek-V3's
router (float32) and shared experts."""
