"""A DataFrame read from a stream is written to another stream as it is, headers column kept.

The sources hold what real producers leave in the header block: this sink's
``Nats-Expected-Stream`` and ``Nats-Msg-Id``, TTLs, repeated user headers, a delete
marker the server placed, and nats-py's expected-stream header. Every message of the
copy is compared with its original, field by field.
"""

from __future__ import annotations

import datetime as dt
import re

from pyspark.sql import functions as F

from ..helpers import jetstream_writer, server_time, wait_until, write


def _user_headers(headers: dict[str, list[str]]) -> dict[str, list[str]]:
    return {k: v for k, v in headers.items() if not k.lower().startswith("nats-")}


def test_copies_of_sink_and_nats_py_streams_round_trip(spark, nats_server, nats_client, stream_name):
    """Two copies of the same sources: one carrying the TTLs as read, one with preserveExpiry."""
    sink_src, py_src = stream_name + "A", stream_name + "B"
    # One message per subject, so that the 1s TTL is not raised to the 60s marker TTL (ADR-43).
    nats_client.add_stream(sink_src, [f"{sink_src}.>"], allow_msg_ttl=True, subject_delete_marker_ttl=60 * 10**9,
                           max_msgs_per_subject=1)
    nats_client.add_stream(py_src, [f"{py_src}.>"])
    rows = [(f"{sink_src}.k{i}", f"v{i}", "1h" if i % 2 else None, {"X-Tag": ["t", str(i)], "X-One": [str(i)]})
            for i in range(6)]
    rows.append((f"{sink_src}.short", "gone", "1s", {"X-Tag": ["s"]}))  # expires: a MaxAge marker replaces it
    write(spark.createDataFrame(rows, "subject string, data string, ttl string, headers map<string,array<string>>")
          .coalesce(1), nats_server, stream=sink_src)
    for i in range(3):
        ack = nats_client.run(nats_client.js.publish(f"{py_src}.p{i}", f"py{i}".encode(), stream=py_src,
                                                     headers={"X-From": "nats-py", "X-N": str(i)}))
        assert ack.seq == i + 1
    wait_until(lambda: any(m.headers.get("Nats-Marker-Reason") for m in nats_client.messages(sink_src)),
               timeout=30, what="the server's MaxAge marker")
    originals = {m.data: m for s in (sink_src, py_src) for m in nats_client.messages(s)}
    assert all("Nats-Expected-Stream" in m.headers for k, m in originals.items() if k), "the sources carry them"

    read = (spark.read.format("jetstream").option("servers", nats_server.url).option("stream", sink_src).load()
            .unionByName(spark.read.format("jetstream").option("servers", nats_server.url).option("stream", py_src)
                         .load()))
    for preserve, target in ((False, stream_name + "C"), (True, stream_name + "D")):
        nats_client.add_stream(target, [f"{target}.>"], allow_msg_ttl=True)
        copy = read.withColumn("subject", F.concat(F.lit(f"{target}."), F.col("subject"))).repartition(2, "subject")
        if not preserve:
            copy = copy.drop("expires_at")
        options = {"stream": target, **({"preserveExpiry": "true"} if preserve else {})}
        before = dt.datetime.now(dt.timezone.utc)
        jetstream_writer(copy, nats_server.url, **options).save()
        _compare(nats_client, originals, target, sink_src, py_src, preserve, before)


def _compare(nats_client, originals, target, sink_src, py_src, preserve, before):
    copied = {m.data: m for m in nats_client.messages(target)}
    expected = {k: m for k, m in originals.items() if not m.headers.get("Nats-Marker-Reason")}
    assert set(copied) == set(expected) and len(copied) == 9  # 6 + 3; the marker was skipped
    for data, original in expected.items():
        c = copied[data]
        source_stream = sink_src if original.subject.startswith(sink_src) else py_src
        assert c.subject == f"{target}.{original.subject}"
        assert _user_headers(c.headers) == _user_headers(original.headers)
        assert c.headers["Nats-Expected-Stream"] == [target]
        # <run>:<stream>.<seq>:<digest of the row's content> (MsgIds)
        assert re.search(rf":{source_stream}\.{original.seq}:[0-9a-f]{{16}}$", c.headers["Nats-Msg-Id"][0])
        if "Nats-TTL" not in original.headers:
            assert "Nats-TTL" not in c.headers
        elif not preserve:
            assert c.headers["Nats-TTL"] == original.headers["Nats-TTL"]
        else:  # the copy keeps the original's absolute expiry: the TTL left, rounded up
            left = int(c.headers["Nats-TTL"][0])
            original_expiry = server_time(original.time) + dt.timedelta(hours=1)
            assert 0 < left <= 3600 and before + dt.timedelta(seconds=left - 1) <= original_expiry


def test_a_kv_bucket_read_is_written_to_a_stream(spark, nats_server, nats_client, stream_name):
    """The change log of a bucket, copied to a stream: the source's ``key`` and ``operation``
    columns are ignored like its other own columns; deletes and purges travel as the messages
    they are (their ``KV-Operation`` header), compared with nats-py's view of the bucket's stream."""
    bucket, target = f"B{stream_name}", stream_name + "KV"
    kv = nats_client.run(nats_client.js.create_key_value(bucket=bucket, history=5))
    for key, value in (("a", b"1"), ("b.c", b"2"), ("a", b"3")):
        nats_client.run(kv.put(key, value))
    nats_client.run(kv.delete("b.c"))
    nats_client.run(kv.purge("a"))
    nats_client.add_stream(target, [f"{target}.>"], allow_msg_ttl=True)  # the read has a ttl column
    read = spark.read.format("jetstream").option("servers", nats_server.url).option("bucket", bucket).load()
    assert {"key", "operation"} <= set(read.columns)
    jetstream_writer(read.withColumn("subject", F.concat(F.lit(f"{target}."), F.col("key"))).repartition(2, "subject"),
                     nats_server.url, stream=target).save()
    originals = nats_client.messages(f"KV_{bucket}")
    copied = nats_client.messages(target)
    assert len(originals) == 3  # the purge rolled up a's revisions: b.c's put and delete, a's purge
    as_copied = sorted((f"{target}.{o.subject.removeprefix(f'$KV.{bucket}.')}", o.data, _user_headers(o.headers))
                       for o in originals)
    assert sorted((c.subject, c.data, _user_headers(c.headers)) for c in copied) == as_copied
    assert sorted(str(c.headers.get("KV-Operation")) for c in copied) == ["None", "['DEL']", "['PURGE']"]
