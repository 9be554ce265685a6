"""The password never appears in what Spark and the connector show or store: the
extended plans, the Spark UI's SQL plan text (REST API), the logs at DEBUG (Spark's
JVM and the connector's Python processes), the checkpoint, or progress reports."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from pyspark_jetstream.server import EmbeddedNatsServer

from ..helpers import SyncNats, fill_stream

JOB = Path(__file__).parent / "jobs" / "secrets_job.py"
PASSWORD = "pw-9f3Kq-never-print-me"


def test_password_absent_from_ui_plans_logs_and_checkpoint(tmp_path):
    config = f'authorization {{ users = [ {{ user: "alice", password: "{PASSWORD}" }} ] }}'
    with EmbeddedNatsServer(config=config) as server:
        client = SyncNats(server.url, user="alice", password=PASSWORD)
        client.add_stream("SECSRC", ["secsrc.>"])
        client.add_stream("SECDST", ["secdst.>"])
        client.close()
        asyncio.run(fill_stream(f"nats://alice:{PASSWORD}@127.0.0.1:{server.port}", "secsrc.x", 500))
        checkpoint, out_dir = tmp_path / "chk", tmp_path / "out"
        env = {**os.environ, "PYSPARK_JETSTREAM_LOG_LEVEL": "DEBUG"}
        done = subprocess.run(
            [sys.executable, str(JOB), server.url, PASSWORD, "SECSRC", "SECDST", str(checkpoint), str(out_dir)],
            capture_output=True, text=True, timeout=600, env=env,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        client = SyncNats(server.url, user="alice", password=PASSWORD)
        assert client.stream_state("SECDST")["messages"] == 1000  # the job really ran both queries
        client.close()

    logs = done.stdout + done.stderr
    explain = (out_dir / "explain.txt").read_text()
    ui = (out_dir / "ui.json").read_text()
    checkpoint_text = {str(p): p.read_bytes() for p in checkpoint.rglob("*") if p.is_file()}

    # What was searched is real: DEBUG logs of Spark and the connector, the plans of
    # the jetstream relations, the UI's SQL executions, the checkpoint's files.
    assert " DEBUG " in logs and "DEBUG pyspark_jetstream" in logs
    assert explain.count("jetstream") >= 2
    sql = json.loads(ui)["sql"]
    assert len(sql) >= 3 and any("jetstream" in (e.get("planDescription") or "") for e in sql)
    assert any(name.endswith("/offsets/0") for name in checkpoint_text)
    assert any(name.endswith("/metadata") for name in checkpoint_text)

    for where, text in [("logs", logs), ("explain", explain), ("Spark UI", ui)]:
        assert PASSWORD not in text, f"the password leaked into the {where}"
    for name, data in checkpoint_text.items():
        assert PASSWORD.encode() not in data, f"the password leaked into {name}"
