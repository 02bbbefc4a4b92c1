"""`StallWatch`: notices that the coordinator's own process stood still.

A paused process (SIGSTOP, a VM freeze, a swap storm) cannot hear heartbeats: when it
resumes, the replicas' beats of the pause still wait in its queue, and judging silence
by its own stalled clock would drop healthy replicas. A daemon thread ticks every
`interval_s` of monotonic time; a tick that comes more than `threshold_s` after the one
before means the whole process stood still (a call that merely runs long does not stop
the thread: the interpreter switches threads every few milliseconds). `take` tells the
coordinator, once per stall, so it can count every replica as heard from and every lease
as renewed at the moment it resumed.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable


class StallWatch:
    """Stalls of this process, seen by a ticking thread (see the module docstring).

    Args:
        threshold_s: a gap between ticks longer than this is a stall.
        interval_s: how often the thread ticks (well below `threshold_s`).
        start: run the thread (tests tick by hand instead; a hand-ticked watch judges
            only the gaps between its ticks, not the one still open at `take`).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        threshold_s: float,
        interval_s: float,
        start: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < interval_s < threshold_s:
            raise ValueError(
                f"interval_s must be in (0, threshold_s={threshold_s}), got {interval_s}"
            )
        self.threshold_s = threshold_s
        self.interval_s = interval_s
        self.stalls = 0
        """Stalls seen so far."""
        self.longest_s = 0.0
        """The longest gap seen between two ticks."""
        self.clock = clock
        self._threaded = start
        self._last = clock()
        self._unseen = False
        self._lock = threading.Lock()
        if start:
            ref = weakref.ref(self)
            threading.Thread(target=_ticks, args=(ref, interval_s), daemon=True).start()

    def tick(self, now: float | None = None) -> None:
        """One tick at monotonic time `now` (default: the current time)."""
        now = self.clock() if now is None else now
        with self._lock:
            self._close_gap(now)

    def _close_gap(self, now: float) -> None:
        """End the gap since the last tick at `now` (the caller holds the lock)."""
        gap = now - self._last
        self._last = now
        self.longest_s = max(self.longest_s, gap)
        if gap > self.threshold_s:
            self.stalls += 1
            self._unseen = True

    def take(self) -> bool:
        """Whether a stall happened since the last `take` (it is reported once),
        counting, on a threaded watch, the gap still open since the last tick."""
        with self._lock:
            now = self.clock()
            if self._threaded and now - self._last > self.threshold_s:
                self._close_gap(now)
            unseen, self._unseen = self._unseen, False
            return unseen


def _ticks(ref: weakref.ref[StallWatch], interval_s: float) -> None:
    """The thread: tick until the watch is gone (it holds no strong reference)."""
    while True:
        time.sleep(interval_s)
        watch = ref()
        if watch is None:
            return
        watch.tick()
        del watch
