"""A streaming write checked when its query starts (issue #56, point 5).

PySpark runs a Python sink's code first at the query's first micro-batch with data, not at ``start()``
(connector/pyspark_jetstream/write_check.py), so a misspelled sink option fails then, perhaps hours later.
``pyspark_jetstream.check_write`` runs the same checks before ``start()``; the last test shows the
behaviour it avoids, on this PySpark.
"""

from __future__ import annotations

import pytest

from pyspark_jetstream import JetStreamConnectorError, OptionError, check_write


def _rows(spark, subject: str):
    return spark.createDataFrame([(subject, b"x")], "subject string, data binary")


def test_a_misspelled_sink_option_is_named_before_the_query_starts(spark, nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    df = _rows(spark, f"{stream_name}.a")
    with pytest.raises(OptionError) as refused:
        check_write(df, {"servers": nats_server.url, "stream": stream_name, "ensureStreams": "create"})
    assert "ensurestreams" in str(refused.value).lower() and "ensureStream" in str(refused.value)
    with pytest.raises(JetStreamConnectorError) as missing:
        check_write(df, {"servers": nats_server.url, "stream": stream_name + "X"})
    assert stream_name + "X" in str(missing.value)
    check_write(df.schema, {"servers": nats_server.url, "stream": stream_name, "publish.mode": "acked"})
    assert nats_client.stored_count(stream_name) == 0  # a check publishes nothing


def test_without_the_check_the_typo_fails_at_the_first_micro_batch_with_data(spark, nats_server, nats_client,
                                                                            stream_name, tmp_path):
    """What the check avoids: ``start()`` returns, and the query fails once data arrives, naming the option."""
    source, target = stream_name + "S", stream_name + "T"
    nats_client.add_stream(source, [f"{source}.>"])
    nats_client.add_stream(target, [f"{target}.>"])
    read = (spark.readStream.format("jetstream").option("servers", nats_server.url).option("stream", source)
            .option("startingOffsets", "earliest").load().select("subject", "data"))
    query = (read.writeStream.format("jetstream").option("servers", nats_server.url).option("stream", target)
             .option("subject", f"{target}.copy").option("ensureStreams", "create")
             .option("checkpointLocation", str(tmp_path / "typo")).start())
    try:
        assert query.isActive  # start() took the typo
        nats_client.publish_raw(f"{source}.a", None, b"x")
        with pytest.raises(Exception) as failed:
            assert query.awaitTermination(120), "the query neither failed nor finished within 120s"
        assert "ensurestreams" in str(failed.value).lower()
    finally:
        query.stop()


def test_a_streaming_read_of_a_missing_stream_fails_as_the_query_starts(spark, nats_server, stream_name, tmp_path):
    """The source's Python runs as the query starts (its first offsets), so a missing stream fails then, before
    any micro-batch."""
    read = (spark.readStream.format("jetstream").option("servers", nats_server.url).option("stream", stream_name)
            .load())
    with pytest.raises(Exception) as failed:
        query = read.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "missing")).start()
        try:
            query.awaitTermination(60)  # a failure raised by the query's first planning, within seconds
        finally:
            query.stop()
    assert stream_name in str(failed.value)
