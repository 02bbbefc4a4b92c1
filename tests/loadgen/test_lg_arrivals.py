"""Arrival process, think-time specs and the loopback host check."""

from __future__ import annotations

import numpy as np
import pytest

from loadgen.arrivals import ThinkTime, parse_think, session_start_times, trace_start_times
from loadgen.hosts import check_url


def _gaps(n: int, rate: float, burstiness: float, seed: int = 0) -> np.ndarray:
    starts = session_start_times(n, rate, burstiness, np.random.default_rng(seed))
    return np.diff(np.asarray(starts))


def test_poisson_mean_rate_and_cv():
    gaps = _gaps(20_001, rate=4.0, burstiness=1.0)
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential: CV 1


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_burstiness_keeps_mean_and_sets_variance(burstiness):
    gaps = _gaps(20_001, rate=2.0, burstiness=burstiness)
    assert gaps.mean() == pytest.approx(0.5, rel=0.05)
    # gamma(k, theta): var = k theta^2 with theta = mean / k, so CV^2 = 1 / k
    assert gaps.var() / gaps.mean() ** 2 == pytest.approx(1 / burstiness, rel=0.1)


def test_arrivals_start_at_zero_are_sorted_and_seeded():
    a = session_start_times(50, 3.0, 1.0, np.random.default_rng(7))
    b = session_start_times(50, 3.0, 1.0, np.random.default_rng(7))
    c = session_start_times(50, 3.0, 1.0, np.random.default_rng(8))
    assert a == b and a != c and a[0] == 0.0 and a == sorted(a) and len(a) == 50
    assert session_start_times(0, 1.0, 1.0, np.random.default_rng(0)) == []


@pytest.mark.parametrize(
    ("n", "rate", "burst", "word"), [(-1, 1, 1, "-1"), (3, 0, 1, "0"), (3, 1, -2, "-2")]
)
def test_bad_arrival_arguments_are_named(n, rate, burst, word):
    with pytest.raises(ValueError, match=word):
        session_start_times(n, rate, burst, np.random.default_rng(0))


def test_think_parsing_and_sampling():
    rng = np.random.default_rng(0)
    assert parse_think("trace") == ThinkTime("trace")
    assert parse_think("trace").sample(2.5, rng) == 2.5
    assert parse_think("trace").sample(-1.0, rng) == 0.0
    assert parse_think("fixed:1.5").sample(99.0, rng) == 1.5
    exp = parse_think("exp:2")
    samples = np.array([exp.sample(0.0, rng) for _ in range(20_000)])
    assert samples.min() >= 0 and samples.mean() == pytest.approx(2.0, rel=0.05)
    assert parse_think("exp:0").sample(0.0, rng) == 0.0


def test_think_sampling_is_seeded():
    exp = parse_think("exp:1")
    a = [exp.sample(0, np.random.default_rng(3)) for _ in range(3)]
    b = [exp.sample(0, np.random.default_rng(3)) for _ in range(3)]
    assert a == b


@pytest.mark.parametrize("spec", ["fixed", "fixed:", "fixed:abc", "exp:-1", "poisson:2", "", "x:1"])
def test_bad_think_spec_is_named(spec):
    with pytest.raises(ValueError, match="think spec"):
        parse_think(spec)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000", "http://localhost", "http://[::1]:9000/", "https://localhost"]
)
def test_loopback_hosts_pass(url):
    check_url(url)


def test_other_hosts_need_allow_host():
    with pytest.raises(ValueError, match=r"'example\.com'"):
        check_url("http://example.com:8000")
    assert check_url("http://example.com:8000", ("example.com",)) == "example.com"
    with pytest.raises(ValueError, match="ftp://x"):
        check_url("ftp://x")
    with pytest.raises(ValueError, match="no host"):
        check_url("http://")


def test_trace_arrivals_keep_the_trace_clock_scaled():
    assert trace_start_times([10.0, 10.5, 14.0], 1.0) == [0.0, 0.5, 4.0]
    assert trace_start_times([10.0, 10.5, 14.0], 0.25) == [0.0, 0.125, 1.0]
    assert trace_start_times([], 2.0) == []
    with pytest.raises(ValueError, match="time scale"):
        trace_start_times([1.0], 0.0)
