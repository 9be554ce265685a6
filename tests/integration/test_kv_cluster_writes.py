"""Compare-and-set, create, delete and purge rows on one server and on an R3 bucket (issue #54), judged by
nats-py's ``KeyValue`` making the same calls one after the other on a twin bucket, message by message.

The sink pipelines its rows, where nats-py awaits each PubAck before the next call. On a cluster a row
that expects a key's last revision is checked before the key's previous message is applied, so a delete
then a create of the same key failed in 20 of 20 runs (10071/10164, then a 503/10008 on the look-up that
follows); the task now lets such a row wait for the key's earlier rows (sink/task/key_barrier.py).
"""

from __future__ import annotations

import pytest

from ..helpers import SyncNats, history, jetstream_writer, kv_of, latest, wait_until

SCHEMA = "key string, data string, operation string, expected_revision long"

PREPARED = [("a", b"v0"), ("b", b"v0"), ("c", b"v0")]
"""Each bucket's keys before the write: revisions 1, 2 and 3."""

ROWS = [
    ("a", None, "DEL", None),  # 4
    ("a", "v1", None, 0),  # a create after a delete: refused (a tombstone is there), put again expecting 4: 5
    ("b", "v1", None, 2),  # 6
    ("b", "v2", None, 6),  # expects the row just before it: 7
    ("c", None, "PURGE", None),  # 8
    ("c", "v1", None, 0),  # 9
    ("a", "v2", None, None),  # 10
    ("b", "v3", None, 7),  # 11
]


async def _judge(kv) -> None:
    """What nats-py's KeyValue makes of :data:`ROWS`, one call after the other."""
    await kv.delete("a")
    await kv.create("a", b"v1")
    await kv.update("b", b"v1", last=2)
    await kv.update("b", b"v2", last=6)
    await kv.purge("c")
    await kv.create("c", b"v1")
    await kv.put("a", b"v2")
    await kv.update("b", b"v3", last=7)


def _messages(client: SyncNats, bucket: str) -> list[tuple]:
    return [(m.subject.removeprefix(f"$KV.{bucket}."), m.seq, m.data,
             m.headers.get("Nats-Expected-Last-Subject-Sequence"), m.headers.get("KV-Operation"))
            for m in client.messages(f"KV_{bucket}")]


def _bucket(client: SyncNats, name: str, replicas: int, batched: bool):
    kv = client.run(client.js.create_key_value(bucket=name, history=10, replicas=replicas))
    if replicas > 1:  # a new R3 stream answers publishes once it has elected a leader
        wait_until(lambda: (client.api(f"STREAM.INFO.KV_{name}").get("cluster") or {}).get("leader"), timeout=30,
                   what=f"a leader of KV_{name}")
    for key, value in PREPARED:
        client.run(kv.put(key, value))
    if batched:
        config = {**client.stream_config(f"KV_{name}"), "allow_batched": True}
        assert client.api(f"STREAM.UPDATE.KV_{name}", config)["config"]["allow_batched"] is True
    return kv


@pytest.mark.parametrize("mode", ["acked", "batched"])
@pytest.mark.parametrize("deployment", ["R1", "R3"])
def test_key_operations_in_one_task_give_what_nats_py_gives_one_call_at_a_time(spark, nats_server, nats_cluster,
                                                                               stream_name, deployment, mode):
    server, replicas = (nats_server, 1) if deployment == "R1" else (nats_cluster, 3)
    client = SyncNats(server.url)
    try:
        ours, judge = stream_name, stream_name + "J"
        _bucket(client, ours, replicas, mode == "batched")
        judge_kv = _bucket(client, judge, replicas, False)
        client.run(_judge(judge_kv))
        for attempt in range(3):  # the same write again, each time into a fresh pair of buckets
            if attempt:
                for name in (ours, judge):
                    client.api(f"STREAM.DELETE.KV_{name}")
                _bucket(client, ours, replicas, mode == "batched")
                judge_kv = _bucket(client, judge, replicas, False)
                client.run(_judge(judge_kv))
            df = spark.createDataFrame(ROWS, SCHEMA).coalesce(1)
            jetstream_writer(df, server.url, bucket=ours, **{"publish.mode": mode}).save()
            assert _messages(client, ours) == _messages(client, judge), attempt
            ours_kv = kv_of(client, ours)
            for key in ("a", "b", "c"):
                assert history(client, ours_kv, key) == history(client, judge_kv, key), (attempt, key)
                assert latest(client, ours_kv, key) == latest(client, judge_kv, key), (attempt, key)
    finally:
        client.close()
