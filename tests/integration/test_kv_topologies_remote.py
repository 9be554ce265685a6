"""Buckets in other shapes, continued (issue #54): a mirrored bucket reached through a JetStream domain
(a hub and a leaf node) or through an imported API prefix, and a bucket that sources several others with
subject transforms (as nats.go's KeyValueConfig.Sources makes it).

Each read is compared, field by field (key, value, revision, operation), with nats-py's KeyValue on the
same bucket reached the same way (``nc.jetstream(domain=...)`` / ``prefix=...``). nats-py 2.16's
``js.key_value(mirror)`` knows no mirrors (it looks for ``$KV.<mirror>.<key>`` and finds no keys), so a
mirror is read with nats-py's KeyValue set up as nats.go's ``KeyValue()`` sets one up for a mirror: the
mirror's stream, the origin's subjects."""

from __future__ import annotations

import time

import nats.js.errors
import pytest
from nats.js.kv import KeyValue

from pyspark_jetstream.tools.server import EmbeddedNatsServer

from ..helpers import SyncNats, _settled, kv_keys, new_bucket, wait_until
from .test_domains import hub_and_leaf  # noqa: F401 (a fixture)
from .test_kv_topologies import PUTS, _origin, _read

KEYS = sorted({key for key, _ in PUTS} | {"b", "d"})


def _mirror(client: SyncNats, name: str, origin: str, *, external: str | None = None, direct: bool = True) -> None:
    """``KV_<name>`` mirroring ``KV_<origin>`` as nats.go's CreateKeyValue(Mirror) makes it; ``external``: the
    API prefix of the origin's JetStream (``$JS.<domain>.API``: nats.go's ``Mirror.Domain``). Caught up."""
    source = {"name": f"KV_{origin}", **({"external": {"api": external}} if external else {})}
    config = {"name": f"KV_{name}", "mirror": source, "mirror_direct": direct, "allow_direct": direct,
              "max_msgs_per_subject": 5, "allow_rollup_hdrs": True, "deny_delete": True, "discard": "new",
              "storage": "file"}
    reply = client.api(f"STREAM.CREATE.KV_{name}", config)
    assert "error" not in reply, reply
    _caught_up(client, name, 9)  # the origin's last: 7 puts, a delete, a purge (rolling up d's put)


def _caught_up(client: SyncNats, bucket: str, last_seq: int) -> None:
    deadline = time.monotonic() + 30
    while (client.api(f"STREAM.INFO.KV_{bucket}").get("state") or {}).get("last_seq", 0) < last_seq:
        assert time.monotonic() < deadline, f"KV_{bucket} did not take its {last_seq} messages within 30 s"
        time.sleep(0.05)


def _nats_view(client: SyncNats, kv: KeyValue, keys: list[str]) -> tuple[dict, list]:
    """What nats-py's KeyValue says: each live key's (value, revision), and every key's history as
    (key, operation, value, revision) in revision order."""
    state = {}
    for key in kv_keys(client, kv):
        entry = client.run(kv.get(key))
        state[key] = (entry.value, entry.revision)

    def entries(key: str) -> list:
        try:
            return client.run(kv.history(key))
        except nats.js.errors.NoKeysError:  # the watcher's replay ended early (CI, through a domain): asked
            return []  # again by _settled, as kv_keys does

    def log() -> list:
        return sorted(((e.key, e.operation or "PUT", e.value, e.revision) for key in keys
                       for e in entries(key)), key=lambda row: row[3])

    return state, _settled(log)


def _compare(spark, url: str, bucket: str, client: SyncNats, kv: KeyValue, keys: list[str], key_bucket: str,
             **options) -> tuple[dict, list]:
    """The connector's latest view, option 'keys', key column and change log of ``bucket`` against nats-py's."""
    state, log = _nats_view(client, kv, keys)
    rows = _read(spark, url, bucket, kv__view="latest", **options)
    assert {r.key: (r.data, r.seq) for r in rows} == state and state
    assert all(r.operation == "PUT" and r.subject == f"$KV.{key_bucket}.{r.key}" for r in rows)
    some = sorted(keys)[1::2] + sorted(keys)[:1]  # live keys, deleted and purged ones
    picked = _read(spark, url, bucket, kv__view="latest", keys=",".join(some), **options)
    assert {r.key: (r.data, r.seq) for r in picked} == {k: v for k, v in state.items() if k in some}
    changes = _read(spark, url, bucket, **options)
    assert [(r.key, r.operation, r.data, r.seq) for r in changes] == log
    assert all(r.subject == f"$KV.{key_bucket}.{r.key}" for r in changes)
    reader = spark.readStream.format("jetstream").option("servers", url).option("bucket", bucket)
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (reader.option("startingOffsets", "earliest").load().select("key", "operation", "data", "seq")
             .writeStream.format("memory").queryName(f"s{bucket.lower()}").trigger(availableNow=True).start())
    assert query.awaitTermination(120) and query.exception() is None
    streamed = sorted((tuple(r) for r in spark.sql(f"select * from s{bucket.lower()}").collect()), key=lambda r: r[3])
    assert streamed == log
    return state, log


def _drop(client: SyncNats, *names: str) -> None:
    for name in names:
        client.api(f"STREAM.DELETE.KV_{name}")


WHERE = ["hub-mirror-from-the-leaf", "leaf-mirror-of-the-hub-from-the-hub"]


@pytest.mark.parametrize("direct", [True, False], ids=["mirror_direct", "no-direct"])
@pytest.mark.parametrize("where", WHERE)
def test_a_mirror_reached_through_a_domain_reads_as_nats_py_reads_it(spark, hub_and_leaf, stream_name, where,  # noqa: F811
                                                                    direct):
    """The mirror on the hub, read from the leaf (option 'domain' = hub); or a mirror on the leaf of a bucket
    on the hub (its ``mirror.external.api`` = ``$JS.hub.API``), read from the hub (option 'domain' = leaf)."""
    hub, leaf, on_hub, on_leaf = hub_and_leaf
    origin, mirror = stream_name, stream_name + "M"
    if where == WHERE[0]:
        owner, reader, domain = on_hub, SyncNats(leaf.url), "hub"
        _origin(on_hub, origin, 1)
        _mirror(on_hub, mirror, origin, direct=direct)
    else:
        owner, reader, domain = on_leaf, SyncNats(hub.url), "leaf"
        _origin(on_hub, origin, 1)
        _mirror(on_leaf, mirror, origin, external="$JS.hub.API", direct=direct)
    try:
        reader.js = reader.nc.jetstream(domain=domain)
        kv = KeyValue(name=mirror, stream=f"KV_{mirror}", pre=f"$KV.{origin}.", js=reader.js, direct=direct)
        url = leaf.url if domain == "hub" else hub.url
        state, log = _compare(spark, url, mirror, reader, kv, KEYS, origin, domain=domain)
        assert state == {"a": (b"2", 3), "c": (b"2", 6), "e/f=g.h": (b"1", 7)} and len(log) == 8
        # Without the domain the connected server's own JetStream answers, which has no such bucket.
        with pytest.raises(Exception, match="does not exist"):
            _read(spark, url, mirror)
    finally:
        _drop(owner, mirror)
        _drop(on_hub, origin)
        reader.close()


def test_a_write_to_a_mirror_through_a_domain_is_refused_naming_its_origin(spark, hub_and_leaf, stream_name):  # noqa: F811
    hub, leaf, on_hub, _ = hub_and_leaf
    origin, mirror = stream_name, stream_name + "M"
    _origin(on_hub, origin, 1)
    _mirror(on_hub, mirror, origin)
    try:
        df = spark.createDataFrame([("a", "x")], "key string, data string")
        with pytest.raises(Exception) as info:
            (df.write.format("jetstream").mode("append").option("servers", leaf.url).option("domain", "hub")
             .option("bucket", mirror).save())
        assert f"is a mirror of 'KV_{origin}'" in str(info.value)
        assert on_hub.stream_state(f"KV_{origin}")["last_seq"] == 9 and on_hub.stream_state(f"KV_{mirror}")[
            "last_seq"] == 9
    finally:
        _drop(on_hub, mirror, origin)


PUSHED = """
accounts {
  JS: {
    jetstream: enabled
    users: [ { user: js, password: js } ]
    exports: [ { service: "$JS.API.>", response_type: stream }, { service: "$JS.FC.>" }, { stream: "app.inbox.>" } ]
  }
  APP: {
    users: [ { user: app, password: app } ]
    imports: [
      { service: { account: JS, subject: "$JS.API.>" }, to: "JS.acct.API.>" }
      { service: { account: JS, subject: "$JS.FC.>" } }
      { stream: { account: JS, subject: "app.inbox.>" } }
    ]
  }
}
"""
"""test_domains.ACCOUNTS, and what nats-py's KV needs besides for ``keys()`` and ``history()``: their push
consumers deliver to APP's inboxes (``app.inbox.>``, exported as a stream) and take flow-control replies."""


def test_a_mirror_reached_through_an_api_prefix_reads_as_nats_py_reads_it(spark, stream_name):
    """Account APP has no JetStream: it reaches account JS's under ``JS.acct.API`` (option 'apiPrefix')."""
    with EmbeddedNatsServer(config=PUSHED) as server:
        owner = SyncNats(server.url.replace("nats://", "nats://js:js@"))
        reader = SyncNats(server.url.replace("nats://", "nats://app:app@"), inbox_prefix="app.inbox")
        try:
            origin, mirror = stream_name, stream_name + "M"
            _origin(owner, origin, 1)
            _mirror(owner, mirror, origin)
            reader.js = reader.nc.jetstream(prefix="JS.acct.API")
            kv = KeyValue(name=mirror, stream=f"KV_{mirror}", pre=f"$KV.{origin}.", js=reader.js, direct=True)
            state, log = _compare(spark, server.url, mirror, reader, kv, KEYS, origin, user="app", password="app",
                                  apiPrefix="JS.acct.API")
            assert state == {"a": (b"2", 3), "c": (b"2", 6), "e/f=g.h": (b"1", 7)} and len(log) == 8
        finally:
            reader.close()
            owner.close()


B_PUTS = [("a", b"B1"), ("x", b"1"), ("c", b"B2"), ("x/y", b"2")]


@pytest.mark.parametrize("deployment", ["R1", "R3"])
def test_a_bucket_sourcing_others_through_subject_transforms_reads_as_nats_py_reads_it(
        spark, request, stream_name, deployment):
    """``KV_<name>`` takes its own ``$KV.<name>.>`` and sources ``KV_<a>`` and ``KV_<b>``, each through a
    subject transform onto its own subjects (nats.go's KeyValueConfig.Sources): read by its own name, as
    nats-py's ``js.key_value(name)`` reads it, latest view, keys, key column, change log and a stream."""
    server, replicas = ((request.getfixturevalue("nats_server"), 1) if deployment == "R1"
                        else (request.getfixturevalue("nats_cluster"), 3))
    first, second, name = stream_name + "A", stream_name + "B", stream_name + "S"
    client = SyncNats(server.url)
    try:
        _origin(client, first, replicas)
        kv_b = new_bucket(client, second, history=5, replicas=replicas)
        for key, value in B_PUTS:
            client.run(kv_b.put(key, value))
        client.run(kv_b.delete("x"))
        sources = [{"name": f"KV_{b}", "subject_transforms": [{"src": f"$KV.{b}.>", "dest": f"$KV.{name}.>"}]}
                   for b in (first, second)]
        config = {"name": f"KV_{name}", "subjects": [f"$KV.{name}.>"], "sources": sources, "allow_direct": True,
                  "max_msgs_per_subject": 5, "allow_rollup_hdrs": True, "deny_delete": True, "discard": "new",
                  "num_replicas": replicas, "storage": "file"}
        created = wait_until(lambda: (lambda r: None if (r.get("error") or {}).get("err_code") == 10008 else r)(
            client.api(f"STREAM.CREATE.KV_{name}", config)), timeout=30, what=f"KV_{name} created")
        assert "error" not in created, created
        _caught_up(client, name, 8 + len(B_PUTS) + 1)  # what the two hold (a's put of 'd' was rolled up)
        kv = client.run(client.js.key_value(name))
        keys = sorted({key for key, _ in PUTS + B_PUTS} | {"b", "d"})
        state, log = _compare(spark, server.url, name, client, kv, keys, name)
        assert set(state) == {"a", "c", "e/f=g.h", "x/y"} and len(log) == 8 + len(B_PUTS) + 1
        assert sorted(row[3] for row in log) == list(range(1, len(log) + 1))  # every message is still held

    finally:
        _drop(client, name, first, second)
        client.close()
