"""The partition's range rules, one test per rule, without a server."""

from __future__ import annotations

import pytest

from pyspark_jetstream.source.read.range_tracker import RangeTracker, Step


def test_messages_in_order_are_taken_and_advance_by_their_sequence_gap():
    r = RangeTracker(10, 20, now=0.0)
    assert r.on_message(10, 1, pending=5, now=1.0) == (Step.TAKE, 1)
    # Sequences 11 and 12 were deleted or filtered out: the range advances by 3.
    assert r.on_message(13, 2, pending=4, now=2.0) == (Step.TAKE, 3)
    assert (r.last_sseq, r.last_dseq, r.next_seq, r.last_progress) == (13, 2, 14, 2.0)


def test_a_consumer_sequence_gap_asks_for_a_new_consumer_from_the_last_taken_plus_one():
    r = RangeTracker(1, 100, now=0.0)
    r.on_message(1, 1, pending=9, now=0.0)
    assert r.on_message(5, 3, pending=9, now=1.0) == (Step.GAP, 0)  # delivery 2 was lost
    assert (r.last_sseq, r.last_dseq, r.next_seq) == (1, 1, 2)  # nothing of the gap was taken
    r.consumer_created()  # the new consumer numbers from 1 again
    assert r.on_message(2, 1, pending=9, now=2.0) == (Step.TAKE, 1)


def test_the_last_sequence_of_the_range_completes_it():
    r = RangeTracker(1, 3, now=0.0)
    r.on_message(1, 1, pending=9, now=0.0)
    r.on_message(2, 2, pending=9, now=0.0)
    assert not r.complete
    assert r.on_message(3, 3, pending=9, now=0.0) == (Step.TAKE_LAST, 1)
    assert r.complete


def test_a_sequence_past_the_range_ends_it_without_taking_the_message():
    r = RangeTracker(1, 3, now=0.0)
    r.on_message(1, 1, pending=9, now=0.0)
    assert r.on_message(7, 2, pending=9, now=5.0) == (Step.PAST_END, 0)
    assert r.last_sseq == 1 and r.last_progress == 0.0


def test_nothing_pending_before_the_range_end_means_drained():
    r = RangeTracker(1, 10, now=0.0)
    assert r.on_message(4, 1, pending=0, now=0.0) == (Step.TAKE_DRAINED, 4)
    assert not r.complete


def test_the_last_sequence_wins_over_nothing_pending():
    r = RangeTracker(1, 4, now=0.0)
    assert r.on_message(4, 1, pending=0, now=0.0) == (Step.TAKE_LAST, 4)


def test_stall_after_max_wait_without_progress_and_a_reconnect_restarts_the_clock():
    r = RangeTracker(1, 10, now=0.0)
    assert not r.stalled(5.0, max_wait=5.0) and r.stalled(5.1, max_wait=5.0)
    r.on_message(1, 1, pending=1, now=5.0)
    assert not r.stalled(9.0, max_wait=5.0)
    r.touch(20.0)
    assert not r.stalled(24.0, max_wait=5.0) and r.stalled(25.5, max_wait=5.0)


@pytest.mark.parametrize("start, delivered, expected", [
    (10, 9, None),  # started where asked (delivered.stream_seq is one below the start)
    (10, None, None),  # no delivered state reported
    (10, 4, None),  # started below (never reported as loss)
    (10, 14, (10, 14, 15)),  # the head 10..14 was removed: it starts at 15
    (10, 99, (10, 20, 100)),  # everything of the range (..20) was removed
])
def test_a_consumer_started_past_its_start_names_the_lost_sequences(start, delivered, expected):
    assert RangeTracker(10, 20, now=0.0).lost_range(start, delivered) == expected


def test_skipping_lost_sequences_moves_the_range_on():
    r = RangeTracker(10, 20, now=0.0)
    assert r.skip_to(14) == 5 and r.next_seq == 15 and not r.complete
    assert r.skip_to(12) == 0 and r.next_seq == 15  # never backwards
    assert r.skip_to(20) == 6 and r.complete


def test_a_recreated_snapshot_consumer_delivers_its_set_again_and_what_was_taken_is_skipped():
    """lastPerSubject: the last message of each subject comes in sequence order (3, 7, 9 here); a new
    consumer after a gap delivers the set from its start again: 3 and 7 are skipped, 9 is taken."""
    r = RangeTracker(1, 10, 0.0)
    assert r.on_message(3, 1, 2, 1.0) == (Step.TAKE, 3)
    assert r.on_message(7, 2, 1, 1.0) == (Step.TAKE, 4)
    r.consumer_created()
    assert r.on_message(3, 1, 2, 2.0) == (Step.TAKEN_BEFORE, 0)
    assert r.on_message(7, 2, 1, 2.0) == (Step.TAKEN_BEFORE, 0)
    assert r.on_message(9, 3, 0, 2.0) == (Step.TAKE_DRAINED, 2)
    assert r.last_sseq == 9
