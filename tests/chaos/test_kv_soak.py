"""A seeded KV soak on an R3 bucket through leader step-downs and kills (issue #54; on request:
``pytest -m slow tests/chaos/test_kv_soak.py``, ``KV_SOAK_SEED`` replays a schedule).

A task writes a seeded mix of puts, deletes, purges and creates (``expected_revision`` 0: after a delete or
a purge they succeed as nats-py's ``kv.create`` does, on a live key they are refused and dead-lettered)
over a few keys, ``ROUNDS`` times, each write in its own task (``write_partition``, as Spark runs it),
while the bucket's leader steps down or is SIGKILLed every second or so and comes back. The judge is
nats-py's ``KeyValue`` making the same calls one after the other on a twin bucket of the same cluster,
with no faults. At the end each key's current value and history, and the refused rows, are the judge's.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from pathlib import Path

import nats.js.errors
import pytest

from ..helpers import SyncNats, history, kv_of, latest

ROWS, KEYS, ROUNDS = 400, 12, 4


def _rows(rng: random.Random, round_no: int) -> list[tuple]:
    """(key, data, operation, expected_revision) in the task's order."""
    out = []
    for i in range(ROWS):
        key, value = f"k{rng.randrange(KEYS)}", f"r{round_no}-{i}"
        op = rng.choices(("put", "del", "purge", "create"), (60, 15, 5, 20))[0]
        out.append((key, None if op in ("del", "purge") else value,
                    {"del": "DEL", "purge": "PURGE"}.get(op), 0 if op == "create" else None))
    return out


async def _judge(kv, rows: list[tuple]) -> list[str]:
    """nats-py's calls one at a time; the values of the creates it refused."""
    refused = []
    for key, data, operation, expected in rows:
        if operation == "DEL":
            await kv.delete(key)
        elif operation == "PURGE":
            await kv.purge(key)
        elif expected == 0:
            try:
                await kv.create(key, data.encode())
            except nats.js.errors.KeyWrongLastSequenceError:
                refused.append(data)
        else:
            await kv.put(key, data.encode())
    return refused


def _faults(client: SyncNats, cluster, stream: str, stop: threading.Event, log: list[str], rng: random.Random) -> None:
    from ..integration.test_cluster import _leader_if_any

    while not stop.wait(rng.uniform(0.5, 1.5)):
        with contextlib.suppress(Exception):  # a request lost mid-election: the next one goes
            leader = _leader_if_any(client, stream)
            if leader is None:
                continue
            if rng.random() < 0.7:
                client.api(f"STREAM.LEADER.STEPDOWN.{stream}")
                log.append(f"step-down of {leader}")
            else:
                node = cluster.node_named(leader)
                node.stop(kill=True)
                log.append(f"kill of {leader}")
                time.sleep(rng.uniform(0.5, 2.0))
                node.start()


@pytest.mark.slow
def test_kv_writes_through_leader_changes_end_as_nats_py_makes_them(nats_cluster):
    import pyarrow as pa
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from pyspark_jetstream.sink.plan.sink_plan import plan_sink
    from pyspark_jetstream.sink.task import write as write_module

    seed = int(os.environ.get("KV_SOAK_SEED") or random.randrange(1_000_000))
    rng = random.Random(seed)
    client = SyncNats(nats_cluster.url)
    ours, judge, dlq = f"SOAK{seed}", f"SOAKJ{seed}", f"SOAKDLQ{seed}"
    try:
        for bucket in (ours, judge):
            client.run(client.js.create_key_value(bucket=bucket, history=64, replicas=3))
        client.add_stream(dlq, [f"{dlq.lower()}.dlq"], storage="file", num_replicas=3)
        schema = StructType([StructField("key", StringType()), StructField("data", StringType()),
                             StructField("operation", StringType()), StructField("expected_revision", LongType())])
        refused: list[str] = []
        log: list[str] = []
        for round_no in range(ROUNDS):
            rows = _rows(rng, round_no)
            # Each round a save() of its own (its own run, so its own generated message ids).
            plan = plan_sink({"servers": nats_cluster.url, "bucket": ours, "deadLetterSubject": f"{dlq.lower()}.dlq",
                              "ackTimeout": "60s"}, schema, overwrite=False, streaming=False)
            refused += client.run(_judge(kv_of(client, judge), rows), timeout=300)
            stop = threading.Event()
            faults = threading.Thread(target=_faults, args=(client, nats_cluster, f"KV_{ours}", stop, log, rng),
                                      daemon=True)
            faults.start()
            try:
                batch = pa.RecordBatch.from_pylist([dict(zip(("key", "data", "operation", "expected_revision"), r,
                                                             strict=True)) for r in rows],
                                                   schema=pa.schema([("key", pa.string()), ("data", pa.string()),
                                                                     ("operation", pa.string()),
                                                                     ("expected_revision", pa.int64())]))
                for attempt in range(3):  # a task Spark retries (ackTimeout through a long election)
                    try:
                        write_module.write_partition(plan, [batch])
                        break
                    except Exception as exc:  # noqa: BLE001 - retried as Spark would, then judged
                        import traceback
                        where_failed = " < ".join(f"{f.name}:{f.lineno}" for f in traceback.extract_tb(exc.__traceback__)[-6:])
                        log.append(f"round {round_no} attempt {attempt} failed: {exc!r}"[:300] + f" at {where_failed}")
                else:
                    raise AssertionError(f"seed {seed}: round {round_no} failed 3 times: {log[-3:]}")
            finally:
                stop.set()
                faults.join(30)
                for node in nats_cluster.nodes:
                    if not node.is_running():
                        node.start()
                nats_cluster.wait_for_jetstream()
        ours_kv, judge_kv = kv_of(client, ours), kv_of(client, judge)
        where = f"seed {seed}, faults: {log}"
        (Path(os.environ.get("KV_SOAK_LOG", "/dev/null"))).write_text("\n".join(log))
        for k in range(KEYS):
            key = f"k{k}"
            assert latest(client, ours_kv, key) == latest(client, judge_kv, key), (key, where)
            ours_history, judge_history = history(client, ours_kv, key), history(client, judge_kv, key)
            if ours_history != judge_history:
                Path(os.environ.get("KV_SOAK_LOG", "/dev/null")).write_text(
                    f"{key}\nours  {ours_history}\njudge {judge_history}\n" + "\n".join(log))
            assert ours_history == judge_history, (key, where)
        dead = sorted(m.data.decode() for m in client.messages(dlq))
        assert dead == sorted(refused), where
        print(f"KV soak seed {seed}: {ROUNDS * ROWS} rows, {len(refused)} creates refused as nats-py refused them, "
              f"{len(log)} faults: {log}")
    finally:
        for name in (f"KV_{ours}", f"KV_{judge}", dlq):
            with contextlib.suppress(Exception):
                client.api(f"STREAM.DELETE.{name}")
        client.close()
