"""Serve config: defaults, YAML, errors naming the key, model resolution (presets, folders)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from marconi_ray.core.cache.tuner import default_grid
from marconi_ray.engine.presets.model_presets import BUILD_VERSION, FAMILIES
from marconi_ray.serve.config import (
    API_KEY_ENV,
    ServeConfig,
    config_from_mapping,
    default_config,
    load_serve_config,
)
from marconi_ray.serve.model_source import (
    MODELS_DIR_ENV,
    default_models_root,
    parse_preset_spec,
    resolve_model,
)
from marconi_ray.serve.settings import ServeSettings, TunerSettings

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "configs" / "serve-tiny.yaml"


@pytest.fixture(scope="module")
def models_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One preset root shared by the tests of this module (the tiny model builds once)."""
    return tmp_path_factory.mktemp("models")


def test_defaults() -> None:
    c = default_config()
    assert (c.model, c.model_name, c.tp, c.replicas) == ("tiny", "tiny", 1, 1)
    assert (c.cache_bytes, c.system, c.alpha) == (10**9, "marconi", "auto")
    assert (c.host, c.port, c.dtype, c.device, c.max_batch) == (
        "127.0.0.1",
        8000,
        "float32",
        "cpu",
        8,
    )
    assert c.kernels == "auto"
    assert c.tuner.grid == list(default_grid()) and c.tuner.workers >= 1
    assert c.tuner.retune_every is None
    assert (c.max_body_bytes, c.redis_url) == (1_048_576, None)
    with pytest.raises(ValueError):
        c.tp = 2  # type: ignore[misc]  # frozen


def test_every_field_has_a_description() -> None:
    for model in (ServeConfig, ServeConfig.model_fields["tuner"].annotation):
        assert model is not None
        for name, field in model.model_fields.items():  # type: ignore[union-attr]
            assert field.description, name


def test_yaml_round_trip(tmp_path: Path) -> None:
    c = config_from_mapping(
        {"model": "tiny:bamba", "tp": 2, "replicas": 3, "alpha": 0.5, "system": "sglang+"}
    )
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(c.model_dump()))
    assert load_serve_config(path) == c
    assert c.model_name == "tiny:bamba"


def test_example_config_loads_and_lists_every_key() -> None:
    c = load_serve_config(EXAMPLE)
    assert c == default_config()
    raw = yaml.safe_load(EXAMPLE.read_text())
    assert set(raw) == set(ServeConfig.model_fields)
    assert set(raw["tuner"]) == set(type(c.tuner).model_fields)


def test_empty_file_means_defaults_and_overrides_apply(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_serve_config(path) == default_config()
    c = load_serve_config(path, {"port": 9000, "model": "small"})
    assert (c.port, c.model_name) == (9000, "small")


def test_cache_bytes_accepts_floats_and_numeric_strings() -> None:
    assert config_from_mapping({"cache_bytes": "1e9"}).cache_bytes == 10**9
    assert config_from_mapping({"kv_memory_bytes": "4e9"}).kv_memory_bytes == 4 * 10**9
    assert config_from_mapping({"cache_bytes": 2.5e8}).cache_bytes == 250_000_000
    assert config_from_mapping({"cache_bytes": 12345}).cache_bytes == 12345


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"bogus": 1}, "bogus"),
        ({"tuner": {"bogus_knob": 1}}, "tuner.bogus_knob"),
        ({"tp": 0}, "tp"),
        ({"replicas": 0}, "replicas"),
        ({"port": 70000}, "port"),
        ({"alpha": "fast"}, "alpha"),
        ({"alpha": -1}, "alpha"),
        ({"system": "foo"}, "system"),
        ({"cache_bytes": -1}, "cache_bytes"),
        ({"cache_bytes": "lots"}, "cache_bytes"),
        ({"dtype": "int8"}, "dtype"),
        ({"device": "tpu"}, "device"),
        ({"kernels": "cuda"}, "kernels"),
        ({"max_batch": 0}, "max_batch"),
        ({"route_load_weight": -1}, "route_load_weight"),
        ({"tuner": {"grid": []}}, "tuner.grid"),
        ({"tuner": {"grid": [0.1, -0.5]}}, "tuner.grid"),
        ({"tuner": {"workers": 0}}, "tuner.workers"),
        ({"tuner": {"multiplier": 0}}, "tuner.multiplier"),
        ({"tuner": {"retune_every": 0}}, "tuner.retune_every"),
        ({"api_key": ""}, "api_key"),
        ({"api_key": "two words"}, "api_key"),
        ({"max_body_bytes": 1023}, "max_body_bytes"),
        ({"max_body_bytes": "big"}, "max_body_bytes"),
        ({"redis_url": "http://localhost:6379"}, "redis_url"),
        ({"redis_url": "redis://"}, "redis_url"),
        ({"kv_memory_bytes": 0}, "kv_memory_bytes"),
        ({"kv_memory_bytes": "much"}, "kv_memory_bytes"),
        ({"kv_memory_fraction": 1.5}, "kv_memory_fraction"),
        ({"kv_memory_fraction": 0.9}, "kv_memory_fraction"),  # needs device cuda
        ({"kv_memory_bytes": 10**9, "max_running_tokens": 100}, "kv_memory_bytes"),
        ({"cuda_graphs": "yes"}, "cuda_graphs"),
        ({"cuda_graphs": "on"}, "cuda_graphs"),  # needs device cuda
    ],
)
def test_bad_values_name_the_key(data: dict[str, Any], key: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=rf"(^|[ ']){key}[:']") as direct:
        config_from_mapping(data)
    assert "\n" not in str(direct.value)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=re.escape(str(path))) as loaded:
        load_serve_config(path)
    assert key in str(loaded.value)


def test_unknown_key_lists_valid_keys() -> None:
    with pytest.raises(ValueError, match=r"unknown key 'tuner\.bogus'.*workers"):
        config_from_mapping({"tuner": {"bogus": 1}})
    with pytest.raises(ValueError, match=r"unknown key 'modle'.*model"):
        config_from_mapping({"modle": "tiny"})


def test_missing_file_and_non_mapping_yaml(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(FileNotFoundError, match=r"nope\.yaml"):
        load_serve_config(missing)
    listing = tmp_path / "list.yaml"
    listing.write_text("- model\n- tiny\n")
    with pytest.raises(ValueError, match="mapping"):
        load_serve_config(listing)
    broken = tmp_path / "broken.yaml"
    broken.write_text("model: [tiny\n")
    with pytest.raises(ValueError, match=r"broken\.yaml"):
        load_serve_config(broken)


def test_preset_builds_once_then_is_reused(models_root: Path) -> None:
    folder = resolve_model("tiny", models_root)
    assert folder == (models_root / "tiny-nemotron_h").resolve()
    assert (folder / "config.json").is_file() and (folder / "marconi.json").is_file()
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert resolve_model("tiny:nemotron_h", models_root) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    assert not [p for p in models_root.iterdir() if p.name.startswith(".")]  # no leftovers


def test_half_written_preset_is_rebuilt(tmp_path: Path, models_root: Path) -> None:
    built = resolve_model("tiny", models_root)
    half = tmp_path / "tiny-nemotron_h"
    shutil.copytree(built, half)
    (half / "marconi.json").unlink()
    (half / "model.safetensors").write_bytes(b"truncated")
    folder = resolve_model("tiny", tmp_path)
    assert folder == half.resolve()
    assert json.loads((folder / "marconi.json").read_text())["preset"] == "tiny"
    assert (folder / "model.safetensors").read_bytes() == (built / "model.safetensors").read_bytes()


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_is_a_servable_preset(family: str) -> None:
    """`serve --model tiny:FAMILY` names a preset for every make-model family (each builds
    and is served by the engine in tests/engine), and the config keeps the name."""
    assert parse_preset_spec(f"tiny:{family}") == ("tiny", family)
    assert config_from_mapping({"model": f"tiny:{family}"}).model_name == f"tiny:{family}"


def test_tiny_bamba(models_root: Path) -> None:
    folder = resolve_model("tiny:bamba", models_root)
    assert folder.name == "tiny-bamba"
    assert json.loads((folder / "config.json").read_text())["model_type"] == "bamba"


def test_tiny_nemotron_h_moe_is_a_nemotron_h_checkpoint_with_moe_layers(
    models_root: Path,
) -> None:
    """A preset variant: its own folder, saved as model_type nemotron_h with `moe` layers."""
    folder = resolve_model("tiny:nemotron_h_moe", models_root)
    assert folder.name == "tiny-nemotron_h_moe"
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "nemotron_h" and "moe" in config["layers_block_type"]


def test_existing_folder_is_used_as_is(models_root: Path) -> None:
    built = resolve_model("tiny", models_root)
    assert resolve_model(str(built)) == built
    c = config_from_mapping({"model": str(built)})
    assert c.model_name == "tiny-nemotron_h"
    assert c.to_settings().model_dir == str(built)


def test_to_settings(models_root: Path) -> None:
    c = config_from_mapping({"replicas": 2, "tuner": {"grid": [0, 1], "workers": 3}})
    s = c.to_settings(models_root)
    assert isinstance(s, ServeSettings)
    assert s.model_dir == str(resolve_model("tiny", models_root))
    assert (s.model_name, s.replicas, s.alpha, s.cache_bytes) == ("tiny", 2, None, 10**9)
    assert s.tuner == TunerSettings(multiplier=5, grid=(0.0, 1.0), retune_every=None, workers=3)
    fixed = config_from_mapping({"alpha": 0.7, "model_name": "my-model"}).to_settings(models_root)
    assert (fixed.alpha, fixed.model_name) == (0.7, "my-model")
    triton = config_from_mapping({"kernels": "triton"}).to_settings(models_root)
    assert (s.kernels, triton.kernels) == ("auto", "triton")


def test_security_keys(monkeypatch: pytest.MonkeyPatch, models_root: Path) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert default_config().api_key is None
    c = config_from_mapping(
        {"api_key": "sk-abc", "max_body_bytes": "64e3", "redis_url": "rediss://h:6380/2"}
    )
    s = c.to_settings(models_root)
    assert (s.api_key, s.max_body_bytes, s.redis_url) == ("sk-abc", 64_000, "rediss://h:6380/2")
    assert "sk-abc" not in repr(c) and "sk-abc" not in repr(s)
    monkeypatch.setenv(API_KEY_ENV, "sk-env")
    assert default_config().api_key == "sk-env"
    assert load_serve_config(EXAMPLE).api_key == "sk-env"  # the example's api_key is null
    assert "sk-env" not in repr(default_config().to_settings(models_root))


def test_models_root_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(MODELS_DIR_ENV, str(tmp_path / "elsewhere"))
    assert default_models_root() == tmp_path / "elsewhere"
    monkeypatch.delenv(MODELS_DIR_ENV)
    assert default_models_root() == Path.home() / ".cache" / "marconi_ray" / "models"


def test_unknown_spec_lists_presets(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"'huge-model'.*\['small', 'tiny'\]"):
        resolve_model("huge-model", tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"config\.json"):
        resolve_model(str(empty), tmp_path)
    with pytest.raises(ValueError, match="'llama'"):
        resolve_model("tiny:llama", tmp_path)
    assert list(tmp_path.iterdir()) == [empty]


def test_paper_7b_shape_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"paper-7b-shape.*too large"):
        resolve_model("paper-7b-shape", tmp_path)
    with pytest.raises(ValueError, match="paper-7b-shape"):
        config_from_mapping({"model": "paper-7b-shape:bamba"}).to_settings(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_preset_from_an_older_build_is_rebuilt(tmp_path: Path, models_root: Path) -> None:
    """A cached preset whose record has another build version (weights made by older code)
    is rebuilt, so users never serve a stale preset after an upgrade."""
    built = resolve_model("tiny", models_root)
    old = tmp_path / "tiny-nemotron_h"
    shutil.copytree(built, old)
    record = json.loads((old / "marconi.json").read_text())
    (old / "marconi.json").write_text(json.dumps({**record, "build_version": 1}))
    (old / "model.safetensors").write_bytes(b"old weights")
    folder = resolve_model("tiny", tmp_path)
    assert json.loads((folder / "marconi.json").read_text())["build_version"] == BUILD_VERSION
    assert BUILD_VERSION > 1
    assert (folder / "model.safetensors").read_bytes() == (built / "model.safetensors").read_bytes()


def test_replica_resources_follow_the_worker() -> None:
    """With tp 1 the worker runs in the replica actor: on CUDA that actor holds the GPU
    (else Ray hides every device from it); with tp > 1 the shard actors hold them."""
    from marconi_ray.serve.replica.deployment import replica_resources, shard_bundles

    base = ServeSettings(model_dir="m", model_name="m")
    gpu1 = ServeSettings(model_dir="m", model_name="m", device="cuda")
    gpu2 = ServeSettings(model_dir="m", model_name="m", device="cuda", tp=2)
    assert replica_resources(base) == {"num_cpus": 1.0} and shard_bundles(base) == [{"CPU": 1.0}]
    assert replica_resources(gpu1) == {"num_cpus": 1.0, "num_gpus": 1.0}
    assert shard_bundles(gpu1) == [{"CPU": 1.0, "GPU": 1.0}]
    assert replica_resources(gpu2) == {"num_cpus": 1.0}
    assert shard_bundles(gpu2) == [{"CPU": 1.0}, {"CPU": 1.0, "GPU": 1.0}, {"CPU": 1.0, "GPU": 1.0}]


def test_stream_interval_is_a_count_of_tokens_from_one() -> None:
    assert config_from_mapping({}).stream_interval == 1
    assert config_from_mapping({"stream_interval": 8}).stream_interval == 8
    for bad in (0, -2, "x"):
        with pytest.raises(ValueError, match="stream_interval"):
            config_from_mapping({"stream_interval": bad})
