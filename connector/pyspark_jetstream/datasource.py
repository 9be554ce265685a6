"""The ``jetstream`` data source: the class Spark finds and instantiates.

Kept thin on purpose: it parses nothing itself and hands the options to the
sink (and, later, source) planning code. Importing it must stay cheap and free
of side effects, because Spark imports every ``pyspark_*`` module to discover
data sources.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource


class JetStreamDataSource(DataSource):
    """NATS JetStream as a Spark data source: ``format("jetstream")``.

    Writing (``df.write`` / ``df.writeStream``) publishes rows with PubAcks awaited;
    the options are documented in docs/ (source.md, sink.md, kv.md, security.md), generated from
    :mod:`pyspark_jetstream.options`.
    """

    @classmethod
    def name(cls) -> str:
        return "jetstream"

    def schema(self) -> str:
        """The source's fixed schema. Spark asks for it when a read is defined (``load()``), before it
        says whether the read is a batch or a streaming one: the options are checked here, so that a
        mistake fails at ``load()`` naming the option, not later at ``start()`` or in a task."""
        from .options import parse_source_options
        from .source.columns.selection import ddl, default_columns

        opts = parse_source_options(self.options, streaming=None)
        kv = opts.bucket is not None
        return ddl(kv, default_columns(kv, opts.include_headers))

    def _columns(self, schema) -> tuple[str, ...]:
        """The columns of ``schema`` (Spark's StructType), checked against the source's
        (source/columns/selection.py)."""
        from .source.columns.selection import chosen

        kv = any(k.lower() == "bucket" for k in self.options)
        return chosen(kv, [(f.name, f.dataType.simpleString()) for f in schema.fields])

    def _source_options(self, schema, streaming: bool):
        import dataclasses

        from .options import parse_source_options
        from .source.columns.selection import default_columns

        opts = parse_source_options(self.options, streaming=streaming)
        if schema is None:
            return opts
        columns = self._columns(schema)
        every = default_columns(opts.bucket is not None, True)
        return dataclasses.replace(opts, columns=None if columns == every else columns)

    def reader(self, schema):
        """The batch reader. One that narrows its read by pushed filters only when Spark's pushdown planner
        asks for it (``spark.sql.python.filterPushdown.enabled``: ``spark_api.pushdown_requested``) on a
        PySpark that keeps a pushed read to its own scan (``spark_api.scoped_pushdown``: none up to 4.3).
        Elsewhere the plain reader, whose ``pushFilters`` (the base class's) hands every filter back to
        Spark: a read shared by every scan of a view is then the whole read, right for each of them."""
        from .spark_api import pushdown_requested, scoped_pushdown

        opts = self._source_options(schema, streaming=False)
        if pushdown_requested() and scoped_pushdown():
            from .source.pushdown_reader import JetStreamPushdownReader

            return JetStreamPushdownReader(opts)
        from .source.spark_readers import JetStreamBatchReader

        return JetStreamBatchReader(opts)

    def streamReader(self, schema):
        from .source.spark_readers import JetStreamStreamReader

        return JetStreamStreamReader(self._source_options(schema, streaming=True))

    def writer(self, schema, overwrite: bool):
        from .options import check_write_has_options
        from .sink.plan.sink_plan import plan_sink
        from .sink.spark_writers import JetStreamBatchWriter

        check_write_has_options(self.options)
        return JetStreamBatchWriter(plan_sink(self.options, schema, overwrite=overwrite, streaming=False))

    def streamWriter(self, schema, overwrite: bool):
        from .options import check_write_has_options
        from .sink.plan.sink_plan import plan_sink
        from .sink.spark_writers import JetStreamStreamWriter

        check_write_has_options(self.options)
        return JetStreamStreamWriter(plan_sink(self.options, schema, overwrite=overwrite, streaming=True))
