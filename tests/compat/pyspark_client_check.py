"""Beside ``pyspark-client`` (Spark Connect's thin client, no JVM): installing the connector did not
pull the full ``pyspark`` (``.ci/compat`` checks the environment before and after), and a client
session writes and reads through a Connect server that holds the connector, with no registration
call. Runs only in the ``client42`` cell of ``.ci/compat`` (its file name keeps it out of the main
suite); the server comes from the venv named by ``COMPAT_SERVER_VENV``."""

from __future__ import annotations

import importlib.metadata as metadata
import os
import socket
import subprocess
import sys
from pathlib import Path

from ..helpers import wait_until

SERVER = Path(__file__).parents[1] / "integration" / "jobs" / "connect_server.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _installed(name: str) -> bool:
    try:
        metadata.distribution(name)
        return True
    except metadata.PackageNotFoundError:
        return False


def test_a_pyspark_client_session_writes_and_reads_through_a_connect_server(nats_server, nats_client, stream_name):
    assert _installed("pyspark-client") and not _installed("pyspark")  # the connector did not pull pyspark
    import pyspark_jetstream  # importable on the client too (for spark.dataSource.register, where wanted)

    assert pyspark_jetstream.spark_api.VERSION >= (4, 0)
    venv = os.environ.get("COMPAT_SERVER_VENV")
    python = f"{venv}/bin/python" if venv else sys.executable
    port = _free_port()
    env = {**os.environ, "PYSPARK_PYTHON": python}
    server = subprocess.Popen([python, str(SERVER), str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        ready = server.stdout.readline()  # the JVM starting: bounded by the test's timeout
        assert ready.strip() == "ready", ready
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
        prefix = stream_name.lower()
        rows = spark.createDataFrame([(f"{prefix}.{i % 2}", f"v{i}") for i in range(4)], "subject string, data string")
        (rows.coalesce(1).write.format("jetstream").mode("append").option("servers", nats_server.url)
         .option("stream", stream_name).option("ensureStream", "create").option("stream.subjects", f"{prefix}.>")
         .save())
        read = spark.read.format("jetstream").option("servers", nats_server.url).option("stream", stream_name).load()
        got = [(r.seq, r.subject, r.data) for r in read.orderBy("seq").collect()]
        assert got == [(i + 1, f"{prefix}.{i % 2}", f"v{i}".encode()) for i in range(4)]
        stored = [nats_client.run(nats_client.js.get_msg(stream_name, seq)) for seq in range(1, 5)]  # nats-py
        assert [(m.subject, m.data) for m in stored] == [(s, d) for _, s, d in got]
        spark.stop()
    finally:
        server.stdin.close()
        wait_until(lambda: server.poll() is not None, timeout=60, what="the Connect server to stop")
