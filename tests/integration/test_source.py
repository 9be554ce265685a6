"""spark.read / spark.readStream .format("jetstream") against a real server."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from pyspark.sql import functions as F

from pyspark_jetstream.progress import parse_offset

from ..helpers import finished, history, publish, read_limit, server_time, wait_until


def read(spark, server, **options):
    r = spark.read.format("jetstream").option("servers", server.url)
    for k, v in options.items():
        r = r.option(k.replace("__", "."), v)
    return r.load()


def stream_query(spark, server, sink_name, trigger=None, **options):
    r = spark.readStream.format("jetstream").option("servers", server.url)
    for k, v in options.items():
        r = r.option(k.replace("__", "."), v)
    w = r.load().writeStream.format("memory").queryName(sink_name)
    w = w.trigger(**(trigger or {"availableNow": True}))
    return w.start()


def seqs(spark, table):
    return sorted(r.seq for r in spark.sql(f"select seq from {table}").collect())


@pytest.fixture
def filled(nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"], allow_msg_ttl=True)
    publish(nats_client, f"{stream_name}.a.{{i}}", 60)
    return stream_name


def test_batch_read_everything_and_ranges(spark, nats_server, filled):
    df = read(spark, nats_server, stream=filled)
    rows = df.orderBy("seq").collect()
    assert [r.seq for r in rows] == list(range(1, 61))
    assert rows[0].subject == f"{filled}.a.0" and rows[0].data == b"m0" and rows[0].stream == filled
    assert sorted(r.seq for r in read(spark, nats_server, stream=filled, startingOffsets="10",
                                      endingOffsets="20").collect()) == list(range(10, 21))
    with pytest.raises(Exception, match="option 'startingOffsets'"):  # it would read nothing (as Kafka refuses it)
        read(spark, nats_server, stream=filled, startingOffsets="latest").count()


def test_multiple_partitions_equal_one_partition(spark, nats_server, filled):
    one = read(spark, nats_server, stream=filled, numPartitions="1")
    many = read(spark, nats_server, stream=filled, numPartitions="7")
    assert many.rdd.getNumPartitions() == 7 and one.rdd.getNumPartitions() == 1
    assert sorted(map(tuple, one.collect())) == sorted(map(tuple, many.collect()))


def test_filters_with_wildcards(spark, nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    for subject in ["orders.eu.1", "orders.us.1", "refunds.eu", "orders.eu.2.x"]:
        publish(nats_client, f"{stream_name}.{subject}", 2)
    got = lambda f: sorted(r.subject.split(".", 1)[1] for r in read(spark, nats_server, stream=stream_name, subjects=f).collect())  # noqa: E731
    assert got(f"{stream_name}.orders.*.1") == ["orders.eu.1"] * 2 + ["orders.us.1"] * 2
    assert got(f"{stream_name}.orders.eu.>,{stream_name}.refunds.*") == \
        ["orders.eu.1"] * 2 + ["orders.eu.2.x"] * 2 + ["refunds.eu"] * 2
    # Multiple partitions over a filtered range, with gaps between matching sequences.
    df = read(spark, nats_server, stream=stream_name, subjects=f"{stream_name}.refunds.*", numPartitions="4")
    assert sorted((r.seq, r.subject) for r in df.collect()) == [(5, f"{stream_name}.refunds.eu"),
                                                                (6, f"{stream_name}.refunds.eu")]


def test_starting_options_streaming(spark, nats_server, nats_client, filled, tmp_path):
    q = stream_query(spark, nats_server, "st_earliest", stream=filled, startingOffsets="earliest")
    finished(q, 120)
    assert seqs(spark, "st_earliest") == list(range(1, 61))
    q = stream_query(spark, nats_server, "st_seq", stream=filled, startingOffsets="55")
    finished(q, 120)
    assert seqs(spark, "st_seq") == list(range(55, 61))
    q = stream_query(spark, nats_server, "st_latest", stream=filled)
    finished(q, 120)
    assert seqs(spark, "st_latest") == []  # streaming default: latest ...
    assert parse_offset(q.lastProgress["sources"][0]["endOffset"])["seq"] == 60  # ... which it planned up to
    # startingTimestamp: the first message at or after a moment between two publishes. The moment
    # is at least 2 ms after the last stored message, so its epoch-ms floor is still after it.
    last = server_time(nats_client.stream_state(filled)["last_ts"])
    wait_until(lambda: dt.datetime.now(dt.timezone.utc) >= last + dt.timedelta(milliseconds=2), timeout=5)
    moment = dt.datetime.now(dt.timezone.utc)
    publish(nats_client, f"{filled}.late", 3, start=100)
    for value in [moment.isoformat(), str(int(moment.timestamp() * 1000))]:
        q = stream_query(spark, nats_server, "st_ts", stream=filled, startingTimestamp=value)
        finished(q, 120)
        assert seqs(spark, "st_ts") == [61, 62, 63]
    assert sorted(r.seq for r in read(spark, nats_server, stream=filled, startingTimestamp=moment.isoformat())
                  .collect()) == [61, 62, 63]


def test_max_messages_per_trigger_batches(spark, nats_server, filled):
    q = stream_query(spark, nats_server, "st_limit", stream=filled, startingOffsets="earliest", maxMessagesPerTrigger="25")
    finished(q, 120)
    assert [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]] == [25, 25, 10]
    assert seqs(spark, "st_limit") == list(range(1, 61))
    source = q.recentProgress[-1]["sources"][0]
    assert parse_offset(source["latestOffset"])["seq"] == 60


def test_available_now_stops_at_its_target(spark, nats_server, nats_client, filled, tmp_path):
    r = (spark.readStream.format("jetstream").option("servers", nats_server.url).option("stream", filled)
         .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", "10").load())
    published = []

    def during_batch(df, batch_id):
        if batch_id == 0:  # messages published while the AvailableNow run is going on
            publish(nats_client, f"{filled}.during", 5, start=200)
            published.append(5)
        df.select("seq").write.mode("append").parquet(str(tmp_path / "out"))

    q = r.writeStream.foreachBatch(during_batch).option("checkpointLocation", str(tmp_path / "chk")) \
        .trigger(availableNow=True).start()
    finished(q, 120)
    assert published and sorted(x.seq for x in spark.read.parquet(str(tmp_path / "out")).collect()) == list(range(1, 61))
    # The next run picks up what arrived later.
    q = r.writeStream.foreachBatch(lambda df, b: df.select("seq").write.mode("append").parquet(str(tmp_path / "out"))) \
        .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start()
    finished(q, 120)
    assert sorted(x.seq for x in spark.read.parquet(str(tmp_path / "out")).collect()) == list(range(1, 66))


def test_messages_published_while_the_query_runs(spark, nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    q = stream_query(spark, nats_server, "st_live", trigger={"processingTime": "100 milliseconds"},
                     stream=stream_name, startingOffsets="earliest")
    try:
        for round_ in range(3):
            publish(nats_client, f"{stream_name}.x", 20, start=round_ * 20)
            wait_until(lambda r=round_: len(seqs(spark, "st_live")) == (r + 1) * 20, timeout=60)
    finally:
        q.stop()
    assert seqs(spark, "st_live") == list(range(1, 61))


def _offsets(checkpoint) -> dict[int, dict]:
    """The source offset of each micro-batch in a checkpoint (``offsets/<batch>``: a version line,
    Spark's metadata line, then one JSON line per source)."""
    return {int(p.name): json.loads(p.read_text().splitlines()[2]) for p in (checkpoint / "offsets").iterdir()
            if p.name.isdigit()}


def _as_written_by_the_first_release(checkpoint) -> None:
    """Offsets without the stream's identity and the batch's partition count, as release 1 wrote them."""
    for path in (checkpoint / "offsets").iterdir():
        if path.name.isdigit():
            version, metadata, offset = path.read_text().splitlines()
            old = {k: v for k, v in json.loads(offset).items() if k in ("stream", "seq")}
            path.write_text("\n".join([version, metadata, json.dumps(old)]))


def test_restart_from_checkpoint_into_files_is_exactly_once(spark, nats_server, nats_client, stream_name, tmp_path):
    """The checkpoint the query restarts from was written by the first release (no identity or
    partition count in its offsets) and its last batch was not committed: that batch is planned
    again from the old offsets, and the offsets of the restarted query record the identity."""
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    publish(nats_client, f"{stream_name}.x", 40)

    def start():
        return (spark.readStream.format("jetstream").option("servers", nats_server.url).option("stream", stream_name)
                .option("startingOffsets", "earliest").options(**read_limit(15)).load()
                .select("seq", "data").writeStream.format("parquet").option("path", str(tmp_path / "out"))
                .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())

    q = start()
    finished(q, 120)
    limited = bool(read_limit(15))  # PySpark < 4.2 reads the 40 in one micro-batch, then the 25 in one
    assert sorted(_offsets(tmp_path / "chk")) == ([0, 1, 2] if limited else [0])
    last = max(_offsets(tmp_path / "chk"))
    _as_written_by_the_first_release(tmp_path / "chk")
    for log in (tmp_path / "chk" / "commits", tmp_path / "out" / "_spark_metadata"):
        for name in (str(last), f".{last}.crc"):  # its last batch is run again, as after a crash before its commit
            (log / name).unlink(missing_ok=True)
    publish(nats_client, f"{stream_name}.x", 25, start=40)
    q = start()
    finished(q, 120)
    if not limited:
        # PySpark < 4.2 (Spark's AvailableNow wrapper): a run that starts by replaying an uncommitted batch
        # ends after it, exactly once; the next run reads what came since.
        assert sorted(r.seq for r in spark.read.parquet(str(tmp_path / "out")).collect()) == list(range(1, 41))
        finished(start(), 120)
    out = [r.seq for r in spark.read.parquet(str(tmp_path / "out")).collect()]
    assert sorted(out) == list(range(1, 66)) and len(out) == len(set(out))
    created = nats_client.api(f"STREAM.INFO.{stream_name}")["created"]
    offsets = _offsets(tmp_path / "chk")
    after = 2 if limited else 1
    assert [offsets[b].get("created") for b in sorted(offsets)] == [None] * (last + 1) + [created] * after
    assert offsets[max(offsets)]["seq"] == 65


def test_ttl_expires_at_and_max_age_markers(spark, nats_server, nats_client, stream_name):
    # One message per subject, so the 1s TTL is not raised to the 60s marker TTL; no MaxAge, which
    # would remove the marker itself a few seconds after it appears.
    nats_client.add_stream(stream_name, [f"{stream_name}.>"], allow_msg_ttl=True, subject_delete_marker_ttl=60 * 10**9,
                           max_msgs_per_subject=1)
    publish(nats_client, f"{stream_name}.ttl", 1, headers=b"NATS/1.0\r\nNats-TTL: 1s\r\n\r\n")
    publish(nats_client, f"{stream_name}.keep", 1, headers=b"NATS/1.0\r\nNats-TTL: 90s\r\n\r\n")
    publish(nats_client, f"{stream_name}.never", 1, headers=b"NATS/1.0\r\nNats-TTL: never\r\n\r\n")
    # Look-alikes of a marker's header, in a name and in a value: ordinary messages.
    publish(nats_client, f"{stream_name}.alike1", 1, headers=b"NATS/1.0\r\nX-Nats-Marker-Reason: none\r\n\r\n")
    publish(nats_client, f"{stream_name}.alike2", 1, headers=b"NATS/1.0\r\nX-Note: Nats-Marker-Reason: MaxAge\r\n\r\n")
    wait_until(lambda: any(m.headers.get("Nats-Marker-Reason") for m in nats_client.messages(stream_name)),
               timeout=30, what="the server's marker for the expired message")
    rows = {r.subject.split(".")[1]: r for r in read(spark, nats_server, stream=stream_name).collect()}
    marker = rows["ttl"]
    assert marker.marker_reason == "MaxAge" and marker.data == b"" and marker.ttl == "1m0s"
    assert dict(marker.headers)["Nats-Rollup"] == ["sub"]
    assert (marker.expires_at - marker.timestamp).total_seconds() == 60
    assert rows["keep"].ttl == "90s" and (rows["keep"].expires_at - rows["keep"].timestamp).total_seconds() == 90
    # Without markers: the ordinary messages only.
    plain = read(spark, nats_server, stream=stream_name, includeMarkers="false").collect()
    assert sorted(r.subject.split(".")[1] for r in plain) == ["alike1", "alike2", "keep", "never"]
    assert rows["alike1"].marker_reason is None and rows["alike2"].marker_reason is None


def test_kv_bucket_change_log(spark, nats_server, nats_client):
    kv = nats_client.run(nats_client.js.create_key_value(bucket="cfgkv", history=5))
    nats_client.run(kv.put("a", b"1"))
    nats_client.run(kv.put("b.c", b"2"))
    nats_client.run(kv.delete("a"))
    nats_client.run(kv.purge("b.c"))
    rows = read(spark, nats_server, bucket="cfgkv").orderBy("seq").collect()
    # A purge is a roll-up: it removes the key's earlier revisions, leaving its PURGE marker.
    assert [(r.key, r.operation, r.data) for r in rows] == [("a", "PUT", b"1"), ("a", "DEL", b""), ("b.c", "PURGE", b"")]
    assert rows[0].stream == "KV_cfgkv"


def test_data_loss_after_purge(spark, nats_server, nats_client, stream_name, tmp_path):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    publish(nats_client, f"{stream_name}.x", 10)

    def query(**extra):
        r = (spark.readStream.format("jetstream").option("servers", nats_server.url).option("stream", stream_name)
             .option("startingOffsets", "earliest").options(**read_limit(5)))
        for k, v in extra.items():
            r = r.option(k, v)
        return r.load().select("seq").writeStream.format("parquet").option("path", str(tmp_path / "out")) \
            .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start()

    q = query()
    finished(q, 120)
    publish(nats_client, f"{stream_name}.x", 10, start=10)
    assert "error" not in nats_client.api(f"STREAM.PURGE.{stream_name}", {"keep": 3})  # removes 11..17 unread
    q = query()
    lost_to = 15 if read_limit(5) else 17  # the first batch's range after the purge (PySpark < 4.2: all new)
    with pytest.raises(Exception, match=rf"Data loss in stream '{stream_name}': sequences 11\.\.{lost_to} .*failOnDataLoss"):
        finished(q, 120)
    q = query(failOnDataLoss="false")
    finished(q, 120)
    assert sorted(r.seq for r in spark.read.parquet(str(tmp_path / "out")).collect()) == list(range(1, 11)) + [18, 19, 20]


def test_bookmark_consumer_shows_progress(spark, nats_server, nats_client, filled):
    """Spark commits a micro-batch's source offset when it plans the next one; the bookmark follows at every
    trigger, idle ones included, and at a clean stop: 0 pending once the query has read everything (issue #56:
    it stayed a micro-batch behind for good once traffic stopped)."""
    q = stream_query(spark, nats_server, "st_bm", trigger={"processingTime": "100 milliseconds"}, stream=filled,
                     startingOffsets="earliest", maxMessagesPerTrigger="20", bookmarkConsumer="spark_orders")
    try:
        wait_until(lambda: len(seqs(spark, "st_bm")) == 60, timeout=60)
        publish(nats_client, f"{filled}.more", 4, start=500)
        wait_until(lambda: len(seqs(spark, "st_bm")) == 64, timeout=60)

        def bookmark():
            info = nats_client.api(f"CONSUMER.INFO.{filled}.spark_orders")
            return info if "error" not in info and info["delivered"]["stream_seq"] >= 60 else None

        info = wait_until(bookmark, timeout=30)
        assert info["num_pending"] == 64 - info["delivered"]["stream_seq"]  # the query's lag, as NATS tools show it

        def caught_up():  # traffic stopped: the idle triggers move it to the end
            idle = nats_client.api(f"CONSUMER.INFO.{filled}.spark_orders")
            return idle if idle["num_pending"] == 0 and idle["delivered"]["stream_seq"] == 64 else None

        wait_until(caught_up, timeout=30, what="the bookmark at the end while the query idles")
    finally:
        q.stop()
    assert info["config"]["ack_policy"] == "none" and info["config"].get("durable_name") == "spark_orders"
    stopped = nats_client.api(f"CONSUMER.INFO.{filled}.spark_orders")
    assert (stopped["num_pending"], stopped["delivered"]["stream_seq"]) == (0, 64)


def test_round_trip_stream_spark_stream(spark, nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"], allow_msg_ttl=True)
    nats_client.add_stream(stream_name + "C", [f"{stream_name}C.>"], allow_msg_ttl=True)
    publish(nats_client, f"{stream_name}.a", 3, headers=b"NATS/1.0\r\nX-M: 1\r\nX-M: 2\r\nNats-TTL: 1h\r\n\r\n")
    publish(nats_client, f"{stream_name}.b", 2, start=3)
    df = read(spark, nats_server, stream=stream_name)
    (df.withColumn("subject", F.regexp_replace("subject", f"^{stream_name}", f"{stream_name}C"))
       .repartition(2, "subject").write.format("jetstream").mode("append").option("servers", nats_server.url)
       .option("stream", stream_name + "C").save())
    copied = sorted(nats_client.messages(stream_name + "C"), key=lambda m: m.data)
    original = sorted(nats_client.messages(stream_name), key=lambda m: m.data)
    assert [m.data for m in copied] == [m.data for m in original]
    for c, o in zip(copied, original, strict=True):
        assert c.subject == o.subject.replace(stream_name, stream_name + "C", 1)
        assert c.headers.get("X-M") == o.headers.get("X-M") and c.headers.get("Nats-TTL") == o.headers.get("Nats-TTL")


def test_source_options_are_validated(spark, nats_server, stream_name):
    for options, needle in [
        ({}, "Name the stream to read"),
        ({"stream": stream_name, "startingOffsets": "first"}, "'startingOffsets': 'first'"),
        ({"stream": stream_name, "consume.maxMessages": "10", "consume.maxBytes": "10"}, "exclusive"),
        ({"stream": stream_name, "consume.expires": "500ms"}, "'consume.expires'"),
        ({"stream": stream_name, "defaultTtl": "1h"}, "does not apply when reading"),
        ({"stream": stream_name, "maxMessagesPerTrigger": "5"}, "streaming reads only"),
        ({"stream": "NO_SUCH_STREAM"}, "Stream 'NO_SUCH_STREAM' does not exist"),
    ]:
        with pytest.raises(Exception, match=needle):
            read(spark, nats_server, **options).collect()


@pytest.mark.parametrize(
    "consume",
    [
        {"consume__maxMessages": "1"},
        {"consume__maxMessages": "7", "consume__thresholdMessages": "0"},
        {"consume__maxBytes": "300"},
        {"consume__maxBytes": "5000", "consume__thresholdBytes": "4999", "batchSize": "3"},
        {"consume__expires": "2s", "consume__idleHeartbeat": "500ms", "batchSize": "1"},
    ],
)
def test_consume_settings_read_the_same_rows(spark, nats_server, filled, consume):
    df = read(spark, nats_server, stream=filled, numPartitions="2", **consume)
    assert sorted(r.seq for r in df.collect()) == list(range(1, 61))


def test_range_whose_tail_was_deleted_ends_without_waiting(spark, nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    publish(nats_client, f"{stream_name}.x", 10)
    for seq in (8, 9, 10):
        assert "error" not in nats_client.api(f"STREAM.MSG.DELETE.{stream_name}", {"seq": seq})
    publish(nats_client, f"{stream_name}.x", 1, start=10)  # seq 11
    # A partition waiting for its 60s pull request to expire would fail after 20s without progress.
    rows = read(spark, nats_server, stream=stream_name, numPartitions="3", consume__expires="60s",
                consume__maxWait="20s").collect()
    assert sorted(r.seq for r in rows) == [1, 2, 3, 4, 5, 6, 7, 11]  # seq 11 ends the middle partition
    # Nothing after the deleted tail: the consumers report nothing pending, which ends the partitions.
    assert "error" not in nats_client.api(f"STREAM.MSG.DELETE.{stream_name}", {"seq": 11})
    rows = read(spark, nats_server, stream=stream_name, numPartitions="3", consume__expires="60s",
                consume__maxWait="20s").collect()
    assert sorted(r.seq for r in rows) == [1, 2, 3, 4, 5, 6, 7]


def test_odd_headers_and_binary_payloads_come_through_intact(spark, nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    odd = b"NATS/1.0\r\nEmpty:\r\nStatus: 503\r\nDescription: No Messages\r\nX-Dup: a\r\nX-Dup: a\r\n\r\n"
    assert "error" not in nats_client.publish_raw(f"{stream_name}.odd", odd, b"\xff\xfe\x00\x80not-utf8")
    assert "error" not in nats_client.publish_raw(f"{stream_name}.empty", None, b"")
    rows = {r.subject.split(".")[1]: r for r in read(spark, nats_server, stream=stream_name).collect()}
    assert rows["odd"].data == b"\xff\xfe\x00\x80not-utf8"
    assert dict(rows["odd"].headers) == {"Empty": [""], "Status": ["503"], "Description": ["No Messages"],
                                         "X-Dup": ["a", "a"]}
    assert rows["empty"].data == b"" and rows["empty"].headers is None


def test_messages_no_schema_can_hold_are_read_not_hung(spark, nats_server, nats_client, stream_name):
    """A TTL the server accepts but whose expiry lies past Spark's timestamp range (written
    by nats-py and by this sink), and a subject that is not UTF-8: the read ends, every
    message is a row, ``ttl`` keeps what is stored and ``expires_at`` is null."""
    nats_client.add_stream(stream_name, [f"{stream_name}.>"], allow_msg_ttl=True)
    huge = "9999999999999"
    ack = nats_client.run(nats_client.js.publish(f"{stream_name}.py", b"from-nats-py", msg_ttl=int(huge)))
    assert ack.seq == 1
    (spark.createDataFrame([(f"{stream_name}.sink", b"from-sink", huge)], "subject string, data binary, ttl string")
     .write.format("jetstream").option("servers", nats_server.url).option("stream", stream_name).mode("append").save())
    assert "error" not in nats_client.publish_raw(f"{stream_name}.odd.".encode() + b"\xff\xfe", None, b"not-utf8")
    publish(nats_client, f"{stream_name}.plain", 1)
    rows = read(spark, nats_server, stream=stream_name, consume__maxWait="20s").orderBy("seq").collect()
    assert [(r.seq, r.data, r.ttl, r.expires_at) for r in rows] == [
        (1, b"from-nats-py", huge, None), (2, b"from-sink", huge, None), (3, b"not-utf8", None, None),
        (4, b"m0", None, None)]
    assert rows[2].subject == f"{stream_name}.odd.\ufffd\ufffd"
    assert dict(rows[1].headers)["Nats-TTL"] == [huge]


def test_subjects_with_a_vertical_tab_or_form_feed_are_read(spark, nats_server, nats_client, stream_name):
    """The server takes VT and FF inside a subject (it splits a line's arguments at space, tab, CR and
    LF); nats-py's delivery-line regex split there too, dropped the connection and the read reconnected
    until its task died. Every message is a row, with and without headers, in a frame nats-py's own
    parser gathers too (past 256 KiB), on 2 partitions, field by field as the server's STREAM.MSG.GET
    gives it."""
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    block = b"NATS/1.0\r\nX-Tag: a\r\n\r\n"
    for subject, headers, data in ((".a\x0cb", None, b"ff"), (".c\x0bd", block, b"vt"), (".plain", block, b"p"),
                                   (".big\x0cx", block, b"L" * 300_000), (".e\x0b\x0cf", None, b"both")):
        assert "error" not in nats_client.publish_raw(stream_name.encode() + subject.encode(), headers, data)
    stored = nats_client.messages(stream_name)
    assert [m.subject for m in stored] == [f"{stream_name}{s}" for s in (".a\x0cb", ".c\x0bd", ".plain", ".big\x0cx",
                                                                        ".e\x0b\x0cf")]
    rows = read(spark, nats_server, stream=stream_name, numPartitions="2", consume__maxWait="20s") \
        .orderBy("seq").collect()
    assert [(r.subject, r.seq, r.data, dict(r.headers or {})) for r in rows] == \
        [(m.subject, m.seq, m.data, m.headers) for m in stored]


def test_kv_keys_removed_by_their_ttl_read_as_purge_like_nats_py_sees_them(spark, nats_server, nats_client):
    """A key created with a per-key TTL in a bucket with limit markers: when it expires the server
    writes a MaxAge marker, which nats-py's KV API (history, get) reports as PURGE. The change log
    says the same, field by field, with marker_reason kept."""
    from nats.js.api import KeyValueConfig

    kv = nats_client.run(nats_client.js.create_key_value(KeyValueConfig(bucket="ttlkv", history=1,
                                                                          limit_marker_ttl=60)))
    nats_client.run(kv.create("short", b"gone-soon", msg_ttl=2))
    nats_client.run(kv.put("stay", b"here"))

    def py_ops(key):  # kv.history() asked until two answers agree (nats-io/nats.py#842)
        return [(op, value or b"") for op, value in history(nats_client, kv, key)]

    wait_until(lambda: py_ops("short") == [("PURGE", b"")], timeout=20, what="nats-py sees the expired key purged")
    rows = read(spark, nats_server, bucket="ttlkv").orderBy("seq").collect()
    assert [(r.key, r.operation, r.data) for r in rows] == [("stay", "PUT", b"here"), ("short", "PURGE", b"")]
    assert [(r.operation, r.data) for r in rows if r.key == "short"] == py_ops("short")
    assert rows[1].marker_reason == "MaxAge" and rows[0].marker_reason is None


def test_expires_at_is_the_earlier_of_ttl_and_max_age(spark, nats_server, nats_client, stream_name):
    # MaxAge 60s: long enough that nothing expires before the read (MaxAge removing a 90s TTL message
    # at its MaxAge is the server's documented behaviour, shown by the sink tests' MaxAge stream).
    nats_client.add_stream(stream_name, [f"{stream_name}.>"], allow_msg_ttl=True, max_age=60 * 10**9)
    publish(nats_client, f"{stream_name}.long", 1, headers=b"NATS/1.0\r\nNats-TTL: 90s\r\n\r\n")
    publish(nats_client, f"{stream_name}.short", 1, headers=b"NATS/1.0\r\nNats-TTL: 30\r\n\r\n")
    publish(nats_client, f"{stream_name}.never", 1, headers=b"NATS/1.0\r\nNats-TTL: never\r\n\r\n")
    publish(nats_client, f"{stream_name}.plain", 1)
    rows = {r.subject.split(".")[1]: r for r in read(spark, nats_server, stream=stream_name).collect()}
    left = {k: None if r.expires_at is None else (r.expires_at - r.timestamp).total_seconds() for k, r in rows.items()}
    assert left == {"long": 60, "short": 30, "never": None, "plain": 60}
    assert rows["long"].ttl == "90s" and rows["short"].ttl == "30"


def test_a_work_queue_stream_is_refused_when_the_read_is_planned(spark, nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"], retention="workqueue")
    publish(nats_client, f"{stream_name}.x", 3)
    with pytest.raises(Exception) as info:
        read(spark, nats_server, stream=stream_name).collect()
    text = str(info.value)
    assert "StreamConfigError" in text and "WorkQueue retention" in text and "--mirror" in text
    assert "CONSUMER.CREATE" not in text  # refused on the driver, before any task
    assert nats_client.stream_state(stream_name)["messages"] == 3  # and nothing was taken from it


def test_interest_mirror_and_sourced_streams_are_read_by_their_own_sequences(spark, nats_server, nats_client,
                                                                            stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"], retention="interest")
    nats_client.add_stream(stream_name + "L", [f"{stream_name}L.>"])
    publish(nats_client, f"{stream_name}L.x", 5)
    assert nats_client.api(f"STREAM.MSG.DELETE.{stream_name}L", {"seq": 2}).get("success")
    nats_client.add_stream(stream_name + "M", [], mirror={"name": stream_name + "L"})
    nats_client.add_stream(stream_name + "S", [], sources=[{"name": stream_name + "L"}])
    wait_until(lambda: nats_client.stream_state(stream_name + "M")["messages"] == 4
               and nats_client.stream_state(stream_name + "S")["messages"] == 4, timeout=30, what="mirrored")
    mirror = [(r.seq, r.data) for r in read(spark, nats_server, stream=stream_name + "M").orderBy("seq").collect()]
    sourced = [(r.seq, r.data) for r in read(spark, nats_server, stream=stream_name + "S").orderBy("seq").collect()]
    assert mirror == [(1, b"m0"), (3, b"m2"), (4, b"m3"), (5, b"m4")]  # a mirror keeps the origin's sequences
    assert sourced == [(1, b"m0"), (2, b"m2"), (3, b"m3"), (4, b"m4")]  # a sourced stream numbers its own
    # An Interest stream is read as it is: what it holds now (here nothing, as no consumer is interested).
    publish(nats_client, f"{stream_name}.x", 2)
    assert read(spark, nats_server, stream=stream_name).collect() == []


def test_the_consumer_limit_names_num_partitions(spark, nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"], max_consumers=1)
    publish(nats_client, f"{stream_name}.x", 10)
    holder = {"name": "holder", "durable_name": "holder", "ack_policy": "none"}
    assert "error" not in nats_client.api(f"CONSUMER.CREATE.{stream_name}.holder",
                                          {"stream_name": stream_name, "config": holder})
    with pytest.raises(Exception) as info:
        read(spark, nats_server, stream=stream_name, numPartitions="2").collect()
    text = str(info.value)
    assert "consumer limit (max_consumers) is reached" in text and "'numPartitions'" in text


def test_header_values_are_trimmed_as_other_nats_clients_read_them(spark, nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    block = b"NATS/1.0\r\nX-Pad:   padded  \r\nX-Inner: a  b\r\n\r\n"
    assert "error" not in nats_client.publish_raw(f"{stream_name}.x", block, b"p")
    [row] = read(spark, nats_server, stream=stream_name).collect()
    sub = nats_client.run(nats_client.js.pull_subscribe(f"{stream_name}.x", durable="trim", stream=stream_name))
    [msg] = nats_client.run(sub.fetch(1, timeout=10))
    assert dict(row.headers) == {"X-Pad": ["padded"], "X-Inner": ["a  b"]}
    assert {k: [v] for k, v in msg.headers.items()} == dict(row.headers)  # what nats-py's JetStream API reads


def _progress_saw(query, seq: int) -> bool:
    """Some progress report shows the source's latest sequence at ``seq`` or past it."""
    latest = [p.sources[0].latestOffset for p in query.recentProgress if p.sources]
    return any((parse_offset(offset) or {}).get("seq", 0) >= seq for offset in latest)


def test_min_messages_per_trigger_waits_for_enough_or_for_the_delay(spark, nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "200")

    def start(name, **options):
        r = (spark.readStream.format("jetstream").option("servers", nats_server.url).option("stream", stream_name)
             .option("startingOffsets", "earliest"))
        for key, value in options.items():
            r = r.option(key, value)
        return (r.load().select("seq").writeStream.format("memory").queryName(name)
                .trigger(processingTime="200 milliseconds").start())

    rows = lambda name: sorted(r.seq for r in spark.table(name).collect())  # noqa: E731
    waiting = start(f"min_{stream_name.lower()}", minMessagesPerTrigger="10", maxTriggerDelay="1h")
    try:
        publish(nats_client, f"{stream_name}.x", 5)
        # The source has seen the 5 new sequences (its latest offset) and planned no batch for them.
        wait_until(lambda: _progress_saw(waiting, 5), timeout=60, what="a progress report after the 5 messages")
        assert rows(f"min_{stream_name.lower()}") == []
        publish(nats_client, f"{stream_name}.x", 5, start=5)
        wait_until(lambda: rows(f"min_{stream_name.lower()}") == list(range(1, 11)), timeout=60,
                   what="one micro-batch with the 10 messages")
        # The memory sink shows the rows before Spark posts that batch's progress report: wait for it.
        batches = lambda: [p.numInputRows for p in waiting.recentProgress if p.numInputRows]  # noqa: E731
        wait_until(lambda: batches(), timeout=60, what="the progress report of the batch with the 10 messages")
        assert batches() == [10]
    finally:
        waiting.stop()
    # Fewer than the minimum: the batch goes once maxTriggerDelay has passed.
    delayed = start(f"delay_{stream_name.lower()}", minMessagesPerTrigger="1000", maxTriggerDelay="2s")
    try:
        wait_until(lambda: rows(f"delay_{stream_name.lower()}") == list(range(1, 11)), timeout=60,
                   what="the 10 messages after maxTriggerDelay")
    finally:
        delayed.stop()


def test_ending_timestamp_reads_up_to_the_last_message_stored_at_or_before_it(spark, nats_server, nats_client,
                                                                              stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    publish(nats_client, f"{stream_name}.x", 10)
    stamps = {r.seq: r.timestamp for r in read(spark, nats_server, stream=stream_name).collect()}
    sixth = stamps[6].astimezone(dt.timezone.utc).isoformat()
    assert [r.seq for r in read(spark, nats_server, stream=stream_name, endingTimestamp=sixth)
            .orderBy("seq").collect()] == [1, 2, 3, 4, 5, 6]
    assert read(spark, nats_server, stream=stream_name, endingTimestamp="2000-01-01T00:00:00Z").count() == 0
    assert read(spark, nats_server, stream=stream_name, endingTimestamp="2999-01-01T00:00:00Z").count() == 10


def test_a_large_batch_of_mixed_header_blocks_reaches_spark_intact(spark, nats_server, nats_client, stream_name):
    """Spark's JVM reads the map column's buffers (to_pylist() in Python does not): a batch of a few
    thousand messages with no headers, one header, and a repeated header, collected as rows."""
    nats_client.add_stream(stream_name, [f"{stream_name}.>"], allow_msg_ttl=True)
    shapes = [None, b"NATS/1.0\r\nNats-TTL: 1h\r\n\r\n",
              b"NATS/1.0\r\nX-Tag: a\r\nX-Id: {i}\r\nX-Tag: b\r\n\r\n"]

    publish_blocks = [shapes[i % 3] and shapes[i % 3].replace(b"{i}", str(i).encode()) for i in range(3000)]
    for i, block in enumerate(publish_blocks):
        assert "error" not in nats_client.publish_raw(f"{stream_name}.x", block, f"m{i}".encode())
    rows = read(spark, nats_server, stream=stream_name).orderBy("seq").collect()
    assert len(rows) == 3000
    for i, row in enumerate(rows):
        expected = [None, {"Nats-TTL": ["1h"]}, {"X-Tag": ["a", "b"], "X-Id": [str(i)]}][i % 3]
        assert (row.data, row.headers) == (f"m{i}".encode(), expected), i
