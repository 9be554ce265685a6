"""The streaming reader's planning calls, without a server (the stream's facts stubbed): one STREAM.INFO
per micro-batch, and a replayed batch (planned before a restart) asks the server again."""

from __future__ import annotations

from pyspark.sql.streaming.datasource import ReadAllAvailable

from pyspark_jetstream.options import parse_source_options
from pyspark_jetstream.source import reader
from pyspark_jetstream.source.planning import StreamBounds


def test_one_stream_info_per_micro_batch(monkeypatch):
    asked = []

    def bounds(opts):
        asked.append(1)
        return StreamBounds(first_seq=1, last_seq=100 * len(asked), created="t0")

    monkeypatch.setattr(reader, "_bounds", bounds)
    opts = parse_source_options({"stream": "S", "startingOffsets": "earliest", "numPartitions": "2"}, streaming=True)
    r = reader.JetStreamStreamReader(opts)
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
