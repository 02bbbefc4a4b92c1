"""The pure state-space families' parsers (`core.model.hf.pure_ssm`): transformers'
config classes read the same way, the layer widths each family really runs, and bad
values named."""

from __future__ import annotations

import pytest
from transformers import FalconMambaConfig, Mamba2Config, MambaConfig

from marconi_ray.core.model.hf.arch import Mamba1Config
from marconi_ray.core.model.hf.arch import Mamba2Config as OurMamba2
from marconi_ray.core.model.hf.parse import parse_hf_config, spec_from_hf_config


def test_mamba_has_no_inner_norms_and_falcon_mamba_weightless_ones() -> None:
    mamba = parse_hf_config(MambaConfig(hidden_size=64, num_hidden_layers=3).to_dict())
    falcon = parse_hf_config(
        FalconMambaConfig(hidden_size=64, num_hidden_layers=3, mixer_rms_eps=1e-3).to_dict()
    )
    for arch in (mamba, falcon):
        assert len(arch.blocks) == 3 and [b.hf_layer for b in arch.blocks] == [0, 1, 2]
        assert arch.norm_eps == 1e-5 and arch.max_position is None
    m, f = mamba.blocks[0].config, falcon.blocks[0].config
    assert isinstance(m, Mamba1Config) and isinstance(f, Mamba1Config)
    assert (m.d_inner, m.dt_rank, m.inner_norms) == (128, 4, False)
    assert (f.inner_norms, f.inner_norm_weights, f.inner_norm_eps) == (True, False, 1e-3)


def test_a_named_intermediate_size_wins_over_expand_as_in_transformers() -> None:
    raw = {"model_type": "falcon_mamba", "hidden_size": 64, "expand": 16, "intermediate_size": 128}
    theirs = FalconMambaConfig(**{k: v for k, v in raw.items() if k != "model_type"})
    assert theirs.intermediate_size == 128
    block = parse_hf_config(raw).blocks[0].config
    assert isinstance(block, Mamba1Config) and block.d_inner == 128
    without = parse_hf_config({"model_type": "mamba", "hidden_size": 64, "expand": 3})
    assert without.blocks[0].config.d_inner == 192  # type: ignore[union-attr]


def test_mamba2_reads_heads_groups_and_the_dt_clamp() -> None:
    cfg = Mamba2Config(
        hidden_size=64, num_heads=4, head_dim=32, n_groups=2, state_size=16,
        num_hidden_layers=2, time_step_limit=(0.01, 5.0), chunk_size=16,
    )  # fmt: skip
    arch = parse_hf_config(cfg.to_dict())
    block = arch.blocks[0].config
    assert isinstance(block, OurMamba2)
    assert (block.n_heads, block.head_dim, block.n_groups, block.d_state) == (4, 32, 2, 16)
    assert (block.dt_min, block.dt_max, block.chunk_size, block.gated_norm) == (0.01, 5.0, 16, True)
    spec = spec_from_hf_config(cfg.to_dict())
    assert spec.kv_bytes_per_token == 0 and spec.n_attention == 0 and spec.n_ssm == 2


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"model_type": "mamba2", "hidden_size": 64, "num_heads": 3, "head_dim": 32},
         r"num_heads \* head_dim \(3 \* 32\) must equal expand \* hidden_size \(2 \* 64\)"),
        ({"model_type": "mamba", "num_hidden_layers": 0}, "num_hidden_layers"),
        ({"model_type": "falcon_mamba", "mixer_rms_eps": "x"}, "mixer_rms_eps"),
        ({"model_type": "mamba", "state_size": None}, "state_size"),
    ],
)  # fmt: skip
def test_bad_values_are_named(config: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_hf_config(config)
