"""`ReleaseLog` and `ReleaseCursor`: each entry taken once and in seq order, whatever the
carriers; acknowledgements trim the log only as far as the replica applied, and only
for its own generation."""

from __future__ import annotations

import numpy as np
import pytest

from marconi_ray.protocol.orders import Move, Release
from marconi_ray.protocol.release_log import ReleaseCursor, ReleaseLog


def _free(*states: int) -> Release:
    return Release(states)


def test_empty_releases_take_no_seq_and_entries_are_consecutive():
    log = ReleaseLog(generation=7)
    assert log.append(Release()) == 0
    assert log.append(_free(1)) == 1
    move = Release(moves=(Move(True, (2,), np.empty(0, np.int64)),))
    assert log.append(move) == 2  # a release that only moves is an entry too
    assert [e.seq for e in log.entries()] == [1, 2]
    log.check()


def test_a_cursor_takes_each_entry_once_in_order_whatever_carries_it():
    log = ReleaseLog(generation=7)
    log.append(_free(1))
    early = log.since()  # carried by a dispatch planned now
    log.append(_free(2))
    late = log.since()  # carried by one planned later, which arrives first
    cursor = ReleaseCursor(7)
    assert cursor.take(late).states == (1, 2) and cursor.applied == 2
    assert cursor.take(early).states == () and cursor.applied == 2  # nothing twice
    assert cursor.gap == ""


def test_a_cursor_ignores_another_generation_but_applies_direct_frees():
    log = ReleaseLog(generation=7)
    log.append(_free(1))
    cursor = ReleaseCursor(8)
    assert cursor.take(log.since(_free(9))).states == (9,) and cursor.applied == 0


def test_entries_that_do_not_follow_the_cursor_are_a_gap_and_are_not_taken():
    log = ReleaseLog(generation=7)
    log.append(_free(1))
    log.append(_free(2))
    log.ack(1)  # the coordinator thinks 1 was applied; this cursor never saw it
    cursor = ReleaseCursor(7)
    assert cursor.take(log.since(_free(5))).states == (5,)
    assert cursor.applied == 0 and "entries 1..1 never did" in cursor.gap


def test_acks_trim_only_what_was_applied_and_only_for_their_generation():
    log = ReleaseLog(generation=7)
    for s in (1, 2, 3):
        log.append(_free(s))
    log.ack(5)  # past the end: foreign, ignored
    log.ack(2, generation=6)  # another generation's figure: ignored
    assert log.acked == 0
    log.ack(2, generation=7)
    assert log.acked == 2 and [e.seq for e in log.since().entries] == [3]
    log.ack(1)  # stale: ignored
    assert log.acked == 2 and log.pending(2).states == (3,) and log.pending(3).states == ()
    log.check()


def test_restoring_entries_that_skip_a_seq_is_refused_and_changes_nothing():
    source = ReleaseLog(generation=2)
    for slot in (1, 2, 3):
        source.append(_free(slot))
    kept = source.entries()
    log = ReleaseLog(generation=2)
    log.restore(kept)
    with pytest.raises(ValueError, match="entry seq 3 where 2 follows acknowledged 0"):
        log.restore([kept[0], kept[2]])
    assert log.entries() == kept and log.last == 3
