"""Random-weight hybrid checkpoints: presets, save/load, seeding, logit separation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from marconi_ray.core.model.hf.xlstm import round_up
from marconi_ray.engine.presets.byte_tokenizer import BOS_ID, BYTE_VOCAB_SIZE, EOS_ID, PAD_ID
from marconi_ray.engine.presets.factory import (
    FAMILIES,
    LOGIT_STD,
    MIN_LOGIT_STD,
    PRESETS,
    build_model,
    count_parameters,
    make_model,
    model_class,
    preset_config,
    read_record,
)
from marconi_ray.engine.presets.model_presets import (
    LFM2_FAMILIES,
    MOE_HYBRIDS,
    PURE_SSM_FAMILIES,
    QWEN_FAMILIES,
)

torch.set_num_threads(1)


def _prompt(n: int = 12, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(7, BYTE_VOCAB_SIZE, (1, n), generator=g)


MULTIMODAL = ("qwen3_5", "qwen3_5_moe")
MOE = ("qwen3_5_moe_text", "qwen3_5_moe", "qwen3_next", *MOE_HYBRIDS)
FEWEST = {
    "zamba2": 0.7,
    "lfm2": 0.9,
    "lfm2_moe": 0.9,
    "lfm3": 0.9,
    "recurrent_gemma": 0.8,
    **dict.fromkeys(PURE_SSM_FAMILIES, 0.4),
    "xlstm": 0.8,
}
"""Share of the usual least parameters a family has: Zamba2 has no per-layer MLP (its
shared block's two copies hold its only MLP weights); a short conv holds about 4 D^2
weights against Mamba-2's 6 D^2, an RG-LRU block about 3 D^2 (RecurrentGemma has one
layer fewer than the preset's mixers, as `rgemma_presets` builds it); the pure SSMs have
no MLP and no attention at all; an xLSTM block (mLSTM + feed-forward, 4 heads, the width
rounded up to 128) holds about 12 D^2."""


@pytest.fixture(scope="module", params=FAMILIES)
def tiny_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", request.param, tmp_path_factory.mktemp(request.param), seed=3)


def test_tiny_saves_and_reloads_with_identical_logits(tiny_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    record = read_record(tiny_dir)
    names = {p.name for p in tiny_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "marconi.json"} <= names
    assert record["preset"] == "tiny" and record["seed"] == 3
    multimodal = record["family"] in MULTIMODAL
    auto: Any = AutoModelForImageTextToText if multimodal else AutoModelForCausalLM
    loaded = auto.from_pretrained(tiny_dir).eval()
    assert isinstance(loaded, model_class(record["family"]))
    fresh = build_model("tiny", record["family"], seed=3)
    assert sum(p.numel() for p in loaded.parameters()) == record["num_parameters"]
    with torch.no_grad():
        expected = fresh(input_ids=_prompt()).logits
        got = loaded(input_ids=_prompt()).logits
    assert torch.equal(expected, got)
    tok = AutoTokenizer.from_pretrained(tiny_dir, local_files_only=True)
    cfg = loaded.config.get_text_config()
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (BOS_ID, EOS_ID, PAD_ID)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (BOS_ID, EOS_ID, PAD_ID)
    assert cfg.vocab_size >= BYTE_VOCAB_SIZE


@pytest.mark.parametrize("family", FAMILIES)
def test_same_seed_same_bytes_other_seed_differs(family: str, tmp_path: Path) -> None:
    a = make_model("tiny", family, tmp_path / "a", seed=7)
    b = make_model("tiny", family, tmp_path / "b", seed=7)
    c = make_model("tiny", family, tmp_path / "c", seed=8)
    weights = [(d / "model.safetensors").read_bytes() for d in (a, b, c)]
    assert weights[0] == weights[1]
    assert weights[0] != weights[2]


def test_building_leaves_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_model("tiny", "nemotron_h", seed=5)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_are_well_separated(family: str) -> None:
    model = build_model("tiny", family, seed=11)
    with torch.no_grad():
        logits = model(input_ids=_prompt(16, seed=2)).logits[0]
    stds = logits[:, :BYTE_VOCAB_SIZE].std(dim=-1)
    assert bool((stds >= MIN_LOGIT_STD).all())
    assert float(stds.mean()) > 0.5 * LOGIT_STD
    top2 = logits.topk(2, dim=-1).values
    assert float((top2[:, 0] - top2[:, 1]).min()) > 1e-4
    assert bool((logits.argmax(dim=-1) < BYTE_VOCAB_SIZE).all())
    assert bool((logits[:, BYTE_VOCAB_SIZE:] == 0).all())  # unused ids: logit exactly 0


def test_tiny_shape() -> None:
    cfg = preset_config("tiny", "nemotron_h")
    assert cfg.layers_block_type.count("full_attention") == 2
    assert len(cfg.layers_block_type) == 8
    assert (cfg.hidden_size, cfg.vocab_size, cfg.n_groups, cfg.chunk_size) == (64, 512, 2, 16)
    assert cfg.mamba_num_heads * cfg.mamba_head_dim == 128
    bamba = preset_config("tiny", "bamba")
    assert len(bamba.attn_layer_indices) == 2
    assert bamba.rope_parameters["partial_rotary_factor"] == 0.5


@pytest.mark.parametrize("family", FAMILIES)
def test_small_parameter_count_and_tp2_divisibility(family: str) -> None:
    assert 40e6 * FEWEST.get(family, 1.0) <= count_parameters("small", family) <= 60e6
    cfg = preset_config("small", family).get_text_config()
    if family in ("nemotron_h", "nemotron_h_moe"):
        heads = (cfg.mamba_num_heads, cfg.n_groups)
    elif family == "zamba2":
        heads = (cfg.n_mamba_heads, cfg.mamba_ngroups, cfg.intermediate_size)
    elif family == "jamba":  # Mamba-1 splits d_inner
        heads = (cfg.mamba_expand * cfg.hidden_size, cfg.intermediate_size)
    elif family in QWEN_FAMILIES or family == "olmo_hybrid":
        heads = (cfg.linear_num_key_heads, cfg.linear_num_value_heads)
    elif family in (*LFM2_FAMILIES, "lfm3"):
        heads = (cfg.hidden_size,)  # the short convs' channels
    elif family == "mamba2":  # no attention heads at all
        heads = (cfg.num_heads, cfg.n_groups)
    elif family in PURE_SSM_FAMILIES:  # Mamba-1 splits d_inner
        heads = (cfg.intermediate_size,)
    elif family == "recurrent_gemma":  # RG-LRU gate blocks and channels
        heads = (cfg.num_attention_heads, cfg.lru_width)
    elif family in ("kimi_linear", "bailing_hybrid"):  # KDA heads, expert and MLP widths
        heads = (cfg.linear_num_heads, cfg.moe_intermediate_size, cfg.intermediate_size)
    elif family == "minimax":
        heads = ()  # lightning attention splits the attention heads
    elif family == "xlstm":  # no attention: the mLSTM heads and the feed-forward width
        heads = (cfg.num_heads, round_up(cfg.hidden_size * cfg.ffn_proj_factor, 64))
    else:
        heads = (cfg.mamba_n_heads, cfg.mamba_n_groups)
    if family not in (*PURE_SSM_FAMILIES, "xlstm"):
        heads = (cfg.num_attention_heads, cfg.num_key_value_heads, *heads)
    for value in heads:
        assert value % 2 == 0


def test_paper_shape_counted_on_meta_only(tmp_path: Path) -> None:
    cfg = preset_config("paper-7b-shape", "nemotron_h")
    types = cfg.layers_block_type
    counts = {t: types.count(t) for t in set(types)}
    assert counts == {"full_attention": 4, "linear_attention": 24, "mlp": 28}
    assert (cfg.hidden_size, cfg.ssm_state_size) == (4096, 128)
    for family in FAMILIES:
        # a mixture of experts holds more weights than it runs: 9.2e9 for the Qwen MoEs;
        # LFM2's short conv holds 4 D^2 weights where a Mamba-2 holds ~6 D^2: 5.8e9
        most = 10e9 if family in MOE else 8e9
        assert 6e9 * FEWEST.get(family, 1.0) <= count_parameters("paper-7b-shape", family) <= most
    with pytest.raises(ValueError, match="allow_large"):
        make_model("paper-7b-shape", "nemotron_h", tmp_path / "big")
    assert not (tmp_path / "big").exists()


def test_presets_registry_is_immutable() -> None:
    with pytest.raises(TypeError):
        PRESETS["x"] = PRESETS["tiny"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"preset": "huge"}, "huge"),
        ({"family": "llama"}, "llama"),
        ({"dtype": "int8"}, "int8"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_arguments_name_the_value(
    kwargs: dict[str, object], needle: str, tmp_path: Path
) -> None:
    args: dict[str, object] = {"preset": "tiny", "family": "bamba", **kwargs}
    with pytest.raises(ValueError, match=needle):
        make_model(args.pop("preset"), args.pop("family"), tmp_path / "m", **args)  # type: ignore[arg-type]
    assert not (tmp_path / "m").exists()


def test_out_dir_rules(tmp_path: Path) -> None:
    out = tmp_path / "m"
    make_model("tiny", "nemotron_h", out)
    make_model("tiny", "bamba", out)  # a previous output is replaced
    assert json.loads((out / "marconi.json").read_text())["family"] == "bamba"
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="overwrite"):
        make_model("tiny", "bamba", other)
    make_model("tiny", "bamba", other, overwrite=True)
    assert (other / "notes.txt").read_text() == "keep me"
    assert (other / "model.safetensors").is_file()
