"""A reading partition after a reconnect, and in front of a message its byte budget cannot carry.

Both run the partition reader in the test process (no Spark) against real servers.
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from pyspark_jetstream.errors import PartitionReadError
from pyspark_jetstream.options import parse_source_options
from pyspark_jetstream.source.read.partition import read_partition
from pyspark_jetstream.tools.server import EmbeddedNatsServer

from ..helpers import SyncNats, fill_stream, wait_until

ACCOUNTS = """
accounts {
  SYS: { users: [ { user: sys, password: sys } ] }
  APP: { jetstream: enabled, users: [ { user: app, password: app } ] }
}
system_account: SYS
"""


def _connector_cids(system: SyncNats) -> tuple[str, list[int]]:
    """(server id, client ids) of the connector's connections (it names itself ``pyspark-jetstream``)."""
    reply = json.loads(system.run(system.nc.request("$SYS.REQ.SERVER.PING.CONNZ", b'{"acc": "APP"}', timeout=5)).data)
    cids = [c["cid"] for c in reply["data"]["connections"] if c.get("name") == "pyspark-jetstream"]
    return reply["server"]["id"], cids


def test_a_reconnect_recreates_the_consumer_from_the_last_delivered_sequence(caplog):
    caplog.set_level(logging.INFO, logger="pyspark_jetstream")
    with EmbeddedNatsServer(config=ACCOUNTS) as server:
        url = server.url.replace("nats://", "nats://app:app@")
        app = SyncNats(url)
        system = SyncNats(server.url.replace("nats://", "nats://sys:sys@"))
        app.add_stream("RECON", ["recon.>"])
        asyncio.run(fill_stream(url, "recon.x", 3000))
        opts = parse_source_options({"servers": server.url, "user": "app", "password": "app", "stream": "RECON",
                                     "batchSize": "100", "consume.maxMessages": "200"}, streaming=False)
        batches = read_partition(opts, "RECON", 1, 3000)
        seqs = next(batches).column("seq").to_pylist()  # mid-range: the reader waits for Spark's thread
        before = app.api("CONSUMER.NAMES.RECON")["consumers"]
        assert len(before) == 1
        server_id, cids = _connector_cids(system)
        assert len(cids) == 1, cids
        cid = cids[0]
        kicked = system.run(system.nc.request(f"$SYS.REQ.SERVER.{server_id}.KICK",
                                              json.dumps({"cid": cid}).encode(), timeout=5))
        assert b"error" not in kicked.data, kicked.data
        wait_until(lambda: _connector_cids(system)[1] not in ([], [cid]), timeout=30, what="the connector reconnected")
        for batch in batches:
            seqs += batch.column("seq").to_pylist()
        assert seqs == list(range(1, 3001))
        recreated = [r.getMessage() for r in caplog.records if "recreating the partition's consumer" in r.getMessage()]
        assert any("reconnected" in m for m in recreated), [r.getMessage() for r in caplog.records]
        assert before[0] not in app.api("CONSUMER.NAMES.RECON")["consumers"]
        app.close()
        system.close()


def test_a_message_larger_than_consume_max_bytes_fails_the_partition_at_once(nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    asyncio.run(fill_stream(nats_server.url, f"{stream_name}.x", 20))
    assert nats_client.publish_raw(f"{stream_name}.big", None, b"B" * 5000)["seq"] == 21
    asyncio.run(fill_stream(nats_server.url, f"{stream_name}.x", 5))
    opts = parse_source_options({"servers": nats_server.url, "stream": stream_name, "consume.maxBytes": "1000",
                                 "consume.maxWait": "20s"}, streaming=False)
    with pytest.raises(PartitionReadError) as info:
        for _ in read_partition(opts, stream_name, 1, 26):
            pass
    text = str(info.value)
    size = len(f"{stream_name}.big") + 5000
    assert f"the message at sequence 21 is {size} bytes" in text
    assert "option 'consume.maxBytes' (1000 bytes)" in text and "Raise 'consume.maxBytes'" in text
