"""On a real cluster: a Spark standalone master and worker on 127.0.0.1 (from the
installed PySpark), a 3-node nats-server cluster with R3 streams, and
``examples/orders_pipeline.py`` submitted with ``spark-submit --master spark://...``.

The executors run a separate virtualenv that has pyarrow but neither the connector
nor nats-py: both reach them through ``--py-files`` with the zip that
``python -m pyspark_jetstream.tools.pack`` builds, the documented way to ship them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow
import pyspark
import pytest

from ..helpers import SyncNats, spark_submit_command, wait_until

ROOT = Path(__file__).resolve().parents[2]
SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def executor_python(tmp_path_factory):
    """A virtualenv for the executors with pyarrow only (the driver's version)."""
    venv = tmp_path_factory.mktemp("executor-venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", f"pyarrow=={pyarrow.__version__}"], check=True, timeout=600)
    cannot = subprocess.run([python, "-c", "import pyspark_jetstream"], capture_output=True)
    assert cannot.returncode != 0, "the executors' venv must not have the connector installed"
    return python


@pytest.fixture(scope="module")
def spark_standalone(tmp_path_factory):
    """A standalone master and one worker (2 cores), stopped by PID at the end."""
    work = tmp_path_factory.mktemp("spark-standalone")
    port = _free_port()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(work)}
    with open(work / "master.log", "w") as master_log, open(work / "worker.log", "w") as worker_log:
        yield from _run_standalone(work, port, env, master_log, worker_log)


def _run_standalone(work, port, env, master_log, worker_log):
    master = subprocess.Popen(
        [str(SPARK_CLASS), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
         "--webui-port", str(_free_port())], stdout=master_log, stderr=subprocess.STDOUT, env=env,
        start_new_session=True)
    url = f"spark://127.0.0.1:{port}"
    worker = None
    try:
        wait_until(lambda: "I have been elected leader" in (work / "master.log").read_text() or master.poll() is not None,
                   timeout=120, what="the Spark master is up")
        assert master.poll() is None, (work / "master.log").read_text()[-3000:]
        worker = subprocess.Popen(
            [str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "2",
             "--memory", "2g", "--webui-port", str(_free_port()), "--work-dir", str(work / "work"), url],
            stdout=worker_log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        wait_until(lambda: "Successfully registered with master" in (work / "worker.log").read_text()
                   or worker.poll() is not None, timeout=120, what="the Spark worker registered")
        assert worker.poll() is None, (work / "worker.log").read_text()[-3000:]
        yield url, work
    finally:
        for proc in (worker, master):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(30)


@pytest.mark.slow  # 80-96 s (a master, a worker and an executor JVM of their own): out of CI's 25 minutes
def test_orders_pipeline_on_a_standalone_cluster_against_a_nats_cluster(
        spark_standalone, executor_python, nats_cluster, tmp_path):
    master_url, work = spark_standalone
    client = SyncNats(nats_cluster.url)
    source, target = "CLUSTER_ORDERS", "CLUSTER_INVOICES"
    try:
        client.add_stream(source, ["cluster.orders.>"], storage="file", num_replicas=3)

        async def publish():
            for i in range(5000):
                body = json.dumps({"id": i, "customer": f"c{i % 10}", "amount": float(i % 50)}).encode()
                await client.js.publish("cluster.orders.new", body)

        client.run(publish(), timeout=300)

        deps = tmp_path / "pyspark_jetstream_deps.zip"
        subprocess.run([sys.executable, "-m", "pyspark_jetstream.tools.pack", str(deps)], check=True, timeout=60)
        command = spark_submit_command(master_url, executor_python) + [
            "--conf", "spark.executor.cores=2", "--conf", "spark.cores.max=2", "--conf", "spark.executor.memory=1g",
            "--py-files", str(deps),
            str(ROOT / "examples" / "orders_pipeline.py"), "--servers", nats_cluster.url,
            "--source-stream", source, "--target-stream", target, "--checkpoint", str(tmp_path / "chk"),
            "--trigger", "availableNow", "--replicas", "3", "--max-messages-per-trigger", "2000",
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        assert "stopped cleanly after 5000 orders" in done.stdout

        # The tasks ran on the standalone worker's executor, with the executors' venv.
        executor_logs = "".join(p.read_text(errors="replace") for p in (work / "work").rglob("stderr"))
        assert executor_logs, "the standalone worker ran an executor"
        info = client.api(f"STREAM.INFO.{target}")
        assert info["config"]["num_replicas"] == 3 and len(info["cluster"]["replicas"]) == 2
        invoices = [json.loads(m.data) for m in client.messages(target)]
        assert sorted(i["order_id"] for i in invoices) == list(range(5000))
        assert sorted(i["source_seq"] for i in invoices) == list(range(1, 5001))
    finally:
        for stream in (source, target):
            client.api(f"STREAM.DELETE.{stream}")
        client.close()
