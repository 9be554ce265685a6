"""A streaming job run as its own process, so its Python workers have the time zone the caller
gives it (``TZ``) and its session a zone of its own: JSON files -> a stream (a timestamp_ntz
``expires_at`` with ``preserveExpiry``), then the same files -> a KV bucket (``sequenceBy`` that
timestamp_ntz column). Prints the workers' UTC offset as they see it.

Usage: TZ=<zone> python zoned_write_job.py SERVERS INPUT_DIR CHECKPOINTS SESSION_ZONE STREAM BUCKET
"""

import os
import sys
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402


def main(servers: str, input_dir: str, checkpoints: str, session_zone: str, stream: str, bucket: str) -> None:
    spark = (
        SparkSession.builder.master("local[2]").appName("zoned-write-job")
        .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", session_zone).getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    print("WORKER_UTC_OFFSET", spark.sparkContext.parallelize([0], 1).map(lambda _: time.strftime("%z")).first(),
          flush=True)
    rows = spark.readStream.schema("key string, data string, at string").json(input_dir)
    at = F.col("at").cast("timestamp_ntz")  # a wall-clock time: no zone is involved in the cast
    queries = [
        rows.select(F.concat(F.lit(f"{stream}."), "key").alias("subject"), "data", at.alias("expires_at"))
        .writeStream.format("jetstream").option("servers", servers).option("stream", stream)
        .option("preserveExpiry", "true"),
        rows.select("key", "data", at.alias("w"))
        .writeStream.format("jetstream").option("servers", servers).option("bucket", bucket)
        .option("sequenceBy", "w"),
    ]
    for i, writer in enumerate(queries):
        query = writer.option("checkpointLocation", f"{checkpoints}/{i}").trigger(availableNow=True).start()
        assert query.awaitTermination(300), "the streaming write did not finish within 300s"
        assert query.exception() is None, query.exception()
    print("WRITTEN", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
