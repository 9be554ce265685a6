"""JetStream domains: a hub and a leaf node, each with its own JetStream, on 127.0.0.1.

A client connected to the leaf reaches the hub's JetStream only through
``$JS.hub.API`` (option ``domain``), and the reverse through ``$JS.leaf.API``.
"""

from __future__ import annotations

import json

import pytest
from pyspark.sql import functions as F

from pyspark_jetstream.server import EmbeddedNatsServer, _free_port

from ..helpers import SyncNats, finished, jetstream_writer, publish, wait_until


def _answers(client: SyncNats, prefix: str) -> bool:
    try:
        reply = client.run(client.nc.request(f"{prefix}.INFO", b"", timeout=2))
    except Exception:
        return False
    return "error" not in json.loads(reply.data)


@pytest.fixture(scope="module")
def hub_and_leaf():
    port = _free_port()
    with EmbeddedNatsServer(jetstream_config="domain: hub",
                            config=f'leafnodes {{ listen: "127.0.0.1:{port}" }}') as hub, \
            EmbeddedNatsServer(jetstream_config="domain: leaf",
                               config=f'leafnodes {{ remotes = [ {{ url: "nats-leaf://127.0.0.1:{port}" }} ] }}') as leaf:
        on_hub, on_leaf = SyncNats(hub.url), SyncNats(leaf.url)
        wait_until(lambda: _answers(on_leaf, "$JS.hub.API") and _answers(on_hub, "$JS.leaf.API"), timeout=30,
                   what="the leaf node connected, each domain reachable from the other side")
        yield hub, leaf, on_hub, on_leaf
        on_hub.close()
        on_leaf.close()


def test_a_hub_stream_read_from_the_leaf_exactly_once_across_a_restart(spark, hub_and_leaf, tmp_path):
    hub, leaf, on_hub, _ = hub_and_leaf
    on_hub.add_stream("HUBS", ["hubs.>"])
    publish(on_hub, "hubs.x", 50)

    def run():
        return finished(spark.readStream.format("jetstream").option("servers", leaf.url).option("domain", "hub")
                        .option("stream", "HUBS").option("startingOffsets", "earliest")
                        .option("maxMessagesPerTrigger", "20").load().select("seq", "data")
                        .writeStream.format("parquet").option("path", str(tmp_path / "out"))
                        .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())

    run()
    publish(on_hub, "hubs.x", 20, start=50)
    run()
    out = sorted((r.seq, r.data) for r in spark.read.parquet(str(tmp_path / "out")).collect())
    assert out == [(i, f"m{i - 1}".encode()) for i in range(1, 71)]
    # Without the domain the leaf's own JetStream answers, which has no such stream.
    with pytest.raises(Exception, match="Stream 'HUBS' does not exist"):
        spark.read.format("jetstream").option("servers", leaf.url).option("stream", "HUBS").load().collect()


def test_a_leaf_stream_written_from_the_hub(spark, hub_and_leaf):
    hub, leaf, on_hub, on_leaf = hub_and_leaf
    on_leaf.add_stream("LEAFS", ["leafs.>"], allow_msg_ttl=True)
    df = spark.createDataFrame([(f"row-{i}", "1h") for i in range(30)], "data string, ttl string").coalesce(1)
    (jetstream_writer(df, hub.url, domain="leaf", stream="LEAFS", subject="leafs.x").save())
    stored = on_leaf.messages("LEAFS")
    assert sorted(m.data for m in stored) == sorted(f"row-{i}".encode() for i in range(30))
    assert all(m.headers["Nats-TTL"] == ["1h"] and m.headers["Nats-Expected-Stream"] == ["LEAFS"] for m in stored)
    # ensureStream=create reaches the leaf's JetStream too.
    (jetstream_writer(df.select(F.col("data")), hub.url, domain="leaf", stream="LEAFNEW", subject="leafnew.x",
                      ensureStream="create").save())
    assert on_leaf.stream_state("LEAFNEW")["messages"] == 30
