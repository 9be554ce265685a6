"""A Spark Connect client session (``SparkSession.builder.remote``) against a local Connect server
started from the installed PySpark: batch write, batch read and a streaming round trip, with no
registration call. The connector is installed where the server and its Python workers run (this
interpreter); the client side only needs ``pyspark[connect]``.

Usage: python connect_job.py SERVERS STREAM
Prints one JSON line with what it read back.
"""

import json
import os
import sys
import tempfile

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402


def main(servers: str, stream: str) -> None:
    spark = SparkSession.builder.remote("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    assert type(spark).__module__.startswith("pyspark.sql.connect"), type(spark)  # a Connect client
    prefix = stream.lower()
    rows = spark.createDataFrame([(f"{prefix}.{i % 2}", f"v{i}", "1h" if i == 0 else None) for i in range(5)],
                                 "subject string, data string, ttl string")
    (rows.coalesce(1).write.format("jetstream").mode("append").option("servers", servers).option("stream", stream)
     .option("ensureStream", "create").option("stream.subjects", f"{prefix}.>").save())
    read = spark.read.format("jetstream").option("servers", servers).option("stream", stream).load()
    batch = [(r.seq, r.subject, r.data.decode(), r.ttl) for r in read.orderBy("seq").collect()]

    target = f"{stream}_OUT"
    copy = (spark.readStream.format("jetstream").option("servers", servers).option("stream", stream)
            .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", 2).load()
            .select(F.concat(F.lit("out."), "subject").alias("subject"), "data", "stream", "seq")
            .repartition(2, "subject"))
    query = (copy.writeStream.format("jetstream").option("servers", servers).option("stream", target)
             .option("ensureStream", "create").option("stream.subjects", "out.>")
             .option("checkpointLocation", tempfile.mkdtemp()).trigger(availableNow=True).start())
    ended = query.awaitTermination(180)
    assert ended and query.exception() is None, (ended, query.exception())
    out = spark.read.format("jetstream").option("servers", servers).option("stream", target).load()
    streamed = [(r.seq, r.subject, r.data.decode()) for r in out.orderBy("seq").collect()]
    print(json.dumps({"batch": batch, "streamed": streamed, "batches": len(query.recentProgress)}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:3])
