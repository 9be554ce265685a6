"""A streaming source that does no I/O: each micro-batch yields its rows as one constant Arrow batch of
the connector's schema, with offsets that count rows. Used only by the benchmark, to measure Spark's
own fixed cost per micro-batch, which the connector's cost per micro-batch is compared against."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from pyspark_jetstream.source.columns.rows import SOURCE_SCHEMA_DDL


class _Range(InputPartition):
    def __init__(self, first: int, last: int) -> None:
        self.first, self.last = first, last


class NoIoReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        self.total = int(options["rows"])
        self.partitions_per_batch = int(options.get("numPartitions", "2"))

    def initialOffset(self) -> dict:
        return {"seq": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(1000)

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        step = limit.max_rows if isinstance(limit, ReadMaxRows) else self.total
        return {"seq": min(start["seq"] + step, self.total)}

    def partitions(self, start: dict, end: dict):
        first, last = start["seq"] + 1, end["seq"]
        if last < first:
            return []
        n = min(self.partitions_per_batch, last - first + 1)
        size = (last - first + 1 + n - 1) // n
        return [_Range(f, min(f + size - 1, last)) for f in range(first, last + 1, size)]

    def read(self, partition: _Range):
        import datetime as dt

        import pyarrow as pa

        from pyspark_jetstream.source.columns.rows import arrow_schema

        n = partition.last - partition.first + 1
        now = dt.datetime.now(dt.timezone.utc)
        yield pa.RecordBatch.from_pydict({
            "subject": ["noio.x"] * n, "data": [b"x" * 100] * n, "headers": [None] * n, "stream": ["NOIO"] * n,
            "seq": list(range(partition.first, partition.last + 1)), "timestamp": [now] * n, "ttl": [None] * n,
            "expires_at": [None] * n, "marker_reason": [None] * n}, schema=arrow_schema(False))

    def commit(self, end: dict) -> None:
        pass


class NoIoBatchReader(DataSourceReader):
    """The batch read of ``rows`` rows of ``size`` bytes in ``numPartitions`` ranges, each yielded in 10,000-row slices of one
    batch made once per partition: Spark's own cost of a read job (issue #57's read bound)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.total = int(options["rows"])
        self.parts = int(options.get("numPartitions", "2"))
        self.size = int(options.get("size", "100"))

    def partitions(self):
        size = (self.total + self.parts - 1) // self.parts
        return [_Range(f, min(f + size - 1, self.total)) for f in range(1, self.total + 1, size)]

    def read(self, partition: _Range):
        import datetime as dt

        import pyarrow as pa

        from pyspark_jetstream.source.columns.rows import arrow_schema

        n = min(10_000, partition.last - partition.first + 1)
        now = dt.datetime.now(dt.timezone.utc)
        one = pa.RecordBatch.from_pydict({
            "subject": ["noio.x"] * n, "data": [b"x" * self.size] * n, "headers": [None] * n, "stream": ["NOIO"] * n,
            "seq": list(range(n)), "timestamp": [now] * n, "ttl": [None] * n, "expires_at": [None] * n,
            "marker_reason": [None] * n}, schema=arrow_schema(False))
        left = partition.last - partition.first + 1
        while left > 0:
            yield one.slice(0, min(n, left))
            left -= n


class NoIoSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "noio_jetstream"

    def schema(self) -> str:
        return SOURCE_SCHEMA_DDL

    def streamReader(self, schema):
        return NoIoReader(self.options)

    def reader(self, schema):
        return NoIoBatchReader(self.options)
