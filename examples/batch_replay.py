"""Replay a bounded range of a stream into Parquet with ``spark.read``.

    python examples/batch_replay.py --out /tmp/replay                       # embedded server, sample data
    python examples/batch_replay.py --servers nats://host:4222 --stream ORDERS \\
        --from-seq 1000 --to-seq 5000 --out /data/orders-replay
    python examples/batch_replay.py --servers nats://host:4222 --stream ORDERS \\
        --from-time 2026-11-21T00:00:00Z --out /data/orders-since-midnight

A batch read takes a snapshot: ``endingOffsets`` (default ``latest``: the last
sequence when the query is planned) bounds it, so the Parquet files hold exactly
the range, however fast the stream grows meanwhile. The range is split into
``--partitions`` sequence ranges read in parallel. Without ``--servers`` the job
starts an embedded nats-server and publishes sample orders first.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


async def publish_samples(servers: str, stream: str, count: int) -> None:
    import nats

    nc = await nats.connect(servers.split(","))
    js = nc.jetstream()
    await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"])
    for i in range(count):
        await js.publish(f"{stream.lower()}.c{i % 5}", json.dumps({"id": i, "amount": i % 100}).encode())
    await nc.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", help="NATS URL(s); default: an embedded nats-server with sample data")
    parser.add_argument("--stream", default="ORDERS")
    parser.add_argument("--from-seq", type=int, help="first sequence (inclusive)")
    parser.add_argument("--to-seq", type=int, help="last sequence (inclusive); default: the latest")
    parser.add_argument("--from-time", help="first message at or after this time (ISO-8601 or epoch ms)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--out", required=True, help="Parquet output directory (overwritten)")
    args = parser.parse_args()
    if args.from_seq is not None and args.from_time is not None:
        parser.error("choose --from-seq or --from-time, not both")

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    with contextlib.ExitStack() as stack:
        servers = args.servers
        if servers is None:
            from pyspark_jetstream.tools.server import EmbeddedNatsServer

            servers = stack.enter_context(EmbeddedNatsServer()).url
            asyncio.run(publish_samples(servers, args.stream, 2000))
            print(f"Started an embedded nats-server at {servers} with 2000 sample messages in {args.stream}")
            if args.from_seq is None and args.from_time is None:
                args.from_seq, args.to_seq = 501, 1500
        spark = (SparkSession.builder.master("local[2]").appName("jetstream-batch-replay")
                 .config("spark.ui.showConsoleProgress", "false").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        stack.callback(spark.stop)

        reader = (spark.read.format("jetstream").option("servers", servers).option("stream", args.stream)
                  .option("numPartitions", str(args.partitions)))
        if args.from_seq is not None:
            reader = reader.option("startingOffsets", str(args.from_seq))
        if args.from_time is not None:
            reader = reader.option("startingTimestamp", args.from_time)
        if args.to_seq is not None:
            reader = reader.option("endingOffsets", str(args.to_seq))
        replay = reader.load().select("stream", "seq", "subject", "timestamp", "data", "headers", "ttl")
        replay.write.mode("overwrite").parquet(args.out)

        written = spark.read.parquet(args.out)
        summary = written.agg(F.count("*").alias("rows"), F.min("seq").alias("first_seq"),
                              F.max("seq").alias("last_seq"), F.countDistinct("seq").alias("distinct_seqs")).first()
        print(f"Replayed {args.stream} sequences {summary.first_seq}..{summary.last_seq} into {args.out}: "
              f"{summary.rows} rows ({summary.distinct_seqs} distinct sequences)")
        written.orderBy("seq").select("seq", "subject", F.col("data").cast("string").alias("data")).show(3, False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
