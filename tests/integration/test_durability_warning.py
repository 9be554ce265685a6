"""The sink says at start when the target can lose writes the server acknowledged (issue #23)."""

from __future__ import annotations

from ..helpers import SyncNats, worker_log


def test_a_one_replica_target_on_a_cluster_is_named_once(spark, nats_cluster, worker_logging):
    client = SyncNats(nats_cluster.url)
    try:
        client.add_stream("DUR1", ["dur1.>"], num_replicas=1, storage="file")
        client.add_stream("DUR3", ["dur3.>"], num_replicas=3, storage="file")
        for stream in ("DUR1", "DUR3"):
            (spark.createDataFrame([(f"{stream.lower()}.x", "v")], "subject string, data string").write
             .format("jetstream").mode("append").option("servers", nats_cluster.url).option("stream", stream).save())
        warned = [m for m in worker_log(spark, "pyspark_jetstream.sink") if "may lose writes" in m]
        assert any("Stream DUR1 " in m and "one replica on a clustered server" in m for m in warned), warned
        assert not any("Stream DUR3 " in m for m in warned)
    finally:
        for stream in ("DUR1", "DUR3"):
            client.api(f"STREAM.DELETE.{stream}")
        client.close()
