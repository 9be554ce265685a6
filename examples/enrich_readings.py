"""Enrichment: every reading of a stream joined with its device's current metadata from a KV bucket.

    python examples/enrich_readings.py                         # a local session and an embedded nats-server
    python examples/enrich_readings.py --remote local[2]       # the same through Spark Connect
    python examples/enrich_readings.py --servers nats://host:4222

What it does: writes the metadata of 50 devices to the bucket DEVICES and 1,000 readings (one of them from a
device the bucket does not know) to the stream READINGS, both through the sink; then a streaming query reads
the readings, looks each one's device up in the bucket (``pyspark_jetstream.lookup``, a partial cache per
Python worker) and keeps the enriched rows; halfway a device moves to another site, and a batch lookup pinned
to the bucket's sequence before the move still reads the old site. The last line is a JSON summary.

A lookup costs what its rows cost, not what the bucket holds: each batch's distinct keys are fetched with
batched direct gets, up to 1,024 keys a request (docs/kv.md, "Lookups").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the workers run this interpreter (it has the connector)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

DEVICES, READINGS = "DEVICES", "READINGS"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--remote", help="a Spark Connect URL (sc://host:port, or local[N] for one in-process)")
    parser.add_argument("--servers", help="NATS URL(s); default: start an embedded nats-server")
    args = parser.parse_args()

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from pyspark_jetstream import lookup

    with contextlib.ExitStack() as stack:
        servers = args.servers
        if servers is None:
            from pyspark_jetstream.tools.server import EmbeddedNatsServer

            servers = stack.enter_context(EmbeddedNatsServer()).url
            print(f"Started an embedded nats-server at {servers}")
        builder = SparkSession.builder.remote(args.remote) if args.remote else \
            SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
        spark = builder.config("spark.sql.shuffle.partitions", "2").getOrCreate()
        stack.callback(spark.stop)
        nats = {"servers": servers}

        devices = spark.createDataFrame([(f"dev-{i}", json.dumps({"site": f"site-{i % 5}", "model": "t1000"}))
                                         for i in range(50)], "key string, data string")
        (devices.write.format("jetstream").mode("append").options(**nats).option("bucket", DEVICES)
         .option("ensureBucket", "create").option("bucket.history", "5").save())  # kept: a pinned lookup reads it
        readings = spark.createDataFrame(
            [(f"readings.dev-{i % 50}" if i != 7 else "readings.dev-unknown", json.dumps({"celsius": 20 + i % 7}))
             for i in range(1000)], "subject string, data string")
        (readings.coalesce(1).write.format("jetstream").mode("append").options(**nats).option("stream", READINGS)
         .option("ensureStream", "create").option("stream.subjects", "readings.>").save())
        print(f"Wrote 50 devices to bucket {DEVICES} and 1,000 readings to stream {READINGS}")

        before_move = spark.read.format("jetstream").options(**nats).option("bucket", DEVICES).load() \
            .agg(F.max("seq")).first()[0]
        (spark.createDataFrame([("dev-3", json.dumps({"site": "site-moved", "model": "t1000"}))],
                               "key string, data string")
         .write.format("jetstream").mode("append").options(**nats).option("bucket", DEVICES).save())

        stream = (spark.readStream.format("jetstream").options(**nats).option("stream", READINGS)
                  .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", 400).load()
                  .select(F.substring_index("subject", ".", -1).alias("device"), "seq",
                          F.get_json_object(F.col("data").cast("string"), "$.celsius").cast("int").alias("celsius")))
        enriched = lookup(stream, DEVICES, "device", **nats, prefix="meta_", cache="partial", cacheTtl="30s") \
            .select("seq", "device", "celsius", "meta_revision",
                    F.get_json_object(F.col("meta_value").cast("string"), "$.site").alias("site"))
        checkpoint = stack.enter_context(tempfile.TemporaryDirectory(prefix="enrich-checkpoint-"))
        query = (enriched.writeStream.format("memory").queryName("enriched").option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        if query.exception() is not None:
            print(f"The enrichment failed: {query.exception()}", file=sys.stderr)
            return 1
        rows = spark.sql("select * from enriched")
        total, unknown = rows.count(), rows.where(F.col("site").isNull()).count()
        per_site = {r["site"]: r["n"] for r in rows.groupBy("site").agg(F.count("*").alias("n")).collect()}
        print(f"Enriched {total} readings in {len(query.recentProgress)} micro-batches; {unknown} from a device the "
              f"bucket does not know; per site: {dict(sorted((str(k), v) for k, v in per_site.items()))}")

        pinned = lookup(spark.createDataFrame([("dev-3",)], "device string"), DEVICES, "device", **nats,
                        prefix="meta_", asOfSequence=before_move).first()
        site_then = json.loads(pinned["meta_value"])["site"]
        print(f"dev-3 at bucket sequence {before_move}: {site_then}; now: site-moved")
        print(json.dumps({"enriched": total, "unknown": unknown, "moved": per_site.get("site-moved", 0),
                          "site_then": site_then, "batches": len(query.recentProgress)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
