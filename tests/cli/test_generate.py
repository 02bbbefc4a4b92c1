"""`marconi-ray generate`: a multi-turn chat whose later turns are served from the cache."""

from __future__ import annotations

import json

import pytest

from marconi_kernels import OPS
from marconi_ray.cli.main import main
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.engine.presets.mtp_weights import add_mtp_weights


def test_generate_multi_turn_reuses_history(tmp_path, capsys):
    model = make_model("tiny", "bamba", tmp_path / "m")
    argv = ["generate", "--model", str(model), "--prompt", "Hi!", "--prompt", "More?"]
    assert main([*argv, "--max-tokens", "5", "--json"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert [r["turn"] for r in lines] == [1, 2]
    assert lines[0]["cached_tokens"] == 0
    first_total = lines[0]["prompt_tokens"] + lines[0]["completion_tokens"]
    assert lines[1]["cached_tokens"] == first_total


def test_generate_bad_model_dir_exits_2(tmp_path, capsys):
    assert main(["generate", "--model", str(tmp_path / "none"), "--prompt", "x"]) == 2
    assert "config.json" in capsys.readouterr().err


@pytest.mark.triton
@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_5"])
def test_generate_triton_json_equals_ref_and_names_every_op(tmp_path, capsys, family):
    """`--kernels triton --json` (under TRITON_INTERPRET=1 without a GPU) gives the same
    tokens as `--kernels ref`, and each line names triton for every kernel op (the Gated
    DeltaNet prefill and step included)."""
    model = make_model("tiny", family, tmp_path / "m")
    argv = ["generate", "--model", str(model), "--prompt", "Hi!", "--prompt", "More?"]
    runs = {}
    for kernels in ("ref", "triton"):
        assert main([*argv, "--max-tokens", "6", "--json", "--kernels", kernels]) == 0
        out = capsys.readouterr().out
        runs[kernels] = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert [r["token_ids"] for r in runs["triton"]] == [r["token_ids"] for r in runs["ref"]]
    assert all(len(r["token_ids"]) == r["completion_tokens"] for r in runs["triton"])
    assert runs["triton"][1]["cached_tokens"] > 0
    for record in runs["triton"]:
        assert record["kernels"] == "triton"
        assert set(record["backends"]) == set(OPS)
        assert all(b.startswith("triton:") for b in record["backends"].values())
    assert set(runs["ref"][0]["backends"].values()) == {"ref"}


def test_generate_triton_without_a_way_to_run_it_fails_loudly(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    model = make_model("tiny", "nemotron_h", tmp_path / "m")
    argv = ["generate", "--model", str(model), "--prompt", "Hi!", "--kernels", "triton"]
    assert main(argv) == 2
    assert "'triton' is unavailable on cpu" in capsys.readouterr().err


def test_generate_speculative_keeps_the_tokens_and_reports_spec(capsys):
    """`--speculative ngram` on the packaged chat model: the same greedy replies, token
    ids and cached tokens as without it, and `spec` (drafted, kept) on every turn."""
    argv = ["generate", "--model", "chat", "--prompt", "the cat sat on the mat " * 3,
            "--prompt", "again", "--max-tokens", "16", "--json"]  # fmt: skip
    runs = []
    for extra in ([], ["--speculative", "ngram", "--num-speculative-tokens", "3"]):
        assert main([*argv, *extra]) == 0
        out = capsys.readouterr().out
        runs.append([json.loads(x) for x in out.splitlines() if x.startswith("{")])
    plain, spec = runs
    keys = ("reply", "token_ids", "cached_tokens")
    assert [[t[k] for k in keys] for t in spec] == [[t[k] for k in keys] for t in plain]
    assert all("spec" not in t for t in plain)
    assert sum(t["spec"]["drafted"] for t in spec) > 0
    assert all(0 <= t["spec"]["accepted"] <= t["spec"]["drafted"] for t in spec)
    assert main([*argv, "--speculative", "ngram", "--num-speculative-tokens", "0"]) == 2
    assert "num_speculative_tokens" in capsys.readouterr().err


def test_generate_speculative_mtp(tmp_path, capsys):
    """`--speculative mtp` drafts with the checkpoint's own MTP layers: the same greedy
    token ids as without; a model without MTP layers (the packaged chat model) is a
    usage error naming what it lacks."""
    model = add_mtp_weights(make_model("tiny", "qwen3_next", tmp_path / "q"))
    argv = ["generate", "--model", str(model), "--prompt", "Hello there", "--prompt", "more",
            "--max-tokens", "12", "--json"]  # fmt: skip
    runs = []
    for extra in ([], ["--speculative", "mtp", "--num-speculative-tokens", "2"]):
        assert main([*argv, *extra]) == 0
        out = capsys.readouterr().out
        runs.append([json.loads(x) for x in out.splitlines() if x.startswith("{")])
    plain, spec = runs
    assert [t["token_ids"] for t in spec] == [t["token_ids"] for t in plain]
    assert sum(t["spec"]["drafted"] for t in spec) > 0
    assert main(["generate", "--model", "chat", "--prompt", "Hi", "--speculative", "mtp"]) == 2
    assert "no multi-token-prediction layers" in capsys.readouterr().err
