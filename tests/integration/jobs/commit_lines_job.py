"""Two streaming queries in one driver, one named and one not, writing side by side to two streams,
then a batch write: the test reads the sink's per-batch totals lines from this process's stderr
(the commits run in Python workers Spark starts, whose records the session's worker-log table does
not hold).

Usage: python commit_lines_job.py SERVERS INPUT_DIR WORKDIR STREAM_A STREAM_B
Prints one JSON line: the queries' ids.
"""

import json
import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402


def main(servers: str, input_dir: str, workdir: str, stream_a: str, stream_b: str) -> None:
    spark = (SparkSession.builder.master("local[2]").appName("commit-lines-job").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")

    def start(target: str, name: str | None = None):
        df = (spark.readStream.schema("id long, data string").option("maxFilesPerTrigger", 1).json(input_dir)
              .select(F.lit(f"{target}.x").alias("subject"), "data"))
        writer = (df.writeStream.format("jetstream").option("servers", servers).option("stream", target)
                  .option("checkpointLocation", os.path.join(workdir, f"chk-{target}")).trigger(availableNow=True))
        return (writer.queryName(name) if name else writer).start()

    named, unnamed = start(stream_a, "orders"), start(stream_b)
    for query in (named, unnamed):
        assert query.awaitTermination(300) and query.exception() is None, query.exception()
    (spark.createDataFrame([("one",)], "data string").write.format("jetstream").mode("append")
     .option("servers", servers).option("subject", f"{stream_a}.one").save())
    print(json.dumps({"named": str(named.id), "unnamed": str(unnamed.id)}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
