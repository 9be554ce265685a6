"""A job run as its own process by the secrets test: everything Spark and the
connector show about a query that carries a password, gathered in one place.

Usage: python secrets_job.py RUNS_JSON

RUNS_JSON is a list of runs, each ``{"servers", "auth", "source", "target",
"checkpoint", "out_dir"}``; one Spark application does them all, one after the
other. Each runs a streaming read -> write with its authentication options (user
and password, a token, or an NKey seed file) on both sides, a batch read and a
batch write, with Spark's JVM log at DEBUG and the connector's at DEBUG
(``PYSPARK_JETSTREAM_LOG_LEVEL``, set by the test), and writes ``explain.txt``
(extended plans) and ``ui.json`` (the Spark UI's REST answers: SQL executions
with plan descriptions, jobs, stages, environment) into its ``out_dir``. The test
greps those, the checkpoints and this process's output for every secret.
"""

import json
import os
import sys
import urllib.request

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402


def ui_dump(spark) -> dict:
    base = spark.sparkContext.uiWebUrl.rstrip("/") + "/api/v1/applications"
    app = spark.sparkContext.applicationId

    def get(path: str):
        with urllib.request.urlopen(f"{base}/{app}/{path}", timeout=30) as reply:
            return json.loads(reply.read())

    return {
        "sql": get("sql?details=true&planDescription=true&length=1000"),
        "jobs": get("jobs"),
        "stages": get("stages?details=true"),
        "environment": get("environment"),
    }


def main(runs: str) -> None:
    spark = (
        SparkSession.builder.master("local[2]").appName("secrets-job")
        .config("spark.ui.enabled", "true").config("spark.ui.port", "0")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("DEBUG")
    for run in json.loads(runs):
        one_run(spark, **run)
    spark.stop()


def one_run(spark, servers: str, auth: dict, source: str, target: str, checkpoint: str, out_dir: str) -> None:
    auth = {"servers": servers, **auth}
    explains = []

    stream_in = (spark.readStream.format("jetstream").options(**auth).option("stream", source)
                 .option("startingOffsets", "earliest").load())
    query = (stream_in.select(F.lit(f"{target.lower()}.copy").alias("subject"), "data")
             .writeStream.format("jetstream").options(**auth).option("stream", target).option("order", "none")
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    assert query.awaitTermination(600), "the streaming copy did not finish within 600s"
    assert query.exception() is None, query.exception()
    explains.append(query._jsq.explainInternal(True))
    explains.append(str(query.lastProgress))

    batch_in = spark.read.format("jetstream").options(**auth).option("stream", source).load()
    explains.append(batch_in._jdf.queryExecution().toString())
    print("batch rows:", batch_in.count(), flush=True)
    out = batch_in.select(F.lit(f"{target.lower()}.batch").alias("subject"), "data")
    out.write.format("jetstream").options(**auth).option("stream", target).option("order", "none").mode("append").save()

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "explain.txt"), "w") as f:
        f.write("\n".join(explains))
    with open(os.path.join(out_dir, "ui.json"), "w") as f:
        json.dump(ui_dump(spark), f)


if __name__ == "__main__":
    main(*sys.argv[1:])
