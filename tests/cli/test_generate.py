"""`marconi-ray generate`: a multi-turn chat whose later turns are served from the cache."""

from __future__ import annotations

import json

from marconi_ray.cli.main import main
from marconi_ray.engine.factory import make_model


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
