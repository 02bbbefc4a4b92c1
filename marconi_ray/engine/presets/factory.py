"""Random-weight hybrid checkpoints from a named preset: `make_model` and helpers.

`make_model` writes a folder that loads through the real loading path
(`AutoModelForCausalLM.from_pretrained(dir)`, or `AutoModelForImageTextToText` for a
multimodal Qwen3.5 checkpoint, and `AutoTokenizer.from_pretrained(dir)`):
`config.json`, `generation_config.json`, `model.safetensors`, the byte tokenizer of
`marconi_ray.engine.presets.byte_tokenizer`, and `marconi.json` (preset, family, seed,
dtype, parameter count).

Logit separation: with the usual init (std 0.02) a random model's logits are nearly flat
(std ~0.02 * sqrt(hidden) across the vocab), so greedy decoding would flip on float
rounding, and sampling would pick any id, including bytes that are no valid UTF-8 on their
own (decoded as U+FFFD) and ids the tokenizer does not have. So only the rows of printable
ASCII bytes and newline (`PRINTABLE_IDS`) are random; every other row of the `lm_head`
(special tokens, other bytes, the padding of the model vocab past `BYTE_VOCAB_SIZE`) is
zero, so its logit is exactly 0, and the printable logits are lifted `LOGIT_LIFT` above 0:

- The lift comes from a constant channel, written by one bias (`_lift_projection`): the
  last layer's MLP `down_proj.bias` (NemotronH, Bamba, FalconH1: the presets have
  `mlp_bias` on, every other MLP bias is 0), the last short conv's `out_proj.bias`
  (LFM2), the last Mamba-2's `out_proj.bias` (Zamba2, `add_bias_linear`), or the output
  projection bias of the last layer's mixer (Qwen, Jamba, Granite, NemotronH with MoE
  layers; the feed-forward after it is kept from passing the channel on). It adds
  `LIFT_RATIO` times the
  median norm of the final residual stream (measured on a calibration prompt) to channel
  `LIFT_CHANNEL`, so after the final RMSNorm that channel is ~sqrt(hidden) at every
  position; the printable rows weigh it so that it adds ~`LOGIT_LIFT` to each of them.
  Nothing but the final norm and the `lm_head` sees the channel, so every layer computes
  what it computed without it. MiniMax has no bias at all: its embedding table writes
  the channel, hidden from every mixer, and its blocks' writes are scaled up so that the
  tokens depend on them (`minimax_lift`).
- The other columns of the printable rows are N(0, s^2) with s chosen so that the
  printable logits have std ~`LOGIT_STD` across those ids at a typical position; the top
  one is ~+2.5 std above their mean.

Greedy text is then plain ASCII, and so is sampled text at any temperature the OpenAI
API allows (<= `MAX_TEMPERATURE`): every other id together has probability below
`MAX_STRAY_PROB` per token, so the text survives decoding and re-encoding (multi-turn
chat). Every build checks on a short random prompt that the std over the printable ids at
each position is >= `MIN_LOGIT_STD` and that the stray probability at `MAX_TEMPERATURE`
is <= `MAX_STRAY_PROB`.

Seeding: the whole build runs under `torch.random.fork_rng` seeded with `seed`, so the
same (preset, family, seed, dtype) gives bit-identical weights and the caller's global RNG
is left untouched. The seeded init draws the weights of a model without MLP biases
(`nn.Linear` would draw its bias from the RNG too), and the zero biases are attached
afterwards, so every other weight is what a build without the lift drew.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

import torch

from marconi_ray.engine.presets.byte_tokenizer import BYTE_OFFSET, BYTE_VOCAB_SIZE, save_tokenizer
from marconi_ray.engine.presets.family_configs import preset_config
from marconi_ray.engine.presets.lfm3_presets import lfm3_prepare
from marconi_ray.engine.presets.minimax_lift import balance_writes, lift_through_embedding
from marconi_ray.engine.presets.model_presets import (
    BUILD_VERSION,
    DTYPE_NAMES,
    FAMILIES,
    LFM2_FAMILIES,
    PRESETS,
    QWEN_FAMILIES,
    ModelPreset,
    check_family,
    get_preset,
)
from marconi_ray.engine.presets.rgemma_presets import rgemma_lift
from marconi_ray.engine.presets.xlstm_presets import prepare_xlstm

__all__ = [
    "DTYPES",
    "FAMILIES",
    "PRESETS",
    "PRINTABLE_IDS",
    "ModelPreset",
    "build_model",
    "check_logit_separation",
    "count_parameters",
    "get_preset",
    "make_model",
    "model_class",
    "preset_config",
    "read_record",
]

DTYPES: Final[Mapping[str, torch.dtype]] = MappingProxyType(
    {name: getattr(torch, name) for name in DTYPE_NAMES}
)
"""Weight dtypes `make_model` accepts, by name."""

LOGIT_STD: Final = 4.0
"""Std of the printable ids' logits across those ids at a typical position."""
LOGIT_LIFT: Final = 44.0
"""How far the printable ids' logits sit above the 0 of every other id."""
LIFT_RATIO: Final = 8.0
"""The lift channel's bias over the median norm of the final residual stream."""
LIFT_CHANNEL: Final = 0
"""The residual-stream channel that carries the lift."""
MIN_LOGIT_STD: Final = 1.0
MAX_TEMPERATURE: Final = 2.0
"""The highest temperature the OpenAI API accepts (`serve.ingress.openai_protocol`)."""
MAX_STRAY_PROB: Final = 1e-6
"""Most probability per token that any non-printable id may get at `MAX_TEMPERATURE`."""
EXPERT_BIAS_STD: Final = 0.02
"""Std of LFM2-MoE's drawn `expert_bias` (the router scores spread about as much)."""
CHECK_PROMPT_LEN: Final = 8
CALIBRATION_LEN: Final = 32
CALIBRATION_SEED: Final = 0
PRINTABLE_IDS: Final = (BYTE_OFFSET + ord("\n"), *range(BYTE_OFFSET + 32, BYTE_OFFSET + 127))
"""The ids whose `lm_head` rows are random: newline and printable ASCII (0x20..0x7e)."""
_MLP_PROJECTIONS: Final = ("gate_proj", "up_proj", "down_proj")
_FINAL_NORM: Final = {
    "nemotron_h": "norm_f",
    "bamba": "final_layernorm",
    "falcon_h1": "final_layernorm",
    "zamba2": "final_layernorm",
    "lfm2": "embedding_norm",
    "lfm2_moe": "embedding_norm",
    "jamba": "final_layernorm",
    "mamba": "norm_f",
    "falcon_mamba": "norm_f",
    "mamba2": "norm_f",
    "recurrent_gemma": "final_norm",
    "lfm3": "embedding_norm",
}
_BIAS_FLAG: Final = {"zamba2": "add_bias_linear"}
"""The config flag of the biases the lift needs, where it is not `mlp_bias`."""
MLP_LIFT_FAMILIES: Final = ("nemotron_h", "bamba", "falcon_h1")
"""Families whose last MLP's `down_proj` bias lifts the logits (NemotronH only without
MoE layers); LFM2's short conv and Zamba2's last Mamba-2 `out_proj` lift theirs, the
others use the output-projection bias of the last layer's mixer (`_mixer_lift`)."""
SELECTION_BIAS_STD: Final = 0.05
"""Std of the random router selection biases (NemotronH `e_score_correction_bias`,
zero after transformers' init), so that routing depends on them."""
_MODEL_CLASSES: Final = {
    "nemotron_h": "NemotronHForCausalLM",
    "bamba": "BambaForCausalLM",
    "qwen3_5_text": "Qwen3_5ForCausalLM",
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
    "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
    "qwen3_next": "Qwen3NextForCausalLM",
    "falcon_h1": "FalconH1ForCausalLM",
    "zamba2": "Zamba2ForCausalLM",
    "lfm2": "Lfm2ForCausalLM",
    "lfm2_moe": "Lfm2MoeForCausalLM",
    "kimi_linear": "KimiLinearForCausalLM",
    "nemotron_h_moe": "NemotronHForCausalLM",
    "jamba": "JambaForCausalLM",
    "granitemoehybrid": "GraniteMoeHybridForCausalLM",
    "mamba": "MambaForCausalLM",
    "falcon_mamba": "FalconMambaForCausalLM",
    "mamba2": "Mamba2ForCausalLM",
    "olmo_hybrid": "OlmoHybridForCausalLM",
    "recurrent_gemma": "RecurrentGemmaForCausalLM",
    "minimax": "MiniMaxForCausalLM",
    "bailing_hybrid": "BailingHybridForCausalLM",
    "lfm3": "Lfm3ForCausalLM",
    "xlstm": "xLSTMForCausalLM",
}
MARCONI_FILE: Final = "marconi.json"

_OUTPUT_FILES: Final = re.compile(
    r"(config\.json|generation_config\.json|marconi\.json|tokenizer\.json"
    r"|tokenizer_config\.json|special_tokens_map\.json|chat_template\.jinja"
    r"|model(-\d+-of-\d+)?\.safetensors|model\.safetensors\.index\.json)"
)


def model_class(family: str) -> Any:
    """The transformers class that builds `family` (ValueError naming a bad one): its
    `*ForCausalLM`, or `*ForConditionalGeneration` for a multimodal Qwen3.5 checkpoint."""
    check_family(family)
    import transformers

    return getattr(transformers, _MODEL_CLASSES[family])


def _decoder(model: Any) -> Any:
    """The decoder stack (`layers`, final norm) of a causal LM (the pure SSMs' is its
    `backbone`) or of a multimodal checkpoint's language model."""
    inner = model.backbone if hasattr(model, "backbone") else model.model
    return getattr(inner, "language_model", inner)


def count_parameters(preset: str, family: str) -> int:
    """Exact parameter count of `preset` as `family`, built on the meta device (no memory)."""
    config = preset_config(preset, family)
    with torch.device("meta"):
        model = model_class(family)(config)
    return sum(p.numel() for p in model.parameters())


def _check_dtype(dtype: str) -> torch.dtype:
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid dtypes: {list(DTYPES)}")
    return DTYPES[dtype]


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    return seed


def _is_previous_output(names: set[str]) -> bool:
    return MARCONI_FILE in names and all(_OUTPUT_FILES.fullmatch(n) for n in names)


def _check_out_dir(out: Path, overwrite: bool) -> None:
    """ValueError naming `out` unless it is absent, empty, a previous output, or `overwrite`."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"output path exists and is not a folder: {out}")
    names = {p.name for p in out.iterdir()} if out.exists() else set()
    if names and not overwrite and not _is_previous_output(names):
        raise ValueError(
            f"output folder {out} is not empty and is not a previous make-model output; "
            "pass overwrite=True (--overwrite) to write into it"
        )


def _remove_stale_outputs(out: Path) -> None:
    """Delete make-model output files of a previous build (e.g. old weight shards)."""
    if out.is_dir():
        for path in out.iterdir():
            if _OUTPUT_FILES.fullmatch(path.name) and path.is_file():
                path.unlink()


def _printable_mask(vocab_size: int) -> torch.Tensor:
    keep = torch.zeros(vocab_size, dtype=torch.bool)
    keep[list(PRINTABLE_IDS)] = True
    return keep


def _attach_mlp_biases(model: Any) -> Any:
    """Give every MLP projection a zero bias (in place, no RNG draw); return the last MLP's
    `down_proj`. ValueError when the model's last layer does not end with an MLP (the lift
    channel must be written after every mixer).
    """
    mlps = [m for m in model.modules() if type(m).__name__.endswith("MLP")]
    if not mlps or not any(m is mlps[-1] for m in _decoder(model).layers[-1].modules()):
        raise ValueError("the last layer of a preset must end with an MLP ('-')")
    for mlp in mlps:
        for name in _MLP_PROJECTIONS:
            linear = getattr(mlp, name, None)
            if isinstance(linear, torch.nn.Linear) and linear.bias is None:
                weight = linear.weight
                zeros = torch.zeros(linear.out_features, dtype=weight.dtype, device=weight.device)
                linear.bias = torch.nn.Parameter(zeros, requires_grad=weight.requires_grad)
    model.config.mlp_bias = True
    return mlps[-1].down_proj


def _mixer_lift(model: Any) -> Any:
    """Families without MLP biases: zero every attention and Mamba projection bias and
    return the output projection (`o_proj` or `out_proj`) of the last layer's mixer,
    whose bias carries the lift. When that layer then runs a feed-forward, its pre-norm
    must not pass the lift channel on: its scale is 0 on the channel and
    `sqrt(1 + LIFT_RATIO**2)` on the others (what the channel takes from their share of
    the RMS at the median residual norm), both minus 1 for zero-centred norms (Qwen).
    ValueError when the last layer's mixer has no output-projection bias."""
    last = _decoder(model).layers[-1]
    for module in _decoder(model).modules():
        for name in ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj", "out_proj"):
            proj = getattr(module, name, None)
            if isinstance(proj, torch.nn.Linear) and proj.bias is not None:
                torch.nn.init.zeros_(proj.bias)
    mixers = [getattr(last, n, None) for n in ("self_attn", "mamba", "mixer")]
    outs = [getattr(m, n, None) for m in mixers if m is not None for n in ("o_proj", "out_proj")]
    out = next((o for o in outs if isinstance(o, torch.nn.Linear) and o.bias is not None), None)
    if out is None:
        raise ValueError("the last layer's mixer must have an output-projection bias")
    norm = getattr(last, "post_attention_layernorm", None) or getattr(
        last, "pre_ff_layernorm", None
    )
    if norm is not None:
        offset = 1.0 if model.config.model_type in QWEN_FAMILIES else 0.0
        with torch.no_grad():
            norm.weight.fill_(math.sqrt(1.0 + LIFT_RATIO**2) - offset)
            norm.weight[LIFT_CHANNEL] = -offset
    return out


def _zero_bias(linear: torch.nn.Linear) -> None:
    """Give `linear` a zero bias (in place, no RNG draw) unless it has one."""
    if linear.bias is None:
        weight = linear.weight
        zeros = torch.zeros(linear.out_features, dtype=weight.dtype, device=weight.device)
        linear.bias = torch.nn.Parameter(zeros, requires_grad=weight.requires_grad)


def _mamba_lift(model: Any) -> Any:
    """Zamba2 (no MLP writes the residual stream): give every linear layer that
    `add_bias_linear` gives a bias (Mamba-2 in/out projections, the shared MLPs) a zero
    one and return the last layer's Mamba-2 `out_proj`, whose bias carries the lift."""
    for module in model.modules():
        name = type(module).__name__
        if name.endswith("MambaMixer"):
            _zero_bias(module.in_proj)
            _zero_bias(module.out_proj)
        elif name.endswith("MLP"):
            _zero_bias(module.gate_up_proj)
            _zero_bias(module.down_proj)
    model.config.add_bias_linear = True
    last = _decoder(model).layers[-1]
    return getattr(last, "mamba_decoder", last).mamba.out_proj


def _conv_lift(model: Any) -> Any:
    """LFM2 families (no MLP or attention biases): zero every short-conv bias and return
    the last layer's conv `out_proj`, whose bias carries the lift. That layer's
    feed-forward must not read the lift channel: its pre-norm scale (plain RMSNorm
    weights) is 0 on the channel and `sqrt(1 + LIFT_RATIO**2)` on the others (see
    `_mixer_lift`). ValueError when the last layer is not a short conv."""
    last = _decoder(model).layers[-1]
    conv = getattr(last, "conv", None)
    if conv is None:
        raise ValueError("the last layer of an LFM2 preset must be a short conv")
    for module in model.modules():
        if type(module).__name__.endswith("ShortConv"):
            for part in (module.in_proj, module.conv, module.out_proj):
                if part.bias is not None:
                    torch.nn.init.zeros_(part.bias)
    with torch.no_grad():
        scale = last.ffn_norm.weight
        scale.fill_(math.sqrt(1.0 + LIFT_RATIO**2))
        scale[LIFT_CHANNEL] = 0.0
    return conv.out_proj


def _lift_projection(model: Any) -> Any:
    """The linear layer whose bias carries the lift channel, its family's way."""
    config = model.config.get_text_config()
    family = config.model_type
    if family in LFM2_FAMILIES:
        return _conv_lift(model)
    if family == "zamba2":
        return _mamba_lift(model)
    if family == "recurrent_gemma":
        return rgemma_lift(model)
    if family in MLP_LIFT_FAMILIES and not _has_moe(config):
        return _attach_mlp_biases(model)
    return _mixer_lift(model)


def _final_residual_norm(model: Any) -> float:
    """Median over the positions of a calibration prompt of the final norm's input norm."""
    decoder = _decoder(model)
    norm = getattr(decoder, _FINAL_NORM.get(model.config.model_type, "norm"))
    seen: list[torch.Tensor] = []
    hook = norm.register_forward_hook(lambda _m, args, _out: seen.append(args[0].detach()))
    g = torch.Generator().manual_seed(CALIBRATION_SEED)
    prompt = torch.randint(BYTE_OFFSET, BYTE_VOCAB_SIZE, (1, CALIBRATION_LEN), generator=g)
    try:
        with torch.no_grad():
            model(input_ids=prompt.to(model.device))
    finally:
        hook.remove()
    return float(seen[0][0].float().norm(dim=-1).median())


def _output_multipliers(config: Any) -> tuple[float, float]:
    """(logit multiplier, multiplier of the last MLP's down_proj output) of a muP model
    (FalconH1's `lm_head_multiplier` and `mlp_multipliers[1]`); (1, 1) for the others.
    The LM head and the lift bias are divided by them so the logits come out as planned."""
    logits = float(getattr(config, "lm_head_multiplier", 1.0))
    mlp = getattr(config, "mlp_multipliers", None)
    return logits, float(mlp[1]) if mlp else 1.0


def _has_moe(config: Any) -> bool:
    """The NemotronH config has MoE layers (`nemotron_h_moe`, lifted like the others)."""
    return "moe" in (getattr(config, "layers_block_type", None) or ())


def _randomise_selection_biases(model: Any) -> None:
    """Draw every router selection bias (zero after init; from the seeded RNG) so that
    routing depends on it: NemotronH's `e_score_correction_bias` from
    N(0, SELECTION_BIAS_STD^2), LFM2-MoE's `expert_bias` from N(0, EXPERT_BIAS_STD^2)."""
    stds = {"e_score_correction_bias": SELECTION_BIAS_STD, "expert_bias": EXPERT_BIAS_STD}
    for module in model.modules():
        for name, std in stds.items():
            bias = getattr(module, name, None)
            if isinstance(bias, torch.Tensor):
                with torch.no_grad():
                    bias.normal_(0.0, std)


def _separate_logits(model: Any, hidden_size: int) -> None:
    """Zero every non-printable `lm_head` row and lift the printable logits by ~LOGIT_LIFT
    through a constant channel written by the last MLP (`MLP_LIFT_FAMILIES`), by the last
    short conv (LFM2) or Mamba-2 (Zamba2), or by the output projection of the last
    layer's mixer for the others (see the module docstring, `_lift_projection`); the muP
    multipliers of Granite (residual, logits_scaling) and FalconH1 (lm_head, down) are
    compensated."""
    head = model.get_output_embeddings().weight
    config = model.config.get_text_config()
    # muP multipliers (Granite): block outputs are scaled before the residual add, the
    # logits divided by logits_scaling
    residual = getattr(config, "residual_multiplier", 1.0)
    logits_scaling = getattr(config, "logits_scaling", 1.0)
    std = LOGIT_STD * logits_scaling / math.sqrt(hidden_size)
    fresh = torch.randn(head.shape, dtype=torch.float32) * std
    down = None
    if config.model_type == "minimax":  # no bias: the embedding table writes the channel
        lift_through_embedding(model, LIFT_CHANNEL, LIFT_RATIO)
        balance_writes(model)
    elif config.model_type == "xlstm":  # no bias: the embedding table writes the channel
        prepare_xlstm(model, LIFT_CHANNEL, LIFT_RATIO)
    elif config.model_type == "lfm3":  # post norms: the last conv's bias through its own
        lfm3_prepare(model, LIFT_CHANNEL, LIFT_RATIO)
    else:
        bias = LIFT_RATIO * _final_residual_norm(model) / residual
        down = _lift_projection(model)
    scale = math.sqrt(1.0 + LIFT_RATIO**2)
    # With the bias R * median|residual| (R = LIFT_RATIO), after the final RMSNorm the lift
    # channel is sqrt(hidden) * R / sqrt(R^2 + r^2) and the other channels have norm
    # sqrt(hidden) * r / sqrt(R^2 + r^2), where r = |residual| / its median (~1): `scale`
    # keeps the printable spread at ~LOGIT_STD, the lift column makes the lift ~LOGIT_LIFT.
    keep = _printable_mask(head.shape[0])
    fresh[~keep] = 0.0
    fresh[keep] *= scale
    fresh[keep, LIFT_CHANNEL] = (
        LOGIT_LIFT * logits_scaling * scale / (LIFT_RATIO * math.sqrt(hidden_size))
    )
    logit_mult, down_mult = _output_multipliers(model.config)
    with torch.no_grad():
        head.copy_((fresh / logit_mult).to(head.dtype))
        if down is not None:
            down.bias[LIFT_CHANNEL] = bias / down_mult


def check_logit_separation(model: Any) -> float:
    """Smallest per-position logit std over the printable ids on a random byte prompt.

    Raises RuntimeError when it is below `MIN_LOGIT_STD` (greedy decoding would not be
    robust to float rounding), or when at `MAX_TEMPERATURE` the other ids together get
    more than `MAX_STRAY_PROB` at some position (sampled text could leave printable
    ASCII). Draws the prompt from torch's global RNG.
    """
    prompt = torch.randint(BYTE_OFFSET, BYTE_VOCAB_SIZE, (1, CHECK_PROMPT_LEN)).to(model.device)
    with torch.no_grad():
        logits = model(input_ids=prompt).logits[0].double().cpu()
    keep = _printable_mask(logits.shape[-1])
    min_std = float(logits[:, keep].std(dim=-1).min())
    if not min_std >= MIN_LOGIT_STD:
        raise RuntimeError(f"random model logits too flat: std {min_std:.3f} < {MIN_LOGIT_STD}")
    scaled = logits / MAX_TEMPERATURE
    stray = float((scaled[:, ~keep].logsumexp(-1) - scaled.logsumexp(-1)).exp().max())
    if not stray <= MAX_STRAY_PROB:
        raise RuntimeError(
            f"non-printable ids get probability {stray:.3g} > {MAX_STRAY_PROB} per token "
            f"at temperature {MAX_TEMPERATURE}"
        )
    return min_std


def build_model(
    preset: str, family: str, *, seed: int = 0, dtype: str = "float32", device: str = "cpu"
) -> Any:
    """The seeded random-weight model (eval mode, on `device`) with separated logits.

    Materialises every weight: callers guard large presets (see `make_model`). On a GPU,
    `device="cuda"` initialises a 7B model in seconds where the CPU needs minutes (its
    weights then come from the CUDA generator, so they differ from a CPU build's).
    """
    config = preset_config(preset, family)
    torch_dtype = _check_dtype(dtype)
    _check_seed(seed)
    import transformers

    # a multimodal Qwen3.5 checkpoint is an image-text-to-text model (its causal-LM auto
    # class would build the text model alone)
    multimodal = family in ("qwen3_5", "qwen3_5_moe")
    auto: Any = (
        transformers.AutoModelForImageTextToText
        if multimodal
        else transformers.AutoModelForCausalLM
    )
    init_config = copy.deepcopy(config)
    if family in MLP_LIFT_FAMILIES or family in _BIAS_FLAG:
        # the biases are attached, zero, after the seeded init
        setattr(init_config, _BIAS_FLAG.get(family, "mlp_bias"), False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device(device):
            model = auto.from_config(init_config, dtype=torch_dtype)
        model.eval()
        _randomise_selection_biases(model)
        _separate_logits(model, config.get_text_config().hidden_size)
        check_logit_separation(model)
    return model


def make_model(
    preset: str,
    family: str,
    out_dir: str | Path,
    *,
    seed: int = 0,
    dtype: str = "float32",
    allow_large: bool = False,
    overwrite: bool = False,
) -> Path:
    """Build `preset` as `family` with random weights and save it to `out_dir`; return it.

    Everything is validated before anything is written: an unknown preset, family or
    dtype, a bad seed, a large preset without `allow_large`, or an `out_dir` that holds
    files other than a previous make-model output (unless `overwrite`) raise ValueError
    naming the value. A previous output in `out_dir` is replaced; with `overwrite`, files
    that are not make-model outputs are left in place.
    """
    spec = get_preset(preset)
    check_family(family)
    torch_dtype = _check_dtype(dtype)
    _check_seed(seed)
    if spec.large and not allow_large:
        n = count_parameters(preset, family)
        gb = n * torch_dtype.itemsize / 1e9
        raise ValueError(
            f"preset {preset!r} has {n:,} parameters (~{gb:.0f} GB in {dtype}); "
            "pass allow_large=True (--allow-large) to materialise it"
        )
    out = Path(out_dir)
    _check_out_dir(out, overwrite)

    model = build_model(preset, family, seed=seed, dtype=dtype)
    n_params = sum(p.numel() for p in model.parameters())
    _remove_stale_outputs(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    save_tokenizer(out, model_max_length=spec.max_position_embeddings)
    record = {
        "preset": preset,
        "family": family,
        "seed": seed,
        "dtype": dtype,
        "num_parameters": n_params,
        "logit_std": LOGIT_STD,
        "logit_lift": LOGIT_LIFT,
        "build_version": BUILD_VERSION,
    }
    (out / MARCONI_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return out


def read_record(model_dir: str | Path) -> dict[str, Any]:
    """The `marconi.json` record of a make-model folder (FileNotFoundError naming it)."""
    path = Path(model_dir) / MARCONI_FILE
    if not path.is_file():
        raise FileNotFoundError(f"not a make-model folder (no {MARCONI_FILE}): {path.parent}")
    record: dict[str, Any] = json.loads(path.read_text())
    return record
