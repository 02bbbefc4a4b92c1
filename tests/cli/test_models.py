"""`marconi-ray models`, run in-process (configs only, meta device), and the derivations
behind it (`engine.presets.family_report`)."""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stdout
from typing import Any

import pytest

from marconi_kernels import get_kernels
from marconi_ray.cli.main import main
from marconi_ray.engine.model.from_hf import FAMILIES
from marconi_ray.engine.model.layers.attention import Attention
from marconi_ray.engine.model.layers.gated_deltanet import GatedDeltaNetMixer
from marconi_ray.engine.model.layers.mamba1 import Mamba1Mixer
from marconi_ray.engine.model.layers.mamba2 import Mamba2Mixer
from marconi_ray.engine.model.layers.moe import MoE
from marconi_ray.engine.presets.family_report import family_report, kernel_ops

CONV = ("causal_conv1d", "causal_conv1d_update", "causal_conv1d_varlen")


@pytest.fixture(scope="module")
def listing() -> dict[str, Any]:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["models", "--json", "--device", "cpu"]) == 0
    doc: dict[str, Any] = json.loads(out.getvalue())
    return doc


def test_json_lists_every_engine_family_with_its_mixers(listing: dict[str, Any]) -> None:
    assert (listing["device"], listing["kernel_set"]) == ("cpu", "ref")
    assert listing["auto_reason"] == "not a CUDA device"
    by = {f["family"]: f for f in listing["families"]}
    assert list(by) == list(FAMILIES)
    mixers = {name: [m["kind"] for m in f["mixers"]] for name, f in by.items()}
    assert mixers["nemotron_h"] == ["mamba2", "attention"]
    assert mixers["jamba"] == ["mamba1", "attention"]
    assert mixers["qwen3_next"] == ["gdn", "attention"]
    assert [m["kind"] for m in by["jamba"]["feed_forwards"]] == ["mlp", "moe"]
    assert all(f["tensor_parallel"] and not f["error"] for f in by.values())


def test_json_names_each_mixers_kernels_and_backends(listing: dict[str, Any]) -> None:
    by = {f["family"]: {m["kind"]: m for m in f["mixers"]} for f in listing["families"]}
    mamba2 = by["bamba"]["mamba2"]
    assert mamba2["engine_class"] == "Mamba2Mixer"
    assert mamba2["kernels"] == dict.fromkeys(
        ("ssd_chunk_scan", "ssd_chunk_scan_varlen", "mamba2_state_update", *CONV), "ref"
    )
    assert set(by["jamba"]["mamba1"]["kernels"]) == {
        "mamba1_state_update",
        "selective_scan",
        "selective_scan_varlen",
        *CONV,
    }
    assert set(by["qwen3_5"]["gdn"]["kernels"]) == {
        "gated_delta_chunk",
        "gated_delta_chunk_varlen",
        "gated_delta_step",
        *CONV,
    }
    assert by["nemotron_h"]["attention"]["kernels"] == dict.fromkeys(
        ("paged_decode_attention", "paged_prefill_attention"), "ref"
    )


def test_kernel_ops_are_read_from_the_mixer_sources() -> None:
    assert kernel_ops(Mamba2Mixer) == (
        "ssd_chunk_scan",
        "ssd_chunk_scan_varlen",
        "mamba2_state_update",
        *CONV,
    )
    assert kernel_ops(Mamba1Mixer) == (
        "mamba1_state_update",
        *CONV,
        "selective_scan",
        "selective_scan_varlen",
    )
    assert kernel_ops(GatedDeltaNetMixer) == (
        *CONV,
        "gated_delta_chunk",
        "gated_delta_chunk_varlen",
        "gated_delta_step",
    )
    assert kernel_ops(Attention) == ("paged_decode_attention", "paged_prefill_attention")
    assert kernel_ops(MoE) == ("grouped_matmul",)


def test_text_listing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "--device", "cpu", "--kernels", "ref"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("kernel set: ref on cpu\n")
    for family in FAMILIES:
        assert f"\n{family}  [reference: " in out
    assert re.search(r"mixer +mamba1 +Mamba1Mixer +.*selective_scan: ref", out)
    assert "tensor parallel: yes" in out


def test_unknown_family_is_reported_not_raised() -> None:
    report = family_report("not_a_model_type", get_kernels("cpu", "ref"))
    assert report.error and not report.mixers and not report.tensor_parallel


def test_unavailable_kernel_set_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert main(["models", "--device", "cpu", "--kernels", "triton"]) == 2
    assert "kernel set 'triton' is unavailable" in capsys.readouterr().err


def test_help_explains_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "models" in capsys.readouterr().out
    assert main(["models", "--help"]) == 0
    text = capsys.readouterr().out
    for option in ("--device", "--kernels", "--json", "ref", "triton"):
        assert option in text, option
