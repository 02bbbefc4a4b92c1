"""The pure state-space families: Mamba (`mamba`), Falcon-Mamba (`falcon_mamba`) and
Mamba-2 (`mamba2`, Codestral Mamba). Every layer is `x = x + mixer(norm(x))` with one
Mamba mixer and no attention or feed-forward, so the models keep no KV at all: every
cached prefix is a state.

- Mamba: Mamba-1 with no inner norms (dt, B and C go straight from x_proj).
- Falcon-Mamba: Mamba-1 with weightless RMSNorms (epsilon `mixer_rms_eps`) on dt, B and C.
- Mamba-2: the gated group RMSNorm before out_proj; dt clamped to `time_step_limit`.

The defaults are those of transformers' `MambaConfig`, `FalconMambaConfig` and
`Mamba2Config` (5.x) for the keys read here; the classes set no context limit
(`max_position_embeddings` None: the serving default applies).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from marconi_ray.core.model.hf.arch import Block, HfArchitecture, Mamba1Config, Mamba2Config
from marconi_ray.core.model.hf.blocks import architecture
from marconi_ray.core.model.hf.reader import ConfigReader

_SSM_COMMON: Final[Mapping[str, object]] = MappingProxyType(
    {
        "vocab_size": 50280,
        "hidden_size": 768,
        "state_size": 16,
        "num_hidden_layers": 32,
        "layer_norm_epsilon": 1e-5,
        "expand": 2,
        "conv_kernel": 4,
        "use_bias": False,
        "use_conv_bias": True,
        "time_step_rank": "auto",
        "intermediate_size": None,
        "tie_word_embeddings": True,
        "eos_token_id": 0,
        "max_position_embeddings": None,
    }
)
MAMBA: Final[Mapping[str, object]] = _SSM_COMMON
"""transformers' `MambaConfig` defaults."""
FALCON_MAMBA: Final[Mapping[str, object]] = MappingProxyType({**_SSM_COMMON, "mixer_rms_eps": 1e-6})
"""transformers' `FalconMambaConfig` defaults."""
MAMBA2: Final[Mapping[str, object]] = MappingProxyType(
    {
        "num_heads": 128,
        "head_dim": 64,
        "vocab_size": 32768,
        "hidden_size": 4096,
        "state_size": 128,
        "num_hidden_layers": 64,
        "layer_norm_epsilon": 1e-5,
        "expand": 2,
        "conv_kernel": 4,
        "n_groups": 8,
        "use_bias": False,
        "use_conv_bias": True,
        "time_step_limit": (0.0, float("inf")),
        "chunk_size": 256,
        "tie_word_embeddings": False,
        "eos_token_id": 2,
        "max_position_embeddings": None,
    }
)
"""transformers' `Mamba2Config` defaults."""


def _pure(r: ConfigReader, mixer: Mamba1Config | Mamba2Config) -> HfArchitecture:
    """`num_hidden_layers` blocks of `mixer`, one per HF layer."""
    blocks = [Block(mixer, i) for i in range(r.pos_int("num_hidden_layers"))]
    return architecture(r, blocks, norm_key="layer_norm_epsilon")


def _mamba1(r: ConfigReader, *, falcon: bool) -> HfArchitecture:
    """The mixer's width is `intermediate_size` when the config names it (Falcon-Mamba-7B:
    8192 beside `expand` 16; transformers keeps the key over its expand * hidden_size),
    else expand * hidden_size."""
    d = r.req_int("hidden_size")
    rank = r.int_or_auto("time_step_rank")
    width = r.opt_int("intermediate_size")
    mixer = Mamba1Config(
        d_inner=r.pos_int("expand") * d if width is None else width,
        d_state=r.pos_int("state_size"),
        d_conv=r.pos_int("conv_kernel"),
        dt_rank=math.ceil(d / 16) if rank is None else rank,
        conv_bias=r.flag("use_conv_bias"),
        proj_bias=r.flag("use_bias"),
        inner_norms=falcon,
        inner_norm_weights=False,
        inner_norm_eps=r.req_float("mixer_rms_eps") if falcon else None,
    )
    return _pure(r, mixer)


def parse_mamba(config: Mapping[str, object]) -> HfArchitecture:
    """Mamba: Mamba-1 layers (in_proj, conv1d, x_proj, dt_proj, out_proj; no inner norms)."""
    return _mamba1(ConfigReader(config, MAMBA, "mamba"), falcon=False)


def parse_falcon_mamba(config: Mapping[str, object]) -> HfArchitecture:
    """Falcon-Mamba: Mamba's layers with weightless RMSNorms on dt, B and C."""
    return _mamba1(ConfigReader(config, FALCON_MAMBA, "falcon_mamba"), falcon=True)


def parse_mamba2(config: Mapping[str, object]) -> HfArchitecture:
    """Mamba-2: `num_heads` heads of `head_dim` (their product must be expand *
    hidden_size, as transformers checks; its mixer ignores `intermediate_size`),
    `n_groups` B/C groups, the gated group norm."""
    r = ConfigReader(config, MAMBA2, "mamba2")
    d = r.req_int("hidden_size")
    heads, head_dim = r.pos_int("num_heads"), r.pos_int("head_dim")
    expand = r.pos_int("expand")
    if heads * head_dim != expand * d:
        raise ValueError(
            f"mamba2 num_heads * head_dim ({heads} * {head_dim}) must equal expand * "
            f"hidden_size ({expand} * {d})"
        )
    dt_min, dt_max = r.float_pair("time_step_limit")
    mixer = Mamba2Config(
        n_heads=heads,
        head_dim=head_dim,
        n_groups=r.pos_int("n_groups"),
        d_state=r.pos_int("state_size"),
        d_conv=r.pos_int("conv_kernel"),
        chunk_size=r.pos_int("chunk_size"),
        conv_bias=r.flag("use_conv_bias"),
        proj_bias=r.flag("use_bias"),
        dt_min=dt_min,
        dt_max=dt_max,
    )
    return _pure(r, mixer)
