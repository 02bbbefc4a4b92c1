"""`benchmarks/compare_systems.py` (what `marconi-loadgen compare` runs): its arguments,
their validation, and the deployment settings and simulator run of each system. The live
comparison itself is in test_integration_service.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from marconi_ray.serve.settings import ServeSettings, TunerSettings

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "compare_systems.py"
sys.path.insert(0, str(SCRIPT.parent))
import compare_systems  # noqa: E402


def _parser():
    return compare_systems.build_parser("marconi-loadgen compare")


def test_sim_config_matches_the_deployment():
    tuner = TunerSettings(multiplier=3, grid=(0.0, 1.0), retune_every=50)
    s = ServeSettings(model_dir="m", model_name="m", cache_bytes=123, system="marconi", tuner=tuner)
    cfg = compare_systems.sim_config(s)
    assert (cfg.system, cfg.cache_bytes, cfg.alpha) == ("marconi", 123, None)
    assert (cfg.tuner.multiplier, cfg.tuner.grid, cfg.tuner.retune_every) == (3, (0.0, 1.0), 50)
    fixed = compare_systems.sim_config(ServeSettings("m", "m", system="vllm+", alpha=0.5))
    assert (fixed.system, fixed.alpha) == ("vllm+", 0.5)


# ---------------------------------------------------------------- arguments
def test_help_covers_every_option():
    parser = _parser()
    for action in parser._actions:
        assert action.help, action.option_strings


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--systems", "vanilla,lmcache"], "'lmcache'"),
        (["--systems", "marconi,marconi"], "marconi"),
        (["--systems", " , "], "--systems"),
        (["--cache-bytes", "0"], "--cache-bytes must be >= 1, got 0"),
        (["--tp", "0"], "--tp must be >= 1, got 0"),
        (["--port", "70000"], "--port must be <= 65535, got 70000"),
        (["--session-rate", "0"], "session_rate must be finite and > 0, got 0.0"),
        (["--session-rate", "none"], "concurrency"),
        (["--sessions", "0"], "sessions must be >= 1, got 0"),
        (["--max-output", "0"], "max_output must be >= 1, got 0"),
        (["--think", "sometimes"], "sometimes"),
        (["--burstiness", "-1"], "burstiness must be finite and > 0, got -1.0"),
        (["--model", "no-such-model"], "'no-such-model'"),
    ],
)
def test_bad_arguments_exit_2_naming_the_value(argv, needle, tmp_path, capsys):
    args = _parser().parse_args(["--out", str(tmp_path), *argv])
    assert args.func is compare_systems.run
    with pytest.raises(ValueError, match=r"."):
        compare_systems.validate(args)
    assert compare_systems.run(args) == 2
    err = capsys.readouterr().err
    assert needle in err and err.startswith("marconi-loadgen compare: error:")
    assert not any(tmp_path.iterdir())


def test_validate_builds_one_load_config(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 512}))
    argv = ["--out", str(tmp_path / "o"), "--model", str(model), "--port", "8123"]
    argv += ["--systems", "vanilla,marconi", "--cache-bytes", "3e8", "--session-rate", "0.25"]
    argv += ["--think", "exp:2", "--slo-ttft-ms", "500", "--max-output", "16"]
    cfg = compare_systems.validate(_parser().parse_args(argv))
    assert cfg.systems == ("vanilla", "marconi") and cfg.cache_bytes == 300_000_000
    load = cfg.load
    assert (load.url, load.prompt_mode, load.vocab_size, load.history) == (
        "http://127.0.0.1:8123",
        "tokens",
        512,
        "live",
    )
    assert (load.session_rate, load.think, load.slo_ttft_ms, load.max_output) == (
        0.25,
        "exp:2",
        500.0,
        16,
    )
    s = compare_systems.settings_for(cfg, "vllm+")
    assert (s.system, s.app_name, s.port, s.cache_bytes) == ("vllm+", "cmp-vllm+", 8123, 3 * 10**8)


def test_config_doc_is_everything_but_the_folder(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 512}))
    cfg = compare_systems.validate(_parser().parse_args(["--out", "o", "--model", str(model)]))
    doc = compare_systems.config_doc(cfg)
    assert set(doc) == {"model", "systems", "cache_bytes", "tp", "port", "max_batch", "load"}
    assert doc["load"]["vocab_size"] == 512 and doc["systems"] == cfg.systems
    json.dumps(doc)


def test_the_script_runs_on_its_own(tmp_path):
    """`python benchmarks/compare_systems.py`: its own name in usage and errors."""
    env_free = {k: v for k, v in os.environ.items() if k != compare_systems.PROG_ENV}
    help_ = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, env=env_free
    )
    assert help_.returncode == 0 and help_.stdout.startswith("usage: compare_systems.py")
    bad = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path), "--tp", "0"],
        capture_output=True,
        text=True,
        env=env_free,
    )
    assert bad.returncode == 2
    assert bad.stderr.startswith("compare_systems.py: error: --tp must be >= 1, got 0")
