"""`StallWatch`: a stall is reported once, and a threaded watch reports it even before
its thread has ticked again (the race the paused-coordinator fault test hit: the main
thread ran a queued call before the ticking thread woke, and dropped healthy replicas)."""

from __future__ import annotations

import pytest

from marconi_ray.serve.coordinator.stall_watch import StallWatch


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_hand_ticked_watch_judges_the_gaps_between_ticks():
    clock = FakeClock()
    watch = StallWatch(1.0, 0.25, start=False, clock=clock)
    watch.tick(100.5)
    assert not watch.take()
    clock.now = 200.0  # no tick: a hand-ticked watch does not judge the open gap
    assert not watch.take()
    watch.tick(102.0)
    assert watch.take() and watch.stalls == 1 and watch.longest_s == pytest.approx(1.5)
    assert not watch.take()


def test_a_threaded_watch_counts_the_gap_still_open_at_take():
    clock = FakeClock()
    # the thread sleeps 30 s of real time before its first tick: it never ticks here
    watch = StallWatch(60.0, 30.0, clock=clock)
    assert not watch.take()
    clock.now += 59.0
    assert not watch.take()
    clock.now += 2.0  # 61 s since the last tick, the thread has not woken
    assert watch.take() and watch.stalls == 1 and watch.longest_s == pytest.approx(61.0)
    assert not watch.take()
    watch.tick()  # the thread's late tick sees no second stall
    assert watch.stalls == 1 and not watch.take()


def test_the_interval_must_be_below_the_threshold():
    with pytest.raises(ValueError, match="interval_s"):
        StallWatch(1.0, 1.0, start=False)
