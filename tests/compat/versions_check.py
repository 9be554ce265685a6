"""What differs between the PySpark versions the connector supports (4.0 to 4.3), tested on whichever
runs these tests: ``.ci/compat`` runs them in each cell (``.ci/run`` in the oldest); the main suite,
on one PySpark, leaves them out by this file's name. Read limits need admission control (4.2+) and
are refused at start before it; ``Trigger.AvailableNow``, ``lastPerSubject``'s first micro-batch, a
recreated stream and the progress's offsets work on every version; streaming writes take Arrow
batches from 4.1 and rows on 4.0."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from pyspark_jetstream import spark_api
from pyspark_jetstream.progress import lag, parse_offset

from ..helpers import finished, publish, wait_until


def _stream(spark, url, **options):
    r = spark.readStream.format("jetstream").option("servers", url)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def test_the_version_module_knows_what_this_pyspark_offers():
    import pyspark

    assert pyspark.__version__ == spark_api.VERSION_TEXT
    assert (spark_api.VERSION >= (4, 2)) == spark_api.ADMISSION_CONTROL
    assert (spark_api.VERSION >= (4, 1)) == spark_api.ARROW_STREAM_WRITER


def test_read_limits_work_where_spark_has_admission_control_and_are_refused_at_start_where_not(
        spark, nats_server, nats_client, stream_name, tmp_path):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    publish(nats_client, f"{stream_name}.a", 30)
    df = _stream(spark, nats_server.url, stream=stream_name, startingOffsets="earliest", maxMessagesPerTrigger="10")
    w = df.writeStream.format("memory").queryName(f"lim_{stream_name}").trigger(availableNow=True)
    if spark_api.ADMISSION_CONTROL:
        q = finished(w.start())
        assert [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]] == [10, 10, 10]
        return
    with pytest.raises(Exception) as caught:  # noqa: PT011 (Spark wraps it; the text is what matters)
        finished(w.start())
    text = str(caught.value)
    assert "Invalid value for option 'maxMessagesPerTrigger': '10'" in text
    assert "needs PySpark 4.2 or newer" in text and f"this is PySpark {spark_api.VERSION_TEXT}" in text


def test_available_now_reads_what_was_there_at_the_start_and_stops(spark, nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    publish(nats_client, f"{stream_name}.a", 25)
    q = finished(_stream(spark, nats_server.url, stream=stream_name, startingOffsets="earliest", numPartitions="3")
                 .writeStream.format("memory").queryName(f"an_{stream_name}").trigger(availableNow=True).start())
    assert sorted(r.seq for r in spark.table(f"an_{stream_name}").collect()) == list(range(1, 26))
    source = q.lastProgress["sources"][0]
    assert parse_offset(source["endOffset"])["seq"] == 25
    assert lag(source) in (0, None)  # the last batch's progress: nothing left (or not reported)


def test_last_per_subject_first_batch_is_the_snapshot_then_every_message(spark, nats_server, nats_client,
                                                                      stream_name, tmp_path):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    for i in range(12):
        nats_client.run(nats_client.js.publish(f"{stream_name}.s{i % 3}", str(i).encode()))
    df = _stream(spark, nats_server.url, stream=stream_name, startingOffsets="lastPerSubject", numPartitions="2")
    q = (df.writeStream.format("memory").queryName(f"lps_{stream_name}")
         .option("checkpointLocation", str(tmp_path / "cp")).trigger(processingTime="200 milliseconds").start())
    try:
        table = f"lps_{stream_name}"
        wait_until(lambda: spark.table(table).count() >= 3, timeout=120, what="the snapshot")
        assert sorted((r.subject, r.data) for r in spark.table(table).collect()) == [
            (f"{stream_name}.s0", b"9"), (f"{stream_name}.s1", b"10"), (f"{stream_name}.s2", b"11")]
        nats_client.run(nats_client.js.publish(f"{stream_name}.s0", b"12"))
        nats_client.run(nats_client.js.publish(f"{stream_name}.s0", b"13"))
        wait_until(lambda: spark.table(table).count() >= 5, timeout=120, what="the two new messages")
        assert sorted(r.seq for r in spark.table(table).collect()) == [10, 11, 12, 13, 14]
    finally:
        q.stop()


def test_a_stream_recreated_between_batches_fails_the_query_naming_it(spark, nats_server, nats_client,
                                                                       stream_name, tmp_path):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    publish(nats_client, f"{stream_name}.a", 5)
    df = _stream(spark, nats_server.url, stream=stream_name, startingOffsets="earliest")
    q = (df.writeStream.format("memory").queryName(f"rc_{stream_name}")
         .option("checkpointLocation", str(tmp_path / "cp")).trigger(processingTime="200 milliseconds").start())
    try:
        wait_until(lambda: spark.table(f"rc_{stream_name}").count() == 5, timeout=120, what="the first messages")
        nats_client.run(nats_client.js.delete_stream(stream_name))
        nats_client.add_stream(stream_name, [f"{stream_name}.>"])
        publish(nats_client, f"{stream_name}.b", 8)  # past the old sequence: only the identity tells them apart
        wait_until(lambda: q.exception() is not None or not q.isActive, timeout=120, what="the query to fail")
        assert "StreamRecreatedError" in str(q.exception()) or "was deleted and created again" in str(q.exception())
        assert spark.table(f"rc_{stream_name}").count() == 5  # nothing of the new stream read as the old one
    finally:
        q.stop()


def test_a_streaming_write_publishes_every_column_kind_on_this_version(spark, nats_server, nats_client, stream_name,
                                                                      tmp_path):
    """Rows on PySpark 4.0, Arrow batches from 4.1: the same messages either way."""
    src, dst = stream_name, f"{stream_name}_OUT"
    nats_client.add_stream(src, [f"{src}.>"])
    nats_client.add_stream(dst, [f"{dst}.>"], allow_msg_ttl=True)
    for i in range(7):
        nats_client.run(nats_client.js.publish(f"{src}.k{i % 2}", f"v{i}".encode(), headers={"X-I": str(i)}))
    out = (_stream(spark, nats_server.url, stream=src, startingOffsets="earliest", numPartitions="1")  # in order
           .select(F.concat(F.lit(f"{dst}."), F.col("subject")).alias("subject"), "data", "headers",
                   F.when(F.col("seq") % 2 == 0, F.lit("1h")).alias("ttl")))
    finished(out.writeStream.format("jetstream").option("servers", nats_server.url).option("stream", dst)
             .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    got = nats_client.messages(dst)
    assert [(m.subject, m.data, m.headers.get("X-I"), m.headers.get("Nats-TTL")) for m in got] == [
        (f"{dst}.{src}.k{i % 2}", f"v{i}".encode(), [str(i)], ["1h"] if (i + 1) % 2 == 0 else None) for i in range(7)]


def test_bookmark_consumer_needs_nats_server_2_14_and_says_so_at_start(spark, nats_server, nats_client, stream_name,
                                                                        tmp_path):
    """The consumer reset API that moves the bookmark is 2.14+: older servers refuse the option when the query
    starts (``.ci/compat`` runs this on 2.11; the main suite's server is newer)."""
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    publish(nats_client, f"{stream_name}.a", 3)
    version = nats_client.nc.connected_server_version
    q = (_stream(spark, nats_server.url, stream=stream_name, startingOffsets="earliest", bookmarkConsumer="bm")
         .writeStream.format("memory").queryName(f"bm_{stream_name}").trigger(availableNow=True))
    if (version.major, version.minor) >= (2, 14):
        assert finished(q.start()).exception() is None  # accepted (what the bookmark shows: test_source)
        return
    with pytest.raises(Exception) as caught:  # noqa: PT011 (Spark wraps it; the text is what matters)
        finished(q.start())
    assert (f"Invalid value for option 'bookmarkConsumer': 'bm'. It needs nats-server 2.14 or newer (the consumer "
            f"reset API that moves the bookmark); the server is {version.major}.{version.minor}.") in str(caught.value)
