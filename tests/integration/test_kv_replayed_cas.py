"""Replayed compare-and-set rows (``expected_revision``, issue #33 item 8) are stored once and counted
as stored, not refused: a retried ``save()`` with its ``writeId`` and a micro-batch replayed from its
checkpoint, within the bucket's duplicate window and past it, with the sink's replay records
(``sinkState``, the default) and without them.

Why they need their own handling: nats-server 2.12 and later (single server) check a publish's
``Nats-Expected-Last-Subject-Sequence`` before its ``Nats-Msg-Id``, so a replayed row whose first
attempt was stored is refused with 10071 (the key has moved on) even inside the duplicate window;
past the window the server has forgotten the id as well."""

from __future__ import annotations

import contextlib
import datetime as dt

import pytest
from pyspark.errors import PySparkException, StreamingQueryException
from pyspark.sql import functions as F

from pyspark_jetstream.protocol import kv as kvp

from ..helpers import (
    forget_last_commit,
    history,
    jetstream_writer,
    kv_of,
    latest,
    read_limit,
    server_time,
    wait_until,
)

SCHEMA = "key string, data string, expected_revision long"
SHORT_NS = 2 * 10**9  # the duplicate window of a bucket whose replay comes later than it
LONG_NS = 120 * 10**9  # ... and of one whose replay comes within it


def _bucket(client, bucket: str, window_ns: int, history_: int = 1) -> object:
    """A bucket as nats-py creates it, with the duplicate window given; a live key ``u`` (revision 1)
    and a deleted key ``d`` (revisions 2, 3: its DEL tombstone)."""
    config = dict(kvp.new_bucket_config(bucket, kvp.BucketSettings(history=history_, storage="memory")),
                  duplicate_window=window_ns)
    reply = client.api(f"STREAM.CREATE.{kvp.stream_name(bucket)}", config)
    assert "error" not in reply, reply
    kv = kv_of(client, bucket)
    client.run(kv.put("u", b"old"))
    client.run(kv.put("d", b"old"))
    client.run(kv.delete("d"))
    return kv


def _past_the_window(client, stream: str, window_ns: int) -> None:
    """Wait until the duplicate window of every message ``stream`` holds has ended."""
    last = max(server_time(m.time) for m in client.messages(stream))
    ends = last + dt.timedelta(seconds=window_ns / 1e9 + 0.5)
    wait_until(lambda: dt.datetime.now(dt.timezone.utc) > ends, timeout=30, interval=0.1,
               what="the duplicate window to pass")


def _state(client, bucket: str) -> list[tuple]:
    """The bucket's messages: (key, seq, data, operation): a replay that stored anything changes it."""
    return [(m.subject.removeprefix(f"$KV.{bucket}."), m.seq, m.data, (m.headers.get("KV-Operation") or ["PUT"])[0])
            for m in client.messages(kvp.stream_name(bucket))]


def _state_option(state: str) -> dict[str, str]:
    return {} if state == "records" else {"sinkState": "none"}


@pytest.mark.parametrize("state", ["records", "none"])
@pytest.mark.parametrize("window_ns", [LONG_NS, SHORT_NS], ids=["within-window", "past-window"])
def test_a_batch_of_compare_and_set_rows_retried_with_its_write_id_is_stored_once(spark, nats_server, nats_client,
                                                                                 stream_name, window_ns, state):
    """A create, a create over a DEL tombstone (put again expecting it) and an update; the retry
    stores nothing and fails nothing."""
    bucket = stream_name
    kv = _bucket(nats_client, bucket, window_ns)
    df = spark.createDataFrame([("c", "created", 0), ("d", "again", 0), ("u", "updated", 1)], SCHEMA).coalesce(1)

    def save() -> None:
        jetstream_writer(df, nats_server.url, bucket=bucket, writeId=f"w-{stream_name}", **_state_option(state)).save()

    save()
    first = _state(nats_client, bucket)
    assert {k: data for k, _, data, _ in first} == {"c": b"created", "d": b"again", "u": b"updated"}
    if window_ns == SHORT_NS:
        _past_the_window(nats_client, kvp.stream_name(bucket), window_ns)
    save()  # the scheduler's retry
    assert _state(nats_client, bucket) == first
    assert {k: latest(nats_client, kv, k) for k in "cdu"} == {"c": b"created", "d": b"again", "u": b"updated"}


CHAIN = [("u", "v2", 1), ("u", "v3", 4), ("u", "v4", 5)]
"""Rows that each update the value the row before them wrote: revisions 4, 5, 6 (``d`` took 2 and 3)."""


def _write_chain(spark, server, client, bucket: str, write_id: str, state: str):
    df = spark.createDataFrame(CHAIN, SCHEMA).coalesce(1)

    def save() -> None:
        jetstream_writer(df, server.url, bucket=bucket, writeId=write_id, **_state_option(state)).save()

    save()
    assert client.stream_state(kvp.stream_name(bucket))["last_seq"] == 6
    return save


@pytest.mark.parametrize("state", ["records", "none"])
@pytest.mark.parametrize(("window_ns", "history_"), [(LONG_NS, 1), (SHORT_NS, 5)],
                         ids=["within-window-history-1", "past-window-history-5"])
def test_a_chain_of_compare_and_set_rows_on_one_key_retried_is_stored_once(spark, nats_server, nats_client,
                                                                           stream_name, state, window_ns, history_):
    """Within the window, with history 1: the first rows' messages are gone when the retry comes, replaced
    by the next; only the server's duplicate window remembers their ids. Past it, with history 5: the
    bucket still holds them, behind the key's last value."""
    bucket = stream_name
    kv = _bucket(nats_client, bucket, window_ns, history_)
    save = _write_chain(spark, nats_server, nats_client, bucket, f"w-{stream_name}", state)
    first = _state(nats_client, bucket)
    assert history(nats_client, kv, "u")[-1] == ("PUT", b"v4")
    if window_ns == SHORT_NS:
        _past_the_window(nats_client, kvp.stream_name(bucket), window_ns)
    save()
    assert _state(nats_client, bucket) == first


@pytest.mark.parametrize("state", ["records", "none"])
def test_a_chain_retried_past_the_window_after_its_first_values_were_replaced(spark, nats_server, nats_client,
                                                                              stream_name, state):
    """Past the window, history 1: the chain's first rows' messages were replaced by the next row of their
    key. With the replay records, the retry's scan finds the later rows of the run on the key, so the
    replaced ones count as stored (sink/records/superseded.py). Without them (``sinkState=none``) the limit of
    docs/kv.md holds: such a row cannot be told from a stale row, and is refused, never stored twice."""
    bucket = stream_name
    _bucket(nats_client, bucket, SHORT_NS)
    save = _write_chain(spark, nats_server, nats_client, bucket, f"w-{stream_name}", state)
    first = _state(nats_client, bucket)
    _past_the_window(nats_client, kvp.stream_name(bucket), SHORT_NS)
    if state == "records":
        save()
    else:
        with pytest.raises(PySparkException) as info:
            save()
        assert "10071" in str(info.value) and f"$KV.{bucket}.u" in str(info.value), str(info.value)[:3000]
    assert _state(nats_client, bucket) == first


def test_a_stale_row_in_a_retry_is_still_refused(spark, nats_server, nats_client, stream_name):
    """What makes a refused row 'stored' is its id in the bucket: a row that was refused the first
    time is refused and dead-lettered again; the created row beside it is not."""
    bucket = stream_name
    _bucket(nats_client, bucket, SHORT_NS)
    nats_client.add_stream(f"{stream_name}DLQ", [f"{stream_name}.dlq"], duplicate_window=SHORT_NS)
    df = spark.createDataFrame([("u", "stale", 7), ("c", "created", 0)], SCHEMA).coalesce(1)

    def save() -> None:
        jetstream_writer(df, nats_server.url, bucket=bucket, writeId=f"w-{stream_name}", sinkState="none",
                         deadLetterSubject=f"{stream_name}.dlq").save()

    save()
    [dead] = nats_client.messages(f"{stream_name}DLQ")
    assert dead.data == b"stale" and dead.headers["Spark-JetStream-Err-Code"] == ["10071"]
    _past_the_window(nats_client, f"{stream_name}DLQ", SHORT_NS)  # the bucket's, too: it is older
    save()  # with no records, past the window: dead-lettered again (at-least-once), never counted as stored
    assert [m.data for m in nats_client.messages(f"{stream_name}DLQ")] == [b"stale", b"stale"]
    assert [(k, data) for k, _, data, _ in _state(nats_client, bucket)] == [("u", b"old"), ("d", b""), ("c",
                                                                                                       b"created")]


@pytest.mark.parametrize("state", ["records", "none"])
def test_a_micro_batch_of_compare_and_set_rows_replayed_past_the_window_is_stored_once(
        spark, nats_server, nats_client, stream_name, state, tmp_path):
    """A driver crash between the last micro-batch's write and its commit; the restart from the
    checkpoint replays it later than the bucket's 2 s window. Creates of new keys, updates of the
    keys the bucket held (their revisions looked up from a side table)."""
    source, bucket = f"{stream_name}S", stream_name
    _bucket(nats_client, bucket, SHORT_NS)
    nats_client.add_stream(source, [f"{source}.>"])
    for key in ("c0", "c1", "u", "c2"):  # the last micro-batch: an update and a create
        assert "error" not in nats_client.publish_raw(f"{source}.{key}", None, f"new-{key}".encode())
    checkpoint = tmp_path / "chk"

    def run():
        rows = (spark.readStream.format("jetstream").option("servers", nats_server.url).option("stream", source)
                .option("startingOffsets", "earliest").options(**read_limit(2)).load()
                .select(F.element_at(F.split("subject", r"\."), -1).alias("key"), "data", "stream", "seq"))
        rows = rows.withColumn("expected_revision", F.when(F.col("key") == "u", F.lit(1)).otherwise(F.lit(0)))
        w = (rows.coalesce(1).writeStream.format("jetstream").option("servers", nats_server.url)
             .option("bucket", bucket).option("checkpointLocation", str(checkpoint)))
        for k, v in _state_option(state).items():
            w = w.option(k, v)
        q = w.trigger(availableNow=True).start()
        with contextlib.suppress(StreamingQueryException):
            assert q.awaitTermination(180), "the query did not finish"
        return q

    assert run().exception() is None
    first = _state(nats_client, bucket)
    assert {k: data for k, _, data, _ in first} == {"u": b"new-u", "d": b"", "c0": b"new-c0", "c1": b"new-c1",
                                                     "c2": b"new-c2"}
    last = forget_last_commit(checkpoint)
    _past_the_window(nats_client, kvp.stream_name(bucket), SHORT_NS)
    replayed = run()
    assert replayed.exception() is None, str(replayed.exception())[:3000]
    assert [p["batchId"] for p in replayed.recentProgress if p["numInputRows"]] == [last]
    assert _state(nats_client, bucket) == first


def test_a_refused_row_whose_stored_copy_was_moved_back_into_order_is_found(nats_server, nats_client, stream_name):
    """Issue #39, item 5: an ordered write that repaired a key's order after a leader change deleted the row's
    first copy and stored it again as ``<id>:o1`` (sink/publish/reorder.py). A replay of the row past the duplicate
    window is refused (the key moved on) and must be counted as stored: the key's last message carries the
    row under the moved copy's id."""
    from pyspark_jetstream.sink.records.cas_replay import stored_already

    bucket = f"b{stream_name.lower()}"
    kv = _bucket(nats_client, bucket, SHORT_NS)
    stream, subject = kvp.stream_name(bucket), f"{kvp.subject_prefix(bucket)}u"
    first = nats_client.publish_raw(subject, b"NATS/1.0\r\nNats-Msg-Id: R:0:5\r\n\r\n", b"new")
    nats_client.api(f"STREAM.MSG.DELETE.{stream}", {"seq": first["seq"], "no_erase": True})
    nats_client.publish_raw(subject, b"NATS/1.0\r\nNats-Msg-Id: R:0:5:o1\r\n\r\n", b"new")
    _past_the_window(nats_client, stream, SHORT_NS)
    found = nats_client.run(stored_already(nats_client.nc, stream, [(subject, "R:0:5", 1), (subject, "R:0:6", 1)]))
    assert found == [True, False]
    assert latest(nats_client, kv, "u") == b"new"
