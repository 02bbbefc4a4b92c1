"""`marconi-ray make-model`, run in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from marconi_ray.cli.main import main


def test_make_model_tiny(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tiny"
    code = main(["make-model", "--preset", "tiny", "--family", "nemotron_h", "--out", str(out)])
    assert code == 0
    for name in ("config.json", "model.safetensors", "tokenizer.json", "marconi.json"):
        assert (out / name).is_file()
    record = json.loads((out / "marconi.json").read_text())
    assert record["family"] == "nemotron_h"
    printed = capsys.readouterr().out
    assert str(out) in printed
    assert f"{record['num_parameters']:,}" in printed


@pytest.mark.parametrize(
    "argv",
    [
        ["--preset", "huge", "--family", "bamba"],
        ["--preset", "tiny", "--family", "llama"],
        ["--preset", "tiny", "--family", "bamba", "--dtype", "int8"],
        ["--preset", "paper-7b-shape", "--family", "bamba"],
    ],
)
def test_bad_input_exits_2(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m"
    assert main(["make-model", *argv, "--out", str(out)]) == 2
    assert "error" in capsys.readouterr().err
    assert not out.exists()


def test_help_lists_make_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "make-model" in capsys.readouterr().out
