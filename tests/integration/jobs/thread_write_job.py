"""Writes from threads in a fresh driver process (the test session's JVM threads may
already carry an active session, which hides the problem).

Usage: python thread_write_job.py SERVERS STREAM
Prints one line per attempt: 'unbound: <outcome>' and 'bound: <outcome>'.
"""

import os
import sys
import threading

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql import SparkSession  # noqa: E402

from pyspark_jetstream import bind_session_to_thread  # noqa: E402


def main(servers: str, stream: str) -> None:
    spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")

    # DataFrames built on the main thread, written from other threads: the common shape
    # (a pool of writers). Building a DataFrame inside the thread (createDataFrame) happens
    # to activate the session there, which hides the problem.
    frames = {label: spark.createDataFrame([(f"{stream.lower()}.x", label)], "subject string, data string")
              for label in ("unbound", "bound")}

    def write(label: str, bind: bool) -> None:
        try:
            if bind:
                bind_session_to_thread(spark)
            frames[label].write.format("jetstream").mode("append").option("servers", servers).option("stream", stream).save()
            print(f"{label}: ok", flush=True)
        except Exception as exc:
            print(f"{label}: {'DATA_SOURCE_NOT_FOUND' if 'DATA_SOURCE_NOT_FOUND' in str(exc) else exc}", flush=True)

    for label, bind in (("unbound", False), ("bound", True)):
        thread = threading.Thread(target=write, args=(label, bind))
        thread.start()
        thread.join()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
