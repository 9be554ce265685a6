"""A batch sink that does no I/O: it takes the rows as Arrow batches, as the connector's writer does, and
drops them. Used only by the benchmark, to measure Spark's own cost of a Python data source write job (job
launch, moving the rows to the Python workers), which the connector's batch writes are compared against."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage


class _Drop(DataSourceArrowWriter):
    def write(self, iterator) -> WriterCommitMessage:
        for _ in iterator:
            pass
        return WriterCommitMessage()


class NoIoSink(DataSource):
    @classmethod
    def name(cls) -> str:
        return "noio_sink"

    def writer(self, schema, overwrite: bool) -> _Drop:
        return _Drop()
