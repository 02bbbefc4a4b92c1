"""`marconi-ray serve`: parsing and validation paths (exit 2 before Ray starts), help text."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from marconi_ray.cli import serve as serve_cmd
from marconi_ray.cli.main import build_parser, main
from marconi_ray.protocol.speculative import SpeculativeConfig
from marconi_ray.serve.config import default_config, load_serve_config
from marconi_ray.serve.settings import ServeSettings, TunerSettings


def _fail(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("marconi-ray: error: ") and err.count("\n") == 1
    return err


def test_bad_config_key_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text("model: tiny\nreplicaz: 2\n")
    err = _fail([str(path)], capsys)
    assert "replicaz" in err and str(path) in err


def test_bad_nested_key_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text("tuner:\n  workerz: 2\n")
    assert "tuner.workerz" in _fail([str(path)], capsys)


def test_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "missing.yaml" in _fail([str(tmp_path / "missing.yaml")], capsys)


@pytest.mark.parametrize(
    ("flags", "key"),
    [
        (["--port", "70000"], "port"),
        (["--tp", "0"], "tp"),
        (["--replicas", "0"], "replicas"),
        (["--coordinators", "0"], "coordinators"),
        (["--cache-bytes", "-5"], "cache_bytes"),
        (["--cache-bytes", "lots"], "cache_bytes"),
        (["--host-cache-bytes", "-5"], "host_cache_bytes"),
        (["--host-cache-bytes", "lots"], "host_cache_bytes"),
        (["--system", "foo"], "--system"),
        (["--port", "eighty"], "--port"),
        (["--model", "no-such-model"], "no-such-model"),
    ],
)
def test_bad_flags_exit_2(
    flags: list[str], key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert key in _fail(flags, capsys)


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text("port: 9000\nreplicas: 3\nmodel: small\n")
    args = build_parser().parse_args(
        [
            "serve",
            str(path),
            "--port",
            "9100",
            "--cache-bytes",
            "2e9",
            "--host-cache-bytes",
            "8e9",
            "--model",
            "tiny:bamba",
            "--coordinators",
            "2",
        ]
    )
    config = serve_cmd.load_config(args)
    assert (config.port, config.replicas, config.cache_bytes) == (9100, 3, 2 * 10**9)
    assert config.coordinators == 2 and config.to_settings(tmp_path).coordinators == 2
    assert config.host_cache_bytes == 8 * 10**9
    assert (config.model, config.model_name) == ("tiny:bamba", "tiny:bamba")
    defaults = serve_cmd.load_config(
        argparse.Namespace(
            config=None,
            **dict.fromkeys(("model", "port", "host", "tp", "replicas", "system", "cache_bytes")),
        )
    )
    assert defaults == default_config()


def test_help_mentions_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    for option in (
        "CONFIG.yaml",
        "--model",
        "--port",
        "--host",
        "--tp",
        "--replicas",
        "--coordinators",
        "--system",
        "--cache-bytes",
        "--host-cache-bytes",
    ):
        assert option in out
    assert main(["--help"]) == 0
    assert "serve" in capsys.readouterr().out


def test_help_does_not_import_torch_or_ray() -> None:
    import subprocess

    code = (
        "import sys; from marconi_ray.cli.main import main; main(['serve', '--help']); "
        "sys.exit(bool({'torch', 'ray'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_client_examples_and_cpu_count() -> None:
    settings = ServeSettings(
        model_dir="/m",
        model_name="tiny",
        host="0.0.0.0",
        port=8123,
        replicas=2,
        tp=2,
        tuner=TunerSettings(workers=3),
    )
    text = serve_cmd.client_examples(settings)
    assert "http://127.0.0.1:8123/v1" in text
    assert "curl http://127.0.0.1:8123/v1/chat/completions" in text
    assert '"model": "tiny"' in text and "OpenAI(base_url=" in text
    assert serve_cmd.cpus_needed(settings) == 1 + 2 * 3 + 1 + 3


@pytest.mark.ray
def test_a_local_ray_started_by_serve_keeps_token_auth_and_an_owner_only_token() -> None:
    """Token auth is on (Ray's default, which the test suite's conftest turns off for
    speed: the child gets a clean environment) and the token file is its owner's only
    (Ray writes it 0644)."""
    import json as _json
    import os
    import subprocess

    code = (
        "import json, os, ray\n"
        "from marconi_ray.cli.serve import _init_ray\n"
        "from marconi_ray.serve.settings import ServeSettings\n"
        "from ray._private.authentication.authentication_utils import is_token_auth_enabled\n"
        "assert _init_ray(ServeSettings(model_dir='unused', model_name='tiny'))\n"
        "mode = os.stat(os.path.expanduser('~/.ray/auth_token')).st_mode & 0o777\n"
        "print(json.dumps([is_token_auth_enabled(), mode]))\n"
        "ray.shutdown()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    auth, mode = _json.loads(done.stdout.strip().splitlines()[-1])
    assert auth is True and mode == 0o600


def test_speculative_flags_and_config_reach_the_settings(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        ["serve", "--speculative", "ngram", "--num-speculative-tokens", "3"]
    )
    config = serve_cmd.load_config(args)
    assert config.speculative is not None and config.speculative.num_speculative_tokens == 3
    assert config.to_settings().speculative == SpeculativeConfig("ngram", 3)
    assert serve_cmd.load_config(build_parser().parse_args(["serve"])).speculative is None
    with pytest.raises(ValueError, match="needs --speculative"):
        serve_cmd.load_config(build_parser().parse_args(["serve", "--num-speculative-tokens", "2"]))
    path = tmp_path / "serve.yaml"
    path.write_text("speculative: {num_speculative_tokens: 0}\n")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        load_serve_config(path)
    path.write_text("speculative: {prompt_lookup_min: 5, prompt_lookup_max: 2}\n")
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        load_serve_config(path)


def test_speculative_mtp_in_the_config(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text("speculative: {method: mtp, num_speculative_tokens: 2}\n")
    assert load_serve_config(path).to_settings().speculative == SpeculativeConfig("mtp", 2)
    path.write_text("speculative: {method: eagle}\n")
    with pytest.raises(ValueError, match="ngram, mtp, draft:MODEL"):
        load_serve_config(path)
