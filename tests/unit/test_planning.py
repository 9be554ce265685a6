"""Offset planning: initial offsets, read limits, splitting, data loss."""

import pytest

from pyspark_jetstream.errors import DataLossError, JetStreamConnectorError, StreamRecreatedError
from pyspark_jetstream.source.plan.offsets import (
    BACKWARDS,
    RECREATED,
    SeqRange,
    StreamBounds,
    end_seq,
    identity_change,
    initial_seq,
    last_seq_at_or_before,
    lost_range,
    make_offset,
    offset_partitions,
    offset_seq,
    restart_seq,
    split_range,
    waits_for_more,
)

B = StreamBounds(first_seq=10, last_seq=100)


@pytest.mark.parametrize(
    "mode, kw, expected",
    [
        ("earliest", {}, 9), ("latest", {}, 100), ("sequence", {"sequence": 42}, 41), ("sequence", {"sequence": 1}, 0),
        ("timestamp", {"timestamp_seq": 50}, 49), ("timestamp", {"timestamp_seq": None}, 100),
    ],
)
def test_initial_offsets(mode, kw, expected):
    assert initial_seq(mode, B, **kw) == expected


def test_earliest_of_a_new_empty_stream():
    assert initial_seq("earliest", StreamBounds(0, 0)) == 0
    # After a purge the server reports first = last + 1.
    assert initial_seq("earliest", StreamBounds(101, 100)) == 100


@pytest.mark.parametrize(
    "start, latest, limit, expected",
    [(0, 100, None, 100), (0, 100, 30, 30), (90, 100, 30, 100), (100, 100, 5, 100), (100, 90, None, 100)],
)
def test_end_honours_read_limits(start, latest, limit, expected):
    assert end_seq(start, latest, limit) == expected


@pytest.mark.parametrize("start, end, n", [(0, 100, 3), (5, 6, 4), (0, 7, 7), (0, 3, 8), (10, 1010, 1), (0, 1_000_001, 16)])
def test_split_is_contiguous_non_empty_and_bounded(start, end, n):
    ranges = split_range(start, end, n)
    assert 1 <= len(ranges) <= n
    assert ranges[0].first == start + 1 and ranges[-1].last == end
    for a, b in zip(ranges, ranges[1:], strict=False):
        assert b.first == a.last + 1
    assert all(r.length >= 1 for r in ranges)
    assert max(r.length for r in ranges) - min(r.length for r in ranges) <= 1
    assert [r.index for r in ranges] == list(range(len(ranges)))


def test_empty_range_gives_no_partition():
    assert split_range(50, 50, 4) == []
    assert split_range(50, 40, 4) == []
    assert split_range(0, 1, 4) == [SeqRange(0, 1, 1)]


@pytest.mark.parametrize(
    "start, end, first, expected",
    [(0, 100, 1, None), (0, 100, 10, (1, 9)), (20, 100, 10, None), (9, 100, 10, None), (0, 5, 10, (1, 5)),
     (50, 50, 100, None)],
)
def test_lost_range(start, end, first, expected):
    assert lost_range(start, end, StreamBounds(first, 200)) == expected


def test_data_loss_message_names_stream_range_and_option():
    text = str(DataLossError("ORDERS", 1, 9, 10))
    assert "ORDERS" in text and "1..9" in text and "failOnDataLoss" in text


def test_offsets_are_tied_to_their_stream():
    assert offset_seq(make_offset("S", 5), "S") == 5
    with pytest.raises(JetStreamConnectorError, match="new checkpointLocation"):
        offset_seq(make_offset("OTHER", 5), "S")


def test_the_split_is_recorded_with_the_offset_and_read_back():
    offset = make_offset("S", 50, 3)
    assert offset == {"stream": "S", "seq": 50, "partitions": 3}
    assert offset_partitions(offset, default=8) == 3  # a replay splits as the first attempt did
    assert offset_partitions(make_offset("S", 50), default=8) == 8  # an offset from before the count was recorded
    assert offset_partitions({"stream": "S", "seq": 1, "partitions": 0}, default=2) == 2


T1, T2 = "2026-11-23T10:00:00.000000001Z", "2026-11-23T11:00:00.5Z"


@pytest.mark.parametrize(
    "offset, bounds, change",
    [
        (make_offset("S", 100, 2, T1), StreamBounds(1, 130, T1), None),  # the same stream, grown
        (make_offset("S", 100, 2, T1), StreamBounds(50, 100, T1), None),  # the same stream, head purged
        (make_offset("S", 100, 2, T1), StreamBounds(1, 30, T2), RECREATED),  # recreated: fewer messages
        (make_offset("S", 100, 2, T1), StreamBounds(1, 500, T2), RECREATED),  # recreated: already past the offset
        (make_offset("S", 100, 2, T1), StreamBounds(1, 30, None), None),  # no identity to compare (never here)
        (make_offset("S", 100), StreamBounds(1, 30, T2), BACKWARDS),  # an offset of an earlier release
        (make_offset("S", 100), StreamBounds(1, 100, T2), None),
        (make_offset("S", 100), StreamBounds(1, 500, T2), None),  # a recreation it cannot see
    ],
)
def test_identity_change(offset, bounds, change):
    assert identity_change(offset, bounds) == change


def test_a_recreated_stream_is_read_from_its_first_sequence():
    assert restart_seq(StreamBounds(1, 30, T2)) == 0
    assert restart_seq(StreamBounds(7, 30, T2)) == 6
    assert restart_seq(StreamBounds(0, 0, T2)) == 0  # empty


def test_recreated_error_says_what_happened_and_what_to_do():
    text = str(StreamRecreatedError("RC", 100, T1, 30, T2))
    assert "stream 'RC'" in text and "deleted and created again" in text and T1 in text and T2 in text
    assert "failOnDataLoss" in text and "checkpointLocation" in text
    backwards = str(StreamRecreatedError("RC", 100, None, 30, T2))
    assert "sequence went backwards" in backwards and "sequence 100" in backwards and "ends at 30" in backwards
    assert isinstance(StreamRecreatedError("RC", 1, None, 0, None), DataLossError)


@pytest.mark.parametrize("available, min_rows, since, delay, waits", [
    (5, None, 0.0, 900.0, False),  # no minimum: never waits
    (5, 10, 0.0, 900.0, True),  # fewer than the minimum, the delay not passed
    (10, 10, 0.0, 900.0, False),  # the minimum reached
    (5, 10, 900.0, 900.0, False),  # the delay passed: a smaller batch goes
    (0, 10, 0.0, 900.0, False),  # nothing new: nothing to wait for
])
def test_min_messages_per_trigger_waits_like_kafkas_min_offsets(available, min_rows, since, delay, waits):
    assert waits_for_more(available, min_rows, since, delay) is waits


def test_ending_timestamp_ends_before_the_first_message_after_it():
    assert last_seq_at_or_before(51, B) == 50
    assert last_seq_at_or_before(None, B) == 100  # nothing after the time: the stream's last
    assert last_seq_at_or_before(1, StreamBounds(1, 5)) == 0  # everything is after it: an empty read
