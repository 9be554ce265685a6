"""A streaming job run as its own process by the crash tests: JSON files -> JetStream.

Usage: python stream_copy_job.py SERVERS INPUT_DIR CHECKPOINT STREAM MAX_PENDING_ACKS
"""

import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402


def main(servers: str, input_dir: str, checkpoint: str, stream: str, max_pending: str) -> None:
    spark = (
        SparkSession.builder.master("local[2]").appName("stream-copy-job")
        .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.readStream.schema("id long, data string").option("maxFilesPerTrigger", 1).json(input_dir)
    query = (
        df.select(F.concat(F.lit(f"{stream}."), (F.col("id") % 3).cast("string")).alias("subject"), "data")
        .writeStream.format("jetstream")
        .option("servers", servers).option("stream", stream).option("maxPendingAcks", max_pending)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    print("STARTED", flush=True)
    assert query.awaitTermination(600), "the streaming copy did not finish within 600s"
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
