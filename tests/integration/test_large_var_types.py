"""Writes with ``spark.sql.execution.arrow.useLargeVarTypes`` on: Spark then hands the writer
``large_string`` and ``large_binary`` columns (PySpark 4.x), and what is stored must be what the same
write stores with it off, message by message and header by header.

A copy of a read (content-addressed ids, ``order=subject`` through a shuffle), a plain write with a
TTL column and generated ids, and a bucket write (keys, operations) are each written twice, once per
setting, and compared through nats-py.
"""

from __future__ import annotations

import contextlib

from pyspark.sql import functions as F

from ..helpers import history, jetstream_writer, kv_keys, kv_of, new_bucket

CONF = "spark.sql.execution.arrow.useLargeVarTypes"


@contextlib.contextmanager
def large_var_types(spark, on: bool):
    before = spark.conf.get(CONF, None)
    spark.conf.set(CONF, "true" if on else "false")
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(CONF)
        else:
            spark.conf.set(CONF, before)


def _stored(nats_client, stream: str, target: str) -> list[tuple]:
    """Each stored message as (subject without the target's prefix, data, headers), in stream order; a
    generated ``Nats-Msg-Id`` without its first part, the query's run (``<run>:<stream>.<seq>:<digest>``,
    ``<run>:<partition>:<position>``), which differs from write to write by design."""
    def own(headers: dict) -> dict:
        return {k: [v.split(":", 1)[1] for v in values] if k == "Nats-Msg-Id" else values
                for k, values in headers.items() if k != "Nats-Expected-Stream"}

    return [(m.subject.removeprefix(f"{target}."), m.data, own(m.headers)) for m in nats_client.messages(stream)]


def test_a_write_with_large_var_types_stores_what_it_stores_without(spark, nats_server, nats_client, stream_name):
    source, copy, plain = stream_name + "S", stream_name + "C", stream_name + "P"
    nats_client.add_stream(source, [f"{source}.>"], allow_msg_ttl=True)
    rows = [(f"{source}.k{i % 7}", f"v{i}", "1h" if i % 3 else None) for i in range(60)]
    jetstream_writer(spark.createDataFrame(rows, "subject string, data string, ttl string").coalesce(1),
                     nats_server.url, stream=source).save()
    read = spark.read.format("jetstream").option("servers", nats_server.url).option("stream", source).load()
    stored = {}
    for on in (False, True):  # the same targets (a content id hashes the subject), made anew for each
        for target in (copy, plain):
            nats_client.api(f"STREAM.DELETE.{target}")
            nats_client.add_stream(target, [f"{target}.>"], allow_msg_ttl=True)
        with large_var_types(spark, on):
            jetstream_writer(read.withColumn("subject", F.concat(F.lit(f"{copy}."), F.col("subject")))
                             .drop("expires_at").repartition(2, "subject"), nats_server.url, stream=copy,
                             order="subject").save()
            jetstream_writer(spark.createDataFrame([(f"{plain}.s{i % 3}", bytes([i % 256]) * 40, "90s")
                                                    for i in range(50)], "subject string, data binary, ttl string")
                             .coalesce(1), nats_server.url, stream=plain).save()
        copied = _stored(nats_client, copy, copy)
        stored[on] = ({s: [m for m in copied if m[0] == s] for s in sorted({m[0] for m in copied})},
                      _stored(nats_client, plain, plain))
    assert sum(len(v) for v in stored[False][0].values()) == 60 and len(stored[False][1]) == 50
    assert stored[True] == stored[False]  # the same messages, ids (content and positional), TTLs, per subject


def test_a_bucket_write_with_large_var_types_reads_the_same_through_nats_py(spark, nats_server, nats_client,
                                                                              stream_name):
    rows = [("a", "1", None), ("b", "2", None), ("a", "3", "PUT"), ("b", None, "DEL"), ("c", "4", None),
            ("c", None, "PURGE"), ("d/e=f", "6", None)]
    seen = {}
    for on in (False, True):
        bucket = f"{stream_name}{int(on)}"
        new_bucket(nats_client, bucket, history=5)
        with large_var_types(spark, on):
            jetstream_writer(spark.createDataFrame(rows, "key string, data string, operation string").coalesce(1),
                             nats_server.url, bucket=bucket).save()
        kv = kv_of(nats_client, bucket)
        seen[on] = (kv_keys(nats_client, kv), {k: history(nats_client, kv, k) for k in ("a", "b", "c", "d/e=f")})
    assert seen[True] == seen[False]
    assert seen[True][0] == ["a", "d/e=f"] and seen[True][1]["b"] == [("PUT", b"2"), ("DEL", b"")]


def test_a_lookup_with_large_var_types_gives_what_it_gives_without(spark, nats_server, nats_client, stream_name):
    from pyspark_jetstream import lookup

    from .test_lookup import GONE, INVALID, LIVE, MISSING, _bucket

    bucket = stream_name.replace("_", "")[:40]
    _bucket(nats_client, bucket)
    keys = LIVE + GONE + MISSING + INVALID + [None] + LIVE[:3] * 3
    df = spark.createDataFrame([(i, k, f"p{i}") for i, k in enumerate(keys)], "n int, device string, payload string")
    got = {}
    for on in (False, True):
        with large_var_types(spark, on):
            got[on] = sorted(tuple(r) for r in lookup(df.repartition(3), bucket, "device", servers=nats_server.url,
                                                      prefix="b_").collect())
    assert got[True] == got[False] and len(got[True]) == len(keys)
    assert sum(r[3] is not None for r in got[True]) == len(LIVE) + 9  # b_value, as kv.get gives it
