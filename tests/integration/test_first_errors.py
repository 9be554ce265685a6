"""What a user sees first when an option or a column is wrong: the error, raised where the
DataFrame is defined (``load()`` for reads; ``save()`` / ``start()`` for writes, the earliest
Spark calls the sink), naming the option or column, with a hint for Kafka habits, and no
unrelated exception (such as PySpark's streaming runner's ``UnboundLocalError``) after it."""

from __future__ import annotations

import pytest
from pyspark.errors import PySparkException

from ..helpers import jetstream_writer


def _first_lines(exc: BaseException) -> str:
    """The exception's message as a user reads it: its first lines, Spark's prefix included."""
    return "\n".join(str(exc).splitlines()[:12])


def _ours(exc: BaseException, error: str, needle: str) -> None:
    text = str(exc)
    assert f"{error}: " in text and needle in text, _first_lines(exc)
    assert "UnboundLocalError" not in text and "Py4JJavaError" not in text, _first_lines(exc)
    # The connector's line is the last of the Python traceback Spark carries: nothing comes after it.
    ours = [line for line in text.splitlines() if line.startswith(f"pyspark_jetstream.errors.{error}:")
            or line.startswith(f"{error}:")]
    assert ours, _first_lines(exc)


def _read(spark, url, stream, **options):
    r = spark.read.format("jetstream").option("servers", url).option("stream", stream)
    for key, value in options.items():
        r = r.option(key, value)
    return r


def _read_stream(spark, url, stream, **options):
    r = spark.readStream.format("jetstream").option("servers", url).option("stream", stream)
    for key, value in options.items():
        r = r.option(key, value)
    return r


def test_an_unknown_read_option_fails_at_load_with_the_nearest_name(spark, nats_server, stream_name):
    with pytest.raises(PySparkException) as info:
        _read(spark, nats_server.url, stream_name, maxMessagePerTrigger="5").load()
    _ours(info.value, "OptionError", "Unknown option 'maxmessagepertrigger' when reading. "
                                     "Did you mean 'maxMessagesPerTrigger'?")


def test_an_unknown_streaming_read_option_fails_at_load_not_at_start(spark, nats_server, stream_name):
    with pytest.raises(PySparkException) as info:
        _read_stream(spark, nats_server.url, stream_name, batchsise="10").load()
    _ours(info.value, "OptionError", "Unknown option 'batchsise' when reading. Did you mean 'batchSize'?")


def test_a_bad_read_value_fails_at_load_naming_option_value_and_what_is_allowed(spark, nats_server, stream_name):
    with pytest.raises(PySparkException) as info:
        _read_stream(spark, nats_server.url, stream_name, **{"consume.maxWait": "soon"}).load()
    _ours(info.value, "OptionError", "'consume.maxWait': 'soon'")
    assert "Expected a duration of at least 1s" in str(info.value)


@pytest.mark.parametrize("option, hint", [
    ("subscribe", "It is a Kafka option; for JetStream use 'stream'"),
    ("kafka.bootstrap.servers", "It is a Kafka option; for JetStream use 'servers'"),
    ("maxOffsetsPerTrigger", "It is a Kafka option; for JetStream use 'maxMessagesPerTrigger'"),
    ("kafka.security.protocol", "It is a Kafka option; for JetStream use the connection options"),
])
def test_kafka_read_options_point_to_their_jetstream_names(spark, nats_server, stream_name, option, hint):
    with pytest.raises(PySparkException) as info:
        _read_stream(spark, nats_server.url, stream_name, **{option: "x"}).load()
    _ours(info.value, "OptionError", hint)


def test_an_unknown_write_option_fails_at_save_with_the_kafka_hint(spark, nats_server, stream_name):
    df = spark.createDataFrame([("a.b", "x")], "subject string, data string")
    with pytest.raises(PySparkException) as info:
        jetstream_writer(df, nats_server.url, topic="a.b").save()
    _ours(info.value, "OptionError", "Unknown option 'topic' when writing. It is a Kafka option; for JetStream "
                                     "use the option 'subject'")


def test_an_unknown_streaming_write_option_fails_the_query_at_its_first_micro_batch(spark, nats_server, stream_name,
                                                                                     tmp_path):
    """Spark creates a streaming sink in the query's thread, not in start(): the query fails with
    the error before it writes anything."""
    source = spark.readStream.format("rate").option("rowsPerSecond", "1").load()
    rows = source.selectExpr("'a.b' as subject", "cast(value as string) as data")
    query = (rows.writeStream.format("jetstream").option("servers", nats_server.url).option("ackTimout", "5s")
             .option("checkpointLocation", str(tmp_path / "chk")).start())
    try:
        with pytest.raises(PySparkException) as info:
            ended = query.awaitTermination(120)
            raise AssertionError(f"the query did not fail with the option error (ended: {ended})")
    finally:
        query.stop()
    _ours(info.value, "OptionError", "Unknown option 'acktimout' when writing. Did you mean 'ackTimeout'?")


def test_kafka_columns_get_their_jetstream_names(spark, nats_server, stream_name):
    df = spark.createDataFrame([("a.b", "x")], "topic string, value string")
    with pytest.raises(PySparkException) as info:
        jetstream_writer(df, nats_server.url).save()
    _ours(info.value, "SchemaError", "Unknown column(s) 'topic', 'value' for the JetStream sink. Kafka's sink "
                                     "columns have JetStream names: 'topic' -> 'subject'; 'value' -> 'data'.")
