"""The Spark Declarative Pipeline example (examples/pipeline) run as its README runs it:
``spark-pipelines run`` from the project directory with ``SPARK_CONF_DIR=conf``, twice, with new
readings published in between. The project is copied to a temporary directory, with its state
(checkpoints, Derby catalog, warehouse) and its streams moved to this test's."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ..helpers import run_script, wait_until

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "examples" / "pipeline"
STATE = "/tmp/pyspark-jetstream/sensor-alerts"  # where the example keeps its state
THRESHOLD = 90.0  # the spec's spark.sensor_alerts.threshold


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path.name} no longer holds {old!r}"
    path.write_text(text.replace(old, new))


def _project(tmp_path: Path, source: str, alerts: str) -> Path:
    project = tmp_path / "pipeline"
    shutil.copytree(PROJECT, project, ignore=shutil.ignore_patterns(
        "__pycache__", "spark-warehouse", "metastore_db", "derby.log", "pipeline-storage"))
    state = str(tmp_path / "state")
    _edit(project / "spark-pipeline.yml", STATE, state)
    _edit(project / "conf" / "spark-defaults.conf", STATE, state)
    _edit(project / "spark-pipeline.yml", "spark.sensor_alerts.sourceStream: SENSORS",
          f"spark.sensor_alerts.sourceStream: {source}")
    _edit(project / "spark-pipeline.yml", "spark.sensor_alerts.alertStream: ALERTS",
          f"spark.sensor_alerts.alertStream: {alerts}")
    with open(project / "conf" / "spark-defaults.conf", "a") as conf:
        conf.write("\nspark.ui.enabled false\n")  # the test's only addition: no UI port to bind
    return project


CONNECT_PORT = 15002
"""The port of the Spark Connect server that ``spark-pipelines`` starts in local mode (fixed: the client
connects to ``sc://localhost`` and its default port). A second one on the machine cannot bind it."""


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _run_pipeline(project: Path, servers: str, timeout: float = 480) -> str:
    """``spark-pipelines run`` of this venv in ``project``; its output (stdout and stderr). The run
    starts JVMs and Python processes of its own: on a timeout, its whole process group is killed.
    A run that finds the Connect port taken (another run on this machine) fails before anything
    runs: then it waits for the port and starts again."""
    env = {**os.environ, "NATS_URL": servers, "SPARK_CONF_DIR": "conf",
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    command = [str(Path(sys.executable).parent / "spark-pipelines"), "run"]
    for _ in range(3):
        wait_until(lambda: not _port_taken(CONNECT_PORT), timeout=300, interval=1,
                   what=f"port {CONNECT_PORT} free for the pipeline's Connect server")
        run = subprocess.Popen(command, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
        try:
            out, _ = run.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            out, _ = run.communicate()
            raise AssertionError(f"spark-pipelines run did not end within {timeout}s\n{out[-6000:]}") from None
        if run.returncode == 0 or f"Failed to bind to address 0.0.0.0/0.0.0.0:{CONNECT_PORT}" not in out:
            break
    assert run.returncode == 0, f"spark-pipelines run: exit {run.returncode}\n{out[-8000:]}"
    assert "Run is COMPLETED." in out, out[-8000:]
    return out


def _readings(nats_client, source: str) -> list[tuple[int, dict]]:
    """(sequence, reading) of every message the source stream holds."""
    return [(m.seq, json.loads(m.data)) for m in nats_client.messages(source)]


def _expected_alerts(readings: list[tuple[int, dict]], alerts: str) -> dict[int, tuple[str, dict]]:
    """reading number -> (subject, data) of the alert the pipeline must publish for it."""
    return {r["reading"]: (f"{alerts.lower()}.{r['sensor']}", {**r, "source_seq": seq})
            for seq, r in readings if r["temp"] >= THRESHOLD}


def _check_alerts(nats_client, alerts: str, expected: dict[int, tuple[str, dict]], source: str,
                  batches: dict[int, int]) -> None:
    """The alert stream holds exactly ``expected``; ``batches``: reading number -> the sink's batch id."""
    stored = nats_client.messages(alerts)
    got: dict[int, tuple[str, dict]] = {}
    for m in stored:
        data = json.loads(m.data)
        assert data["reading"] not in got, f"reading {data['reading']} alerted twice: {got[data['reading']]}, {data}"
        got[data["reading"]] = (m.subject, data)
    assert len(stored) == len(expected), f"{len(stored)} alerts stored, {len(expected)} expected"
    assert sorted(got) == sorted(expected)
    for number, (subject, data) in expected.items():
        assert got[number][0] == subject, (number, got[number])
        assert set(got[number][1]) == {"sensor", "reading", "temp", "source_seq"}, got[number]
        for field in ("sensor", "reading", "temp", "source_seq"):
            assert got[number][1][field] == data[field], (number, field, got[number][1], data)
    # Each sensor's alerts in reading order (one write task per subject, rows in source order).
    for subject in {s for s, _ in expected.values()}:
        order = [json.loads(m.data)["source_seq"] for m in stored if m.subject == subject]
        assert order == sorted(order), (subject, order)
    # Every alert carries the sink's id <queryId>:<batchId>:<stream>.<seq>:<digest>, all distinct, all of
    # one query: the flow's query id is kept in its checkpoint, so it survives the runs.
    ids = {json.loads(m.data)["reading"]: m.headers["Nats-Msg-Id"][0] for m in stored}
    assert len(set(ids.values())) == len(ids)
    assert len({i.split(":")[0] for i in ids.values()}) == 1, sorted(ids.values())[:3]
    for number, (_, data) in expected.items():
        assert ids[number].split(":")[1] == str(batches[number]), (number, ids[number])
        assert ids[number].split(":")[2] == f"{source}.{data['source_seq']}", (number, ids[number])


def _check_tables(state: Path, readings: list[tuple[int, dict]]) -> None:
    """The streaming table holds each reading once; the materialized view the per-sensor totals."""
    table = pq.read_table(state / "spark-warehouse" / "readings").to_pylist()
    assert sorted((r["seq"], r["reading"]) for r in table) == sorted((seq, r["reading"]) for seq, r in readings)
    expected: dict[str, dict] = {}
    for _, r in readings:
        s = expected.setdefault(r["sensor"], {"sensor": r["sensor"], "readings": 0, "max_temp": 0.0, "alerts": 0})
        s["readings"] += 1
        s["max_temp"] = max(s["max_temp"], r["temp"])
        s["alerts"] += r["temp"] >= THRESHOLD
    view = pq.read_table(state / "spark-warehouse" / "sensor_stats").to_pylist()
    assert sorted(view, key=lambda row: row["sensor"]) == sorted(expected.values(), key=lambda row: row["sensor"])


def _committed(batch: int, published: int, out: str) -> bool:
    """The sink's commit line for a batch; the alerts stream is created with ensureStream=create, so on
    nats-server 2.14.3+ it takes fast-ingest batches and the line names them."""
    return re.search(rf"batch {batch} committed: {published} published, 0 duplicates", out) is not None


# Two runs of the pipeline, each with a Spark Connect server of its own (80 to 160 s of both cores): run on request
# (-m slow) with the soaks and the Spark Connect round trip (CI time); CI runs the other examples.
@pytest.mark.slow
def test_pipeline_runs_twice_and_publishes_each_alert_once(nats_server, nats_client, stream_name, tmp_path):
    source, alerts = f"{stream_name}S", f"{stream_name}A"
    project = _project(tmp_path, source, alerts)
    publish = project / "publish_readings.py"
    env = {"NATS_URL": nats_server.url}

    run_script(sys.executable, publish, "--stream", source, "--count", "200", env=env, timeout=60)
    first = _readings(nats_client, source)
    assert len(first) == 200
    out = _run_pipeline(project, nats_server.url)
    expected = _expected_alerts(first, alerts)
    assert len(expected) == 50  # a quarter of the readings reach 90
    batches = dict.fromkeys(expected, 0)
    _check_alerts(nats_client, alerts, expected, source, batches)
    _check_tables(tmp_path / "state", first)
    assert _committed(0, 50, out), out[-4000:]

    # New readings, and a second run from the same checkpoints and catalog: only the new ones.
    run_script(sys.executable, publish, "--stream", source, "--first", "200", "--count", "100", env=env, timeout=60)
    both = _readings(nats_client, source)
    assert len(both) == 300
    out = _run_pipeline(project, nats_server.url)
    expected = _expected_alerts(both, alerts)
    assert len(expected) == 75
    batches = {number: batches.get(number, 1) for number in expected}  # the new ones: batch 1
    _check_alerts(nats_client, alerts, expected, source, batches)
    _check_tables(tmp_path / "state", both)
    assert _committed(1, 25, out), out[-4000:]
    assert "batch 0 committed" not in out  # the sink's flow went on from its checkpoint
