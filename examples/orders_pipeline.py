"""A long-running orders pipeline for spark-submit: JetStream -> enrich -> JetStream.

    spark-submit --properties-file spark-conf/spark-defaults.conf examples/orders_pipeline.py \\
        --servers nats://n1:4222,nats://n2:4222 --source-stream ORDERS --target-stream INVOICES \\
        --checkpoint /checkpoints/orders-pipeline --trigger "10 seconds"

Each order message (JSON ``{"id", "customer", "amount"}``) becomes an invoice message
on ``<target-subject-prefix>.<customer>`` with the tax added, the source stream and
sequence recorded, and the order's TTL kept. Each customer's invoices keep the orders'
order: ``repartition(--partitions, "subject")`` gives each customer to one write task,
which publishes its rows in source sequence order (the sink refuses a write straight
from a read split into sequence ranges). Exactly-once end to end: the source re-reads a
replayed micro-batch's exact sequence range, and the sink publishes every row with a
``Nats-Msg-Id`` derived from the query id, batch id and the order's source stream and
sequence (the rows keep the ``stream`` and ``seq`` columns), so a restart from
``--checkpoint`` neither loses nor duplicates invoices, however late it comes.

``--trigger`` is a processing-time interval (``"10 seconds"``) or ``availableNow``
(process what is there, then exit). On SIGTERM or SIGINT the query is stopped and
the job exits 0; the next run resumes from the checkpoint (a micro-batch cut short
is replayed and the server drops the rows it already stored).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", required=True, help="NATS URLs, comma-separated")
    parser.add_argument("--source-stream", required=True)
    parser.add_argument("--target-stream", required=True)
    parser.add_argument("--checkpoint", required=True, help="checkpoint directory (shared storage on a cluster)")
    parser.add_argument("--trigger", default="10 seconds", help="'availableNow' or an interval such as '10 seconds'")
    parser.add_argument("--target-subject-prefix", default=None,
                        help="invoice subjects are <prefix>.<customer>; default: the target stream in lower case")
    parser.add_argument("--replicas", type=int, default=1, help="replicas of the target stream if it is created")
    parser.add_argument("--tax-rate", type=float, default=0.2)
    parser.add_argument("--max-messages-per-trigger", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=2,
                        help="write tasks per micro-batch (each customer's invoices in one task, in order)")
    return parser.parse_args(argv)


def invoices(spark, args: argparse.Namespace):
    from pyspark.sql import functions as F

    prefix = args.target_subject_prefix or args.target_stream.lower()
    orders = (
        spark.readStream.format("jetstream")
        .option("servers", args.servers)
        .option("stream", args.source_stream)
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", str(args.max_messages_per_trigger))
        .load()
    )
    order = F.from_json(F.col("data").cast("string"), "id long, customer string, amount double")
    return (
        orders.select(order.alias("o"), "stream", "seq", "ttl")
        .where(F.col("o.id").isNotNull())
        .select(
            F.concat(F.lit(prefix + "."), F.col("o.customer")).alias("subject"),
            F.to_json(F.struct(
                F.col("o.id").alias("order_id"),
                F.col("o.customer").alias("customer"),
                F.col("o.amount").alias("amount"),
                F.round(F.col("o.amount") * (1 + args.tax_rate), 2).alias("amount_with_tax"),
                F.col("stream").alias("source_stream"),
                F.col("seq").alias("source_seq"),
            )).alias("data"),
            F.col("ttl"),
            "stream", "seq",  # the order's position: exactly-once ids, and the order the sink keeps
        )
        .repartition(args.partitions, "subject")
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("jetstream-orders-pipeline").getOrCreate()
    prefix = args.target_subject_prefix or args.target_stream.lower()
    writer = (
        invoices(spark, args)
        .writeStream.format("jetstream")
        .queryName("orders_pipeline")
        .option("servers", args.servers)
        .option("stream", args.target_stream)
        .option("ensureStream", "create")
        .option("stream.subjects", prefix + ".>")
        .option("stream.replicas", str(args.replicas))
        .option("checkpointLocation", args.checkpoint)
    )
    if args.trigger.replace("_", "").lower() == "availablenow":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=args.trigger)

    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    query = writer.start()
    print(f"orders_pipeline started: {args.source_stream} -> {args.target_stream} (query id {query.id})", flush=True)
    while query.isActive and not stop.is_set():
        query.awaitTermination(1)
    if stop.is_set():
        print("orders_pipeline: stopping on signal", flush=True)
        query.stop()
    failure = query.exception()
    processed = sum(p["numInputRows"] for p in query.recentProgress)
    spark.stop()
    if failure is not None:
        print(f"orders_pipeline failed: {failure}", file=sys.stderr, flush=True)
        return 1
    print(f"orders_pipeline stopped cleanly after {processed} orders in this run", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
