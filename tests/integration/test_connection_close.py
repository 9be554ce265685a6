"""The connector's shared connection: closed by the server, or lost under a task that ends.

A connection the server closes fails every waiting publish and read at once, with the real cause.

nats-server answers a frame over ``max_payload`` with ``-ERR 'Maximum Payload
Violation'`` and closes the connection; nats-py then closes the client for good.
Publishes awaiting a PubAck and partitions awaiting messages on that connection
can never complete: they must fail now, naming that cause, not after
``ackTimeout`` or ``consume.maxWait`` with an error that blames the server.

And a task that ends (Spark closes a reader's iterator, a write fails) leaves nothing
behind on the connection: no consumer or subscription, no frame sent later.

These run the connector's I/O code in the test process (no Spark), against a real
server, on the connector's own shared connection.
"""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import time

import pyarrow as pa
import pytest
from pyspark.sql.types import StringType, StructField, StructType

from pyspark_jetstream.client import runtime
from pyspark_jetstream.client.jsapi import stream_info
from pyspark_jetstream.client.nats_internals import send_raw
from pyspark_jetstream.errors import AckTimeoutError, JetStreamConnectorError, PartitionReadError
from pyspark_jetstream.options import parse_sink_options, parse_source_options
from pyspark_jetstream.protocol.frames import hpub_frame
from pyspark_jetstream.sink.encode.frames import OutFrame
from pyspark_jetstream.sink.plan.sink_plan import plan_sink
from pyspark_jetstream.sink.publish.publisher import Publisher
from pyspark_jetstream.sink.task.write import write_partition
from pyspark_jetstream.source.read.partition import read_partition
from pyspark_jetstream.source.read.partition_reader import PartitionReader
from pyspark_jetstream.tools.server import EmbeddedNatsServer

from ..helpers import SyncNats, fill_stream, wait_until


def _oversized(nc) -> bytes:
    """Only the control line of a too-large PUB: the server refuses it from the size alone. With the
    payload too, the server would close while bytes still arrive and reset the socket, and the reset
    may reach the client before the -ERR does (nats-py then reconnects instead of closing)."""
    return f"PUB too.big {nc.max_payload + 1}\r\n".encode()


def test_publishes_awaiting_acks_fail_at_once_naming_the_close(nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    opts = parse_sink_options({"servers": nats_server.url, "ackTimeout": "20s"}).connection

    async def go() -> None:
        nc = await runtime.connection(opts)
        pub = await Publisher(nc, max_pending=100, ack_timeout=20, idempotent=True).start()
        block = b"NATS/1.0\r\n\r\n"
        frames = [tuple(OutFrame(i, hpub_frame(f"{stream_name}.a", f"{pub.reply_prefix}{i}", block, b"x"),
                                 f"{stream_name}.a", None, None, len(block), 1)) for i in range(5)]
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


def test_a_close_whose_callback_never_comes_still_fails_the_partition(nats_client, stream_name):
    """nats-py marks the client closed, then writes what is buffered, then calls ``closed_cb``;
    when that write meets the server's reset it raises and the callback never comes (seen under
    load). Here the callback is taken away to make that certain: the partition must still fail
    at once with the cause, not after ``consume.maxWait``."""
    with EmbeddedNatsServer() as server:
        client = SyncNats(server.url)
        client.add_stream(stream_name, [f"{stream_name}.>"])
        asyncio.run(fill_stream(server.url, f"{stream_name}.x", 200))
        opts = parse_source_options({"servers": server.url, "stream": stream_name, "batchSize": "10",
                                     "consume.maxMessages": "20", "consume.maxWait": "60s"}, streaming=False)
        batches = read_partition(opts, stream_name, 1, 200)
        next(batches)

        async def close_without_callback() -> None:
            nc = await runtime.connection(opts.connection)
            nc._closed_cb = None
            await send_raw(nc, _oversized(nc))

        runtime.run(close_without_callback(), timeout=30)
        started = time.monotonic()
        with pytest.raises(PartitionReadError, match=r"the NATS connection was closed \(maximum payload violation\)"):
            for _ in batches:
                pass
        assert time.monotonic() - started < 30, "failed by the 60 s deadline, not by the close"
        client.close()


def test_a_close_while_the_consumer_is_being_created_leaves_nothing_behind():
    """Spark closes a partition's iterator while its consumer is being created (the server is
    frozen, so the create request waits). When the create completes, the consumer and the inbox
    subscription must go, not linger on the shared connection until the server reaps them."""
    with EmbeddedNatsServer() as server:
        client = SyncNats(server.url)
        client.add_stream("LATE", ["late.>"])
        asyncio.run(fill_stream(server.url, "late.x", 10))
        opts = parse_source_options({"servers": server.url, "stream": "LATE"}, streaming=False)
        nc = runtime.run(runtime.connection(opts.connection), timeout=30)
        runtime.run(stream_info(nc, "LATE"), timeout=30)  # nats-py's request inbox exists from here on
        subs_before = len(nc._subs)
        out: queue.Queue = queue.Queue()
        reader = PartitionReader(opts, "LATE", 1, 10, out)
        os.kill(server.pid, signal.SIGSTOP)
        try:
            started = runtime.submit(reader.start())
            # The reader's own state, not the connection's subscription count: a reader that failed
            # to start (its error is in ``out``) is told apart from one still on its way.
            wait_until(lambda: reader.sub is not None or reader.done, timeout=30, what="the inbox subscribed")
            assert not reader.done, f"the reader ended before its consumer was created: {out.get_nowait()!r}"
            assert reader.nc is nc and len(nc._subs) == subs_before + 1
            runtime.run(reader.close(), timeout=30)
        finally:
            os.kill(server.pid, signal.SIGCONT)
        started.result(timeout=30)
        wait_until(lambda: client.api("CONSUMER.NAMES.LATE")["consumers"] == [], timeout=10,
                   what="the late consumer deleted")
        assert len(nc._subs) == subs_before
        client.close()


def test_frames_of_a_failed_write_are_not_sent_after_the_reconnect(tmp_path):
    """A write task whose server went away fails at ackTimeout; nats-py still holds its frames
    and would send them when the server is back, long after Spark gave up on the task."""
    with EmbeddedNatsServer() as server:
        client = SyncNats(server.url)
        client.add_stream("PARK", ["park.>"], storage="file")
        plan = plan_sink({"servers": server.url, "stream": "PARK", "subject": "park.x", "ackTimeout": "1s"},
                         StructType([StructField("data", StringType())]), overwrite=False, streaming=False)
        nc = runtime.run(runtime.connection(plan.options.connection), timeout=30)
        server.stop(kill=True)
        wait_until(lambda: not nc.is_connected, timeout=10, what="the connector noticed the server is gone")
        batch = pa.RecordBatch.from_pylist([{"data": f"r{i}"} for i in range(10)])
        with pytest.raises(AckTimeoutError):
            write_partition(plan, [batch])
        server.start()
        wait_until(lambda: nc.is_connected, timeout=30, what="the connector reconnected")
        runtime.run(nc.flush(timeout=10), timeout=30)  # whatever nats-py held has reached the server now
        wait_until(lambda: client.nc.is_connected, timeout=30, what="the test client reconnected")
        assert client.stream_state("PARK")["messages"] == 0
        client.close()
