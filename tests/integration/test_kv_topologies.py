"""Buckets in other shapes (issue #54): a bucket that mirrors another holds the origin's subjects
(``$KV.<origin>.<key>``), so a read of the mirror takes its keys' prefix from its origin, as nats.go's
writes do. Read on one server and on an R3 cluster; judged by nats-py's KeyValue on the origin and by
direct gets on the mirror itself (nats-py's ``get_msg(direct=True)``), field by field."""

from __future__ import annotations

import time

import pytest

from ..helpers import SyncNats, kv_keys, kv_of, latest, new_bucket

PUTS = [("a", b"1"), ("b", b"1"), ("a", b"2"), ("c", b"1"), ("d", b"1"), ("c", b"2"), ("e/f=g.h", b"1")]


def _origin(client: SyncNats, name: str, replicas: int):
    kv = new_bucket(client, name, history=5, replicas=replicas)
    for key, value in PUTS:
        client.run(kv.put(key, value))
    client.run(kv.delete("b"))
    client.run(kv.purge("d"))
    return kv


def _mirror(client: SyncNats, name: str, origin: str, replicas: int, direct: bool) -> None:
    """A bucket mirroring ``origin`` as nats.go's CreateKeyValue(Mirror) makes it, caught up."""
    config = {"name": f"KV_{name}", "mirror": {"name": f"KV_{origin}"}, "mirror_direct": direct,
              "allow_direct": direct, "max_msgs_per_subject": 5, "allow_rollup_hdrs": True, "deny_delete": True,
              "discard": "new", "num_replicas": replicas, "storage": "file"}
    reply = client.api(f"STREAM.CREATE.KV_{name}", config)
    assert "error" not in reply, reply
    want = client.stream_state(f"KV_{origin}")["last_seq"]
    deadline = time.monotonic() + 30
    while client.stream_state(f"KV_{name}")["last_seq"] < want:
        assert time.monotonic() < deadline, "the mirror did not catch up within 30 s"
        time.sleep(0.05)


def _read(spark, url: str, bucket: str, **options) -> list:
    reader = spark.read.format("jetstream").option("servers", url).option("bucket", bucket)
    for key, value in options.items():
        reader = reader.option(key.replace("__", "."), value)
    return reader.load().orderBy("seq").collect()


@pytest.mark.parametrize("direct", [True, False], ids=["mirror_direct", "no-direct"])
@pytest.mark.parametrize("deployment", ["R1", "R3"])
def test_a_mirror_of_a_bucket_reads_as_its_origin(spark, nats_server, nats_cluster, stream_name, deployment, direct):
    server, replicas = (nats_server, 1) if deployment == "R1" else (nats_cluster, 3)
    origin, mirror = stream_name, stream_name + "M"
    client = SyncNats(server.url)
    try:
        kv = _origin(client, origin, replicas)
        _mirror(client, mirror, origin, replicas, direct)
        state = {key: latest(client, kv, key) for key in kv_keys(client, kv)}
        assert state == {"a": b"2", "c": b"2", "e/f=g.h": b"1"}

        # The latest view, and option 'keys' (direct gets where the mirror allows them).
        rows = _read(spark, server.url, mirror, kv__view="latest")
        assert {r.key: r.data for r in rows} == state
        assert {r.key: r.data for r in _read(spark, server.url, mirror, kv__view="latest", keys="a,b,e/f=g.h")} == {
            "a": b"2", "e/f=g.h": b"1"}
        if direct:  # the mirror itself answers direct gets of the origin's subjects
            for r in rows:
                msg = client.run(client.js.get_msg(f"KV_{mirror}", subject=f"$KV.{origin}.{r.key}", direct=True))
                assert (msg.seq, msg.data) == (r.seq, r.data)

        # The change log: the origin's, row for row (key, operation, value, sequence, subject).
        def log(bucket: str) -> list:
            return [(r.key, r.operation, r.data, r.seq, r.subject) for r in _read(spark, server.url, bucket)]

        assert log(mirror) == log(origin) and len(log(origin)) == 8
        assert [row[0] for row in log(mirror) if row[1] == "PUT"] == ["a", "b", "a", "c", "c", "e/f=g.h"]

        # A streaming read of the mirror (AvailableNow) sees the same change log.
        query = (spark.readStream.format("jetstream").option("servers", server.url).option("bucket", mirror)
                 .option("startingOffsets", "earliest").load()
                 .select("key", "operation", "data", "seq").writeStream.format("memory")
                 .queryName(f"m{mirror.lower()}").trigger(availableNow=True).start())
        assert query.awaitTermination(120) and query.exception() is None
        streamed = [(r.key, r.operation, r.data, r.seq) for r in spark.sql(f"select * from m{mirror.lower()}").collect()]
        assert sorted(streamed, key=lambda row: row[3]) == [row[:4] for row in log(origin)]
    finally:
        for name in (mirror, origin):
            client.api(f"STREAM.DELETE.KV_{name}")
        client.close()


def test_a_write_to_a_mirrored_bucket_is_refused_naming_its_origin(spark, nats_server, stream_name):
    origin, mirror = stream_name, stream_name + "M"
    client = SyncNats(nats_server.url)
    try:
        _origin(client, origin, 1)
        _mirror(client, mirror, origin, 1, True)
        df = spark.createDataFrame([("a", "x")], "key string, data string")
        with pytest.raises(Exception) as info:
            df.write.format("jetstream").mode("append").option("servers", nats_server.url).option(
                "bucket", mirror).save()
        assert f"is a mirror of 'KV_{origin}'" in str(info.value)
        assert latest(client, kv_of(client, origin), "a") == b"2"
    finally:
        client.close()
