"""Quickstart: write orders with per-message TTLs into JetStream and show what the stream holds.

    python examples/quickstart.py                    # starts an embedded nats-server itself
    python examples/quickstart.py --servers nats://host:4222

It creates the stream ORDERS (AllowMsgTTL on) through the sink's ensureStream=create,
publishes a few thousand orders whose TTLs mix a row's own `ttl`, the sink's
`defaultTtl`, `never` and 0 (no TTL), and prints counts, a few rows, their TTLs and
expiry times, read back with nats-py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import os
import sys
from collections import Counter

# Spark's Python workers must use this interpreter (it has the connector and pyarrow).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

STREAM = "ORDERS"


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


async def read_back(servers: str, limit: int = 5) -> None:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig

    nc = await nats.connect(servers)
    js = nc.jetstream()
    info = await js.stream_info(STREAM)
    print(f"\nStream {STREAM}: {info.state.messages} messages, {info.state.bytes} bytes, "
          f"AllowMsgTTL={info.config.allow_msg_ttl}")
    ttl_counts: Counter[str] = Counter()
    # AckNone: nothing to acknowledge, so the consumer never stalls at max_ack_pending.
    sub = await js.pull_subscribe("orders.>", stream=STREAM, config=ConsumerConfig(ack_policy=AckPolicy.NONE))
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
                print(f"  seq={m.metadata.sequence.stream:<5} {m.subject:<10} ttl={ttl or '-':<6} "
                      f"expires={expiry} data={m.data.decode()}")
                shown += 1
    await sub.unsubscribe()
    print("TTL mix:", ", ".join(f"{k}: {v}" for k, v in sorted(ttl_counts.items())))
    await nc.close()


def _expiry(stored: dt.datetime, ttl: str) -> str:
    from pyspark_jetstream.ttl import server_ttl_seconds

    seconds = server_ttl_seconds(ttl)
    return (stored + dt.timedelta(seconds=seconds)).isoformat(timespec="seconds") if seconds else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", help="NATS URL(s); default: start an embedded nats-server")
    parser.add_argument("--orders", type=int, default=5000)
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    with contextlib.ExitStack() as stack:
        servers = args.servers
        if servers is None:
            from pyspark_jetstream.server import EmbeddedNatsServer

            server = stack.enter_context(EmbeddedNatsServer())
            servers = server.url
            print(f"Started an embedded nats-server at {servers}")
        spark = (
            SparkSession.builder.master("local[2]").appName("jetstream-quickstart")
            .config("spark.ui.showConsoleProgress", "false").getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        stack.callback(spark.stop)

        orders = build_orders(spark, args.orders)
        orders.show(5, truncate=False)
        (
            orders.write.format("jetstream").mode("append")
            .option("servers", servers)
            .option("stream", STREAM)
            .option("ensureStream", "create")
            .option("stream.subjects", "orders.>")
            .option("defaultTtl", "30m")
            .save()
        )
        print(f"Published {args.orders} orders to stream {STREAM}")
        asyncio.run(read_back(servers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
