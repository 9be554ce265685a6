"""Secrets never appear in what Spark and the connector show or store: the extended
plans, the Spark UI's SQL plan text (REST API), the logs at DEBUG (Spark's JVM and the
connector's Python processes), the checkpoint, or progress reports. One job per kind of
secret: a password, a token, and an NKey seed (given as a file, read by the connector)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyspark_jetstream.server import EmbeddedNatsServer

from ..helpers import SyncNats, fill_stream, user_nkey_seed_file

JOB = Path(__file__).parent / "jobs" / "secrets_job.py"
PASSWORD = "pw-9f3Kq-never-print-me"
TOKEN = "tok-7Rz2-never-print-me"


def _password(tmp_path: Path):
    config = f'authorization {{ users = [ {{ user: "alice", password: "{PASSWORD}" }} ] }}'
    return PASSWORD, config, {"user": "alice", "password": PASSWORD}, {"user": "alice", "password": PASSWORD}


def _token(tmp_path: Path):
    config = f'authorization {{ token: "{TOKEN}" }}'
    return TOKEN, config, {"token": TOKEN}, {"token": TOKEN}


def _nkey_seed(tmp_path: Path):
    seed, public, seed_file = user_nkey_seed_file(tmp_path)
    config = f'authorization {{ users = [ {{ nkey: "{public}" }} ] }}'
    return seed.decode(), config, {"nkeySeedFile": seed_file}, {"nkeys_seed": seed_file}


@pytest.mark.parametrize("auth", [_password, _token, _nkey_seed], ids=["password", "token", "nkey-seed"])
def test_secret_absent_from_ui_plans_logs_and_checkpoint(tmp_path, auth):
    secret, config, options, client_auth = auth(tmp_path)
    with EmbeddedNatsServer(config=config) as server:
        client = SyncNats(server.url, **client_auth)
        client.add_stream("SECSRC", ["secsrc.>"])
        client.add_stream("SECDST", ["secdst.>"])
        asyncio.run(fill_stream(server.url, "secsrc.x", 500, **client_auth))
        checkpoint, out_dir = tmp_path / "chk", tmp_path / "out"
        env = {**os.environ, "PYSPARK_JETSTREAM_LOG_LEVEL": "DEBUG"}
        done = subprocess.run(
            [sys.executable, str(JOB), server.url, json.dumps(options), "SECSRC", "SECDST", str(checkpoint),
             str(out_dir)],
            capture_output=True, text=True, timeout=600, env=env,
        )
        assert done.returncode == 0, done.stderr[-3000:]
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
        assert secret not in text, f"the secret leaked into the {where}"
    for name, data in checkpoint_text.items():
        assert secret.encode() not in data, f"the secret leaked into {name}"
