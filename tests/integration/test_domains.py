"""JetStream domains: a hub and a leaf node, each with its own JetStream, on 127.0.0.1.

A client connected to the leaf reaches the hub's JetStream only through
``$JS.hub.API`` (option ``domain``), and the reverse through ``$JS.leaf.API``.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest
from pyspark.sql import functions as F

from pyspark_jetstream.tools.server import EmbeddedNatsServer, _free_port

from ..helpers import SyncNats, finished, jetstream_writer, publish, server_time, wait_until


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


ACCOUNTS = """
accounts {
  JS: {
    jetstream: enabled
    users: [ { user: js, password: js } ]
    exports: [
      { service: "$JS.API.>", response_type: stream }
      { service: "imp.>" }
    ]
  }
  APP: {
    users: [ { user: app, password: app } ]
    imports: [
      { service: { account: JS, subject: "$JS.API.>" }, to: "JS.acct.API.>" }
      { service: { account: JS, subject: "imp.>" } }
    ]
  }
}
"""


def test_an_account_reads_and_writes_through_an_imported_api_prefix(spark, tmp_path):
    """Account APP has no JetStream of its own: it imports account JS's API under JS.acct.API
    (pull deliveries come back as a streamed service response) and publishes to JS's stream
    through an imported service subject, PubAcks included."""
    with EmbeddedNatsServer(config=ACCOUNTS) as server:
        owner = SyncNats(server.url.replace("nats://", "nats://js:js@"))
        owner.add_stream("IMP", ["imp.>"], allow_msg_ttl=True)
        auth = {"user": "app", "password": "app", "apiPrefix": "JS.acct.API"}
        df = spark.createDataFrame([(f"row-{i}",) for i in range(40)], "data string").coalesce(1)
        jetstream_writer(df, server.url, stream="IMP", subject="imp.x", defaultTtl="1h", **auth).save()
        assert sorted(m.data for m in owner.messages("IMP")) == sorted(f"row-{i}".encode() for i in range(40))
        reader = spark.read.format("jetstream").option("servers", server.url).option("stream", "IMP")
        for key, value in auth.items():
            reader = reader.option(key, value)
        rows = reader.option("numPartitions", "2").load().collect()
        assert sorted((r.seq, r.data, r.ttl) for r in rows) == [(m.seq, m.data, "1h") for m in owner.messages("IMP")]
        owner.close()


def test_messages_with_the_v2_ack_subject_layout_are_read(spark, tmp_path):
    """nats-server 2.15 can send the ADR-15 v2 ack subject ($JS.ACK.<domain>.<account hash>.<stream>...,
    11 tokens) behind the js_ack_fc_v2 feature flag; with it on, the read is the same."""
    with EmbeddedNatsServer(config="feature_flags { js_ack_fc_v2: true }") as server:
        client = SyncNats(server.url)
        client.add_stream("V2", ["v2.>"])
        publish(client, "v2.x", 25)
        sub = client.run(client.js.pull_subscribe("v2.x", durable="probe", stream="V2"))
        [msg] = client.run(sub.fetch(1, timeout=10))
        assert len(msg.reply.split(".")) == 11, msg.reply  # the flag is on: v2 layout
        rows = (spark.read.format("jetstream").option("servers", server.url).option("stream", "V2")
                .option("numPartitions", "2").load().orderBy("seq").collect())
        stored = client.messages("V2")
        assert [(r.seq, r.data, r.subject) for r in rows] == [(m.seq, m.data, m.subject) for m in stored]
        # Spark hands timestamps back in the session time zone, without tzinfo.
        assert [r.timestamp.astimezone(dt.timezone.utc) for r in rows] == [server_time(m.time) for m in stored]
        client.close()
