"""The partitions a read is cut into (source/plan/partitions.py), without a server: sequence ranges padded
to the partition count, an open last range, a split by subject, and failOnDataLoss on the driver."""

from __future__ import annotations

import pickle

import pytest

from pyspark_jetstream.errors import DataLossError, StreamRecreatedError
from pyspark_jetstream.options import parse_source_options
from pyspark_jetstream.source.plan.offsets import StreamBounds
from pyspark_jetstream.source.plan.partitions import (
    JetStreamPartition,
    check_loss,
    check_recreated,
    plan_partitions,
)
from pyspark_jetstream.source.plan.subject_split import ALL

BOUNDS = StreamBounds(first_seq=1, last_seq=10, created="t0", max_age=5.0)


def options(**more: str):
    return parse_source_options({"servers": "nats://127.0.0.1:4222", "stream": "S", "numPartitions": "4",
                                 **more}, streaming=True)


def test_sequence_ranges_are_padded_to_the_partition_count():
    parts = plan_partitions(options(), 0, 2, BOUNDS)
    assert [(p.index, p.first, p.last, p.count) for p in parts] == [(0, 1, 1, 4), (1, 2, 2, 4), (2, 3, 2, 4),
                                                                   (3, 3, 2, 4)]
    assert all(p.created == "t0" and p.max_age == 5.0 and p.split is None for p in parts)


def test_without_an_end_the_last_range_reads_on_and_only_the_first_starts_from_earliest():
    parts = plan_partitions(options(), 0, None, BOUNDS, from_earliest=True)
    assert [(p.first, p.last) for p in parts] == [(1, 3), (4, 6), (7, 8), (9, None)]
    assert [p.from_earliest for p in parts] == [True, False, False, False]


def test_a_split_by_subject_reads_the_whole_range_in_every_partition():
    parts = plan_partitions(options(), 2, 8, BOUNDS, depth=None)
    assert [(p.first, p.last, p.split) for p in parts] == [(3, 8, (None, 4))] * 4
    one = plan_partitions(options(), 2, 8, BOUNDS, depth=ALL, snapshot=True)
    assert [(p.index, p.last_per_subject, p.split) for p in one] == [(0, True, (ALL, 1))]


def test_an_empty_range_plans_nothing():
    assert plan_partitions(options(), 8, 8, BOUNDS) == []


def test_removed_sequences_fail_or_are_skipped_per_fail_on_data_loss():
    bounds = StreamBounds(first_seq=6, last_seq=10)
    with pytest.raises(DataLossError, match=r"sequences 3\.\.5 were removed"):
        check_loss(options(), 2, 10, bounds)
    assert check_loss(options(failOnDataLoss="false"), 2, 10, bounds) == 5
    assert check_loss(options(), 5, 10, bounds) == 5  # nothing lost
    parts = plan_partitions(options(failOnDataLoss="false"), 2, 10, bounds, 1)
    assert [(p.first, p.last) for p in parts] == [(6, 10)]


def test_a_recreated_stream_fails_or_goes_on_per_fail_on_data_loss(caplog):
    offset = {"stream": "S", "seq": 7, "created": "t-old"}
    with pytest.raises(StreamRecreatedError):
        check_recreated(options(), offset, BOUNDS, "going on")
    check_recreated(options(failOnDataLoss="false"), offset, BOUNDS, "Reading the new stream from sequence 1")
    assert "Reading the new stream from sequence 1 (failOnDataLoss=false)." in caplog.text


def test_a_partition_pickles_as_it_is():
    part = JetStreamPartition("S", 1, 3, None, "t0", 5.0, True, (None, 4), False, 4, keys=("a",), up_to=9)
    assert pickle.loads(pickle.dumps(part)) == part
