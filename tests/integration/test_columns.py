"""Headers only when asked (issue #41): ``includeHeaders=false`` and a schema given to the read produce
the columns asked for, with the values the default read has; a wrong schema is refused naming the
columns the source has; the default read still returns every stored header."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from pyspark_jetstream.spark_api import PUSHDOWN_CONF

from ..helpers import finished


def _sink_written(spark, nats_server, nats_client, stream: str) -> None:
    nats_client.add_stream(stream, [f"{stream}.>"], allow_msg_ttl=True)
    rows = [(f"{stream}.s{i % 3}", f"v{i}", "1h" if i % 2 else None) for i in range(12)]
    (spark.createDataFrame(rows, "subject string, data string, ttl string").coalesce(1)
     .withColumn("headers", F.create_map(F.lit("X-Tag"), F.array(F.lit("a"), F.lit("b"))))
     .write.format("jetstream").mode("append").option("servers", nats_server.url).option("stream", stream).save())


def _reader(spark, url: str, **options: str):
    r = spark.read.format("jetstream").option("servers", url)
    for k, v in options.items():
        r = r.option(k.replace("__", "."), v)
    return r


def _rows(df, columns) -> list[tuple]:
    return sorted(tuple(r) for r in df.select(*columns).collect())


def test_include_headers_false_leaves_out_the_map_and_keeps_every_other_column(spark, nats_server, nats_client,
                                                                               stream_name):
    _sink_written(spark, nats_server, nats_client, stream_name)
    full = _reader(spark, nats_server.url, stream=stream_name).load()
    lean = _reader(spark, nats_server.url, stream=stream_name, includeHeaders="false").load()
    assert lean.columns == [c for c in full.columns if c != "headers"]
    assert _rows(lean, lean.columns) == _rows(full, lean.columns)
    assert any(r.ttl == "1h" and r.expires_at is not None for r in lean.collect())  # derived from headers still
    # The default read: every stored header, the user's repeated one in order.
    headers = [r.headers for r in full.orderBy("seq").collect()]
    assert all(h["X-Tag"] == ["a", "b"] and "Nats-Msg-Id" in h for h in headers)
    assert [("Nats-TTL" in h) for h in headers] == [bool(i % 2) for i in range(12)]


def test_a_given_schema_reads_those_columns_in_its_order(spark, nats_server, nats_client, stream_name):
    _sink_written(spark, nats_server, nats_client, stream_name)
    full = _reader(spark, nats_server.url, stream=stream_name).load()
    given = _reader(spark, nats_server.url, stream=stream_name, numPartitions="2") \
        .schema("seq long, data binary, expires_at timestamp, subject string").load()
    assert given.columns == ["seq", "data", "expires_at", "subject"]
    assert _rows(given, given.columns) == _rows(full, given.columns)
    # With a pushed filter too.
    spark.conf.set(PUSHDOWN_CONF, "true")
    try:
        pushed = given.where(f"subject = '{stream_name}.s1'")
        assert _rows(pushed, pushed.columns) == _rows(full.where(f"subject = '{stream_name}.s1'"), pushed.columns)
    finally:
        spark.conf.unset(PUSHDOWN_CONF)


def test_buckets_read_any_view_with_the_columns_asked(spark, nats_server, nats_client, stream_name):
    kv = nats_client.run(nats_client.js.create_key_value(bucket=stream_name, history=5))
    for i in range(9):
        nats_client.run(kv.put(f"k{i % 4}", f"v{i}".encode()))
    nats_client.run(kv.delete("k2"))
    for view in ("changes", "latest"):
        full = _reader(spark, nats_server.url, bucket=stream_name, kv__view=view).load()
        lean = _reader(spark, nats_server.url, bucket=stream_name, kv__view=view, includeHeaders="false").load()
        assert "headers" not in lean.columns and "operation" in lean.columns
        assert _rows(lean, lean.columns) == _rows(full, lean.columns), view
        given = _reader(spark, nats_server.url, bucket=stream_name, kv__view=view) \
            .schema("key string, operation string, data binary").load()
        assert _rows(given, given.columns) == _rows(full, given.columns), view


def test_a_streaming_read_takes_a_schema_and_include_headers(spark, nats_server, nats_client, stream_name, tmp_path):
    _sink_written(spark, nats_server, nats_client, stream_name)
    for n, configure in enumerate((lambda r: r.option("includeHeaders", "false"),
                                   lambda r: r.schema("subject string, seq long"))):
        read = configure(spark.readStream.format("jetstream").option("servers", nats_server.url)
                         .option("stream", stream_name).option("startingOffsets", "earliest")).load()
        name = f"cols_{stream_name.lower()}_{n}"
        finished(read.writeStream.format("memory").queryName(name).trigger(availableNow=True)
                 .option("checkpointLocation", str(tmp_path / name)).start())
        got = spark.table(name)
        assert "headers" not in got.columns and got.count() == 12
        assert sorted(r.seq for r in got.collect()) == list(range(1, 13))


@pytest.mark.parametrize(("schema", "says"), [
    ("subject string, nope string", "has no column 'nope'"),
    ("seq int", "gives column 'seq' as int, not bigint"),
    ("timestamp timestamp_ntz", "gives column 'timestamp' as timestamp_ntz, not timestamp"),
    ("subject string, subject string", "names column 'subject' twice"),
])
def test_a_wrong_schema_is_refused_naming_the_columns_the_source_has(spark, nats_server, nats_client, stream_name,
                                                                     schema, says):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    df = _reader(spark, nats_server.url, stream=stream_name).schema(schema).load()
    with pytest.raises(Exception) as refused:
        df.collect()
    text = str(refused.value)
    assert "SchemaError" in text and says in text
    assert "subject string, data binary, headers map<string, array<string>>, stream string, seq long" in text
