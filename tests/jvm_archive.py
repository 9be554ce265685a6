"""A class-data-sharing archive for the tests' JVMs: each Spark JVM starts on half the CPU.

Why: about a third of the suite's CPU went to starting JVMs (the session's, and the jobs, examples and
servers the tests run as their own processes). A minimal local session's start, one count and its stop
took 19 CPU-seconds on 2 cores; with the classes such a run loads mapped from a dynamic CDS archive
(JDK 13+, ``-XX:ArchiveClassesAtExit`` then ``-XX:SharedArchiveFile``), 10. The archive is built once per
Java, PySpark and interpreter (about 75 s on 2 cores, under ``~/.cache``; two test processes take a lock),
by a run that touches what the tests use: SQL, a shuffle, Arrow, a Python data source batch and
streaming read and a batch write, parquet.

A JVM whose class path differs (the standalone cluster's master and worker, another PySpark) cannot use
the archive and starts as before; the JVM's CDS messages are turned off so that no test sees them on
stderr. Nothing here changes what a JVM computes, only where its classes are read from. Turned off with
``JETSTREAM_TESTS_NO_CDS=1``; a ``JAVA_TOOL_OPTIONS`` the caller set is kept as it is.

    python -m tests.jvm_archive <archive>      # the archive-building run (what ensure() starts)
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import subprocess
import sys
from pathlib import Path

C1_ONLY = "-XX:TieredStopAtLevel=1"
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def _key() -> str:
    """What the archive depends on: the JVM, PySpark's jars and this interpreter."""
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "JAVA_TOOL_OPTIONS"})
    jars = Path(pyspark.__file__).parent / "jars"
    stamp = f"{java.stderr}|{pyspark.__version__}|{jars}|{sys.executable}"
    return hashlib.sha256(stamp.encode()).hexdigest()[:16]


def ensure() -> Path | None:
    """The archive for this Java and PySpark, built if missing; None if it cannot be built (then the JVMs
    start as they would without it)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pyspark-jetstream-tests"
    try:
        cache.mkdir(parents=True, exist_ok=True)
        archive = cache / f"spark-{_key()}.jsa"
        with open(cache / f"{archive.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the other test process waits for the one building it
            if not archive.exists():
                partial = archive.with_suffix(".partial")
                with contextlib.suppress(FileNotFoundError):
                    partial.unlink()
                env = {**os.environ, "JAVA_TOOL_OPTIONS": f"{C1_ONLY} -XX:ArchiveClassesAtExit={partial} {QUIET}"}
                subprocess.run([sys.executable, "-m", "tests.jvm_archive", str(partial)], env=env, timeout=600,
                               cwd=Path(__file__).resolve().parents[1], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, check=True)
                partial.rename(archive)
        return archive
    except (OSError, subprocess.SubprocessError):
        return None


def java_options() -> str:
    """What JAVA_TOOL_OPTIONS the tests' JVMs get: C1 only (conftest says why), and the archive if there is one."""
    if os.environ.get("JETSTREAM_TESTS_NO_CDS"):
        return C1_ONLY
    archive = ensure()
    return f"{C1_ONLY} -XX:SharedArchiveFile={archive} {QUIET}" if archive is not None else C1_ONLY


def _touch_what_the_tests_use() -> None:
    """A short Spark run that loads the classes the tests' jobs load (the archive holds only those)."""
    import tempfile

    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceReader,
        DataSourceStreamReader,
        DataSourceWriter,
        InputPartition,
        WriterCommitMessage,
    )

    class Reader(DataSourceReader):
        def read(self, partition):
            yield from ((i, f"s{i % 3}") for i in range(10))

    class StreamReader(DataSourceStreamReader):
        def initialOffset(self):
            return {"n": 0}

        def latestOffset(self):
            return {"n": 10}

        def partitions(self, start, end):
            return [InputPartition(0)]

        def read(self, partition):
            yield from ((i, "s") for i in range(10))

    class Writer(DataSourceWriter):
        def write(self, rows):
            for _ in rows:
                pass
            return WriterCommitMessage()

    class Source(DataSource):
        @classmethod
        def name(cls):
            return "cds_warmup"

        def schema(self):
            return "seq long, subject string"

        def reader(self, schema):
            return Reader()

        def streamReader(self, schema):
            return StreamReader()

        def writer(self, schema, overwrite):
            return Writer()

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.dataSource.register(Source)
    df = spark.read.format("cds_warmup").load()
    df.groupBy("subject").count().collect()
    df.repartition(2, "subject").write.format("cds_warmup").mode("append").save()
    df.toPandas()
    with tempfile.TemporaryDirectory() as tmp:
        df.write.parquet(f"{tmp}/p")
        spark.read.parquet(f"{tmp}/p").where("seq > 3").collect()
        query = (spark.readStream.format("cds_warmup").load().writeStream.format("noop")
                 .option("checkpointLocation", f"{tmp}/c").start())
        query.processAllAvailable()
        query.stop()
    spark.sql("SELECT 1 AS x").collect()
    jvm = spark.sparkContext._gateway.proc  # spark-submit execs java: this is the JVM itself
    spark.stop()
    # The JVM writes the archive as it exits, which it does when its stdin closes; wait for that, so that
    # the archive is whole when this process ends.
    jvm.stdin.close()
    jvm.wait(timeout=300)


if __name__ == "__main__":
    _touch_what_the_tests_use()
    sys.exit(0)
