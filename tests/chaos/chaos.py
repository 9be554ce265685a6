"""Chaos soak: two streaming copies under a seeded random schedule of faults, then one checker.

    python tests/chaos/chaos.py                          # 30 minutes, a random seed (printed)
    python tests/chaos/chaos.py --minutes 3 --seed 42    # the same seed replays the same schedule

Two copies run at once in one Spark driver, each with 4 partitions on both sides
(``numPartitions=4``, the default sequence split, then ``.repartition(4, "subject")`` / ``"key"``
before the write, as docs/sink.md tells a copy to: each subject's rows reach one write task):

* stream -> stream: ``CH_SRC`` (50 subjects ``dev.<n>``, each message ``"<n> <counter>"`` with
  ``Nats-Msg-Id: dev.<n>.<counter>``, published by nats-py, one subject's next message only
  after the previous one's PubAck, so each subject's counters rise in the source) is copied to
  ``CH_DST`` (``copy.dev.<n>``);
* bucket -> bucket: ``CH_KV_SRC`` (history 64, 50 keys, puts and every tenth update a delete,
  by nats-py with message ids) is copied to ``CH_KV_DST`` with option ``bucket`` on both sides.

Both targets have a short duplicate window (``--dup-window``, 5 s), so most replays come later
than the window and only the sink's replay records (``SPARK_JETSTREAM_SINK``) keep them exactly-once.

The run has two phases (``--phases``), each with its own servers, streams, checkpoints and half
of ``--minutes``:

* ``single``: one nats-server (file store, default settings: each message is written to its
  block file before the PubAck, so a SIGKILL of the process loses nothing the page cache holds;
  a power loss could, which is not simulated; docs/guarantees.md, "What JetStream itself can lose").
  Faults: ``server_kill`` (SIGKILL, restart on the same store),
  ``server_stop`` (SIGSTOP for a few seconds, SIGCONT);
* ``cluster``: a 3-node cluster, every stream R3 (the sink's state bucket too). Faults:
  ``node_kill`` (one node SIGKILLed, restarted on its store after a few seconds), ``node_stop``
  (SIGSTOP/SIGCONT of one node), ``leader_stepdown`` (``$JS.API.STREAM.LEADER.STEPDOWN``),
  ``leader_kill`` (SIGKILL of the node leading a target, ``CH_DST`` or the target bucket, while
  the sink publishes into it; restarted after a few seconds);

and in both: ``worker_kill`` (SIGKILL of one of Spark's Python workers, a descendant of the
driver's JVM), ``driver_kill_short`` / ``driver_kill_long`` (SIGKILL of the driver's whole
process group; a standby driver, already started, takes over the same checkpoints 0-1 s later or
``dup-window`` + 2-6 s later), ``task_failure`` (a marker file read by a thin wrapper around the
connector's stream writer, format ``jetstream_chaos``: the first task to see it publishes half of
an Arrow batch, waits for the PubAcks, then raises; Spark retries the task, ``local[2,4]``).

The schedule (kinds, times, durations, victims) is drawn from ``random.Random(seed)`` before
anything starts and printed. At the end of each phase the faults and the publishers stop, the
copies catch up (``--catch-up`` deadline), the driver stops, and nats-py (not the connector)
reads both sides: every source message exactly once in the target, each subject's counters
strictly increasing in target sequence order, each key's ``kv.get`` equal in both buckets and
each key's retained history equal, nothing lost. The table goes to stdout and ``--out``; exit
status 1 when a loss column is not 0. ``tests/chaos/test_chaos.py`` runs a short version.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SRC, DST = "CH_SRC", "CH_DST"
KV_SRC, KV_DST = "CH_KV_SRC", "CH_KV_DST"
STATE_BUCKET = "SPARK_JETSTREAM_SINK"
SUBJECTS = 50
KEYS = 50
KV_HISTORY = 64
SOURCE_WINDOW_S = 600  # the publishers' resends must be deduplicated in the sources
STANDBY_NICE = 10
START_TIMEOUT = 600.0  # a Spark driver's start on 2 cores shared with other work has taken 100 s
SINGLE_KINDS = ("server_kill", "server_stop")
CLUSTER_KINDS = ("node_kill", "node_stop", "leader_stepdown", "leader_kill")
SPARK_KINDS = ("worker_kill", "driver_kill_short", "driver_kill_long", "task_failure")
ALL_KINDS = SINGLE_KINDS + CLUSTER_KINDS + SPARK_KINDS


# --------------------------------------------------------------------------- the schedule

@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the phase's copies started
    kind: str
    params: dict = field(default_factory=dict, hash=False)

    def describe(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.kind}({shown})" if shown else self.kind


def draw_schedule(seed: int, phases: list[str], phase_seconds: float, gap: float, kinds: set[str],
                  window: float) -> dict[str, list[Fault]]:
    """Every fault of every phase, drawn before anything starts: the same arguments give the same schedule."""
    rng = random.Random(seed)
    schedule: dict[str, list[Fault]] = {}
    for phase in phases:
        allowed = [k for k in (SINGLE_KINDS if phase == "single" else CLUSTER_KINDS) + SPARK_KINDS if k in kinds]
        faults: list[Fault] = []
        at = rng.uniform(0.4 * gap, gap)
        while allowed and at < phase_seconds - 5:
            kind = rng.choice(allowed)
            params: dict = {}
            if kind in ("server_stop", "node_stop"):
                params["seconds"] = round(rng.uniform(2.0, 6.0), 1)
            if kind in ("node_kill", "node_stop"):
                params["node"] = rng.randrange(3)
            if kind == "node_kill":
                params["down"] = round(rng.uniform(1.0, 8.0), 1)
            if kind == "leader_stepdown":
                params["stream"] = rng.choice([SRC, DST, f"KV_{KV_SRC}", f"KV_{KV_DST}", f"KV_{STATE_BUCKET}"])
            if kind == "leader_kill":  # the node leading a target while the sink publishes into it
                params["stream"] = rng.choice([DST, f"KV_{KV_DST}"])
                params["down"] = round(rng.uniform(1.0, 8.0), 1)
            if kind == "worker_kill":
                params["pick"] = rng.randrange(1000)
            if kind == "driver_kill_short":
                params["restart_after"] = round(rng.uniform(0.0, 1.0), 1)
            if kind == "driver_kill_long":
                params["restart_after"] = round(window + rng.uniform(2.0, 6.0), 1)
            if kind == "task_failure":
                params["copy"] = rng.choice(["stream", "bucket"])
            faults.append(Fault(round(at, 1), kind, params))
            at += rng.uniform(0.6 * gap, 1.4 * gap)
        schedule[phase] = faults
    return schedule


# --------------------------------------------------------------------------- processes

def descendants(pid: int) -> list[int]:
    from tests.helpers import child_processes

    return child_processes(pid, "")


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a child started in its own session: its process group, then any descendant left over."""
    if proc.poll() is None:
        left = descendants(proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(30)


def wait_for(condition, timeout: float, what: str):
    """The tests' ``wait_until``, polled every 0.2 s (the chaos loop need not spin faster)."""
    from tests.helpers import wait_until

    return wait_until(condition, timeout=timeout, interval=0.2, what=what)


# --------------------------------------------------------------------------- NATS admin (nats-py)

def nats_call(url: str, work, timeout: float = 30.0):
    """Run ``work(nc)`` on a fresh nats-py connection (one event loop per call: simple across restarts)."""
    import nats

    async def go():
        nc = await nats.connect(url.split(","), connect_timeout=5, max_reconnect_attempts=3,
                                reconnect_time_wait=0.5, error_cb=_quiet)
        try:
            return await asyncio.wait_for(work(nc), timeout)
        finally:
            await nc.close()

    return asyncio.run(go())


async def _quiet(exc: Exception) -> None:
    """Faults are the point of the run: connection errors are expected."""


async def api(nc, subject: str, body: dict | None = None, timeout: float = 10.0) -> dict:
    msg = await nc.request(f"$JS.API.{subject}", json.dumps(body).encode() if body is not None else b"",
                           timeout=timeout)
    return json.loads(msg.data)


def kv_stream(bucket: str, history: int, window_s: float, replicas: int) -> dict:
    """The stream nats-py's ``create_key_value`` creates, with its own duplicate window."""
    return {"name": f"KV_{bucket}", "subjects": [f"$KV.{bucket}.>"], "allow_direct": True,
            "allow_rollup_hdrs": True, "allow_msg_ttl": True, "deny_delete": True, "discard": "new",
            "duplicate_window": int(window_s * 1e9), "max_msgs_per_subject": history, "num_replicas": replicas,
            "storage": "file", "max_msgs": -1, "max_bytes": -1, "max_age": 0}


def create_streams(url: str, replicas: int, window: float, dst_history: int = KV_HISTORY,
                   batched: bool = False) -> None:
    """The sources and the targets; ``batched``: the targets allow fast-ingest batches (the sink's
    ``publish.mode=auto`` then writes through them, issue #48)."""
    async def work(nc):
        configs = [
            {"name": SRC, "subjects": ["dev.*"], "storage": "file", "num_replicas": replicas,
             "duplicate_window": SOURCE_WINDOW_S * 10**9},
            {"name": DST, "subjects": ["copy.dev.*"], "storage": "file", "num_replicas": replicas,
             "duplicate_window": int(window * 1e9)},
            kv_stream(KV_SRC, KV_HISTORY, SOURCE_WINDOW_S, replicas),
            kv_stream(KV_DST, dst_history, window, replicas),
        ]
        if batched:
            configs[1]["allow_batched"] = configs[3]["allow_batched"] = True
        if replicas > 1:  # the sink creates its state bucket R1; on a cluster it must survive a node
            state = kv_stream(STATE_BUCKET, 1, 120, replicas)
            state["max_age"] = 7 * 24 * 3600 * 10**9
            configs.append(state)
        for config in configs:
            for _ in range(30):  # a fresh cluster may still be electing its meta leader
                reply = await api(nc, f"STREAM.CREATE.{config['name']}", config)
                if "error" not in reply:
                    break
                await asyncio.sleep(1)
            else:
                raise RuntimeError(f"could not create {config['name']}: {reply}")

    nats_call(url, work, timeout=120)


# --------------------------------------------------------------------------- publishers

class Publishers:
    """nats-py publishers in one thread: ``SUBJECTS`` subjects of ``SRC`` and ``KEYS`` keys of ``KV_SRC``.

    Each subject (key) is a loop that sends its next message only once the previous one was
    acknowledged, resending it with the same ``Nats-Msg-Id`` until then: a subject's counters rise
    in the source however the server fails. ``acked[...]`` is how many messages of each subject
    (key) the server confirmed."""

    def __init__(self, url: str, stream_rate: float, kv_rate: float) -> None:
        self.url, self.stream_rate, self.kv_rate = url, stream_rate, kv_rate
        self.acked_stream = [0] * SUBJECTS
        self.acked_kv = [0] * KEYS
        self.kv_deletes = 0
        self.gave_up: list[str] = []
        self._stopping = False
        self._give_up_at = float("inf")
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> Publishers:
        self.began = time.monotonic()
        self._thread.start()
        return self

    def stop(self, drain: float = 90.0) -> None:
        """Stop after every subject's current message is acknowledged (at most ``drain`` seconds)."""
        self._give_up_at = time.monotonic() + drain
        self._stopping = True
        self._thread.join(drain + 30)

    async def _run(self) -> None:
        import nats

        nc = await nats.connect(self.url.split(","), max_reconnect_attempts=-1, reconnect_time_wait=0.2,
                                error_cb=_quiet)
        loops = [self._loop(nc, f"dev.{n}", n, self.stream_rate / SUBJECTS, self.acked_stream, False)
                 for n in range(SUBJECTS)]
        loops += [self._loop(nc, f"$KV.{KV_SRC}.k{n}", n, self.kv_rate / KEYS, self.acked_kv, True)
                  for n in range(KEYS)]
        await asyncio.gather(*loops)
        with contextlib.suppress(Exception):
            await nc.close()

    async def _loop(self, nc, subject: str, n: int, rate: float, acked: list[int], kv: bool) -> None:
        started = time.monotonic() + random.random() / rate
        counter = 0
        while not self._stopping:
            await asyncio.sleep(max(0.0, started + counter / rate - time.monotonic()))
            if self._stopping:
                return
            headers = {"Nats-Msg-Id": f"{subject}.{counter}"}
            data = f"{n} {counter}".encode()
            if kv and counter % 10 == 9:
                headers["KV-Operation"] = "DEL"
                data = b""
            while True:  # bounded: stop() sets the time after which a message is given up
                try:
                    reply = await nc.request(subject, data, timeout=2.0, headers=headers)
                    if b'"error"' not in reply.data:
                        break
                except Exception:  # timeouts, no responders, reconnecting: resent below
                    pass
                if time.monotonic() > self._give_up_at:
                    self.gave_up.append(f"{subject} #{counter}")
                    return
                await asyncio.sleep(0.2)
            counter += 1
            acked[n] = counter
            if kv and counter % 10 == 0:
                self.kv_deletes += 1


# --------------------------------------------------------------------------- the Spark driver (child process)

def chaos_sink_class():
    """Format ``jetstream_chaos``: the connector's stream writer with one extra option, ``chaos.marker``.

    When the marker file exists, the first task that sees a batch of 2 rows or more claims it
    (an atomic rename), lets the sink publish the first half of that batch, waits for its PubAcks,
    and raises: a task failure after part of a batch was stored. Product code is untouched."""
    from pyspark_jetstream.datasource import JetStreamDataSource
    from pyspark_jetstream.sink.spark_writers import JetStreamStreamWriter
    from pyspark_jetstream.sink.task.write import write_partition

    def fail_once(batches, marker):
        import os as _os
        import time as _time

        for batch in batches:
            if batch.num_rows >= 2 and _os.path.exists(marker):
                claimed = f"{marker}.fired-{_os.getpid()}-{_time.time_ns()}"
                try:
                    _os.rename(marker, claimed)
                except OSError:  # another task claimed it
                    claimed = None
                if claimed:
                    half = batch.num_rows // 2
                    yield batch.slice(0, half)  # the sink publishes it before asking for more
                    _time.sleep(1.5)  # its PubAcks arrive meanwhile (the connection's own thread)
                    with open(claimed, "w") as f:
                        f.write(str(half))
                    raise RuntimeError(f"chaos: injected task failure after publishing {half} rows")
            yield batch

    class InjectingStreamWriter(JetStreamStreamWriter):
        def __init__(self, plan, marker):
            super().__init__(plan)
            self.marker = marker

        def write(self, iterator):
            return write_partition(self.plan, fail_once(iterator, self.marker))

    class ChaosJetStream(JetStreamDataSource):
        @classmethod
        def name(cls):
            return "jetstream_chaos"

        def streamWriter(self, schema, overwrite):
            options = {k: v for k, v in self.options.items() if k.lower() != "chaos.marker"}
            inner = JetStreamDataSource(options).streamWriter(schema, overwrite)
            return InjectingStreamWriter(inner.plan, self.options["chaos.marker"])

    return ChaosJetStream


def write_status(ctl: Path, **status) -> None:
    tmp = ctl / "status.json.tmp"
    tmp.write_text(json.dumps(status))
    tmp.replace(ctl / "status.json")


def read_status(ctl: Path) -> dict:
    try:
        return json.loads((ctl / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def driver_main(args) -> int:
    """A Spark driver running both copies: started ``ready``, it waits for ``ctl/go`` (a standby
    takes over within a second of its predecessor's death), restarts a failed query from its
    checkpoint (as a job supervisor would), and stops on ``ctl/stop`` or when its parent is gone."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    ctl, work = Path(args.ctl), Path(args.workdir)
    parent = os.getppid()
    spark = (SparkSession.builder.master("local[2,4]").appName("pyspark-jetstream-chaos")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
             .config("spark.python.worker.reuse", "true")
             .config("spark.python.authenticate.socketTimeout", "120s")
             .config("spark.sql.streaming.stopTimeout", "30s").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(chaos_sink_class())
    write_status(ctl, state="ready", pid=os.getpid())
    while not (ctl / "go").exists():
        if os.getppid() != parent or (ctl / "stop").exists():
            return 0
        time.sleep(0.05)
    url = args.url

    def stream_copy():
        src = (spark.readStream.format("jetstream").option("servers", url).option("stream", SRC)
               .option("startingOffsets", "earliest").option("numPartitions", "4")
               .option("maxMessagesPerTrigger", str(args.max_per_trigger)).load())
        return (src.select(F.concat(F.lit("copy."), "subject").alias("subject"), "data", "stream", "seq")
                .repartition(4, "subject")  # each subject to one write task, which publishes it in seq order
                .writeStream.format("jetstream_chaos").option("chaos.marker", str(work / "fail-stream"))
                .option("servers", url).option("stream", DST).option("ackTimeout", "60s")
                .option("checkpointLocation", str(work / "checkpoints" / "stream")).queryName("stream_copy")
                .trigger(processingTime="1 second").start())

    def bucket_copy():
        src = (spark.readStream.format("jetstream").option("servers", url).option("bucket", KV_SRC)
               .option("startingOffsets", "earliest").option("numPartitions", "4")
               .option("maxMessagesPerTrigger", str(args.max_per_trigger)).load())
        return (src.repartition(4, "key").writeStream.format("jetstream_chaos").option("chaos.marker", str(work / "fail-bucket"))
                .option("servers", url).option("bucket", KV_DST).option("ackTimeout", "60s")
                .option("checkpointLocation", str(work / "checkpoints" / "bucket")).queryName("bucket_copy")
                .trigger(processingTime="1 second").start())

    starts = {"stream_copy": stream_copy, "bucket_copy": bucket_copy}
    restarts = {name: 0 for name in starts}
    failures: list[str] = []

    def started(name):
        """Start a query and wait (30 s at most) for its first progress or its end: queries start one after
        the other, because Spark gives the Python process each start spawns 10 s to connect back (hard-coded
        in PythonWorkerFactory.createSimpleWorker), which two at once on a loaded machine can miss."""
        query = starts[name]()
        deadline = time.monotonic() + 30
        while query.isActive and query.lastProgress is None and time.monotonic() < deadline:
            time.sleep(0.2)
        return query

    queries = {}
    for name in starts:
        queries[name] = started(name)
    while True:
        if os.getppid() != parent:
            return 1
        if (ctl / "stop").exists():
            for q in queries.values():
                with contextlib.suppress(Exception):
                    q.stop()
            write_status(ctl, state="stopped", pid=os.getpid(), restarts=restarts, failures=failures)
            spark.stop()
            return 0
        for name, q in list(queries.items()):
            if not q.isActive:
                failures.append(f"{name}: {_cause(str(q.exception()))}")
                time.sleep(2.0)  # a back-off: a failed start is mostly a machine too busy to start Python
                queries[name] = started(name)
                restarts[name] += 1
        batches = {name: (q.lastProgress or {}).get("batchId") for name, q in queries.items()}
        write_status(ctl, state="running", pid=os.getpid(), restarts=restarts, failures=failures, batches=batches)
        time.sleep(0.5)


def _cause(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    named = [line for line in lines if "Error:" in line or "Exception:" in line]
    return (named[-1] if named else lines[0] if lines else text)[:300]


class DriverDied(RuntimeError):
    """A driver process ended before it reached the state waited for."""


@dataclass
class Driver:
    proc: subprocess.Popen
    ctl: Path
    log: Path

    def status(self) -> dict:
        return read_status(self.ctl)


class Drivers:
    """The active driver, and (when the schedule kills drivers) a standby already started."""

    def __init__(self, workdir: Path, url: str, standby: bool, max_per_trigger: int = 20000) -> None:
        self.max_per_trigger = max_per_trigger
        self.workdir, self.url, self.want_standby = workdir, url, standby
        self.count = 0
        self.active: Driver | None = None
        self.standby: Driver | None = None
        self.all: list[Driver] = []
        self.standby_deaths = 0

    def _spawn(self) -> Driver:
        self.count += 1
        ctl = self.workdir / f"driver-{self.count}"
        ctl.mkdir()
        log = ctl / "driver.log"
        env = dict(os.environ, PYSPARK_JETSTREAM_LOG_LEVEL="INFO")
        with open(log, "wb") as out:
            # Niced while it waits as a standby (its JVM's start must not starve the active driver's
            # Python processes); back to normal when it takes over (_take_over).
            proc = subprocess.Popen([sys.executable, __file__, "--driver", "--url", self.url, "--workdir",
                                     str(self.workdir), "--ctl", str(ctl), "--max-per-trigger", str(self.max_per_trigger)],
                                    stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True, env=env, cwd=str(ROOT),
                                    preexec_fn=lambda: os.nice(STANDBY_NICE))
        driver = Driver(proc, ctl, log)
        self.all.append(driver)
        return driver

    def _ready(self, driver: Driver, state: str, timeout: float) -> None:
        def check():
            if driver.proc.poll() is not None:
                lines = [ln for ln in driver.log.read_text(errors="replace").splitlines() if ln.strip()]
                raise DriverDied(f"driver {driver.ctl.name} exited ({driver.proc.returncode}) before it was "
                                 f"{state}: {lines[-1][:200] if lines else 'no output'} (log {driver.log})")
            return driver.status().get("state") == state
        wait_for(check, timeout, f"driver {driver.ctl.name} {state}")

    def _progressing(self, driver: Driver, timeout: float) -> None:
        """Both queries of ``driver`` have finished a micro-batch (a query's start, which spawns Python
        processes Spark gives 10 s to connect back, is past; on a loaded machine it can take a minute)."""
        self._ready(driver, "running", timeout)
        wait_for(lambda: driver.proc.poll() is not None or all(
            b is not None for b in (driver.status().get("batches") or {"-": None}).values()),
            timeout, f"driver {driver.ctl.name}'s copies made a micro-batch")

    def _take_over(self, driver: Driver) -> None:
        self.active = driver
        with contextlib.suppress(OSError):  # every thread of its process group (JVM included) back to 0
            os.setpriority(os.PRIO_PGRP, driver.proc.pid, 0)
        (driver.ctl / "go").touch()
        self._progressing(driver, START_TIMEOUT)
        if self.want_standby:  # started once the active one runs: two JVMs starting at once starve each other
            self.standby = self._spawn()

    def start(self) -> None:
        driver = self._spawn()
        self._ready(driver, "ready", START_TIMEOUT)
        self._take_over(driver)

    def kill_and_take_over(self, restart_after: float) -> float:
        """SIGKILL the active driver's process group; the standby takes over ``restart_after`` s later.
        Returns the seconds from the kill until both copies of the new driver had made a micro-batch
        (the replay of the killed driver's last batch is in there)."""
        assert self.active is not None
        for attempt in range(3):  # a standby whose JVM died while starting (seen once) is replaced
            if self.standby is None or self.standby.proc.poll() is not None:
                if self.standby is not None:
                    self.standby_deaths += 1
                self.standby = self._spawn()
            try:
                self._ready(self.standby, "ready", START_TIMEOUT)
                break
            except DriverDied:
                if attempt == 2:
                    raise
        kill_tree(self.active.proc)
        killed = time.monotonic()
        time.sleep(restart_after)  # the fault's duration: how long no driver runs
        standby, self.standby = self.standby, None
        self._take_over(standby)
        return time.monotonic() - killed

    def ensure_alive(self) -> bool:
        """A driver that died by itself is replaced (counted); True when it had to be."""
        if self.active is not None and self.active.proc.poll() is not None:
            if self.standby is not None and self.standby.proc.poll() is None:
                standby, self.standby = self.standby, None
            else:
                standby, self.standby = self._spawn(), None
            self._ready(standby, "ready", START_TIMEOUT)
            self._take_over(standby)
            return True
        return False

    def stop(self) -> None:
        for driver in (self.active, self.standby):
            if driver is not None and driver.proc.poll() is None:
                (driver.ctl / "stop").touch()
        for driver in (self.active, self.standby):
            if driver is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    driver.proc.wait(90)

    def close(self) -> None:
        for driver in self.all:
            kill_tree(driver.proc)


# --------------------------------------------------------------------------- a phase

class Phase:
    def __init__(self, name: str, workdir: Path, args) -> None:
        from pyspark_jetstream.tools.server import EmbeddedNatsCluster, EmbeddedNatsServer

        self.name, self.workdir, self.args = name, workdir, args
        self.cluster = None
        if name == "single":
            self.nodes = [EmbeddedNatsServer(store_dir=workdir / "store")]
        else:
            self.cluster = EmbeddedNatsCluster(3, name="chaos")
            self.nodes = self.cluster.nodes
        self.drivers: Drivers | None = None
        self.publishers: Publishers | None = None
        self.done: list[tuple[float, Fault, str]] = []
        self.started = 0.0
        self.fired: set[str] = set()
        self.skipped: list[Fault] = []
        self.driver_deaths = 0

    @property
    def url(self) -> str:
        return self.cluster.url if self.cluster is not None else self.nodes[0].url

    def log(self, text: str) -> None:
        print(f"  [{self.name} {time.monotonic() - self.started:7.1f}s] {text}", flush=True)

    def close(self) -> None:
        for node in self.nodes:  # a frozen server must run again to be stopped
            if node.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node.pid, signal.SIGCONT)
        if self.publishers is not None:
            self.publishers.stop(drain=5)
        if self.drivers is not None:
            self.drivers.close()
        if self.cluster is not None:
            self.cluster.close()
        else:
            for node in self.nodes:
                node.close()

    # ---- faults

    def _kill_node(self, index: int, down: float) -> None:
        """SIGKILL cluster node ``index``, and start it again on its store ``down`` seconds later."""
        node = self.nodes[index]
        node.stop(kill=True)
        time.sleep(down)  # the fault's duration
        node.start()
        self.cluster.wait_for_jetstream()

    def inject(self, fault: Fault) -> str:
        kind, p = fault.kind, fault.params
        if kind == "server_kill":
            self.nodes[0].restart(kill=True)
            return "SIGKILLed, restarted on its store"
        if kind in ("server_stop", "node_stop"):
            node = self.nodes[p.get("node", 0)]
            os.kill(node.pid, signal.SIGSTOP)
            try:
                time.sleep(p["seconds"])  # the fault's duration
            finally:
                os.kill(node.pid, signal.SIGCONT)
            return f"pid {node.pid} frozen {p['seconds']}s"
        if kind == "node_kill":
            self._kill_node(p["node"], p["down"])
            return f"node n{p['node'] + 1} SIGKILLed, down {p['down']}s"
        if kind == "leader_kill":
            async def leader(nc):
                return (await api(nc, f"STREAM.INFO.{p['stream']}")).get("cluster", {}).get("leader")
            name = nats_call(self.url, leader, timeout=30)
            if not name or not str(name).startswith("chaos-n"):
                return f"FAILED: no leader of {p['stream']} seen ({name})"
            self._kill_node(int(str(name).removeprefix("chaos-n")) - 1, p["down"])
            return f"{p['stream']}'s leader {name} SIGKILLed, down {p['down']}s"
        if kind == "leader_stepdown":
            async def work(nc):
                before = (await api(nc, f"STREAM.INFO.{p['stream']}")).get("cluster", {}).get("leader")
                reply = await api(nc, f"STREAM.LEADER.STEPDOWN.{p['stream']}")
                for _ in range(100):  # a new leader within 30 s
                    await asyncio.sleep(0.3)
                    with contextlib.suppress(Exception):
                        now = (await api(nc, f"STREAM.INFO.{p['stream']}")).get("cluster", {}).get("leader")
                        if now and now != before:
                            return f"leader {before} -> {now}"
                return f"step-down answered {reply}; no new leader seen"
            return nats_call(self.url, work, timeout=60)
        if kind == "worker_kill":
            return self.kill_worker(p["pick"])
        if kind in ("driver_kill_short", "driver_kill_long"):
            old = self.drivers.active.proc.pid
            back = self.drivers.kill_and_take_over(p["restart_after"])
            return (f"driver pid {old} killed; standby took over after {p['restart_after']}s; both copies had "
                    f"made a micro-batch {back:.0f}s after the kill")
        if kind == "task_failure":
            marker = self.workdir / f"fail-{p['copy']}"
            marker.touch()
            try:
                fired = wait_for(lambda: [f for f in self.workdir.glob(f"fail-{p['copy']}.fired-*")
                                          if f.stat().st_size > 0 and f.name not in self.fired], 60,
                                 f"a {p['copy']} copy task took the failure marker")
            except AssertionError:  # wait_until's "not within" failure
                marker.unlink(missing_ok=True)
                return "NOT FIRED (no batch of 2 rows or more within 60 s)"
            self.fired.add(fired[0].name)
            return f"a task failed after publishing {fired[0].read_text()} rows"
        raise ValueError(kind)

    def kill_worker(self, pick: int) -> str:
        """SIGKILL one Python worker of the active driver's JVM (a ``pyspark`` process below it, not the
        driver itself), preferring those connected to NATS (partition readers and writers)."""
        from tests.helpers import processes_connected_to

        driver = self.drivers.active.proc.pid
        below = [pid for pid in descendants(driver) if "pyspark" in cmdline(pid) and "java" not in cmdline(pid)
                 and pid != driver]
        connected = set()
        for node in self.nodes:
            with contextlib.suppress(Exception):
                connected.update(processes_connected_to(node.port))
        candidates = sorted(pid for pid in below if pid in connected) or sorted(below)
        if not candidates:
            return "no Python worker found"
        victim = candidates[pick % len(candidates)]
        what = cmdline(victim)[-60:]
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
        return f"pid {victim} ({what.strip()}) of {len(candidates)} candidates"

    # ---- the run

    def run(self, faults: list[Fault], seconds: float) -> None:
        args = self.args
        if self.cluster is not None:
            self.cluster.start()
        else:
            self.nodes[0].start()
        create_streams(self.url, 3 if self.cluster is not None else 1, args.dup_window, args.dst_history,
                       args.batched)
        self.publishers = Publishers(self.url, args.stream_rate, args.kv_rate).start()
        standby = any(f.kind.startswith("driver_kill") for f in faults)
        self.drivers = Drivers(self.workdir, self.url, standby, args.max_per_trigger)
        self.drivers.start()
        self.started = time.monotonic()
        self.log(f"copies running (nats {self.url}); {len(faults)} faults scheduled over {seconds:.0f}s")
        for index, fault in enumerate(faults):
            if time.monotonic() >= self.started + seconds:  # faults ran late (driver restarts are slow)
                self.skipped = faults[index:]
                self.log(f"phase time is over: {len(self.skipped)} scheduled faults not injected")
                break
            while time.monotonic() < self.started + fault.at:
                self.watch()
                time.sleep(min(0.5, max(0.0, self.started + fault.at - time.monotonic())))
            self.watch()
            began = time.monotonic() - self.started
            try:
                outcome = self.inject(fault)
            except Exception as exc:  # recorded; the run goes on
                outcome = f"FAILED TO INJECT: {type(exc).__name__}: {exc}"
            self.done.append((began, fault, outcome))
            self.log(f"{fault.describe()}: {outcome}")
        while time.monotonic() < self.started + seconds:
            self.watch()
            time.sleep(0.5)

    def watch(self) -> None:
        try:
            if self.drivers is not None and self.drivers.ensure_alive():
                self.driver_deaths += 1
                self.log("the driver died by itself; a new one started from the checkpoints")
        except DriverDied as exc:  # tried again at the next watch
            self.driver_deaths += 1
            self.log(f"the driver died by itself and its replacement too: {exc}")

    def catch_up(self) -> dict:
        """Publishers stopped, then wait for both targets to hold at least what the sources hold, stable."""
        self.publishers.stop()
        self.published_for = time.monotonic() - self.publishers.began
        self.log(f"publishers stopped: {sum(self.publishers.acked_stream)} stream messages and "
                 f"{sum(self.publishers.acked_kv)} bucket updates acknowledged")

        def sizes():
            async def work(nc):
                out = {}
                for name in (SRC, DST, f"KV_{KV_SRC}", f"KV_{KV_DST}"):
                    out[name] = (await api(nc, f"STREAM.INFO.{name}"))["state"]
                return out
            try:
                return nats_call(self.url, work)
            except Exception:
                return None

        deadline = time.monotonic() + self.args.catch_up
        last, stable_since = None, time.monotonic()
        caught = False
        while time.monotonic() < deadline:
            self.watch()
            s = sizes()
            if s is not None:
                key = (s[SRC]["messages"], s[DST]["messages"], s[f"KV_{KV_SRC}"]["last_seq"],
                       s[f"KV_{KV_DST}"]["last_seq"])
                if key != last:
                    last, stable_since = key, time.monotonic()
                elif key[1] >= key[0] and key[3] >= key[2] and time.monotonic() - stable_since >= 3:
                    caught = True
                    break
            time.sleep(1.0)
        self.log(f"copies {'caught up' if caught else 'DID NOT catch up'}: "
                 f"{SRC} {last[0] if last else '?'} -> {DST} {last[1] if last else '?'}, "
                 f"KV_{KV_SRC} {last[2] if last else '?'} -> KV_{KV_DST} {last[3] if last else '?'}")
        self.drivers.stop()
        return {"caught_up": caught}

    def evidence(self) -> dict:
        """What the drivers' logs say: query restarts, replays and rows the replay records kept back."""
        replays = skipped = dup_dropped = batches = 0
        failures: list[str] = []
        restarts = 0
        for driver in self.drivers.all:
            text = driver.log.read_text(errors="replace") if driver.log.exists() else ""
            replays += len(re.findall(r"JetStream sink: run \S+ partition \d+ replays", text))
            commits = re.findall(r"JetStream sink (?:batch \d+|write) committed: ([^\n]*)", text)
            skipped += sum(int(n) for line in commits for n in re.findall(r"(\d+) stored before", line))
            dup_dropped += sum(int(n) for line in commits for n in re.findall(r"(\d+) duplicates", line))
            batches += sum(int(n) for line in commits for n in re.findall(r"(\d+) fast-ingest batches", line))
            status = driver.status()
            restarts += sum((status.get("restarts") or {}).values())
            failures += status.get("failures") or []
        return {"replays": replays, "skipped": skipped, "dup_dropped": dup_dropped, "query_restarts": restarts,
                "failures": failures, "batches": batches}


# --------------------------------------------------------------------------- the checker (nats-py only)

async def read_all(nc, stream: str) -> list:
    """Every message ``stream`` holds, in sequence order, through an ephemeral AckNone consumer."""
    import nats.js.api
    import nats.js.errors

    js = nc.jetstream()
    deadline = time.monotonic() + 300
    while True:  # a cluster just out of its faults may answer 503 for a while: read it all again
        try:
            info = await js.stream_info(stream)
            want = info.state.messages
            sub = await js.pull_subscribe("", stream=stream, config=nats.js.api.ConsumerConfig(
                ack_policy="none", inactive_threshold=60.0, mem_storage=True, num_replicas=1))
            out = []
            try:
                while len(out) < want and time.monotonic() < deadline:
                    with contextlib.suppress(nats.errors.TimeoutError):
                        out.extend(await sub.fetch(5000, timeout=5))
            finally:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
            break
        except (nats.js.errors.ServiceUnavailableError, nats.js.errors.APIError, nats.errors.TimeoutError,
                nats.errors.NoRespondersError) as exc:
            if time.monotonic() > deadline:
                raise
            print(f"  checker: reading {stream} failed ({type(exc).__name__}); reading it again", flush=True)
            await asyncio.sleep(1)
    if len(out) < want:
        raise RuntimeError(f"read {len(out)} of {want} messages of {stream}")
    return sorted(out, key=lambda m: m.metadata.sequence.stream)


def check(url: str, publishers: Publishers) -> dict:
    async def work(nc):
        import nats.js.errors

        src, dst = await read_all(nc, SRC), await read_all(nc, DST)
        kv_src, kv_dst = await read_all(nc, f"KV_{KV_SRC}"), await read_all(nc, f"KV_{KV_DST}")
        js = nc.jetstream()
        src_info, dst_info = await js.stream_info(f"KV_{KV_SRC}"), await js.stream_info(f"KV_{KV_DST}")
        a, b = await js.key_value(KV_SRC), await js.key_value(KV_DST)
        latest = {}
        for n in range(KEYS):
            pair = []
            for bucket in (a, b):
                try:
                    entry = await bucket.get(f"k{n}")
                    pair.append(("PUT", entry.value))
                except nats.js.errors.KeyNotFoundError as exc:
                    pair.append((exc.op or "missing", b""))
            latest[n] = pair
        return src, dst, kv_src, kv_dst, src_info.state.last_seq, dst_info.state.last_seq, latest

    src, dst, kv_src, kv_dst, kv_in, kv_out, latest = nats_call(url, work, timeout=900)

    def ids(msgs):
        return [tuple(int(x) for x in m.data.split()) for m in msgs]

    src_ids, dst_ids = ids(src), ids(dst)
    src_set = set(src_ids)
    counts: dict = {}
    for i in dst_ids:
        counts[i] = counts.get(i, 0) + 1
    stream = {
        "in": len(src_ids), "out": len(dst_ids),
        "duplicates": sum(c - 1 for c in counts.values() if c > 1) + sum(1 for i in counts if i not in src_set),
        "order": 0, "stale": None,
        "lost": sum(1 for i in src_set if i not in counts),
        # what the server acknowledged to the publisher but the source does not hold (JetStream's own loss)
        "source_lost": sum(publishers.acked_stream) - len(src_set),
    }
    last: dict[int, int] = {}
    for n, c in dst_ids:
        if n in last and c <= last[n]:
            stream["order"] += 1
        last[n] = c
    # a copy lands on its own subject: copy.dev.<n> for "<n> <counter>"
    stream["wrong_subject"] = sum(1 for m, (n, _c) in zip(dst, dst_ids, strict=True) if m.subject != f"copy.dev.{n}")
    stream["lost"] += stream["wrong_subject"]

    def history(msgs):
        per: dict[str, list] = {}
        for m in msgs:
            op = (m.headers or {}).get("KV-Operation", "PUT")
            per.setdefault(m.subject.split(".", 2)[2], []).append((op, m.data))
        return per

    hs, hd = history(kv_src), history(kv_dst)
    kv_dups = kv_order = kv_lost = 0
    for key in set(hs) | set(hd):
        s, d = hs.get(key, []), hd.get(key, [])
        counters = [int(v.split()[1]) for op, v in d if op == "PUT"]
        kv_dups += len(counters) - len(set(counters))
        kv_order += sum(1 for x, y in zip(counters, counters[1:], strict=False) if y <= x)
        kv_lost += sum(1 for entry in s if entry not in d)
    stale = sum(1 for pair in latest.values() if pair[0] != pair[1])
    # evidence of duplicates still retained: which update, at which target sequences and times
    seen: dict[tuple, list] = {}
    for m in kv_dst:
        if (m.headers or {}).get("KV-Operation", "PUT") == "PUT":
            seen.setdefault((m.subject, m.data), []).append((m.metadata.sequence.stream, str(m.metadata.timestamp)))
    twice = [(k, v) for k, v in seen.items() if len(v) > 1]
    for (subject, data), where in twice[:20]:
        print(f"  duplicate in KV_{KV_DST}: {subject} {data!r} at {where}", flush=True)
    bucket = {
        "in": kv_in, "out": kv_out,
        "duplicates": max(kv_dups, kv_out - kv_in),
        "order": kv_order, "stale": stale,
        "lost": max(kv_lost, kv_in - kv_out),
        "source_lost": sum(publishers.acked_kv) - kv_in,
    }
    return {"stream": stream, "bucket": bucket}


# --------------------------------------------------------------------------- main

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="fault time, split evenly over the phases")
    parser.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    parser.add_argument("--phases", default="single,cluster")
    parser.add_argument("--kinds", default=",".join(ALL_KINDS), help="fault kinds to draw from")
    parser.add_argument("--gap", type=float, default=30.0, help="mean seconds between faults")
    parser.add_argument("--dup-window", type=float, default=5.0, help="the targets' duplicate window (s)")
    parser.add_argument("--stream-rate", type=float, default=100.0, help="stream messages per second")
    parser.add_argument("--dst-history", type=int, default=KV_HISTORY,
                        help="the target bucket's history (more than the source's keeps every copy for the check)")
    parser.add_argument("--max-per-trigger", type=int, default=20000, help="the reads' maxMessagesPerTrigger")
    parser.add_argument("--kv-rate", type=float, default=10.0, help="bucket updates per second")
    parser.add_argument("--catch-up", type=float, default=600.0, help="deadline for the copies to catch up (s)")
    parser.add_argument("--batched", action="store_true",
                        help="targets with allow_batched: the copies write in fast-ingest batches")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "chaos.md"))
    parser.add_argument("--driver", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--ctl", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        return driver_main(args)

    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    phases = [p for p in args.phases.split(",") if p]
    kinds = {k for k in args.kinds.split(",") if k}
    unknown = kinds - set(ALL_KINDS)
    if unknown or not set(phases) <= {"single", "cluster"}:
        parser.error(f"unknown kinds {sorted(unknown)} or phases {phases}")
    phase_seconds = args.minutes * 60 / len(phases)
    schedule = draw_schedule(seed, phases, phase_seconds, args.gap, kinds, args.dup_window)
    print(f"chaos: seed {seed}, {args.minutes:g} min over phases {phases}, duplicate window {args.dup_window:g}s, "
          f"{args.stream_rate:g} stream msg/s + {args.kv_rate:g} bucket updates/s", flush=True)
    for phase, faults in schedule.items():
        print(f"  schedule {phase}: " + "; ".join(f"{f.at:g}s {f.describe()}" for f in faults), flush=True)

    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    workroot = Path(tempfile.mkdtemp(prefix="chaos-"))
    began = time.monotonic()
    results: list[tuple[str, dict, dict, Phase, dict]] = []
    try:
        for name in phases:
            workdir = workroot / name
            workdir.mkdir()
            phase = Phase(name, workdir, args)
            try:
                phase.run(schedule[name], phase_seconds)
                caught = phase.catch_up()
                checked = check(phase.url, phase.publishers)
                for copy, r in checked.items():
                    phase.log(f"checked the {copy} copy: " + ", ".join(f"{k} {v}" for k, v in r.items()))
                results.append((name, checked, caught, phase, phase.evidence()))
            finally:
                phase.close()
    finally:
        duration = time.monotonic() - began
        if results:
            report, ok = render(seed, args, duration, results)
            print(report, flush=True)
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            Path(args.out).write_text(report + "\n")
        passed = bool(results) and len(results) == len(phases) and ok
        if passed:
            shutil.rmtree(workroot, ignore_errors=True)
        else:  # the evidence: every driver's log (the sink's replay lines), checkpoints, server logs
            print(f"kept the work dir for the evidence: {workroot}", flush=True)
    return 0 if passed else 1


def render(seed: int, args, duration: float, results) -> tuple[str, bool]:
    ok = True
    lines = [f"# Chaos soak: seed {seed}, {args.minutes:g} min of faults, phases {args.phases}",
             "", f"Command: `python tests/chaos/chaos.py --minutes {args.minutes:g} --seed {seed} --phases "
             f"{args.phases} --gap {args.gap:g}" + (f" --kinds {args.kinds}" if set(args.kinds.split(',')) !=
                                                     set(ALL_KINDS) else "")
             + f" --stream-rate {args.stream_rate:g}" + (" --batched" if args.batched else "") + "`",
             "", f"Wall time {duration / 60:.1f} min; duplicate window of both targets {args.dup_window:g}s; "
             f"{args.stream_rate:g} stream messages/s over {SUBJECTS} subjects, {args.kv_rate:g} bucket "
             f"updates/s over {KEYS} keys (every tenth a delete).", "",
             "| phase | copy | messages in | messages out | duplicates | order violations | stale keys | lost "
             "| acked but not in the source (JetStream) | caught up |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name, checked, caught, _phase, _ev in results:
        for copy in ("stream", "bucket"):
            r = checked[copy]
            bad = r["duplicates"] or r["order"] or r["stale"] or r["lost"] or r["source_lost"] \
                or not caught["caught_up"]
            ok = ok and not bad
            lines.append(f"| {name} | {copy} | {r['in']} | {r['out']} | {r['duplicates']} | {r['order']} | "
                         f"{'-' if r['stale'] is None else r['stale']} | {r['lost']} | {r['source_lost']} | "
                         f"{'yes' if caught['caught_up'] else 'NO'} |")
    lines += ["", "Rates while the publishers ran: " + "; ".join(
        f"{name} stream {checked['stream']['in'] / phase.published_for:,.0f} messages/s acknowledged into the "
        f"source, bucket {checked['bucket']['in'] / phase.published_for:,.0f} updates/s "
        f"({phase.published_for:.0f} s)" for name, checked, _caught, phase, _ev in results) + "."]
    kinds = sorted({f.kind for *_, phase, _ in results for _, f, _ in phase.done})
    lines += ["", "Faults injected, by kind:", "", "| phase | " + " | ".join(kinds) + " | total |",
              "|---|" + "---:|" * (len(kinds) + 1)]
    for name, _c, _u, phase, _ev in results:
        got = [sum(1 for _, f, o in phase.done if f.kind == k and not o.startswith(("FAILED", "NOT FIRED",
                                                                                     "no Python")))
               for k in kinds]
        lines.append(f"| {name} | " + " | ".join(str(n) for n in got) + f" | {sum(got)} |")
    lines += ["", "| phase | query restarts from the checkpoint | drivers that died by themselves | task replays "
              "seen by the sink | rows the replay records kept back | duplicates the server dropped "
              "| fast-ingest batches committed |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for name, _c, _u, phase, ev in results:
        lines.append(f"| {name} | {ev['query_restarts']} | {phase.driver_deaths} + {phase.drivers.standby_deaths} "
                     f"standby | {ev['replays']} | "
                     f"{ev['skipped']} | {ev['dup_dropped']} | {ev['batches']} |")
    lines += ["", "Fault log (seconds after the phase's copies started):", ""]
    for name, _c, _u, phase, _ev in results:
        lines += [f"- {name} {t:.1f}s {f.describe()}: {o}" for t, f, o in phase.done]
    for name, _c, _u, phase, _ev in results:
        if phase.skipped:
            lines.append(f"- {name}: not reached before the phase's end (driver restarts run late): "
                         + "; ".join(f"{f.at:g}s {f.describe()}" for f in phase.skipped))
    failures = [f for *_, ev in results for f in ev["failures"]]
    if failures:
        lines += ["", "Query failures (each restarted from its checkpoint):", ""]
        counted: dict[str, int] = {}
        for f in failures:
            counted[f] = counted.get(f, 0) + 1
        lines += [f"- {n} x {f}" for f, n in sorted(counted.items(), key=lambda kv: -kv[1])]
    lines += ["", f"Result: {'PASS' if ok else 'FAIL'}"]
    return "\n".join(lines), ok


if __name__ == "__main__":
    sys.exit(main())
