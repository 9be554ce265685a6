"""The embedded nats-server harness: start, restart on the same store, clear failures."""

import os
import subprocess
import sys

import pytest

from pyspark_jetstream.errors import ServerBinaryNotFound
from pyspark_jetstream.tools.server import EmbeddedNatsServer, find_nats_server_binary

from ..helpers import SyncNats


def test_restart_keeps_port_and_store():
    with EmbeddedNatsServer() as server:
        url, pid = server.url, server.pid
        client = SyncNats(url)
        client.add_stream("KEEP", ["keep.>"], storage="file")
        assert "error" not in client.publish_raw("keep.a", None, b"1")
        client.close()
        server.restart(kill=True)
        assert server.url == url and server.pid != pid
        client = SyncNats(url)
        assert client.stream_state("KEEP")["messages"] == 1
        client.close()
        store = server.store_dir
    assert not server.is_running()
    assert not store.exists()


def test_missing_binary_fails_clearly(monkeypatch, tmp_path):
    monkeypatch.setenv("NATS_SERVER_BIN", str(tmp_path / "nope"))
    with pytest.raises(ServerBinaryNotFound, match="NATS_SERVER_BIN"):
        find_nats_server_binary()


def test_bad_config_reports_the_server_error():
    with pytest.raises(Exception, match="exited with code"), EmbeddedNatsServer(config="this is { not valid"):
        pass


def test_import_is_cheap_and_side_effect_free():
    code = "import sys, pyspark_jetstream; print('nats' in sys.modules, 'pyarrow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ)
    assert out.stdout.split() == ["False", "False"]
