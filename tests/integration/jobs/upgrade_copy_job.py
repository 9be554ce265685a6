"""The streaming copy of the upgrade test, as a user's job: unchanged between two releases of the connector.

A copy straight from a 4-partition read, no shuffle (the way a job written for a release whose reads
were split by subject by default keeps each subject's order). Which connector runs is whichever
``pyspark_jetstream`` comes first on ``PYTHONPATH``: the test runs the job once with the previous
release's package, once with this one's, from the same checkpoint.

Usage: python upgrade_copy_job.py SERVERS SOURCE TARGET CHECKPOINT
Prints one JSON line: the connector's file and the rows of each micro-batch.
"""

import contextlib
import json
import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402


def main(servers: str, source: str, target: str, checkpoint: str) -> None:
    import pyspark_jetstream

    spark = (SparkSession.builder.master("local[2]").appName("upgrade-copy-job")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    read = (spark.readStream.format("jetstream").option("servers", servers).option("stream", source)
            .option("startingOffsets", "earliest").option("numPartitions", "4").load())
    query = (read.withColumn("subject", F.concat(F.lit(f"{target}."), F.col("subject")))
             .writeStream.format("jetstream").option("servers", servers).option("stream", target)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    ended = True  # a failed query raises here: its error is reported below
    with contextlib.suppress(Exception):
        ended = query.awaitTermination(600)
    error = query.exception()
    print(json.dumps({"connector": pyspark_jetstream.__file__, "ended": ended, "error": str(error) if error else None,
                      "rows": [p["numInputRows"] for p in query.recentProgress]}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
