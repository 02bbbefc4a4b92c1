"""`host_cache_bytes`: validated at the config boundary, carried to the coordinator's caches,
and refused at start when a node's free memory cannot hold it (`serve.host_memory`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from marconi_ray.protocol.ops import Register
from marconi_ray.serve import host_memory
from marconi_ray.serve.config import config_from_mapping
from marconi_ray.serve.coordinator.cache_state import CacheState
from marconi_ray.serve.host_memory import (
    check_host_memory,
    check_this_node,
    mem_available,
    model_node_ids,
)
from marconi_ray.serve.replica.shard import ShardActor
from marconi_ray.serve.settings import ServeSettings

HUGE = 10**18


def settings(**kw: Any) -> ServeSettings:
    return ServeSettings(model_dir="/nonexistent", model_name="tiny", **kw)


@pytest.mark.parametrize("value", [-1, "lots", True, float("nan"), [1]])
def test_bad_host_cache_bytes_is_named(value: object) -> None:
    with pytest.raises(ValueError, match=r"host_cache_bytes: ") as info:
        config_from_mapping({"host_cache_bytes": value})
    assert "\n" not in str(info.value)


def test_host_cache_bytes_accepts_byte_counts_like_cache_bytes() -> None:
    assert config_from_mapping({}).host_cache_bytes == 0
    assert config_from_mapping({"host_cache_bytes": "8e9"}).host_cache_bytes == 8 * 10**9
    assert config_from_mapping({"host_cache_bytes": 2.5e8}).host_cache_bytes == 250_000_000
    assert config_from_mapping({"host_cache_bytes": 12345}).host_cache_bytes == 12345


@pytest.mark.parametrize("value", [-1, 1.5, True, "1e9"])
def test_settings_refuse_a_bad_host_budget(value: object) -> None:
    with pytest.raises(ValueError, match="host_cache_bytes must be an integer >= 0"):
        settings(host_cache_bytes=value)


def test_the_coordinator_gives_each_cache_the_host_tier() -> None:
    for host, expected in ((0, 0), (5000, 5000)):
        state = CacheState(
            settings(host_cache_bytes=host), (1.0, 1.0), 1024, lambda: 0.0, lambda *_: None
        )
        state.apply(Register("r0", 10, 100, 1))
        config = state.planners["r0"].cache.config
        assert config.host.capacity_bytes == expected
    assert settings().host_tier is None
    tier = settings(host_cache_bytes=7).host_tier
    assert tier is not None and tier.capacity_bytes == 7


def test_mem_available_reads_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16384 kB\nMemFree:  1 kB\nMemAvailable:    8192 kB\n")
    assert mem_available(meminfo) == 8192 * 1024
    meminfo.write_text("MemTotal:       16384 kB\n")
    assert mem_available(meminfo) is None
    assert mem_available(tmp_path / "absent") is None
    real = mem_available()
    assert real is None or real > 0


def test_check_names_both_numbers() -> None:
    check_host_memory(1000, 2, 2000, "n1")  # fits exactly
    with pytest.raises(ValueError) as one:
        check_host_memory(3000, 1, 2000, "n1")
    assert str(one.value) == (
        "host_cache_bytes=3000 exceeds the 2000 bytes of free memory (MemAvailable) on node n1"
    )
    with pytest.raises(ValueError) as two:
        check_host_memory(1500, 2, 2000, "n1")
    assert "host_cache_bytes=1500 x 2 ranks = 3000 bytes exceeds the 2000 bytes" in str(two.value)


def test_this_node_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_memory, "mem_available", lambda: 4096)
    check_this_node(0, 4)  # no host tier: nothing to check
    check_this_node(1024, 4)
    with pytest.raises(ValueError, match=r"x 4 ranks = 8192 bytes exceeds the 4096 bytes"):
        check_this_node(2048, 4)
    monkeypatch.setattr(host_memory, "mem_available", lambda: None)
    check_this_node(HUGE, 1)  # unknown free memory: skipped (logged)


def test_a_shard_refuses_before_loading_anything() -> None:
    """The check comes first: the model folder does not exist, the process group of a
    2-rank replica is never joined (it would wait for the other rank)."""
    shard = ShardActor(0, 2)
    with pytest.raises(ValueError, match=rf"host_cache_bytes={HUGE} x 2 ranks") as info:
        shard.setup("/nonexistent", "tcp://127.0.0.1:1", "float32", "cpu", 4, host_cache_bytes=HUGE)
    assert f"{2 * HUGE} bytes exceeds the " in str(info.value)
    assert shard.worker is None


def test_model_nodes_follow_the_placement() -> None:
    nodes = [
        {"NodeID": "head", "Alive": True, "Resources": {"CPU": 4.0}},
        {"NodeID": "gpu", "Alive": True, "Resources": {"CPU": 8.0, "GPU": 4.0, "m": 2.0}},
        {"NodeID": "dead", "Alive": False, "Resources": {"CPU": 8.0, "GPU": 4.0, "m": 2.0}},
        {"NodeID": "cpu", "Alive": True, "Resources": {"CPU": 8.0, "m": 1.0}},
    ]
    assert model_node_ids(nodes, None, False) == ["head", "gpu", "cpu"]
    assert model_node_ids(nodes, "m", False) == ["gpu", "cpu"]
    assert model_node_ids(nodes, "m", True) == ["gpu"]
    assert model_node_ids(nodes, "x", False) == []


def test_placement_and_clock_reach_the_caches_and_bad_ones_are_named() -> None:
    conf = config_from_mapping(
        {"host_cache_bytes": 5000, "host_placement": "lru", "host_gbps": 25, "prefill_tflops": 1}
    )
    tier = ServeSettings(
        model_dir="/x",
        model_name="t",
        **{
            k: getattr(conf, k)
            for k in ("host_cache_bytes", "host_placement", "host_gbps", "prefill_tflops")
        },
    ).host_tier
    assert tier is not None and (tier.placement, tier.gbps, tier.prefill_tflops) == ("lru", 25, 1)
    for key, value in (("host_placement", "mru"), ("host_gbps", 0), ("prefill_tflops", -1)):
        with pytest.raises(ValueError, match=f"{key}: "):
            config_from_mapping({key: value})
    with pytest.raises(ValueError, match="unknown placement 'mru'"):
        settings(host_cache_bytes=1, host_placement="mru")
