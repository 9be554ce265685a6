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

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        import uuid

        # One per load() or view: Spark pickles this instance once per relation and hands that copy to
        # every planner of it, so the token tells two scans of one relation apart from two relations
        # (source/pushdown_registry.py).
        self.relation = uuid.uuid4().hex

    @classmethod
    def name(cls) -> str:
        return "jetstream"

    def schema(self) -> str:
        """The source's fixed schema. Spark asks for it when a read is defined (``load()``), before it
        says whether the read is a batch or a streaming one: the options are checked here, so that a
        mistake fails at ``load()`` naming the option, not later at ``start()`` or in a task."""
        from .options import parse_source_options
        from .source.rows import KV_SCHEMA_DDL, SOURCE_SCHEMA_DDL

        parse_source_options(self.options, streaming=None)
        return KV_SCHEMA_DDL if "bucket" in self.options else SOURCE_SCHEMA_DDL

    def _source_options(self, schema, streaming: bool):
        from .errors import SchemaError
        from .options import parse_source_options
        from .source.rows import arrow_schema

        opts = parse_source_options(self.options, streaming=streaming)
        expected = arrow_schema(opts.bucket is not None).names
        if schema is not None and [f.name for f in schema.fields] != expected:
            raise SchemaError(
                f"The JetStream source has a fixed schema ({self.schema()}); do not pass another one to .schema()."
            )
        return opts

    def reader(self, schema):
        """The batch reader; one that takes pushed filters when Spark's pushdown planner asks for it
        (PySpark 4.1+ with ``spark.sql.python.filterPushdown.enabled``: ``spark_api.pushdown_requested``)."""
        from .spark_api import pushdown_requested

        opts = self._source_options(schema, streaming=False)
        if pushdown_requested():
            from .source.pushdown_reader import JetStreamPushdownReader

            return JetStreamPushdownReader(opts, getattr(self, "relation", None))
        from .source.reader import JetStreamBatchReader

        return JetStreamBatchReader(opts)

    def streamReader(self, schema):
        from .source.reader import JetStreamStreamReader

        return JetStreamStreamReader(self._source_options(schema, streaming=True))

    def writer(self, schema, overwrite: bool):
        from .options import check_write_has_options
        from .sink.setup import plan_sink
        from .sink.writer import JetStreamBatchWriter

        check_write_has_options(self.options)
        return JetStreamBatchWriter(plan_sink(self.options, schema, overwrite=overwrite, streaming=False))

    def streamWriter(self, schema, overwrite: bool):
        from .options import check_write_has_options
        from .sink.setup import plan_sink
        from .sink.writer import JetStreamStreamWriter

        check_write_has_options(self.options)
        return JetStreamStreamWriter(plan_sink(self.options, schema, overwrite=overwrite, streaming=True))
