"""Issue #46 through Spark Connect: every pattern of ``test_pushdown_answers.py`` run from a Connect client
session (``SparkSession.builder.remote``), with ``spark.sql.python.filterPushdown.enabled`` off and on, and
the lookup forms (a view made with ``keys``, a catalog table read ``WITH`` the keys).

Usage: python connect_answers_job.py SERVERS STREAM BUCKET WORKDIR
Prints one JSON line: the patterns whose answers differed (none expected), and the forms' rows.
"""

import json
import os
import pathlib
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))  # the repository: the patterns' module

from pyspark.sql import SparkSession  # noqa: E402

from tests.integration.test_pushdown_answers import PATTERNS, Source  # noqa: E402

CONF = "spark.sql.python.filterPushdown.enabled"


def main(servers: str, stream: str, bucket: str, workdir: str) -> None:
    spark = SparkSession.builder.remote("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    assert type(spark).__module__.startswith("pyspark.sql.connect"), type(spark)
    data = {"url": servers, "stream": stream, "bucket": bucket}
    differed, errors = {}, {}
    for kind in ("stream", "bucket"):
        source = Source(spark, data, kind)
        for name, run in PATTERNS.items():
            try:
                spark.conf.set(CONF, "false")
                off = run(source, pathlib.Path(workdir))
                spark.conf.set(CONF, "true")
                on = run(source, pathlib.Path(workdir))
            except Exception as exc:  # noqa: BLE001 - reported, as a refusal would be
                errors[f"{name}-{kind}"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                continue
            if on != off:
                differed[f"{name}-{kind}"] = {"on": repr(on)[:300], "off": repr(off)[:300]}
    spark.conf.unset(CONF)
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW one_key USING jetstream OPTIONS (servers '{servers}', "
              f"bucket '{bucket}', `kv.view` 'latest', keys 'user42,user43')")
    view = sorted(r.key for r in spark.sql("SELECT key FROM one_key").collect())
    spark.sql("DROP TABLE IF EXISTS lookups_t")
    spark.sql(f"CREATE TABLE lookups_t USING jetstream OPTIONS (bucket '{bucket}')")
    table = [r.key for r in spark.sql(f"SELECT key FROM lookups_t WITH ('servers' = '{servers}', 'bucket' = "
                                      f"'{bucket}', 'kv.view' = 'latest', 'keys' = 'user7')").collect()]
    spark.sql("DROP TABLE IF EXISTS lookups_t")
    print(json.dumps({"differed": differed, "errors": errors, "view": view, "table": table,
                      "patterns": 2 * len(PATTERNS)}))
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
