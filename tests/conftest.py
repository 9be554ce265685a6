"""Session fixtures: one real nats-server and one local SparkSession for the whole run."""

from __future__ import annotations

import itertools
import os
import sys

import pytest

from pyspark_jetstream.tools.server import EmbeddedNatsCluster, EmbeddedNatsServer

from . import jvm_archive
from .helpers import PYTHON_START_TIMEOUT, SyncNats
from .schedule import file_order

# Spark's Python workers must run this interpreter (it has pyarrow and the connector).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# Bind Spark to loopback: tests talk only to this machine.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Every JVM the tests start (this session's, and those of the jobs they run as their own
# processes) compiles with C1 only: the tests' Spark jobs are short and their data tiny, so
# C2's optimising compiles cost more CPU than they ever win back. Measured on 2 cores: the
# same integration tests took 182 s instead of 224 s. And each maps the classes a Spark run loads
# from a class-data-sharing archive built once (tests/jvm_archive.py): a JVM's start takes half the
# CPU. Each JVM prints "Picked up JAVA_TOOL_OPTIONS" on stderr once. A value the caller set is kept.
# The archive is built in the background while the unit tests run (tests/schedule.py): every test
# that may start a JVM waits for it first (``_jvm_archive_ready`` below, and the ``spark`` fixture).
if "JAVA_TOOL_OPTIONS" not in os.environ:
    os.environ["JAVA_TOOL_OPTIONS"] = jvm_archive.start()

_names = itertools.count(1)


@pytest.fixture(scope="session")
def nats_server():
    with EmbeddedNatsServer() as server:
        yield server


@pytest.fixture(scope="session")
def nats_cluster():
    """A 3-node JetStream cluster, started on first use. Tests that stop a node
    start it again before they end, so the next test finds three nodes."""
    with EmbeddedNatsCluster(3) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def nats_client(nats_server):
    client = SyncNats(nats_server.url)
    yield client
    client.close()


def pytest_collection_modifyitems(config, items):
    """Unit tests first, then the integration files longest first (tests/schedule.py says why). Each
    file's tests keep their order; pytest-xdist's own reordering (by number of tests) is off in addopts."""
    items.sort(key=lambda item: file_order(item.nodeid.split("::")[0]))


@pytest.fixture(scope="module", autouse=True)
def _jvm_archive_ready(request):
    """Before a module's tests or fixtures may start a JVM (a unit test starts none): the archive built."""
    if not request.node.nodeid.startswith("tests/unit/"):
        jvm_archive.wait()


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    jvm_archive.wait()  # a session fixture comes before the module's own

    session = (
        SparkSession.builder.master("local[2]")
        .appName("pyspark-jetstream-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.python.worker.reuse", "true")
        .config("spark.python.authenticate.socketTimeout", PYTHON_START_TIMEOUT)
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


WORKER_LOGGING = "spark.sql.pyspark.worker.logging.enabled"


@pytest.fixture
def worker_logging(spark):
    """Python workers' log records queryable (``helpers.worker_log``) for one test.

    Off for the rest of the session: with it on, Spark puts the session's id in the Python
    workers' environment, so every streaming query (a cloned session) starts its own Python
    daemons (measured: 140 daemons in one run, and about half of a test's CPU spent in Python
    workers starting and importing)."""
    spark.conf.set(WORKER_LOGGING, "true")
    yield spark
    spark.conf.set(WORKER_LOGGING, "false")


@pytest.fixture
def stream_name(request):
    """A stream name unique to the test, so tests never share state."""
    base = "".join(ch for ch in request.node.name.upper() if ch.isalnum())[:40]
    return f"T{next(_names)}_{base}"
