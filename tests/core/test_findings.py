"""`core.cache.findings`: a cache setting that does nothing for a model is named at start,
with its values; a setting that works is silent."""

from __future__ import annotations

from marconi_ray.core.cache.findings import FINDING_CODES, PROBE_TOKENS, find
from marconi_ray.core.cache.host_tier import NO_HOST_TIER, HostTier
from marconi_ray.core.cache.systems import get_system
from marconi_ray.core.model.cost_model import CostModel

COST = CostModel(flops_linear=2e6, flops_quadratic=1e3, kv_bytes_per_token=512, state_bytes=33_792)
ENTRY = COST.state_bytes + COST.kv_bytes(PROBE_TOKENS)


def _codes(**kw: object) -> list[str]:
    args: dict[str, object] = {
        "cost": COST,
        "system": get_system("marconi"),
        "capacity_bytes": 10**8,
        "host": NO_HOST_TIER,
        "context_limit": 2048,
        **kw,
    }
    return [f.code for f in find(**args)]  # type: ignore[arg-type]


def test_a_working_setting_finds_nothing() -> None:
    assert _codes() == []
    assert _codes(system=get_system("vllm+")) == []
    assert _codes(host=HostTier(10**8, placement="lru")) == []
    assert _codes(alpha=1.5) == []  # marconi weighs FLOPs


def test_a_budget_below_one_state_and_its_kv_is_named_with_the_bytes_it_needs() -> None:
    assert _codes(capacity_bytes=ENTRY) == []
    (finding,) = find(COST, get_system("marconi"), ENTRY - 1, NO_HOST_TIER, 2048)
    assert finding.code == "budget_below_one_entry"
    assert f"{ENTRY - 1:,}" in finding.message and f"{ENTRY:,}" in finding.message
    short = find(COST, get_system("marconi"), COST.state_bytes + 512 * 10, NO_HOST_TIER, 10)
    assert short == (), "a context shorter than the probe is probed at its length"


def test_vanilla_caches_nothing_and_an_lru_system_ignores_alpha() -> None:
    assert _codes(system=get_system("vanilla")) == ["caches_nothing"]
    assert _codes(system=get_system("sglang+"), alpha=2.0) == ["alpha_ignored"]


def test_a_host_tier_that_flop_aware_placement_never_uses_is_named() -> None:
    """Prefill slow next to the copy (a CPU's TFLOP/s) pays for copies; prefill fast next
    to the copy (GPU-like TFLOP/s over a slow link) makes no cached turn worth it."""
    cpu = HostTier(10**8, gbps=50.0, prefill_tflops=0.05)
    assert _codes(host=cpu) == []
    fast = HostTier(10**8, gbps=0.001, prefill_tflops=4000.0)
    (finding,) = find(COST, get_system("marconi"), 10**8, fast, 2048)
    assert finding.code == "host_tier_unused" and "2048 tokens" in finding.message
    assert _codes(host=HostTier(10**8, gbps=0.001, prefill_tflops=4000.0, placement="lru")) == []


def test_the_host_check_covers_every_depth_between_its_ends() -> None:
    """Worth a copy at some depth <=> worth it at the shortest or the longest turn (the
    saving minus the cost is convex in the depth): checked depth by depth."""
    outcomes = set()
    for tflops in (1.0, 20.0, 60.0, 200.0, 4000.0):
        for gbps in (0.01, 1.0, 50.0):
            host = HostTier(10**8, gbps=gbps, prefill_tflops=tflops)
            some = any(
                host.worth_demoting(COST.total_flops(n), COST.state_bytes + COST.kv_bytes(n))
                for n in range(1, 2049)
            )
            assert (_codes(host=host) == []) == some, (tflops, gbps)
            outcomes.add(some)
    assert outcomes == {True, False}


def test_every_code_is_listed() -> None:
    codes = set(_codes(system=get_system("vanilla"), capacity_bytes=1, alpha=1.0))
    fast = HostTier(10**8, gbps=0.001, prefill_tflops=4000.0)
    codes |= set(_codes(host=fast))
    codes |= set(_codes(host=HostTier(0, placement="lru"), alpha=1.0, tuner_set=("grid",)))
    assert codes == set(FINDING_CODES)


def test_host_settings_without_a_host_tier_are_named_as_ignored() -> None:
    """Placement, bandwidth or prefill clock set while host_cache_bytes is 0 do nothing;
    their defaults, or a tier with a budget, say nothing."""
    assert _codes(host=HostTier(0)) == []
    (finding,) = find(COST, get_system("marconi"), 10**8, HostTier(0, placement="lru"), 2048)
    assert finding.code == "host_settings_ignored"
    assert "host_placement 'lru'" in finding.message and "host_cache_bytes is 0" in finding.message
    both = find(COST, get_system("marconi"), 10**8, HostTier(0, gbps=3.0, prefill_tflops=7.0), 2048)
    assert [f.code for f in both] == ["host_settings_ignored"]
    assert "host_gbps 3.0" in both[0].message and "prefill_tflops 7.0" in both[0].message
    assert _codes(host=HostTier(10**8, gbps=50.0, prefill_tflops=0.05, placement="lru")) == []


def test_tuner_options_with_nothing_to_tune_are_named_as_ignored() -> None:
    """Tuner options count only when marconi tunes alpha (alpha unset, FLOP-aware
    eviction); a fixed alpha or an LRU system makes them do nothing."""
    assert _codes(tuner_set=("grid",)) == []
    fixed = find(COST, get_system("marconi"), 10**8, NO_HOST_TIER, 2048, 1.0, ("grid",))
    assert [f.code for f in fixed] == ["tuner_ignored"] and "alpha is fixed at 1.0" in fixed[
        0
    ].message
    lru = find(COST, get_system("sglang+"), 10**8, NO_HOST_TIER, 2048, None, ("multiplier",))
    assert [f.code for f in lru] == ["tuner_ignored"] and "'sglang+' evicts by" in lru[0].message
    assert set(FINDING_CODES) >= {"host_settings_ignored", "tuner_ignored"}
