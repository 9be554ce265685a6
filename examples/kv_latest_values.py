"""Latest value per key with TTLs, and the MaxAge tombstones of expired keys (ADR-43).

    python examples/kv_latest_values.py              # starts an embedded nats-server itself
    python examples/kv_latest_values.py --servers nats://host:4222

The stream SENSORS keeps one message per subject (``MaxMsgsPerSubject=1``, a
key-value layout), allows per-message TTLs and writes subject delete markers
(``SubjectDeleteMarkerTTL``). The job:

1. writes a first value for five keys (``sensors.<key>``) with a TTL per key;
2. writes newer values for two of the keys: the stream keeps only the latest;
3. waits until the short-lived keys expire: for each, the server removes the last
   message of the subject and writes a marker in its place (empty payload,
   ``Nats-Marker-Reason: MaxAge``), which consumers see like any other message;
4. reads the change log with ``spark.read.format("jetstream")`` and shows the
   values and the markers (``marker_reason`` column), then the keys still alive.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

STREAM = "SENSORS"
# key -> TTL of its value; "never" keys stay, the others expire.
KEYS = {"boiler": "2s", "garage": "3s", "kitchen": "never", "attic": "1h", "porch": "2s"}


def write_values(spark, servers: str, rows: list[tuple[str, str, str]]) -> None:
    """rows: (key, value, ttl) -> one message per row on sensors.<key>."""
    df = spark.createDataFrame(rows, "key string, value string, ttl string")
    (
        df.selectExpr("concat('sensors.', key) as subject", "value as data", "ttl")
        .write.format("jetstream").mode("append")
        .option("servers", servers)
        .option("stream", STREAM)
        .option("ensureStream", "create")
        .option("stream.subjects", "sensors.>")
        .option("stream.maxMsgsPerSubject", "1")
        .option("stream.subjectDeleteMarkerTtl", "5m")
        .save()
    )


async def markers_written(servers: str) -> int:
    """How many subjects now hold a MaxAge marker."""
    import nats

    nc = await nats.connect(servers.split(","))
    js = nc.jetstream()
    found = 0
    for key in KEYS:
        with contextlib.suppress(Exception):  # a subject with no message at all
            msg = await js.get_last_msg(STREAM, f"sensors.{key}")
            if (msg.headers or {}).get("Nats-Marker-Reason") == "MaxAge":
                found += 1
    await nc.close()
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", help="NATS URL(s); default: start an embedded nats-server")
    parser.add_argument("--wait", type=float, default=30.0, help="seconds to wait for the markers at most")
    args = parser.parse_args()

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    with contextlib.ExitStack() as stack:
        servers = args.servers
        if servers is None:
            from pyspark_jetstream.server import EmbeddedNatsServer

            servers = stack.enter_context(EmbeddedNatsServer()).url
            print(f"Started an embedded nats-server at {servers}")
        spark = (SparkSession.builder.master("local[2]").appName("jetstream-kv-latest-values")
                 .config("spark.ui.showConsoleProgress", "false").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        stack.callback(spark.stop)

        write_values(spark, servers, [(k, json.dumps({"key": k, "celsius": 20 + i}), ttl)
                                      for i, (k, ttl) in enumerate(KEYS.items())])
        write_values(spark, servers, [("kitchen", json.dumps({"key": "kitchen", "celsius": 23.5}), "never"),
                                      ("attic", json.dumps({"key": "attic", "celsius": 31.0}), "1h")])
        print(f"Wrote {len(KEYS)} keys, then newer values for kitchen and attic (TTLs: {KEYS})")

        expiring = sum(1 for ttl in KEYS.values() if ttl.endswith("s"))
        deadline = time.monotonic() + args.wait
        while (found := asyncio.run(markers_written(servers))) < expiring:
            if time.monotonic() > deadline:
                print(f"Only {found} of {expiring} markers appeared within {args.wait:g}s", file=sys.stderr)
                return 1
            time.sleep(0.5)

        log = (spark.read.format("jetstream").option("servers", servers).option("stream", STREAM).load()
               .select("seq", "subject", F.col("data").cast("string").alias("value"), "ttl", "expires_at",
                       "marker_reason"))
        print("\nThe change log now (MaxMsgsPerSubject=1 keeps the last message per key):")
        log.orderBy("seq").show(truncate=False)
        alive = log.where(F.col("marker_reason").isNull()).select("subject", "value").orderBy("subject")
        print("Keys still alive:")
        alive.show(truncate=False)
        markers = log.where(F.col("marker_reason") == "MaxAge").count()
        print(f"{markers} keys expired and left a MaxAge marker; {alive.count()} keys alive")
    return 0


if __name__ == "__main__":
    sys.exit(main())
