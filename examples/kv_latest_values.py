"""Latest value per key in a real KV bucket: per-key TTLs, purges whose tombstones expire (ADR-43).

    python examples/kv_latest_values.py              # starts an embedded nats-server itself
    python examples/kv_latest_values.py --servers nats://host:4222

1. Publishes sensor readings to the stream READINGS (one subject per sensor).
2. A streaming query (availableNow, micro-batches of 100 readings) averages the readings per
   sensor and writes every sensor's running summary to the KV bucket SENSORS (``complete``
   output mode, ``option("bucket", "SENSORS")``, created as nats-py's ``create_key_value``
   would), each key with its own TTL: ``porch`` lives 30 s (long enough to be seen
   before it expires, even on a busy machine), ``kitchen`` never expires, the
   others 1 hour.
3. Purges two keys with a tombstone TTL of 20 s (``operation = PURGE``, ``ttl = 20s``): the key's
   history is rolled up into one tombstone, and the tombstone itself expires.
4. Reads the bucket's current state with the connector (``kv.view=latest``) and prints it
   beside what nats-py's ``KeyValue.get`` returns for the same keys; then waits until the
   porch value and the tombstones have expired and prints both views again.

Exits 1 when the two views ever differ.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

READINGS, BUCKET = "READINGS", "SENSORS"
SENSORS = ("attic", "boiler", "garage", "kitchen", "porch")
TTLS = {"porch": "30s", "kitchen": "never"}  # the others: 1h
PURGED = ("garage", "attic")
TOMBSTONE_TTL = "20s"  # both TTLs outlast the reads below, even on a busy machine


def publish_readings(spark, servers: str, count: int) -> None:
    from pyspark.sql import functions as F

    sensor = F.element_at(F.array(*[F.lit(s) for s in SENSORS]), (F.col("id") % len(SENSORS) + 1).cast("int"))
    (spark.range(count).select(
        F.concat(F.lit("readings."), sensor).alias("subject"),
        F.to_json(F.struct(sensor.alias("sensor"), (F.lit(15) + F.col("id") % 10).alias("celsius"))).alias("data"))
     .write.format("jetstream").mode("append").option("servers", servers).option("stream", READINGS)
     .option("ensureStream", "create").option("stream.subjects", "readings.>").save())


def summarise_into_the_bucket(spark, servers: str, checkpoint: str):
    """READINGS as a stream -> per-sensor summary -> the bucket, a per-key TTL on each key."""
    from pyspark.sql import functions as F

    readings = (spark.readStream.format("jetstream").option("servers", servers).option("stream", READINGS)
                .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", 100).load()
                .select(F.from_json(F.col("data").cast("string"), "sensor string, celsius double").alias("r"))
                .select("r.*"))
    ttl = F.coalesce(*[F.when(F.col("sensor") == k, F.lit(v)) for k, v in TTLS.items()], F.lit("1h"))
    summary = (readings.groupBy("sensor").agg(F.count("*").alias("readings"),
                                              F.round(F.avg("celsius"), 2).alias("avg_celsius"))
               .select(F.col("sensor").alias("key"), F.to_json(F.struct("readings", "avg_celsius")).alias("data"),
                       ttl.alias("ttl")))
    query = (summary.writeStream.format("jetstream").outputMode("complete")
             .option("servers", servers).option("bucket", BUCKET)
             .option("ensureBucket", "create").option("bucket.history", 5)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    if not query.awaitTermination(300) or query.exception() is not None:
        raise SystemExit(f"the streaming query did not finish: {query.exception()}")
    return query


def purge_with_tombstone_ttl(spark, servers: str) -> None:
    rows = [(key, None, "PURGE", TOMBSTONE_TTL) for key in PURGED]
    (spark.createDataFrame(rows, "key string, data string, operation string, ttl string")
     .write.format("jetstream").mode("append").option("servers", servers).option("bucket", BUCKET).save())


def connector_view(spark, servers: str) -> dict[str, str]:
    rows = (spark.read.format("jetstream").option("servers", servers).option("bucket", BUCKET)
            .option("kv.view", "latest").load().collect())
    return {r.key: r.data.decode() for r in rows}


async def nats_py_view(servers: str) -> tuple[dict[str, str], dict[str, str]]:
    """(live keys and values, what ``get`` says of every sensor) through nats-py's own KeyValue."""
    import nats
    import nats.js.errors

    nc = await nats.connect(servers.split(","))
    try:
        kv = await nc.jetstream().key_value(BUCKET)
        said: dict[str, str] = {}
        for key in SENSORS:
            try:
                said[key] = (await kv.get(key)).value.decode()
            except nats.js.errors.KeyNotFoundError as exc:
                history = []
                with contextlib.suppress(nats.js.errors.NoKeysError):
                    history = await kv.history(key)
                said[key] = f"<{exc.op or 'no such key'}; {len(history)} entries in history>"
        return {k: v for k, v in said.items() if not v.startswith("<")}, said
    finally:
        await nc.close()


def show(title: str, mine: dict[str, str], said: dict[str, str]) -> None:
    print(f"\n{title}")
    print(f"  {'key':<8} {'connector (kv.view=latest)':<40} nats-py KeyValue.get")
    for key in SENSORS:
        print(f"  {key:<8} {mine.get(key, '-'):<40} {said[key]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", help="NATS URL(s); default: start an embedded nats-server")
    parser.add_argument("--readings", type=int, default=500)
    parser.add_argument("--wait", type=float, default=120.0, help="seconds to wait for the expiries at most")
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    with contextlib.ExitStack() as stack:
        servers = args.servers
        if servers is None:
            from pyspark_jetstream.tools.server import EmbeddedNatsServer

            servers = stack.enter_context(EmbeddedNatsServer()).url
            print(f"Started an embedded nats-server at {servers}")
        spark = (SparkSession.builder.master("local[2]").appName("jetstream-kv-latest-values")
                 .config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "2")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        stack.callback(spark.stop)

        publish_readings(spark, servers, args.readings)
        query = summarise_into_the_bucket(spark, servers, tempfile.mkdtemp(prefix="kv-latest-"))
        batches = [p.numInputRows for p in query.recentProgress if p.numInputRows]
        print(f"Summarised {sum(batches)} readings in {len(batches)} micro-batches into bucket {BUCKET} "
              f"(TTLs: porch 30s, kitchen never, others 1h)")
        purge_with_tombstone_ttl(spark, servers)
        print(f"Purged {', '.join(PURGED)} with a tombstone TTL of {TOMBSTONE_TTL}")

        mine = connector_view(spark, servers)
        live, said = asyncio.run(nats_py_view(servers))
        show("The bucket now:", mine, said)
        same = mine == live
        print(f"connector == nats-py: {same}")

        deadline = time.monotonic() + args.wait
        while "porch" in live or any("PURGE" in said[k] for k in PURGED):
            if time.monotonic() > deadline:
                print(f"The porch value or the tombstones did not expire within {args.wait:g}s", file=sys.stderr)
                return 1
            time.sleep(0.5)
            live, said = asyncio.run(nats_py_view(servers))
        mine = connector_view(spark, servers)
        show("After the expiries (porch's 30s TTL, the tombstones' 20s):", mine, said)
        print(f"connector == nats-py: {mine == live}")
        same = same and mine == live
        print(f"{len(live)} keys alive: {', '.join(sorted(live))}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
