"""The streaming reader's planning calls, without a server (the stream's facts stubbed): one STREAM.INFO
per micro-batch, and a replayed batch (planned before a restart) asks the server again."""

from __future__ import annotations

from pyspark_jetstream.options import parse_source_options
from pyspark_jetstream.source import spark_readers
from pyspark_jetstream.source.plan.offsets import StreamBounds
from pyspark_jetstream.spark_api import ReadAllAvailable


def test_one_stream_info_per_micro_batch(monkeypatch):
    asked = []

    def bounds(opts):
        asked.append(1)
        return StreamBounds(first_seq=1, last_seq=100 * len(asked), created="t0")

    monkeypatch.setattr(spark_readers, "stream_bounds", bounds)
    opts = parse_source_options({"stream": "S", "startingOffsets": "earliest", "numPartitions": "2"}, streaming=True)
    r = spark_readers.JetStreamStreamReader(opts)
    start = r.initialOffset()
    asked.clear()
    for _ in range(3):
        end = r.latestOffset(start, ReadAllAvailable())
        parts = r.partitions(start, end)
        assert [(p.first, p.last) for p in parts][-1][1] == end["seq"]
        start = end
    assert len(asked) == 3  # latestOffset asked; partitions used its answer
    # A batch planned before a restart (its end offset was not planned by this reader) asks again.
    replayed = {"stream": "S", "seq": 50, "partitions": 2, "created": "t0"}
    r.partitions({"stream": "S", "seq": 0, "partitions": 2, "created": "t0"}, replayed)
    assert len(asked) == 4


def test_the_split_is_recorded_with_the_offset_and_replayed_as_recorded(monkeypatch):
    monkeypatch.setattr(spark_readers, "stream_bounds", lambda opts: StreamBounds(first_seq=1, last_seq=40, created="t0",
                                                                      num_subjects=6))
    opts = parse_source_options({"stream": "S", "startingOffsets": "earliest", "numPartitions": "4",
                                 "split": "subject"}, streaming=True)
    r = spark_readers.JetStreamStreamReader(opts)
    start = r.initialOffset()
    end = r.latestOffset(start, ReadAllAvailable())
    assert end["split"] == "subject" and end["depth"] is None  # literal subjects: 6 fit one consumer each
    parts = r.partitions(start, end)
    assert [(p.index, p.first, p.last, p.split) for p in parts] == [(i, 1, 40, (None, 4)) for i in range(4)]
    assert r.latestOffset(end, ReadAllAvailable()) is end  # nothing new: the same offset, no batch planned
    # Offsets written before splits existed are read by sequence ranges, as then.
    old = {"stream": "S", "seq": 40, "partitions": 2, "created": "t0"}
    assert [(p.first, p.last, p.split) for p in r.partitions(start, old)] == [(1, 20, None), (21, 40, None)]
    # ... and an old snapshot batch by one partition.
    snap = dict(old, snapshot=True)
    assert [(p.index, p.last_per_subject, p.split) for p in r.partitions(start, snap)] == [(0, True, (0, 1))]
    # A recorded grouping wins over today's options.
    grouped = dict(end, depth=2, partitions=3)
    assert {p.split for p in r.partitions(start, grouped)} == {(2, 3)}


def test_the_default_split_is_contiguous_sequence_ranges(monkeypatch):
    monkeypatch.setattr(spark_readers, "stream_bounds", lambda opts: StreamBounds(first_seq=1, last_seq=40, created="t0",
                                                                      num_subjects=6))
    opts = parse_source_options({"stream": "S", "startingOffsets": "earliest", "numPartitions": "4"}, streaming=True)
    r = spark_readers.JetStreamStreamReader(opts)
    start = r.initialOffset()
    end = r.latestOffset(start, ReadAllAvailable())
    assert "split" not in end
    parts = r.partitions(start, end)
    assert [(p.first, p.last, p.count) for p in parts] == [(1, 10, 4), (11, 20, 4), (21, 30, 4), (31, 40, 4)]


def test_without_a_start_pyspark_4_0_gets_the_streams_end_and_an_idle_poll_lists_nothing(monkeypatch):
    """PySpark < 4.2 calls latestOffset() with no start: the end is the stream's last sequence, its split
    recorded; a poll that finds nothing new returns the same end without listing the subjects again."""
    last = [500]
    listings = []
    monkeypatch.setattr(spark_readers, "stream_bounds", lambda opts: StreamBounds(first_seq=1, last_seq=last[0], created="t0",
                                                                      num_subjects=1000))
    monkeypatch.setattr(spark_readers, "split_depth", lambda opts, bounds, parts: listings.append(1) or None)
    opts = parse_source_options({"stream": "S", "startingOffsets": "earliest", "numPartitions": "4",
                                 "split": "subject"}, streaming=True)
    r = spark_readers.JetStreamStreamReader(opts)
    first = r.latestOffset()
    assert (first["seq"], first["split"], len(listings)) == (500, "subject", 1)
    assert r.latestOffset() == first and len(listings) == 1  # idle: no new listing
    last[0] = 510
    assert r.latestOffset()["seq"] == 510 and len(listings) == 2
    parts = r.partitions(r.initialOffset(), r.latestOffset())
    assert len(parts) == 4 and {(p.first, p.last) for p in parts} == {(1, 510)}
