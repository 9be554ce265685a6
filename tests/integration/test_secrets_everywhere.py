"""Secrets never appear in what Spark and the connector show or store: the extended
plans, the Spark UI's SQL plan text (REST API), the logs at DEBUG (Spark's JVM and the
connector's Python processes), the checkpoint, or progress reports. One run per kind of
secret: a password, a token, and an NKey seed (given as a file, read by the connector).

The three runs share one Spark application (one JVM start instead of three): a password
user and an NKey user on one server, a token on another (a token excludes users). Every
secret is then searched for everywhere, the other runs' output included.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyspark_jetstream.tools.server import EmbeddedNatsServer

from ..helpers import SyncNats, fill_stream, user_nkey_seed_file

JOB = Path(__file__).parent / "jobs" / "secrets_job.py"
PASSWORD = "pw-9f3Kq-never-print-me"
TOKEN = "tok-7Rz2-never-print-me"


@pytest.fixture(scope="module")
def secrets_job(tmp_path_factory):
    """Run the job once for the three kinds: {kind: (secret, its run's out_dir, its checkpoint)}, and the logs."""
    tmp = tmp_path_factory.mktemp("secrets")
    seed, public, seed_file = user_nkey_seed_file(tmp)
    users = f'authorization {{ users = [ {{ user: "alice", password: "{PASSWORD}" }}, {{ nkey: "{public}" }} ] }}'
    kinds = {  # kind: (secret, server, connector options, nats-py options)
        "password": (PASSWORD, "users", {"user": "alice", "password": PASSWORD}, {"user": "alice",
                                                                                  "password": PASSWORD}),
        "nkey-seed": (seed.decode(), "users", {"nkeySeedFile": seed_file}, {"nkeys_seed": seed_file}),
        "token": (TOKEN, "token", {"token": TOKEN}, {"token": TOKEN}),
    }
    with EmbeddedNatsServer(config=users) as users_server, \
            EmbeddedNatsServer(config=f'authorization {{ token: "{TOKEN}" }}') as token_server:
        servers = {"users": users_server, "token": token_server}
        runs, clients = [], {}
        for kind, (_, where, options, client_auth) in kinds.items():
            source, target = f"SRC_{kind.replace('-', '_').upper()}", f"DST_{kind.replace('-', '_').upper()}"
            client = clients[kind] = SyncNats(servers[where].url, **client_auth)
            client.add_stream(source, [f"{source.lower()}.>"])
            client.add_stream(target, [f"{target.lower()}.>"])
            asyncio.run(fill_stream(servers[where].url, f"{source.lower()}.x", 500, **client_auth))
            runs.append({"servers": servers[where].url, "auth": options, "source": source, "target": target,
                         "checkpoint": str(tmp / kind / "chk"), "out_dir": str(tmp / kind / "out")})
        env = {**os.environ, "PYSPARK_JETSTREAM_LOG_LEVEL": "DEBUG"}
        done = subprocess.run([sys.executable, str(JOB), json.dumps(runs)], capture_output=True, text=True,
                              timeout=600, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        for kind, run in zip(kinds, runs, strict=True):  # each run really ran both queries
            assert clients[kind].stream_state(run["target"])["messages"] == 1000, kind
            clients[kind].close()
    return {kind: (kinds[kind][0], Path(run["out_dir"]), Path(run["checkpoint"])) for kind, run in zip(kinds, runs, strict=True)}, \
        done.stdout + done.stderr


@pytest.mark.parametrize("kind", ["password", "token", "nkey-seed"])
def test_secret_absent_from_ui_plans_logs_and_checkpoint(secrets_job, kind):
    runs, logs = secrets_job
    secret, out_dir, checkpoint = runs[kind]
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

    # This secret, in this run's output and in every other run's (they share the logs and the UI).
    for _, other_out, other_checkpoint in runs.values():
        texts = [("logs", logs), ("explain", (other_out / "explain.txt").read_text()),
                 ("Spark UI", (other_out / "ui.json").read_text())]
        for where, text in texts:
            assert secret not in text, f"the {kind} secret leaked into the {where}"
        for path in other_checkpoint.rglob("*"):
            if path.is_file():
                assert secret.encode() not in path.read_bytes(), f"the {kind} secret leaked into {path}"
