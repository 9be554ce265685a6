"""What SQL users can do, as the README claims it: a temporary view over a stream, a catalog table
whose options are given per query (Spark does not pass a catalog table's OPTIONS to a Python data
source), and a clear error, not a stray default, when a query gives none."""

from __future__ import annotations

import pytest
from pyspark.errors import PySparkException

from ..helpers import publish


def test_a_temporary_view_using_jetstream_reads_the_stream(spark, nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    publish(nats_client, f"{stream_name}.{{i}}", 3)
    view = f"v_{stream_name.lower()}"
    spark.sql(f"CREATE TEMPORARY VIEW {view} USING jetstream "
              f"OPTIONS (servers '{nats_server.url}', stream '{stream_name}')")
    rows = spark.sql(f"SELECT seq, subject, CAST(data AS STRING) AS data FROM {view} ORDER BY seq").collect()
    assert [tuple(r) for r in rows] == [(i + 1, f"{stream_name}.{i}", f"m{i}") for i in range(3)]


def test_a_catalog_table_reads_and_inserts_with_options_given_in_the_query(spark, nats_server, nats_client,
                                                                             stream_name):
    # An INSERT with a column list fills the table's other columns (ttl among them) with nulls.
    nats_client.add_stream(stream_name, [f"{stream_name}.>"], allow_msg_ttl=True)
    publish(nats_client, f"{stream_name}.a", 1)
    table = f"t_{stream_name.lower()}"
    spark.sql(f"CREATE TABLE {table} USING jetstream OPTIONS (servers '{nats_server.url}', stream '{stream_name}')")
    try:
        given = f"WITH ('servers' = '{nats_server.url}', 'stream' = '{stream_name}')"
        spark.sql(f"INSERT INTO {table} {given} (subject, data) "
                  f"VALUES ('{stream_name}.b', CAST('sql' AS BINARY))").collect()
        rows = spark.sql(f"SELECT seq, subject, CAST(data AS STRING) AS data FROM {table} {given} ORDER BY seq")
        assert [tuple(r) for r in rows.collect()] == [(1, f"{stream_name}.a", "m0"), (2, f"{stream_name}.b", "sql")]
        assert [(m.subject, m.data) for m in nats_client.messages(stream_name)] == [
            (f"{stream_name}.a", b"m0"), (f"{stream_name}.b", b"sql")]
        # Without options in the query, the connector says why rather than reading a default server.
        for statement in (f"SELECT * FROM {table}",
                          f"INSERT INTO {table} (subject, data) VALUES ('{stream_name}.c', CAST('x' AS BINARY))"):
            with pytest.raises(PySparkException) as info:
                spark.sql(statement).collect()
            assert "OptionError" in str(info.value) and "Spark does not pass them to a Python data source" in str(
                info.value), str(info.value)[:2000]
        assert nats_client.stored_count(stream_name) == 2
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {table}")
