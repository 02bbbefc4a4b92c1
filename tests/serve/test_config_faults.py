"""Config of the fault-tolerance settings: the journal's Redis URL (also from the
environment the cluster launchers set), leases and heartbeats."""

from __future__ import annotations

from pathlib import Path

import pytest

from marconi_ray.serve.config import ServeConfig, load_serve_config, redis_url_from_env


def test_redis_url_from_env_variants(tmp_path: Path):
    assert redis_url_from_env({}) is None
    assert redis_url_from_env({"MARCONI_REDIS_URL": "redis://h:1/0"}) == "redis://h:1/0"
    assert redis_url_from_env({"MARCONI_REDIS_HOST": "10.0.0.5"}) == "redis://10.0.0.5:6379/0"
    secret = tmp_path / "pass"
    secret.write_text("p@ss/word\n")
    env = {
        "MARCONI_REDIS_HOST": "10.0.0.5",
        "MARCONI_REDIS_PORT": "6380",
        "MARCONI_REDIS_PASSWORD_FILE": str(secret),
    }
    assert redis_url_from_env(env) == "redis://:p%40ss%2Fword@10.0.0.5:6380/0"
    env["MARCONI_REDIS_PASSWORD"] = "direct"
    assert redis_url_from_env(env) == "redis://:direct@10.0.0.5:6380/0"


def test_config_reads_the_redis_url_from_env_and_never_echoes_it(monkeypatch):
    monkeypatch.setenv("MARCONI_REDIS_URL", "redis://:hunter2@127.0.0.1:6380/0")
    cfg = ServeConfig()
    assert cfg.redis_url == "redis://:hunter2@127.0.0.1:6380/0"
    assert "hunter2" not in repr(cfg) and "hunter2" not in repr(cfg.to_settings())
    explicit = ServeConfig(redis_url="redis://127.0.0.1:7000/1")
    assert explicit.redis_url == "redis://127.0.0.1:7000/1"


def test_lease_heartbeat_and_snapshot_settings(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("MARCONI_REDIS_URL", raising=False)
    monkeypatch.delenv("MARCONI_REDIS_HOST", raising=False)
    path = tmp_path / "c.yaml"
    path.write_text("lease_s: 12\nheartbeat_s: 0.5\nsnapshot_every: 100\n")
    settings = load_serve_config(path).to_settings(tmp_path / "models")
    assert (settings.lease_s, settings.heartbeat_s, settings.snapshot_every) == (12, 0.5, 100)
    path.write_text("lease_s: 2\nheartbeat_s: 1\n")
    with pytest.raises(ValueError, match="heartbeat_s"):
        load_serve_config(path)
    path.write_text("lease_s: 3\nheartbeat_s: 1\ncommit_relay_s: 2\n")
    with pytest.raises(ValueError, match="commit_relay_s"):
        load_serve_config(path)
    path.write_text("snapshot_every: 0\n")
    with pytest.raises(ValueError, match="snapshot_every"):
        load_serve_config(path)
