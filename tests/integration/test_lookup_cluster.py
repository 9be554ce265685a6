"""Lookups through leader changes and outages (issue #55): on an R3 bucket whose leader steps down again and again
while lookups run, every row still gets what nats-py's ``kv.get`` gives; with the server stopped, a lookup
rides a restart within its ``timeout`` and fails naming the bucket and the option past it."""

from __future__ import annotations

import contextlib
import threading

import nats.errors
import pytest

from pyspark_jetstream import lookup
from pyspark_jetstream.tools.server import EmbeddedNatsServer

from ..helpers import SyncNats, kv_of, new_bucket, wait_until
from .test_lookup import _compare

KEYS = 1_500


def _filled(client: SyncNats, bucket: str, replicas: int):
    kv = new_bucket(client, bucket, history=5, replicas=replicas, direct=True)

    async def put_all():
        for i in range(KEYS):
            await kv.put(f"k{i}", f"v{i}".encode())
        await kv.delete("k3")
        await kv.purge("k4")

    client.run(put_all(), timeout=300)
    return kv


def test_lookups_through_leader_step_downs_give_what_kv_get_gives(spark, nats_cluster, stream_name):
    client = SyncNats(nats_cluster.url)
    bucket = stream_name.replace("_", "")[:40]
    try:
        kv = _filled(client, bucket, 3)
        keys = [f"k{i}" for i in range(0, KEYS + 300, 3)] * 2  # repeats, and 100 keys past the bucket's
        df = spark.createDataFrame([(i, k) for i, k in enumerate(keys)], "n int, device string").repartition(4)
        stop = threading.Event()
        step_downs = []

        def step_down() -> None:
            while not stop.wait(0.4):
                with contextlib.suppress(nats.errors.Error, AssertionError, TimeoutError):
                    if client.api(f"STREAM.LEADER.STEPDOWN.KV_{bucket}").get("success"):
                        step_downs.append(1)

        thread = threading.Thread(target=step_down, daemon=True)
        thread.start()
        try:
            runs = [lookup(df, bucket, "device", servers=nats_cluster.url, prefix="b_", timeout="60s").collect()
                    for _ in range(4)]
        finally:
            stop.set()
            thread.join(30)
        assert len(step_downs) >= 2, "the leader did not change while the lookups ran"
        for got in runs:
            assert sorted(r["n"] for r in got) == list(range(len(keys)))
            _compare(client, kv, got, keys)
    finally:
        with contextlib.suppress(Exception):
            client.api(f"STREAM.DELETE.KV_{bucket}")
        client.close()


def test_a_lookup_rides_a_restart_within_its_timeout_and_names_the_bucket_past_it(spark, stream_name):
    with EmbeddedNatsServer() as server:  # its own: it is stopped
        client = SyncNats(server.url)
        bucket = stream_name.replace("_", "")[:40]
        try:
            _filled(client, bucket, 1)
            keys = [f"k{i}" for i in range(0, KEYS, 7)]
            df = spark.createDataFrame([(i, k) for i, k in enumerate(keys)], "n int, device string").coalesce(1)
            short = lookup(df, bucket, "device", servers=server.url, prefix="b_", timeout="3s")
            patient = lookup(df, bucket, "device", servers=server.url, prefix="b_", timeout="60s")
            server.stop()
            with pytest.raises(Exception) as failed:
                short.collect()
            text = str(failed.value)
            assert f"KV bucket '{bucket}'" in text and "option 'timeout'" in text, text[-2000:]

            restart = threading.Timer(3.0, server.start)  # down for 3 s into the lookup, then back
            restart.start()
            try:
                got = patient.collect()
            finally:
                restart.join()
            wait_until(lambda: client.run(client.nc.flush(), timeout=5) is None, timeout=30, what="the judge again")
            _compare(client, kv_of(client, bucket), got, keys)
        finally:
            client.close()
