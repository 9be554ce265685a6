"""Test helpers: a synchronous NATS client for assertions, and condition waits."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import nats

from pyspark_jetstream.protocol.headers import parse_headers


def wait_until(condition: Callable[[], Any], *, timeout: float = 30.0, interval: float = 0.05, what: str = "") -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {what or condition}")
        time.sleep(interval)


@dataclass
class StoredMessage:
    subject: str
    seq: int
    data: bytes
    headers: dict[str, list[str]]
    time: str


class SyncNats:
    """A real nats-py connection driven from synchronous test code."""

    def __init__(self, url: str, **connect_kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.nc = self.run(nats.connect(url.split(","), **connect_kwargs))
        self.js = self.nc.jetstream()

    def run(self, coro: Any, timeout: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def api(self, subject: str, body: dict | None = None, timeout: float = 10) -> dict:
        payload = json.dumps(body).encode() if body is not None else b""
        msg = self.run(self.nc.request(f"$JS.API.{subject}", payload, timeout=timeout))
        return json.loads(msg.data)

    def add_stream(self, name: str, subjects: list[str], **config: Any) -> dict:
        """Create a stream; while a cluster's JetStream says it is temporarily unavailable (10008: its meta
        group catching up after a node came back), ask again, for at most 30 s."""
        body = {"name": name, "subjects": subjects, "storage": "memory", **config}

        def created() -> dict | None:
            reply = self.api(f"STREAM.CREATE.{name}", body)
            return None if (reply.get("error") or {}).get("err_code") == 10008 else reply

        reply = wait_until(created, timeout=30, interval=0.2, what=f"JetStream to take the creation of stream {name}")
        assert "error" not in reply, reply
        return reply["config"]

    def stream_config(self, name: str) -> dict:
        return self.api(f"STREAM.INFO.{name}")["config"]

    def stream_state(self, name: str) -> dict:
        return self.api(f"STREAM.INFO.{name}")["state"]

    def stored_count(self, name: str) -> int:
        """The stream's message count, or -1 while it cannot be asked (this client reconnecting,
        a clustered stream between leaders): for waits across faults."""
        try:
            return self.api(f"STREAM.INFO.{name}").get("state", {}).get("messages", -1)
        except Exception:
            return -1

    def messages(self, stream: str) -> list[StoredMessage]:
        """Every message the stream holds now, in sequence order (STREAM.MSG.GET by next seq)."""
        out: list[StoredMessage] = []
        seq = 1
        while True:
            reply = self.api(f"STREAM.MSG.GET.{stream}", {"seq": seq, "next_by_subj": ">"})
            if "error" in reply:
                assert reply["error"]["err_code"] == 10037, reply
                return out
            m = reply["message"]
            headers = parse_headers(base64.b64decode(m["hdrs"])) if m.get("hdrs") else {}
            out.append(StoredMessage(m["subject"], m["seq"], base64.b64decode(m.get("data") or b""), headers, m["time"]))
            seq = m["seq"] + 1

    def subjects_and_data(self, stream: str, batch: int = 20_000) -> list[tuple[str, bytes]]:
        """Every message of a large stream, in sequence order, through one AckNone pull consumer
        (:meth:`messages` asks once per message: minutes for 100,000)."""
        import json as _json

        async def go() -> list[tuple[str, bytes]]:
            info = await self.nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=10)
            total = _json.loads(info.data)["state"]["messages"]
            name = f"all{id(self)}{int(time.monotonic() * 1000)}"
            await self.nc.request(f"$JS.API.CONSUMER.CREATE.{stream}.{name}", _json.dumps({
                "stream_name": stream, "config": {"name": name, "ack_policy": "none", "deliver_policy": "all",
                                                  "mem_storage": True, "num_replicas": 1}}).encode(), timeout=10)
            sub = await self.nc.subscribe(self.nc.new_inbox())
            out: list[tuple[str, bytes]] = []
            try:
                while len(out) < total:
                    want = min(batch, total - len(out))
                    await self.nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{name}",
                                          _json.dumps({"batch": want, "expires": 10 * 10**9}).encode(), reply=sub.subject)
                    while want:
                        msg = await sub.next_msg(timeout=15)
                        if not msg.reply:
                            break  # a status: ask again
                        out.append((msg.subject, msg.data))
                        want -= 1
            finally:
                await sub.unsubscribe()
                await self.nc.request(f"$JS.API.CONSUMER.DELETE.{stream}.{name}", b"", timeout=10)
            return out

        return self.run(go(), timeout=300)

    def publish_raw(self, subject: str | bytes, headers: bytes | None, data: bytes, timeout: float = 5.0) -> dict:
        """Publish with an exact header block (and subject bytes) and return the PubAck JSON."""

        async def go() -> dict:
            inbox = self.nc.new_inbox()
            fut: asyncio.Future = asyncio.get_running_loop().create_future()

            async def cb(msg: Any) -> None:
                if not fut.done():
                    fut.set_result(msg)

            sub = await self.nc.subscribe(inbox, cb=cb)
            subj = subject if isinstance(subject, bytes) else subject.encode()
            if headers is None:
                cmd = b"PUB " + subj + f" {inbox} {len(data)}\r\n".encode() + data + b"\r\n"
            else:
                cmd = b"HPUB " + subj + f" {inbox} {len(headers)} {len(headers) + len(data)}\r\n".encode() \
                    + headers + data + b"\r\n"
            await self.nc._send_command(cmd)
            await self.nc._flush_pending()
            try:
                msg = await asyncio.wait_for(fut, timeout)
            finally:
                await sub.unsubscribe()
            return json.loads(msg.data)

        return self.run(go())

    def close(self) -> None:
        self.run(self.nc.close())
        self._loop.call_soon_threadsafe(self._loop.stop)


FILL_WINDOW = 2000


async def fill_stream(url: str, subject: str, count: int, **connect_kwargs: Any) -> None:
    """Publish ``count`` small messages fast (pipelined, at most ``FILL_WINDOW`` PubAcks outstanding, every
    one checked); a ``subject`` with ``{}`` names the i-th message's subject (``subject.format(i)``). The
    window keeps a busy server's stream ingest queue short: nats-server 2.12+ answers a publish past its
    limit with 429/10167 "too many requests" (seen with 20,000 unbounded on a loaded machine)."""
    import nats

    nc = await nats.connect(url.split(","), **connect_kwargs)
    inbox = nc.new_inbox()
    done, room, acked, errors = asyncio.Event(), asyncio.Event(), [0], []

    async def on_ack(msg):
        if b'"error"' in msg.data:
            errors.append(msg.data)
        acked[0] += 1
        room.set()
        if acked[0] == count:
            done.set()

    await nc.subscribe(inbox + ".*", cb=on_ack)
    for i in range(count):
        while i - acked[0] >= FILL_WINDOW:
            room.clear()
            await asyncio.wait_for(room.wait(), 60)
        await nc.publish(subject.format(i) if "{}" in subject else subject, b"p" * 100, reply=f"{inbox}.{i}")
    await asyncio.wait_for(done.wait(), 60)
    await nc.close()
    assert not errors, errors[:3]


def gate_at_first_batch(reached: str, release: str, timeout: float = 120.0):
    """A ``mapInArrow`` function that holds the pipeline at its first batch.

    It marks ``reached`` and waits (a barrier with a deadline) until ``release``
    exists, so a test can inject a fault while a partition is mid-read. Returned
    as a closure so that Spark ships it to its workers by value.
    """

    def gate(batches):
        import os as _os
        import time as _time

        from pyspark import TaskContext

        first = True
        for batch in batches:
            if first:
                open(reached, "w").close()
                open(f"{reached}-{TaskContext.get().partitionId()}", "w").close()
                deadline = _time.monotonic() + timeout
                while not _os.path.exists(release) and _time.monotonic() < deadline:
                    _time.sleep(0.05)
                first = False
            yield batch

    return gate


class HeldRead:
    """A batch read of stream sequences on a background thread, held at its first
    Arrow batch (a partition mid-read) until the test has injected its fault."""

    def __init__(self, df: Any, workdir: Any, tasks: int = 1) -> None:
        """Hold until ``tasks`` partitions (0 .. tasks-1) have reached their first batch."""
        self._reached, self._release = str(workdir / "held-reached"), str(workdir / "held-release")
        gated = df.mapInArrow(gate_at_first_batch(self._reached, self._release), df.schema).select("seq")
        self._outcome: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._collect, args=(gated,), daemon=True)
        self._thread.start()
        wait_until(lambda: all(os.path.exists(f"{self._reached}-{t}") for t in range(tasks))
                   or not self._thread.is_alive(), timeout=120, what=f"{tasks} partition(s) reached their first batch")
        assert self._thread.is_alive(), self._outcome.get("error")

    def _collect(self, gated: Any) -> None:
        try:
            self._outcome["seqs"] = [row.seq for row in gated.collect()]
        except Exception as exc:  # handed to the test by seqs() / error()
            self._outcome["error"] = exc

    def let_go(self) -> None:
        open(self._release, "w").close()

    def _join(self, timeout: float) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the read did not end within {timeout}s"

    def seqs(self, timeout: float = 300) -> list[int]:
        """The sequences read, sorted; the read's own exception if it failed."""
        self._join(timeout)
        if "error" in self._outcome:
            raise self._outcome["error"]
        return sorted(self._outcome["seqs"])

    def error(self, timeout: float = 300) -> BaseException:
        self._join(timeout)
        assert "error" in self._outcome, "the read should have failed"
        return self._outcome["error"]


def write_json_inputs(directory: Any, files: int, rows_per_file: int) -> None:
    """JSON files of ``{"id", "data"}`` rows for file-source streaming tests.

    Files become micro-batches in modification-time order, so the times are set explicitly.
    """
    import os

    os.makedirs(directory, exist_ok=True)
    for f in range(files):
        path = os.path.join(directory, f"part-{f:03d}.json")
        with open(path, "w") as out:
            for r in range(rows_per_file):
                i = f * rows_per_file + r
                out.write(json.dumps({"id": i, "data": f"row-{i}"}) + "\n")
        os.utime(path, (1_700_000_000 + f * 10, 1_700_000_000 + f * 10))


def gate_at_sequence(seq: int, reached: str, release: str, timeout: float = 120.0):
    """A ``mapInArrow`` function (over the source schema) that holds its partition
    when the batch holding stream sequence ``seq`` arrives, until ``release`` exists.

    Streaming queries run the function in every micro-batch, so the gate keys on a
    sequence rather than on "the first batch"; it opens once and stays open.
    """

    def gate(batches):
        import os as _os
        import time as _time

        import pyarrow.compute as _pc

        for batch in batches:
            if not _os.path.exists(release) and _pc.any(_pc.equal(batch.column("seq"), seq)).as_py():
                open(reached, "w").close()
                deadline = _time.monotonic() + timeout
                while not _os.path.exists(release) and _time.monotonic() < deadline:
                    _time.sleep(0.05)
            yield batch

    return gate


def processes_connected_to(port: int) -> list[int]:
    """PIDs of this user's processes holding a TCP connection to 127.0.0.1:``port``.

    Read from /proc (Linux): the socket inodes whose remote port is ``port`` in
    /proc/net/tcp, then the processes with a file descriptor on one of them.
    """
    import os

    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                    if remote_port == port and fields[3] == "01":  # ESTABLISHED
                        inodes.add(fields[9])
        except FileNotFoundError:
            continue
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                pids.append(int(pid))
                break
    return pids


def child_processes(parent: int, needle: str) -> list[int]:
    """Descendants of ``parent`` whose command line contains ``needle`` (from /proc)."""
    import os

    children: dict[int, list[int]] = {}
    cmdlines: dict[int, str] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdlines[int(pid)] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(pid))
    found, todo = [], [parent]
    while todo:
        for child in children.get(todo.pop(), []):
            todo.append(child)
            if needle in cmdlines.get(child, ""):
                found.append(child)
    return found


PYTHON_START_TIMEOUT = "120s"
"""How long Spark waits for a Python process it started to answer (default 15s). On 2 cores running
a Spark cluster, a NATS cluster and the tests, a new Python worker has taken longer to import and
answer, failing the query with "Python worker failed to connect back" before it began."""


def spark_submit_command(master: str, executor_python: str | None = None) -> list[str]:
    """``spark-submit`` of the installed PySpark with the project's spark-conf/; the driver
    runs this interpreter, the executors ``executor_python`` (default: this one too)."""
    import shutil
    import sys
    from pathlib import Path

    import pyspark

    root = Path(__file__).resolve().parents[1]
    submit = shutil.which("spark-submit", path=str(Path(sys.executable).parent)) or str(
        Path(pyspark.__file__).parent / "bin" / "spark-submit")
    return [submit, "--master", master, "--properties-file", str(root / "spark-conf" / "spark-defaults.conf"),
            "--conf", f"spark.pyspark.python={executor_python or sys.executable}",
            "--conf", f"spark.pyspark.driver.python={sys.executable}",
            "--conf", f"spark.python.authenticate.socketTimeout={PYTHON_START_TIMEOUT}"]


def server_time(text: str) -> dt.datetime:
    """A time as the server writes it (RFC 3339 in UTC, 0 to 9 fraction digits: ``...:32.66506Z``)
    as an aware datetime. ``fromisoformat`` on a fixed-width slice broke on a fraction whose
    trailing zero the server drops."""
    found = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z", text)
    assert found, f"not a server time: {text!r}"
    whole = dt.datetime.fromisoformat(found.group(1)).replace(tzinfo=dt.timezone.utc)
    return whole + dt.timedelta(microseconds=int((found.group(2) or "0")[:6].ljust(6, "0")))


def worker_log(spark: Any, logger: str) -> list[str]:
    """Messages Spark's Python workers logged to ``logger`` (captured only while the test's
    ``worker_logging`` fixture has turned ``spark.sql.pyspark.worker.logging.enabled`` on)."""
    assert spark.conf.get("spark.sql.pyspark.worker.logging.enabled") == "true", \
        "the test must request the worker_logging fixture to read workers' logs"
    rows = spark.tvf.python_worker_logs().where(f"logger = '{logger}'").select("msg").collect()
    return [row.msg for row in rows]


def forget_last_commit(checkpoint: Any) -> int:
    """What a driver crash between the sink's write and Spark's commit leaves behind: the last commit
    file of a streaming checkpoint removed; returns that batch id (Spark replays it on restart)."""
    commits = sorted(int(n) for n in os.listdir(checkpoint / "commits") if n.isdigit())
    os.remove(checkpoint / "commits" / str(commits[-1]))
    crc = checkpoint / "commits" / f".{commits[-1]}.crc"
    if crc.exists():
        os.remove(crc)
    return commits[-1]


def finished(query: Any, timeout: float = 180.0) -> Any:
    """Wait for a query that must end by itself (an ``availableNow`` trigger): fail the test when it
    did not end in time (``awaitTermination`` returns False then) or ended with an error."""
    assert query.awaitTermination(timeout), f"the query did not finish within {timeout}s"
    assert query.exception() is None, query.exception()
    return query


def jetstream_writer(df: Any, url: str, **options: str) -> Any:
    """``df.write.format("jetstream")`` in append mode against ``url``; ``a__b`` names option ``a.b``."""
    w = df.write.format("jetstream").mode("append").option("servers", url)
    for key, value in options.items():
        w = w.option(key.replace("__", "."), value)
    return w


def write(df: Any, server: Any, **options: str) -> None:
    """A batch write to the embedded ``server`` (options as for :func:`jetstream_writer`)."""
    jetstream_writer(df, server.url, **options).save()


def publish(client: SyncNats, subject: str, count: int, start: int = 0, headers: bytes | None = None) -> None:
    """``count`` messages ``m<start>`` .. with an exact header block, one PubAck checked each;
    ``subject`` may hold ``{i}`` for the message's number."""
    for i in range(start, start + count):
        ack = client.publish_raw(subject.format(i=i) if "{" in subject else subject, headers, f"m{i}".encode())
        assert "error" not in ack, ack


def user_nkey_seed_file(directory: Any) -> tuple[bytes, str, str]:
    """A new NKey user: (seed, public key, path of a seed file in ``directory``)."""
    import nkeys

    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    path = os.path.join(str(directory), f"user-{os.urandom(4).hex()}.nk")
    with open(path, "wb") as f:
        f.write(seed)
    return seed, nkeys.from_seed(seed).public_key.decode(), path


def readme_python_block(first_line: str) -> str:
    """The README's Python code block whose first line is ``first_line``, exactly as a reader copies it."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = [block.split("```", 1)[0] for block in text.split("```python\n")[1:]]
    [block] = [b for b in blocks if b.startswith(first_line + "\n")]
    return block


def run_script(python: str, script: Any, *args: str, env: dict[str, str] | None = None, timeout: float = 300,
               cwd: Any = None) -> str:
    """Run ``script`` with ``python`` as a user would (its own process, the given environment on top of
    this one, minus ``PYSPARK_PYTHON``: the script chooses its workers' Python); fail with its output
    when it exits non-zero or does not end within ``timeout``; return stdout."""
    import subprocess

    environment = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    environment.update(env or {})
    done = subprocess.run([python, str(script), *args], env=environment, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)
    assert done.returncode == 0, f"exit {done.returncode}\n--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-6000:]}"
    return done.stdout


# nats-py's own KeyValue API, the second client the KV tests compare with.

def kv_of(client: SyncNats, bucket: str) -> Any:
    return client.run(client.js.key_value(bucket))


def new_bucket(client: SyncNats, name: str, **config: Any) -> Any:
    """nats-py's ``create_key_value``, and, for a replicated bucket, its leader: a new R3 stream answers
    publishes only once it has elected one ("no response from stream" before, under load)."""
    kv = client.run(client.js.create_key_value(bucket=name, **config))
    if config.get("replicas", 1) > 1:
        wait_until(lambda: (client.api(f"STREAM.INFO.KV_{name}").get("cluster") or {}).get("leader"), timeout=30,
                   what=f"a leader of KV_{name}")
    return kv


def _settled(ask: Callable[[], Any], deadline: float = 10.0) -> Any:
    """nats-py's answer once two in a row agree. nats-py 2.16's KV watcher, under ``keys()`` and
    ``history()``, can end its initial replay before deliveries already on their way and answer
    fewer entries or none (nats-io/nats.py#842); asking again gives the bucket's real state."""
    answer = ask()
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        again = ask()
        if again == answer:
            return answer
        answer = again
    return answer


def kv_keys(client: SyncNats, kv: Any) -> list[str]:
    """``kv.keys()``, sorted; [] when nats-py finds none."""
    import nats.js.errors

    def ask() -> list[str]:
        try:
            return sorted(client.run(kv.keys()))
        except nats.js.errors.NoKeysError:
            return []

    return _settled(ask)


def history(client: SyncNats, kv: Any, key: str) -> list[tuple[str, bytes]]:
    """``kv.history(key)`` as (operation, value) pairs; [] when the key has no trace."""
    import nats.js.errors

    def ask() -> list[tuple[str, bytes]]:
        try:
            return [(e.operation or "PUT", e.value) for e in client.run(kv.history(key))]
        except nats.js.errors.NoKeysError:
            return []

    return _settled(ask)


def latest(client: SyncNats, kv: Any, key: str) -> Any:
    """What ``kv.get`` says: the value, or the operation that removed the key, or 'missing'."""
    import nats.js.errors

    try:
        return client.run(kv.get(key)).value
    except nats.js.errors.KeyNotFoundError as exc:
        return exc.op or "missing"


def read_limit(rows: int) -> dict[str, str]:
    """``maxMessagesPerTrigger=rows`` where this PySpark lets a Python source limit its micro-batches
    (4.2+); nothing on 4.0 and 4.1, which refuse it (a test then reads everything in one batch)."""
    from pyspark_jetstream.spark_api import ADMISSION_CONTROL

    return {"maxMessagesPerTrigger": str(rows)} if ADMISSION_CONTROL else {}

