"""A seeded KV soak on an R3 bucket through leader step-downs and kills (issue #54; on request:
``pytest -m slow tests/chaos/test_kv_soak.py``, ``KV_SOAK_SEED`` replays a schedule).

A task writes a seeded mix of puts, deletes, purges and creates (``expected_revision`` 0: after a delete or
a purge they succeed as nats-py's ``kv.create`` does, on a live key they are refused and dead-lettered)
over a few keys, ``ROUNDS`` times, each write in its own task (``write_partition``, as Spark runs it),
while the bucket's leader steps down or is SIGKILLed every second or so and comes back. The judge is
nats-py's ``KeyValue`` making the same calls one after the other on a twin bucket of the same cluster,
with no faults. At the end each key's current value (``kv.get``) and history, and the refused rows, are the
judge's. The histories are read from every replica of both buckets, and each bucket's is the one a majority
of its replicas holds: a replica SIGKILLed after a purge can come back holding messages the purge removed
(a nats-server fault, seen on the judge's bucket as on ours; docs/guarantees.md), and nats-py's
``kv.history`` reads through a consumer that may sit on that replica. Replicas that differ are printed.
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

from ..helpers import SyncNats, kv_of, latest

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


def _held(client: SyncNats, bucket: str) -> dict[str, list[tuple[str, str]]]:
    """Each key's messages as the bucket's leader holds them, oldest first: (operation, value)."""
    out: dict[str, list[tuple[str, str]]] = {}
    for m in client.messages(f"KV_{bucket}"):
        op = (m.headers.get("KV-Operation") or ["PUT"])[-1].strip()
        out.setdefault(m.subject.split(".", 2)[2], []).append((op, m.data.decode()))
    return out


def _replica_views(client: SyncNats, bucket: str) -> dict[str, dict[str, list[tuple[str, str]]]]:
    """What each replica of ``bucket`` holds (:func:`_held`), each made the leader in turn (a step-down naming
    it): ``STREAM.MSG.GET`` is answered by the leader alone. A replica that does not take the lead within 60 s
    (still catching up, say) is left out."""
    stream, out = f"KV_{bucket}", {}
    info = client.api(f"STREAM.INFO.{stream}")["cluster"]
    for name in [info["leader"]] + [r["name"] for r in info.get("replicas", [])]:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # an answer lost mid-election: asked again
                if client.api(f"STREAM.INFO.{stream}").get("cluster", {}).get("leader") == name:
                    out[name] = _held(client, bucket)
                    break
                client.api(f"STREAM.LEADER.STEPDOWN.{stream}", {"placement": {"preferred": name}})
            time.sleep(0.5)
    return out


def _agreed(views: dict[str, dict[str, list[tuple[str, str]]]], key: str) -> tuple[list, list[str]]:
    """``key``'s history as a majority of the replicas hold it, and a note per replica that holds another.

    A replica can end holding more than the others (nats-server 2.15.1): SIGKILLed and started again, it keeps
    messages that a KV purge (``Nats-Rollup: sub``) had removed, on every bucket it replicates, whoever wrote
    them (docs/guarantees.md, "KV soak on an R3 bucket"). nats-py's ``kv.history`` reads through an R1
    consumer that may sit on that replica, so the soak judges what the quorum holds, and says which replica
    differs."""
    histories = {name: view.get(key, []) for name, view in views.items()}
    counts: dict[tuple, int] = {}
    for h in histories.values():
        counts[tuple(h)] = counts.get(tuple(h), 0) + 1
    best, votes = max(counts.items(), key=lambda item: item[1]) if counts else ((), 0)
    judged = "the majority's"
    if votes * 2 <= len(views):  # no majority: the first (the leader's) view is judged, and the others noted
        best, judged = tuple(next(iter(histories.values()), [])), "the leader's (no majority)"
    notes = [f"{key} on {name}: {len(h)} messages, {judged} {len(best)}"
             for name, h in histories.items() if tuple(h) != best]
    return list(best), notes


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
    rng = random.Random(seed)  # the rows; the faults draw from their own: a seed replays every round's rows
    faults_rng = random.Random(seed + 1_000_003)
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
            faults = threading.Thread(target=_faults, args=(client, nats_cluster, f"KV_{ours}", stop, log, faults_rng),
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
                        message = write_module.write_partition(plan, [batch])
                        log.append(f"round {round_no} attempt {attempt}: {message}")
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
        ours_views, judge_views = _replica_views(client, ours), _replica_views(client, judge)
        diverged: list[str] = []
        for k in range(KEYS):
            key = f"k{k}"
            assert latest(client, ours_kv, key) == latest(client, judge_kv, key), (key, where)
            (ours_history, ours_notes), (judge_history, judge_notes) = (_agreed(ours_views, key),
                                                                        _agreed(judge_views, key))
            diverged += [f"ours: {n}" for n in ours_notes] + [f"judge: {n}" for n in judge_notes]
            if ours_history != judge_history:
                Path(os.environ.get("KV_SOAK_LOG", "/dev/null")).write_text(
                    f"{key}\nours  {ours_history}\njudge {judge_history}\nours per replica "
                    f"{ {n: v.get(key) for n, v in ours_views.items()} }\njudge per replica "
                    f"{ {n: v.get(key) for n, v in judge_views.items()} }\n" + "\n".join(log))
            assert ours_history == judge_history, (key, where)
        dead = sorted(m.data.decode() for m in client.messages(dlq))
        assert dead == sorted(refused), where
        print(f"KV soak seed {seed}: {ROUNDS * ROWS} rows, {len(refused)} creates refused as nats-py refused them, "
              f"{sum(1 for line in log if not line.startswith('round'))} faults: {log}; replicas holding another "
              f"history than their bucket's majority (SIGKILLed after a purge): {diverged or 'none'}")
    finally:
        for name in (f"KV_{ours}", f"KV_{judge}", dlq):
            with contextlib.suppress(Exception):
                client.api(f"STREAM.DELETE.{name}")
        client.close()
