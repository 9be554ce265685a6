"""Quickstart: orders into JetStream, a streaming aggregation, totals back into JetStream.

    python examples/quickstart.py                    # starts an embedded nats-server itself
    python examples/quickstart.py --servers nats://host:4222

1. Publishes a few thousand orders to the stream ORDERS (created by the sink's
   ``ensureStream=create`` with AllowMsgTTL on) with a mix of TTLs: a row's own
   ``ttl``, ``never``, ``0`` (no TTL) and the sink's ``defaultTtl`` for the rest.
2. Runs a streaming query with ``trigger(availableNow=True)``: it reads ORDERS from
   the earliest sequence in micro-batches of ``--batch`` messages, sums the amounts
   per customer, and after each micro-batch publishes every customer's running
   total (``complete`` output mode) to the stream CUSTOMER_TOTALS, which keeps one
   message per customer (``MaxMsgsPerSubject=1``), with a ``defaultTtl`` of 1 hour.
   Each micro-batch's progress is printed as it completes.
3. Prints what both streams hold (counts, a few messages, their TTLs and expiry
   times), read back with nats-py, and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import sys
import tempfile
from collections import Counter

# Spark's Python workers must use this interpreter (it has the connector and pyarrow).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

ORDERS = "ORDERS"
TOTALS = "CUSTOMER_TOTALS"


def build_orders(spark, count: int):
    from pyspark.sql import functions as F

    return (
        spark.range(count)
        .withColumn("customer", F.concat(F.lit("c"), (F.col("id") % 7).cast("string")))
        .withColumn("amount", F.round(F.rand(seed=7) * 100, 2))
        .select(
            F.concat(F.lit("orders."), F.col("customer")).alias("subject"),
            F.to_json(F.struct("id", "customer", "amount")).alias("data"),
            # A mix: 1 hour, 2 minutes, never, 0 (= no TTL, ADR-43), and null (= defaultTtl).
            F.element_at(F.array(F.lit("1h"), F.lit("2m"), F.lit("never"), F.lit("0"), F.lit(None)),
                         (F.col("id") % 5 + 1).cast("int")).alias("ttl"),
            F.create_map(F.lit("Customer"), F.col("customer")).alias("headers"),
        )
    )


def totals_per_customer(spark, servers: str, batch: int):
    """ORDERS as a stream -> running total per customer, as sink rows."""
    from pyspark.sql import functions as F

    orders = (
        spark.readStream.format("jetstream")
        .option("servers", servers).option("stream", ORDERS)
        .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", str(batch))
        .load()
    )
    order = F.from_json(F.col("data").cast("string"), "id long, customer string, amount double")
    return (
        orders.select(order.alias("o"))
        .groupBy("o.customer")
        .agg(F.count("*").alias("orders"), F.round(F.sum("o.amount"), 2).alias("total"))
        .select(
            F.concat(F.lit("totals."), F.col("customer")).alias("subject"),
            F.to_json(F.struct("customer", "orders", "total")).alias("data"),
        )
    )


class ProgressPrinter:
    """A StreamingQueryListener that prints one line per completed micro-batch.

    Spark delivers listener events asynchronously; ``finished`` is set by the last
    one, so the caller can wait for every line before printing more."""

    def __new__(cls):
        import threading

        from pyspark.sql.streaming import StreamingQueryListener

        class Printer(StreamingQueryListener):
            finished = threading.Event()

            def onQueryStarted(self, event):
                print(f"Query started (id {event.id})", flush=True)

            def onQueryProgress(self, event):
                p = event.progress
                source = p.sources[0]
                print(f"  micro-batch {p.batchId}: {p.numInputRows} orders read, "
                      f"{p.inputRowsPerSecond:.0f} rows/s in, {p.processedRowsPerSecond:.0f} rows/s processed; "
                      f"offsets {_offset(source.startOffset)} -> {source.endOffset} (latest {source.latestOffset}, "
                      f"lag {lag(source)} messages)", flush=True)

            def onQueryIdle(self, event):
                pass

            def onQueryTerminated(self, event):
                print(f"Query finished{'' if event.exception is None else ' with ' + event.exception}", flush=True)
                self.finished.set()

        return Printer()


async def show_stream(servers: str, stream: str, limit: int = 5) -> None:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig

    nc = await nats.connect(servers.split(","))
    js = nc.jetstream()
    info = await js.stream_info(stream)
    cut = f"; the first {limit}:" if info.state.messages > limit else ":"
    print(f"\nStream {stream}: {info.state.messages} messages, {info.state.bytes} bytes, "
          f"AllowMsgTTL={info.config.allow_msg_ttl}{cut}")
    ttl_counts: Counter[str] = Counter()
    # AckNone: nothing to acknowledge, so the consumer never stalls at max_ack_pending.
    sub = await js.pull_subscribe(">", stream=stream, config=ConsumerConfig(ack_policy=AckPolicy.NONE))
    shown = 0
    remaining = info.state.messages
    while remaining > 0:
        msgs = await sub.fetch(min(remaining, 1000), timeout=5)
        remaining -= len(msgs)
        for m in msgs:
            ttl = (m.headers or {}).get("Nats-TTL")
            ttl_counts[ttl or "(none)"] += 1
            if shown < limit:
                stored = m.metadata.timestamp
                expiry = {None: "by stream limits", "never": "never"}.get(ttl) or _expiry(stored, ttl)
                print(f"  seq={m.metadata.sequence.stream:<5} {m.subject:<12} ttl={ttl or '-':<6} "
                      f"expires={expiry} data={m.data.decode()}")
                shown += 1
    await sub.unsubscribe()
    print("TTL mix:", ", ".join(f"{k}: {v}" for k, v in sorted(ttl_counts.items())))
    await nc.close()


def _offset(offset) -> str:
    """A micro-batch's start offset as progress reports it: the first batch has none yet
    (PySpark gives the JSON ``null`` as ``None`` or as the string ``"None"``)."""
    return "start" if offset in (None, "None", "null") else str(offset)


def lag(source) -> int | str:
    """Sequences the query has still to read after this micro-batch: the stream's last sequence
    (``latestOffset``, which the connector reports) minus the batch's end. PySpark gives no metrics
    hook to Python sources, so the lag is read from the progress's offsets (``progress.lag`` reads
    them on every PySpark: JSON on 4.2+, a Python repr on 4.0 and 4.1)."""
    from pyspark_jetstream.progress import lag as lag_of

    value = lag_of(source)
    return "?" if value is None else value


def _expiry(stored: dt.datetime, ttl: str) -> str:
    from pyspark_jetstream.protocol.ttl import server_ttl_seconds

    seconds = server_ttl_seconds(ttl)
    return (stored + dt.timedelta(seconds=seconds)).isoformat(timespec="seconds") if seconds else "-"


async def grand_total(servers: str) -> tuple[int, float]:
    """Orders and amount summed over the latest total of every customer."""
    import nats

    nc = await nats.connect(servers.split(","))
    js = nc.jetstream()
    count, amount = 0, 0.0
    for customer in range(7):
        msg = await js.get_last_msg(TOTALS, f"totals.c{customer}")
        total = json.loads(msg.data)
        count, amount = count + total["orders"], amount + total["total"]
    await nc.close()
    return count, amount


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", help="NATS URL(s); default: start an embedded nats-server")
    parser.add_argument("--orders", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=1000, help="maxMessagesPerTrigger of the streaming read")
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    with contextlib.ExitStack() as stack:
        servers = args.servers
        if servers is None:
            from pyspark_jetstream.tools.server import EmbeddedNatsServer

            server = stack.enter_context(EmbeddedNatsServer())
            servers = server.url
            print(f"Started an embedded nats-server at {servers}")
        spark = (
            SparkSession.builder.master("local[2]").appName("jetstream-quickstart")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        stack.callback(spark.stop)

        # 1. Orders in, with a mix of TTLs.
        orders = build_orders(spark, args.orders)
        orders.show(5, truncate=False)
        (
            orders.write.format("jetstream").mode("append")
            .option("servers", servers)
            .option("stream", ORDERS)
            .option("ensureStream", "create")
            .option("stream.subjects", "orders.>")
            .option("defaultTtl", "30m")
            .save()
        )
        print(f"Published {args.orders} orders to stream {ORDERS}")

        # 2. A streaming aggregation, run until everything available is processed.
        printer = ProgressPrinter()
        spark.streams.addListener(printer)
        checkpoint = stack.enter_context(tempfile.TemporaryDirectory(prefix="quickstart-checkpoint-"))
        query = (
            totals_per_customer(spark, servers, args.batch)
            .writeStream.format("jetstream").outputMode("complete")
            .option("servers", servers)
            .option("stream", TOTALS)
            .option("ensureStream", "create")
            .option("stream.subjects", "totals.>")
            .option("stream.maxMsgsPerSubject", "1")
            .option("defaultTtl", "1h")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        printer.finished.wait(30)
        if query.exception() is not None:
            print(f"The streaming query failed: {query.exception()}", file=sys.stderr)
            return 1

        # 3. What both streams hold.
        asyncio.run(show_stream(servers, ORDERS))
        asyncio.run(show_stream(servers, TOTALS))
        count, amount = asyncio.run(grand_total(servers))
        print(f"\nCustomer totals cover {count} orders, {amount:.2f} in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
