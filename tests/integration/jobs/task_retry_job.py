"""A batch job run as its own process by the task-retry tests, on ``local[2,4]`` so
that Spark retries a failed task (the shared test session, ``local[2]``, does not).

Usage: python task_retry_job.py MODE SERVERS SOURCE_STREAM TARGET_STREAM GATE_DIR

- ``write``: 4000 rows -> JetStream; a UDF raises on the first attempt of the task
  that reaches id 3500, after that task has published part of its rows.
- ``read``: SOURCE_STREAM -> JetStream TARGET_STREAM; on the first attempt, the
  partition holding sequence 15000 stops at a gate (``GATE_DIR/reached``) until
  the test has killed Python workers and created ``GATE_DIR/release``.
"""

import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.types import LongType  # noqa: E402


def fail_first_attempt(value):
    from pyspark import TaskContext

    if value == 3500 and TaskContext.get().attemptNumber() == 0:
        raise RuntimeError("injected failure on the first attempt")
    return value


def gate_first_attempt(reached, release):
    def gate(batches):
        import time

        import pyarrow.compute as pc
        from pyspark import TaskContext

        first_attempt = TaskContext.get().attemptNumber() == 0
        for batch in batches:
            if first_attempt and pc.any(pc.equal(batch.column("seq"), 15000)).as_py():
                open(reached, "w").close()
                deadline = time.monotonic() + 120
                while not os.path.exists(release) and time.monotonic() < deadline:
                    time.sleep(0.05)
            yield batch

    return gate


def main(mode: str, servers: str, source: str, target: str, gate_dir: str) -> None:
    spark = (
        SparkSession.builder.master("local[2,4]").appName(f"task-retry-{mode}")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "200")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    if mode == "write":
        rows = spark.range(0, 4000, numPartitions=2).select(
            F.udf(fail_first_attempt, LongType())("id").alias("id"))
    else:
        df = (spark.read.format("jetstream").option("servers", servers).option("stream", source)
              .option("numPartitions", "2").option("batchSize", "500").option("consume.maxMessages", "1000").load())
        gate = gate_first_attempt(os.path.join(gate_dir, "reached"), os.path.join(gate_dir, "release"))
        rows = df.mapInArrow(gate, df.schema).select(F.col("seq").alias("id"))
    (rows.select(F.lit(f"{target.lower()}.x").alias("subject"), F.col("id").cast("string").alias("data"))
     .write.format("jetstream").option("servers", servers).option("stream", target).option("order", "none")
     .mode("append").save())
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
