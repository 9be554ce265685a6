"""A class-data-sharing archive for the tests' JVMs: each Spark JVM starts on half the CPU.

Why: about a third of the suite's CPU went to starting JVMs (the session's, and the jobs, examples and
servers the tests run as their own processes). A minimal local session's start, one count and its stop
took 19 CPU-seconds on 2 cores; with the classes such a run loads mapped from a dynamic CDS archive
(JDK 13+, ``-XX:ArchiveClassesAtExit`` then ``-XX:SharedArchiveFile``), 10. The archive is built once per
Java, PySpark and interpreter (about 85 s of one core, under ``~/.cache``), by a run that touches what the
tests use: SQL, a shuffle, Arrow, a Python data source batch and streaming read and a batch write, parquet.

The build runs in the background while the unit tests, which start no JVM, use the other core
(``start()`` when the tests' conftest is imported); a test that may start a JVM waits for it first
(``wait()``). A JVM pointed at an archive that is not there yet starts without it, silently, so no JVM
may start before ``wait()`` returns. The builder holds a lock on the archive's lock file from before it
starts until it ends: a process that gets the lock sees either the archive or a build that failed.

A JVM whose class path differs (the standalone cluster's master and worker, another PySpark) cannot use
the archive and starts as before; the JVM's CDS messages are turned off so that no test sees them on
stderr. Nothing here changes what a JVM computes, only where its classes are read from. Turned off with
``JETSTREAM_TESTS_NO_CDS=1``; a ``JAVA_TOOL_OPTIONS`` the caller set is kept as it is.

    python -m tests.jvm_archive build <archive>   # the builder start() spawns (it inherits the lock)
    python -m tests.jvm_archive touch             # the Spark run the builder records the classes of
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

C1_ONLY = "-XX:TieredStopAtLevel=1"
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
BUILD_DEADLINE = 900.0  # seconds a test waits for a build under way (it takes about 85 s of one core)
ROOT = Path(__file__).resolve().parents[1]

_state: dict[str, object] = {}  # "archive": the Path being waited for, "builder": the Popen this process started


def _key() -> str:
    """What the archive depends on: the JVM, PySpark's jars and this interpreter."""
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "JAVA_TOOL_OPTIONS"})
    jars = Path(pyspark.__file__).parent / "jars"
    stamp = f"{java.stderr}|{pyspark.__version__}|{jars}|{sys.executable}"
    return hashlib.sha256(stamp.encode()).hexdigest()[:16]


def _lock_path(archive: Path) -> Path:
    return archive.with_name(f"{archive.name}.lock")


def _with_archive(archive: Path) -> str:
    return f"{C1_ONLY} -XX:SharedArchiveFile={archive} {QUIET}"


def start() -> str:
    """The JAVA_TOOL_OPTIONS for the tests' JVMs: C1 only (conftest says why), and the archive, which is
    started building in the background when it is missing and nobody builds it yet."""
    if os.environ.get("JETSTREAM_TESTS_NO_CDS"):
        return C1_ONLY
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pyspark-jetstream-tests"
    try:
        cache.mkdir(parents=True, exist_ok=True)
        archive = cache / f"spark-{_key()}.jsa"
        _state["archive"] = archive
        if archive.exists():
            return _with_archive(archive)
        fd = os.open(_lock_path(archive), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another test process's builder has it
            os.close(fd)
            return _with_archive(archive)
        try:
            if not archive.exists():  # a builder may have ended between the two looks
                # The builder inherits the locked descriptor: the lock is released when it ends, never before.
                _state["builder"] = subprocess.Popen(
                    [sys.executable, "-m", "tests.jvm_archive", "build", str(archive)], cwd=ROOT, pass_fds=(fd,),
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        finally:
            os.close(fd)
        return _with_archive(archive)
    except (OSError, subprocess.SubprocessError):
        _state.pop("archive", None)
        return C1_ONLY


def wait() -> None:
    """Return when no build of the archive is under way; without an archive then (a failed build), the
    JVMs that follow start without it. Called before anything that may start a JVM."""
    archive = _state.get("archive")
    if not isinstance(archive, Path) or archive.exists():
        return
    builder = _state.pop("builder", None)
    if isinstance(builder, subprocess.Popen):
        with contextlib.suppress(subprocess.TimeoutExpired):
            builder.wait(timeout=BUILD_DEADLINE)
    fd = os.open(_lock_path(archive), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + BUILD_DEADLINE
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)  # another test process's builder holds the lock until it ends
    finally:
        os.close(fd)
    if not archive.exists():
        print(f"tests/jvm_archive.py: no class-data archive at {archive}; the JVMs start without it",
              file=sys.stderr)
        os.environ["JAVA_TOOL_OPTIONS"] = C1_ONLY
        _state.pop("archive", None)


def _build(archive: Path) -> None:
    """The builder: record the classes of a Spark run, then move the archive into place (whole or not at all)."""
    partial = archive.with_suffix(".partial")
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()
    env = {**os.environ, "JAVA_TOOL_OPTIONS": f"{C1_ONLY} -XX:ArchiveClassesAtExit={partial} {QUIET}"}
    subprocess.run([sys.executable, "-m", "tests.jvm_archive", "touch"], env=env, timeout=600, cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    partial.rename(archive)


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
    if sys.argv[1:2] == ["build"]:
        _build(Path(sys.argv[2]))
    elif sys.argv[1:2] == ["touch"]:
        _touch_what_the_tests_use()
    else:
        sys.exit("usage: python -m tests.jvm_archive build <archive> | touch")
