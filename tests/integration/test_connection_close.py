"""A connection the server closes fails every waiting publish and read at once, with the real cause.

nats-server answers a frame over ``max_payload`` with ``-ERR 'Maximum Payload
Violation'`` and closes the connection; nats-py then closes the client for good.
Publishes awaiting a PubAck and partitions awaiting messages on that connection
can never complete: they must fail now, naming that cause, not after
``ackTimeout`` or ``consume.maxWait`` with an error that blames the server.

These run the connector's I/O code in the test process (no Spark), against a real
server, on the connector's own shared connection.
"""

from __future__ import annotations

import asyncio

import pytest

from pyspark_jetstream import runtime
from pyspark_jetstream.errors import JetStreamConnectorError, PartitionReadError
from pyspark_jetstream.options import parse_sink_options, parse_source_options
from pyspark_jetstream.partition_reader import read_partition
from pyspark_jetstream.publisher import Publisher
from pyspark_jetstream.sink_encoder import hpub_frame
from pyspark_jetstream.wire import send_raw

from ..helpers import fill_stream


def _oversized(nc) -> bytes:
    return f"PUB too.big {nc.max_payload + 1}\r\n".encode() + b"x" * (nc.max_payload + 1) + b"\r\n"


def test_publishes_awaiting_acks_fail_at_once_naming_the_close(nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    opts = parse_sink_options({"servers": nats_server.url, "ackTimeout": "20s"}).connection

    async def go() -> None:
        nc = await runtime.connection(opts)
        pub = await Publisher(nc, max_pending=100, ack_timeout=20, idempotent=True).start()
        frames = [(i, hpub_frame(f"{stream_name}.a", f"{pub.reply_prefix}{i}", b"NATS/1.0\r\n\r\n", b"x"))
                  for i in range(5)]
        await send_raw(nc, _oversized(nc))  # the server closes the connection on this one ...
        await pub.publish(frames)  # ... so these are never acknowledged
        await asyncio.wait_for(pub.drain(), timeout=60)

    with pytest.raises(JetStreamConnectorError, match="connection was closed while 5 publishes awaited their "
                                                      "PubAck: maximum payload violation"):
        runtime.run(go(), timeout=300)


def test_a_partition_mid_read_fails_at_once_naming_the_close(nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    asyncio.run(fill_stream(nats_server.url, f"{stream_name}.x", 2000))
    opts = parse_source_options({"servers": nats_server.url, "stream": stream_name, "batchSize": "10",
                                 "consume.maxMessages": "20", "consume.maxWait": "20s"}, streaming=False)
    batches = read_partition(opts, stream_name, 1, 2000)
    first = next(batches)  # the reader is mid-range: it stops pulling while two batches wait
    assert first.column("seq").to_pylist() == list(range(1, 11))

    async def close_it() -> None:
        nc = await runtime.connection(opts.connection)
        await send_raw(nc, _oversized(nc))

    runtime.run(close_it(), timeout=30)
    with pytest.raises(PartitionReadError, match=rf"stream '{stream_name}' sequences 1..2000 failed after sequence "
                                                 r"\d+: the NATS connection was closed \(maximum payload violation\)"):
        for _ in batches:
            pass
