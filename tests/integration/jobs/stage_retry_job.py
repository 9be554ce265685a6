"""A copy whose write stage Spark resubmits, run as its own process (its own SparkSession and
``spark.local.dir``) by ``test_task_retry.py`` (issue #33, item 1).

Usage: python stage_retry_job.py SERVERS SOURCE TARGET LOCAL_DIR GATE_DIR WINDOW_S

SOURCE is read in 4 sequence ranges, shuffled by subject into 2 write tasks and written to
TARGET with ``order=none`` (rows published as they come, so a task publishes before it has
read all its input). In the write stage's first attempt, the task of partition 0 waits until
some of its rows are stored (the other write task holds its rows until then), then deletes the
shuffle's data files: a block a task has not opened yet is gone, Spark fails that task with a
FetchFailed and resubmits the stages, whose tasks run again with attemptNumber 0. The
resubmitted tasks wait until WINDOW_S seconds (the target's duplicate window) have passed
since the first publish, so that only the sink's replay records can keep them from storing
their rows twice.
"""

import glob
import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402


def gate(servers, target, local_dir, gate_dir, window):
    def run(batches):
        import asyncio
        import time

        from pyspark import TaskContext

        first = os.path.join(gate_dir, "first-published")
        deleted = os.path.join(gate_dir, "deleted")
        if os.path.exists(deleted):  # the stage's second attempt: past the duplicate window of the first's rows
            deadline = time.monotonic() + 120
            while time.time() < os.path.getmtime(first) + window + 1 and time.monotonic() < deadline:
                time.sleep(0.1)
            open(os.path.join(gate_dir, "resubmitted"), "w").close()
            yield from batches
            return
        if TaskContext.get().partitionId() != 0:  # publishes only once partition 0's first rows are in
            deadline = time.monotonic() + 120
            while not os.path.exists(deleted) and time.monotonic() < deadline:
                time.sleep(0.05)
            yield from batches
            return
        for i, batch in enumerate(batches):
            yield batch
            if i == 5:  # the first batches are through the workers' buffers to the sink by now
                import nats

                async def stored():
                    nc = await nats.connect(servers)
                    try:
                        info = await nc.jetstream().stream_info(target)
                        return info.state.messages
                    finally:
                        await nc.close()

                deadline = time.monotonic() + 60
                while asyncio.run(stored()) == 0 and time.monotonic() < deadline:
                    time.sleep(0.05)
                open(first, "w").close()
                for path in glob.glob(os.path.join(local_dir, "**", "shuffle_*.data"), recursive=True):
                    os.remove(path)
                open(deleted, "w").close()

    return run


def main(servers: str, source: str, target: str, local_dir: str, gate_dir: str, window: str) -> None:
    spark = (
        SparkSession.builder.master("local[2]").appName("stage-retry")
        .config("spark.ui.enabled", "false")
        .config("spark.local.dir", local_dir)
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    read = (spark.read.format("jetstream").option("servers", servers).option("stream", source)
            .option("numPartitions", "4").option("batchSize", "500").load()
            .select(F.concat(F.lit(f"{target.lower()}."), F.col("subject")).alias("subject"), "data", "stream", "seq")
            .repartition(2, "subject"))
    rows = read.mapInArrow(gate(servers, target, local_dir, gate_dir, float(window)), read.schema)
    (rows.write.format("jetstream").option("servers", servers).option("stream", target).option("order", "none")
     .option("writeId", "stage-retry").mode("append").save())
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:7])
