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
    the options are documented in the README, generated from
    :mod:`pyspark_jetstream.options`.
    """

    @classmethod
    def name(cls) -> str:
        return "jetstream"

    def writer(self, schema, overwrite: bool):
        from .sink_setup import plan_sink
        from .writer import JetStreamBatchWriter

        return JetStreamBatchWriter(plan_sink(self.options, schema, overwrite=overwrite, streaming=False))

    def streamWriter(self, schema, overwrite: bool):
        from .sink_setup import plan_sink
        from .writer import JetStreamStreamWriter

        return JetStreamStreamWriter(plan_sink(self.options, schema, overwrite=overwrite, streaming=True))
