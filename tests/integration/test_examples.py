"""The examples run as a user runs them: as their own processes, from the command line.

The orders pipeline runs through ``spark-submit`` with spark-conf/ as documented there
(``--properties-file`` and ``SPARK_CONF_DIR`` for its log4j2.properties)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ..helpers import SyncNats, child_processes, spark_submit_command, wait_until

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
JVM_INFO = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d INFO (?!Python)\w+: ")


def _clean_env() -> dict[str, str]:
    """The user's environment: no PYSPARK_* settings inherited from the test session."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}


def _run_example(name: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True,
                          timeout=timeout, env=_clean_env())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def test_quickstart_with_its_embedded_server():
    done = _run_example("quickstart.py", "--orders", "1000", "--batch", "400")
    out = done.stdout
    assert "Started an embedded nats-server" in out
    assert "Stream ORDERS: 1000 messages" in out and "AllowMsgTTL=True" in out
    orders_section, totals_section = out.split("Stream CUSTOMER_TOTALS:")
    mix = dict(re.findall(r"(\(none\)|1h|2m|30m|never): (\d+)", orders_section.split("TTL mix:")[1]))
    assert mix == {"(none)": "200", "1h": "200", "2m": "200", "30m": "200", "never": "200"}
    # The streaming aggregation: three micro-batches of at most 400 orders, progress shown as it ran.
    progress = out.split("Stream ORDERS:")[0]  # printed as the query ran, before the streams are shown
    assert re.findall(r"micro-batch (\d+): (\d+) orders read", progress) == [("0", "400"), ("1", "400"), ("2", "200")]
    assert re.search(r"micro-batch 0: .* offsets start -> \{", progress), progress  # not "None"
    assert re.findall(r"lag (\d+) messages", progress) == ["600", "200", "0"]  # from the progress's offsets
    assert "Query finished\n" in progress
    # One total per customer kept (MaxMsgsPerSubject=1), each with the sink's defaultTtl.
    assert totals_section.startswith(" 7 messages") and "TTL mix: 1h: 7" in totals_section
    assert "AllowMsgTTL=True; the first 5:" in totals_section  # the list below is cut, and says so
    assert "Customer totals cover 1000 orders" in out
    # The driver's per-batch totals are visible without any logging setup.
    # ORDERS is created with ensureStream=create, so on nats-server 2.14.3+ it takes fast-ingest batches.
    assert re.search(r"JetStream sink write committed: 1000 published, 0 duplicates", done.stderr), done.stderr[-3000:]


def _publish_orders(client: SyncNats, subject: str, first: int, count: int) -> None:
    async def go():
        for i in range(first, first + count):
            body = json.dumps({"id": i, "customer": f"c{i % 5}", "amount": float(i % 100)}).encode()
            await client.js.publish(subject, body, headers={"Nats-TTL": "1h"} if i % 2 else None)

    client.run(go(), timeout=120)


@pytest.mark.slow  # 130 s of spark-submit; the same pipeline runs in CI on a standalone cluster (test_spark_cluster)
def test_orders_pipeline_stops_on_sigterm_and_resumes_exactly_once(nats_server, nats_client, stream_name, tmp_path):
    source, target = f"{stream_name}O", f"{stream_name}I"
    nats_client.add_stream(source, [f"{source.lower()}.new"], allow_msg_ttl=True)
    _publish_orders(nats_client, f"{source.lower()}.new", 0, 3000)
    command = spark_submit_command("local[2]") + [
        str(EXAMPLES / "orders_pipeline.py"), "--servers", nats_server.url, "--source-stream", source,
        "--target-stream", target, "--checkpoint", str(tmp_path / "chk"), "--max-messages-per-trigger", "500"]

    # As spark-conf/ documents it: the properties file (in the command) and its log4j2.properties.
    env = {**os.environ, "SPARK_CONF_DIR": str(ROOT / "spark-conf")}
    job = subprocess.Popen(command + ["--trigger", "1 second"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, start_new_session=True, env=env)
    try:
        wait_until(lambda: job.poll() is not None or (
            "error" not in nats_client.api(f"STREAM.INFO.{target}")
            and nats_client.stream_state(target)["messages"] >= 1000), timeout=240, what="invoices arriving")
        assert job.poll() is None, job.communicate()[1][-3000:]
        # SIGTERM the Python driver, as a scheduler stopping the job would.
        drivers = child_processes(job.pid, "orders_pipeline.py")
        assert drivers, "the Python driver process of spark-submit"
        os.kill(drivers[0], signal.SIGTERM)
        out, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 0, err[-3000:]
    assert "stopping on signal" in out and "stopped cleanly" in out
    # spark-conf/log4j2.properties prints "%d %p %c{1}: %m" at WARN: Spark's own INFO lines (SparkContext's
    # "Running Spark version ..." first of all) would read "... INFO SparkContext: ...", while the
    # connector's per-batch totals (logged by the Python workers) stay visible.
    jvm_info = [line for line in err.splitlines() if JVM_INFO.match(line)]
    assert jvm_info == [], jvm_info[:5]
    assert re.search(r"JetStream sink batch \d+ committed: \d+ published", err), err[-3000:]

    _publish_orders(nats_client, f"{source.lower()}.new", 3000, 1000)
    done = subprocess.run(command + ["--trigger", "availableNow"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    invoices = [(json.loads(m.data), m) for m in nats_client.messages(target)]
    assert sorted(inv["order_id"] for inv, _ in invoices) == list(range(4000))  # each order exactly once
    assert sorted(inv["source_seq"] for inv, _ in invoices) == list(range(1, 4001))
    sample, message = next((inv, m) for inv, m in invoices if inv["order_id"] == 7)
    assert message.subject == f"{target.lower()}.c2" and sample["amount_with_tax"] == round(7 * 1.2, 2)
    assert message.headers.get("Nats-TTL") == ["1h"]  # the order's TTL travelled with it


@pytest.mark.slow  # 80 s, most of it waiting for a 30 s TTL (CI's 25 minutes); -m slow runs it
def test_kv_latest_values_reads_the_bucket_as_nats_py_does():
    out = _run_example("kv_latest_values.py").stdout
    assert "Summarised 500 readings in 5 micro-batches into bucket SENSORS" in out
    now, after = out.split("The bucket now:")[1].split("After the expiries")
    # Both views agree at both times (the example exits 1 otherwise), and say what the issue expects.
    assert out.count("connector == nats-py: True") == 2
    rows = {line.split()[0]: line for line in now.splitlines()[2:] if line.startswith("  ") and "{" in line}
    assert sorted(rows) == ["boiler", "kitchen", "porch"]
    assert '"readings":100' in rows["kitchen"] and "<PURGE; 1 entries in history>" in now  # a tombstone
    assert "2 keys alive: boiler, kitchen" in after  # porch's TTL and the tombstones expired
    assert after.count("<no such key; 0 entries in history>") == 3


@pytest.mark.slow  # 46 s of subprocess JVM (CI's 25 minutes); preserveExpiry is tested in-suite (test_sink_batch, test_copy_round_trip)
def test_copy_preserving_expiry_keeps_absolute_expiry():
    out = _run_example("copy_preserving_expiry.py", "--delay", "2").stdout
    found = re.search(r"(\d+) messages copied; .* at most ([\d.]+)s", out)
    assert found and found.group(1) == "4"
    assert "EARLY" not in out  # no copy expires before its original (the example exits 1 otherwise)


@pytest.mark.slow  # 38 s of subprocess JVM (CI's 25 minutes); sequence-range reads are tested in-suite (test_source)
def test_batch_replay_writes_the_sequence_range_to_parquet(tmp_path):
    out = _run_example("batch_replay.py", "--out", str(tmp_path / "replay")).stdout
    assert "sequences 501..1500" in out and "1000 rows (1000 distinct sequences)" in out
    table = pq.read_table(tmp_path / "replay")
    seqs = sorted(table.column("seq").to_pylist())
    assert seqs == list(range(501, 1501))
    assert json.loads(table.column("data")[0].as_py())["id"] >= 0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accepts(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_spark_connect_example_against_a_server_started_as_its_docstring_says(tmp_path):
    """The example's docstring (and the README) tell how to start a Connect server: pip PySpark's
    sbin/start-connect-server.sh, in the background, stopped by sbin/stop-connect-server.sh. Done
    here exactly so (pid and log files in tmp_path), then the example runs against it over sc://."""
    import pyspark

    sbin = Path(pyspark.__file__).parent / "sbin"
    for attempt in range(3):
        # A free port can be taken by a parallel test's server before the Connect server binds it: then
        # the server exits (BindException) while the other one answers on the port. Only the server's
        # own line "Spark Connect server started at" says it listens; a lost race tries another port.
        port = _free_port()
        logs_dir = tmp_path / f"attempt{attempt}"
        env = {**_clean_env(), "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
               "SPARK_PID_DIR": str(logs_dir), "SPARK_LOG_DIR": str(logs_dir)}
        started = subprocess.run([str(sbin / "start-connect-server.sh"), "--master", "local[2]", "--conf",
                                  f"spark.connect.grpc.binding.port={port}", "--conf", "spark.ui.enabled=false"],
                                 env=env, capture_output=True, text=True, timeout=120)
        assert started.returncode == 0, started.stdout + started.stderr
        [pid_file] = logs_dir.glob("*SparkConnectServer*.pid")
        pid = int(pid_file.read_text())

        def logs(directory: Path = logs_dir) -> str:
            return "".join(p.read_text() for p in directory.glob("*.out"))

        wait_until(lambda pid=pid: "Spark Connect server started at" in logs() or not Path(f"/proc/{pid}").exists(),
                   timeout=240, what="the Connect server listens")
        if "Spark Connect server started at" in logs() or "BindException" not in logs():
            break
    try:
        assert "Spark Connect server started at" in logs() and _accepts(port), logs()[-3000:]
        out = _run_example("spark_connect.py", "--remote", f"sc://127.0.0.1:{port}").stdout
    finally:
        subprocess.run([str(sbin / "stop-connect-server.sh")], env=env, capture_output=True, timeout=120)
        try:
            wait_until(lambda: not Path(f"/proc/{pid}").exists(), timeout=60, what="the Connect server stops")
        finally:
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)
    assert f"Spark Connect session to sc://127.0.0.1:{port}" in out and "pyspark.sql.connect" in out
    reads = re.findall(r"read back: seq (\d) corders\.c(\d) \{\"id\": (\d)\} ttl=(1h|None)", out)
    assert [(int(s), int(c), int(i), t) for s, c, i, t in reads] == [
        (i + 1, i % 3, i, "1h" if i % 2 else "None") for i in range(6)], out
    assert "Streaming copy: 6 messages in CONNECT_ORDERS_COPY after 2 micro-batches" in out


def test_enrich_readings_joins_every_reading_with_its_device_through_spark_connect():
    """Issue #55: the lookup join from a Spark Connect session (an in-process Connect server): every reading
    enriched, the unknown device's row kept with nulls, the moved device seen at its new site from the move
    on, and a lookup pinned to the sequence before the move reading the old site."""
    out = _run_example("enrich_readings.py", "--remote", "local[2]", timeout=400).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result == {"enriched": 1000, "unknown": 1, "moved": 20, "site_then": "site-3", "batches": 3}, out[-2000:]
