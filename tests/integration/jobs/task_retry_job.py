"""A batch job run as its own process by the task-retry tests, on ``local[2,4]`` so
that Spark retries a failed task (the shared test session, ``local[2]``, does not).

Usage: python task_retry_job.py MODE SERVERS SOURCE_STREAM TARGET_STREAM GATE_DIR

- ``write``: 4000 rows -> JetStream; a UDF raises on the first attempt of the task
  that reaches id 3500, after that task has published part of its rows.
- ``read``: SOURCE_STREAM -> JetStream TARGET_STREAM; on the first attempt, the
  partition holding sequence 15000 stops at a gate (``GATE_DIR/reached``) until
  the test has killed Python workers and created ``GATE_DIR/release``.
- ``hole``: 300 rows on three subjects (``<target>.k<id % 3>``), in one task, with
  the default ``order=subject``; row 100 is larger than the test's target stream
  takes (``max_msg_size``), so the first attempt has it refused after the rows behind
  it are stored, and fails. Its retry waits at a gate (``GATE_DIR/retrying``) until the
  test has raised the limit and created ``GATE_DIR/release``. With a ``writeId``: the retry
  finds what its first attempt stored by the replay records (sink/records/replay_guard.py).
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


HOLE_ROW = 100
HOLE_PAD = "x" * 2000


def hole_data(value: int) -> str:
    """What row ``value`` of the ``hole`` mode carries (the test compares it field by field)."""
    return f"{value}:{HOLE_PAD}" if value == HOLE_ROW else str(value)


def gate_retried_attempt(retrying, release):
    def gate(batches):
        import time

        from pyspark import TaskContext

        if TaskContext.get().attemptNumber() > 0:
            open(retrying, "w").close()
            deadline = time.monotonic() + 120
            while not os.path.exists(release) and time.monotonic() < deadline:
                time.sleep(0.05)
        yield from batches

    return gate


def write_hole(spark, servers: str, target: str, gate_dir: str, write_id: bool = True) -> None:
    rows = spark.range(0, 300, numPartitions=1)
    gate = gate_retried_attempt(os.path.join(gate_dir, "retrying"), os.path.join(gate_dir, "release"))
    rows = rows.mapInArrow(gate, rows.schema)
    data = F.udf(hole_data)("id")
    (rows.select(F.concat(F.lit(f"{target.lower()}.k"), (F.col("id") % 3).cast("string")).alias("subject"),
                 data.alias("data"))
     .write.format("jetstream").option("servers", servers).option("stream", target)
     .options(**({"writeId": f"hole-{target}"} if write_id else {})).mode("append").save())


def main(mode: str, servers: str, source: str, target: str, gate_dir: str) -> None:
    spark = (
        SparkSession.builder.master("local[2,4]").appName(f"task-retry-{mode}")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "200")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    if mode in ("hole", "hole-no-write-id"):
        write_hole(spark, servers, target, gate_dir, write_id=mode == "hole")
        spark.stop()
        return
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
