"""`marconi-ray explain`: text prompts through the packaged chat model's tokenizer, token
ids, JSON, and bad input (exit 2, one line)."""

from __future__ import annotations

import json

import pytest

from marconi_ray.cli.main import main


def test_text_prompts_with_the_packaged_model(capsys: pytest.CaptureFixture[str]) -> None:
    first = "You are a helpful assistant. Please tell me about bread."
    second = "You are a helpful assistant. Please tell me about cheese."
    assert main(["explain", first, second]) == 0
    out = capsys.readouterr().out
    assert "system marconi" in out and "reusable (a state at its end):     0 tokens" in out
    assert "(branch)" in out


def test_ids_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    first = ",".join(str(t) for t in range(7, 107))
    second = ",".join(str(t) for t in [*range(7, 67), *range(500, 540)])
    assert main(["explain", "--ids", "--json", "--system", "vllm+", first, second]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["cached_tokens"], got["reusable_tokens"]) == (60, 32)
    assert got["states"] == [{"depth": 32, "reason": "block"}]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["explain", "--ids", "1,x", "1"], "integers"),
        (["explain", "--ids", "1,2", ""], "second prompt is empty"),
        (["explain", "--system", "nope", "a", "b"], "nope"),
        (["explain", "--model", "no-such-model", "a", "b"], "no-such-model"),
    ],
)
def test_bad_input_exits_2_naming_it(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert named in capsys.readouterr().err
