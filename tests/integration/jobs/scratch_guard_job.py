"""A job run as its own process by the order-guard tests of issue #47: copies of one stream, straight
from a 4-range read (no shuffle) and through ``repartition(4, "subject")``, with the scratch space
writable, then not. Its own process because the Python workers' ``TMPDIR`` is fixed when the Spark
session starts (the test runs it with ``TMPDIR`` set to a folder of its own).

Usage: python scratch_guard_job.py SERVERS SOURCE_STREAM TARGET_PREFIX

Phases, in order, each copying SOURCE_STREAM twice (``narrow``: no shuffle; ``documented``: with the
repartition line) into the streams ``<TARGET_PREFIX><PHASE><COPY>``, which the test created:

- ``W`` (writable): the temp directory as it is.
- ``T`` (temp dir unwritable): a plain file where the connector's old temp folder went,
  ``$TMPDIR/pyspark-jetstream-<uid>`` (what a full disk, a read-only temp dir or a sandbox look like).
- ``L`` (local dir unwritable): a plain file where the task notes go under Spark's local directory
  (the executor's block-manager folder, which Spark also writes its shuffle files to).

Prints one JSON line per copy: ``{"phase", "copy", "verdict": "stored" | "refused", "errors": [...]}``,
``errors`` naming the connector's error types found in the failure.
"""

import json
import os
import sys
import tempfile

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

ERRORS = ("OrderError", "LocalDirectoryError")


def local_dir(spark) -> str:
    """The first of the Python workers' SPARK_LOCAL_DIRS, as a task sees it."""
    return spark.sparkContext.parallelize([0], 1).map(
        lambda _: os.environ["SPARK_LOCAL_DIRS"].split(",")[0]).collect()[0]


def copy(spark, servers: str, source: str, target: str, shuffled: bool) -> dict:
    read = (spark.read.format("jetstream").option("servers", servers).option("stream", source)
            .option("numPartitions", "4").load())
    rows = read.withColumn("subject", F.concat(F.lit(f"{target}."), F.col("subject")))
    if shuffled:
        rows = rows.repartition(4, "subject")
    try:
        rows.write.format("jetstream").mode("append").option("servers", servers).option("stream", target).save()
        return {"verdict": "stored", "errors": []}
    except Exception as exc:  # Spark wraps the task's error: its text names the connector's type
        text = str(exc)
        return {"verdict": "refused", "errors": [name for name in ERRORS if name in text], "text": text[-1500:]}


def main() -> None:
    servers, source, prefix = sys.argv[1:4]
    spark = (SparkSession.builder.master("local[2]").appName("scratch-guard-job")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    old_folder = os.path.join(tempfile.gettempdir(), f"pyspark-jetstream-{os.getuid()}")
    notes = os.path.join(local_dir(spark), "pyspark-jetstream-notes")
    blockers = {"W": None, "T": old_folder, "L": notes}
    for phase, blocker in blockers.items():
        if blocker is not None:
            if os.path.isdir(blocker):
                os.rename(blocker, blocker + ".moved")
            with open(blocker, "w") as f:
                f.write("not a folder\n")
        try:
            for name, shuffled in (("narrow", False), ("documented", True)):
                result = copy(spark, servers, source, f"{prefix}{phase}{name.upper()}", shuffled)
                print(json.dumps({"phase": phase, "copy": name, **result}), flush=True)
        finally:
            if blocker is not None:
                os.remove(blocker)
                if os.path.isdir(blocker + ".moved"):
                    os.rename(blocker + ".moved", blocker)
    spark.stop()


if __name__ == "__main__":
    main()
