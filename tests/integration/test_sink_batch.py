"""df.write.format("jetstream"): columns, TTLs, streams, errors, dead letters, secrets."""

from __future__ import annotations

import datetime as dt
import itertools

import pytest
from pyspark.sql import Row
from pyspark.sql import functions as F

from ..helpers import server_time, wait_until, write


def test_auto_registration_needs_no_register_call(spark, nats_server, nats_client, stream_name):
    # Nothing in the test suite calls spark.dataSource.register: Spark found DefaultSource itself.
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    df = spark.createDataFrame([(f"{stream_name}.a", b"hi")], "subject string, data binary")
    df.write.format("jetstream").option("servers", nats_server.url).mode("append").save()
    assert [m.data for m in nats_client.messages(stream_name)] == [b"hi"]


DATA = {"binary": ("binary", lambda i: f"d{i}".encode()), "string": ("string", lambda i: f"d{i}")}
HEADERS = {
    "none": (None, None),
    "map": ("map<string,string>", lambda i: {"X-I": str(i)}),
    "multi": ("map<string,array<string>>", lambda i: {"X-I": [str(i), "two"]}),
}
TTLS = {"none": (None, None), "string": ("string", lambda i: "1h"), "int": ("int", lambda i: 3600)}
SUBJECT = ["column", "option"]


@pytest.mark.parametrize("data, headers, ttl, subject", list(itertools.product(DATA, HEADERS, TTLS, SUBJECT)))
def test_every_column_type_combination(spark, nats_server, nats_client, stream_name, data, headers, ttl, subject):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"], allow_msg_ttl=True)
    fields, makers = [], []
    if subject == "column":
        fields.append("subject string")
        makers.append(lambda i: f"{stream_name}.s{i}")
    for name, spec in (("data", DATA[data]), ("headers", HEADERS[headers]), ("ttl", TTLS[ttl])):
        if spec[0] is not None:
            fields.append(f"{name} {spec[0]}")
            makers.append(spec[1])
    rows = [tuple(m(i) for m in makers) for i in range(3)]
    df = spark.createDataFrame(rows, ", ".join(fields))
    opts = {"stream": stream_name}
    if subject == "option":
        opts["subject"] = f"{stream_name}.fixed"
    write(df, nats_server, **opts)

    msgs = sorted(nats_client.messages(stream_name), key=lambda m: m.data)
    assert [m.data for m in msgs] == [f"d{i}".encode() for i in range(3)]
    for i, m in enumerate(msgs):
        assert m.subject == (f"{stream_name}.s{i}" if subject == "column" else f"{stream_name}.fixed")
        assert m.headers.get("Nats-TTL") == (None if ttl == "none" else ["1h" if ttl == "string" else "3600"])
        expected_x = {"none": None, "map": [str(i)], "multi": [str(i), "two"]}[headers]
        assert m.headers.get("X-I") == expected_x
        assert m.headers["Nats-Expected-Stream"] == [stream_name]
        assert len(m.headers["Nats-Msg-Id"]) == 1


def test_default_ttl_applies_only_where_row_ttl_is_null(spark, nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"], allow_msg_ttl=True)
    df = spark.createDataFrame(
        [("a", "5m"), ("b", None), ("c", "0"), ("d", "never")], "data string, ttl string"
    ).coalesce(1)
    write(df, nats_server, stream=stream_name, subject=f"{stream_name}.x", defaultTtl="90s")
    ttls = {m.data: m.headers.get("Nats-TTL") for m in nats_client.messages(stream_name)}
    assert ttls == {b"a": ["5m"], b"b": ["90s"], b"c": None, b"d": ["never"]}


def test_never_survives_max_age_and_one_second_ttl_expires(spark, nats_server, nats_client, stream_name):
    # A 1s TTL ends its own message only: its neighbours (1h, none, never) stay.
    nats_client.add_stream(stream_name, [f"{stream_name}.>"], allow_msg_ttl=True)
    rows = [("forever", "never"), ("short", "1s"), ("hour", "1h"), ("plain", None)]
    write(spark.createDataFrame(rows, "data string, ttl string").coalesce(1), nats_server, stream=stream_name,
          subject=f"{stream_name}.x")

    def data(stream):
        return {m.data for m in nats_client.messages(stream)}

    assert nats_client.stream_state(stream_name)["last_seq"] == 4  # all four were stored
    wait_until(lambda: b"short" not in data(stream_name), timeout=10, what="the 1s TTL message expires")
    assert data(stream_name) == {b"forever", b"hour", b"plain"}
    # MaxAge removes everything but 'never', a finite TTL included.
    aged = stream_name + "AGE"
    nats_client.add_stream(aged, [f"{aged}.>"], allow_msg_ttl=True, max_age=2 * 10**9)
    write(spark.createDataFrame([r for r in rows if r[0] != "short"], "data string, ttl string").coalesce(1),
          nats_server, stream=aged, subject=f"{aged}.x")
    wait_until(lambda: data(aged) == {b"forever"}, timeout=15, what="MaxAge removes all but 'never'")


def test_preserve_expiry_copies_remaining_lifetime(spark, nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"], allow_msg_ttl=True)
    now = dt.datetime.now(dt.timezone.utc)
    rows = [
        Row(data="in_2m", expires_at=now + dt.timedelta(seconds=120), ttl=None),
        Row(data="gone", expires_at=now - dt.timedelta(seconds=5), ttl="1h"),
        Row(data="never", expires_at=None, ttl="never"),
    ]
    df = spark.createDataFrame(rows, "data string, expires_at timestamp, ttl string").coalesce(1)
    write(df, nats_server, stream=stream_name, subject=f"{stream_name}.x", preserveExpiry="true")
    msgs = {m.data: m for m in nats_client.messages(stream_name)}
    assert set(msgs) == {b"in_2m", b"never"}
    stored_ttl = int(msgs[b"in_2m"].headers["Nats-TTL"][0])
    stored_at = server_time(msgs[b"in_2m"].time)
    # The TTL is the lifetime left when the row was encoded (after `now`, before `stored_at`), rounded
    # up: the copy never expires before the original, and later only by the encode-to-store time + 1s.
    original = now + dt.timedelta(seconds=120)
    expiry = stored_at + dt.timedelta(seconds=stored_ttl)
    assert stored_ttl <= 120
    assert original <= expiry <= original + (stored_at - now) + dt.timedelta(seconds=1)
    assert msgs[b"never"].headers["Nats-TTL"] == ["never"]


def test_ttl_rows_into_stream_without_allow_msg_ttl_fail_before_publishing(spark, nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    df = spark.createDataFrame([("a", "1h"), ("b", None)], "data string, ttl string")
    with pytest.raises(Exception, match="AllowMsgTTL is false"):
        write(df, nats_server, stream=stream_name, subject=f"{stream_name}.x")
    with pytest.raises(Exception, match="AllowMsgTTL is false"):
        write(df.select("data"), nats_server, subject=f"{stream_name}.x", defaultTtl="1h")
    assert nats_client.stream_state(stream_name)["messages"] == 0
    # Rows that cannot carry a TTL are fine.
    write(df.select("data"), nats_server, stream=stream_name, subject=f"{stream_name}.x")
    assert nats_client.stream_state(stream_name)["messages"] == 2


def test_ensure_stream_validate_refuses_a_missing_stream(spark, nats_server, stream_name):
    df = spark.createDataFrame([("a",)], "data string")
    with pytest.raises(Exception, match=f"Stream '{stream_name}' does not exist"):
        write(df, nats_server, stream=stream_name, subject=f"{stream_name}.x")


def test_ensure_stream_create(spark, nats_server, nats_client, stream_name):
    df = spark.createDataFrame([("a", "1h")], "data string, ttl string")
    write(df, nats_server, stream=stream_name, subject=f"{stream_name}.x", ensureStream="create",
          stream__subjects=f"{stream_name}.>", stream__subjectDeleteMarkerTtl="2s", stream__maxMsgsPerSubject="1",
          stream__storage="memory", stream__duplicateWindow="5m")
    config = nats_client.stream_config(stream_name)
    assert config["allow_msg_ttl"] is True and config["subject_delete_marker_ttl"] == 2 * 10**9
    assert config["allow_rollup_hdrs"] is True and config["deny_purge"] is False
    assert config["max_msgs_per_subject"] == 1 and config["storage"] == "memory"
    assert config["duplicate_window"] == 300 * 10**9
    assert nats_client.stream_state(stream_name)["messages"] == 1
    # A second run finds the stream and only validates it.
    write(df, nats_server, stream=stream_name, subject=f"{stream_name}.y", ensureStream="create")
    assert nats_client.stream_state(stream_name)["messages"] == 2


def test_ensure_stream_update_enables_ttl_and_markers(spark, nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"], allow_rollup_hdrs=False)
    df = spark.createDataFrame([("a", "1h")], "data string, ttl string")
    with pytest.raises(Exception, match="AllowMsgTTL is false"):
        write(df, nats_server, stream=stream_name, subject=f"{stream_name}.x")
    write(df, nats_server, stream=stream_name, subject=f"{stream_name}.x", ensureStream="update",
          stream__subjectDeleteMarkerTtl="1s")
    config = nats_client.stream_config(stream_name)
    assert config["allow_msg_ttl"] is True and config["subject_delete_marker_ttl"] == 10**9
    assert config["allow_rollup_hdrs"] is True and config["deny_purge"] is False
    assert nats_client.stream_state(stream_name)["messages"] == 1


def test_ensure_stream_update_refuses_markers_on_a_deny_purge_stream(spark, nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"], deny_purge=True)
    df = spark.createDataFrame([("a", "1h")], "data string, ttl string")
    with pytest.raises(Exception, match="DenyPurge=true, which an update cannot turn off"):
        write(df, nats_server, stream=stream_name, subject=f"{stream_name}.x", ensureStream="update",
              stream__subjectDeleteMarkerTtl="1s")
    assert nats_client.stream_config(stream_name).get("allow_msg_ttl") is not True
    assert nats_client.stream_state(stream_name)["messages"] == 0


def test_ensure_stream_refuses_a_mirror(spark, nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name + "O", [f"{stream_name}.>"])
    reply = nats_client.api(f"STREAM.CREATE.{stream_name}M", {"name": f"{stream_name}M", "mirror": {"name": stream_name + "O"}, "storage": "memory"})
    assert "error" not in reply
    df = spark.createDataFrame([("a",)], "data string")
    with pytest.raises(Exception, match="is a mirror"):
        write(df, nats_server, stream=f"{stream_name}M", subject=f"{stream_name}.x", ensureStream="update",
              stream__subjectDeleteMarkerTtl="1s")
    assert "subject_delete_marker_ttl" not in nats_client.stream_config(f"{stream_name}M")


def test_bad_options_fail_at_start_naming_the_option(spark, nats_server, nats_client, stream_name):
    df = spark.createDataFrame([("a",)], "data string")
    for key, value, needle in [
        ("defaultTtl", "500ms", "'defaultTtl': '500ms'"),
        ("stream.subjectDeleteMarkerTtl", "500ms", "'stream.subjectDeleteMarkerTtl'"),
        ("ensureStream", "sometimes", "'ensureStream': 'sometimes'"),
        ("maxPendingAck", "10", "Did you mean 'maxPendingAcks'"),
    ]:
        with pytest.raises(Exception, match=needle):
            write(df, nats_server, subject="x.y", **{key.replace(".", "__"): value})
    with pytest.raises(Exception, match="Unknown column.*'extra'"):
        write(df.withColumn("extra", F.lit(1)), nats_server, subject="x.y")
    with pytest.raises(Exception, match="only appends"):
        df.write.format("jetstream").mode("overwrite").option("servers", nats_server.url).option("subject", "x.y").save()


@pytest.mark.parametrize("kind", ["struct", "array", "map"])
def test_a_nested_data_column_is_refused_at_start_and_the_suggested_to_json_works(spark, nats_server, nats_client,
                                                                                   stream_name, kind):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    value = {"struct": F.struct(F.lit(1).alias("id"), F.lit("a").alias("name")), "array": F.array(F.lit(1), F.lit(2)),
             "map": F.create_map(F.lit("id"), F.lit(1))}[kind]
    df = spark.range(1).select(value.alias("Data"))
    with pytest.raises(Exception) as info:
        write(df, nats_server, stream=stream_name, subject=f"{stream_name}.x")
    text = str(info.value)
    assert "SchemaError" in text and "Column 'Data' has type" in text and "expected binary or string" in text
    assert ".withColumn('Data', to_json('Data'))" in text and "to_json(struct(...))" in text, text[:2000]
    assert nats_client.stream_state(stream_name)["messages"] == 0
    # The suggestion, as written, makes the column writable.
    write(df.withColumn("Data", F.to_json("Data")), nats_server, stream=stream_name, subject=f"{stream_name}.x")
    stored = nats_client.run(nats_client.js.get_msg(stream_name, 1))
    assert stored.data == {"struct": b'{"id":1,"name":"a"}', "array": b"[1,2]", "map": b'{"id":1}'}[kind]


def test_bad_row_fails_with_subject_position_and_code(spark, nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"], allow_msg_ttl=True)
    nats_client.add_stream(stream_name + "B", [f"{stream_name}B.>"])
    rows = [(f"{stream_name}.ok", "1", None), (f"{stream_name}.ok", "2", "500ms"), (f"{stream_name}.ok", "3", None)]
    df = spark.createDataFrame(rows, "subject string, data string, ttl string").coalesce(1)
    with pytest.raises(Exception) as info:
        write(df, nats_server, stream=stream_name)
    text = str(info.value)
    assert f"row 1 of partition 0 to subject '{stream_name}.ok'" in text
    assert "below the 1 second minimum" in text and "column 'ttl' value '500ms'" in text

    # A row the server rejects: its subject belongs to another stream (Nats-Expected-Stream, err_code 10060).
    rows = [(f"{stream_name}.ok", "1"), (f"{stream_name}B.other", "2")]
    df = spark.createDataFrame(rows, "subject string, data string").coalesce(1)
    with pytest.raises(Exception) as info:
        write(df, nats_server, stream=stream_name)
    text = str(info.value)
    assert f"row 1 of partition 0 to subject '{stream_name}B.other'" in text and "err_code 10060" in text


def test_dead_letter_subject_catches_rejected_rows(spark, nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"], allow_msg_ttl=True)
    nats_client.add_stream(stream_name + "B", [f"{stream_name}B.>"])
    nats_client.add_stream(stream_name + "DLQ", [f"{stream_name}dlq"])
    rows = [
        (f"{stream_name}.ok", "good1", None),
        (f"{stream_name}.ok", "badttl", "500ms"),
        (f"{stream_name}B.other", "wrongstream", None),
        (f"{stream_name}.*", "wildcard", None),
        (f"{stream_name}.ok", "good2", "1h"),
    ]
    df = spark.createDataFrame(rows, "subject string, data string, ttl string").coalesce(1)
    write(df, nats_server, stream=stream_name, deadLetterSubject=f"{stream_name}dlq")
    assert [m.data for m in nats_client.messages(stream_name)] == [b"good1", b"good2"]
    assert nats_client.stream_state(stream_name + "B")["messages"] == 0
    dead = {m.data: m.headers for m in nats_client.messages(stream_name + "DLQ")}
    assert set(dead) == {b"badttl", b"wrongstream", b"wildcard"}
    assert dead[b"badttl"]["Spark-JetStream-Err-Code"] == ["client"]
    assert "1 second minimum" in dead[b"badttl"]["Spark-JetStream-Error"][0]
    assert dead[b"wrongstream"]["Spark-JetStream-Err-Code"] == ["10060"]
    assert dead[b"wrongstream"]["Spark-JetStream-Original-Subject"] == [f"{stream_name}B.other"]
    assert dead[b"wildcard"]["Spark-JetStream-Row"] == ["0:3"]
    assert "Nats-TTL" not in dead[b"badttl"]


@pytest.mark.parametrize("column, ttl_type, bad, shown", [("ttl", "string", "1 hour", "'1 hour'"),
                                                            ("TTL", "int", -5, "-5")])
def test_a_ttl_the_connector_refuses_is_named_in_the_dead_letter_and_in_the_error(
        spark, nats_server, nats_client, stream_name, column, ttl_type, bad, shown):
    """The refused value is what the user must find and fix: the dead letter carries it as
    Spark-JetStream-Original-TTL and in Spark-JetStream-Error (with the column as spelled); without
    a dead-letter subject the task's error names both."""
    nats_client.add_stream(stream_name, [f"{stream_name}.>"], allow_msg_ttl=True)
    nats_client.add_stream(stream_name + "DLQ", [f"{stream_name}dlq"])
    good = "3600" if ttl_type == "string" else 3600
    df = spark.createDataFrame([("good", good), ("bad", bad)], f"data string, {column} {ttl_type}").coalesce(1)
    write(df, nats_server, stream=stream_name, subject=f"{stream_name}.x", deadLetterSubject=f"{stream_name}dlq")
    assert [m.data for m in nats_client.messages(stream_name)] == [b"good"]
    # nats-py's own JetStream API reads the dead letter back.
    dead = nats_client.run(nats_client.js.get_msg(stream_name + "DLQ", 1))
    assert dead.data == b"bad" and dead.headers["Spark-JetStream-Err-Code"] == "client"
    assert dead.headers["Spark-JetStream-Original-TTL"] == str(bad)
    error = dead.headers["Spark-JetStream-Error"]
    assert f"column '{column}' value {shown}" in error, error
    assert "Nats-TTL" not in dead.headers

    with pytest.raises(Exception) as info:
        write(df, nats_server, stream=stream_name, subject=f"{stream_name}.x")
    text = str(info.value)
    assert "PublishError" in text and f"row 1 of partition 0 to subject '{stream_name}.x'" in text
    assert f"column '{column}' value {shown}" in text, text[-2000:]


def test_a_row_no_stream_takes_names_where_its_subject_could_go(spark, nats_server, nats_client, stream_name):
    """A 503 (no stream captures the row's subject): with option 'stream' the error lists that stream's
    subjects; without it, the streams capturing subjects under the same first token (or that none do)."""
    s = stream_name
    nats_client.add_stream(s, [f"{s}.a", f"{s}.b.>"])
    nats_client.add_stream(s + "DLQ", [f"{s}dlq"])
    df = spark.createDataFrame([(f"{s}.c", "x")], "subject string, data string")
    subjects = f"'{s}.a', '{s}.b.>'"
    with pytest.raises(Exception) as info:
        write(df, nats_server, stream=s)
    text = str(info.value)
    assert "no stream captures this subject" in text and f"stream '{s}' (option 'stream') captures {subjects}" in text
    write(df, nats_server, stream=s, deadLetterSubject=f"{s}dlq")
    dead = nats_client.run(nats_client.js.get_msg(s + "DLQ", 1))
    assert dead.headers["Spark-JetStream-Err-Code"] == "status 503"
    assert f"stream '{s}' (option 'stream') captures {subjects}" in dead.headers["Spark-JetStream-Error"]

    with pytest.raises(Exception) as info:
        write(df, nats_server)
    assert f"under '{s}.>': stream '{s}' captures {subjects}" in str(info.value), str(info.value)[-2000:]
    alone = spark.createDataFrame([(f"NONE{s}.c", "x")], "subject string, data string")
    with pytest.raises(Exception) as info:
        write(alone, nats_server)
    assert f"no stream captures any subject under 'NONE{s}.>'" in str(info.value), str(info.value)[-2000:]
    assert nats_client.stream_state(s)["messages"] == 0


def test_ensure_stream_create_names_the_stream_that_already_captures_the_subjects(spark, nats_server, nats_client,
                                                                                  stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    df = spark.createDataFrame([("x",)], "data string")
    with pytest.raises(Exception) as info:
        write(df, nats_server, stream=stream_name + "B", ensureStream="create", subject=f"{stream_name}.x",
              stream__subjects=f"{stream_name}.x")
    text = str(info.value)
    assert "StreamConfigError" in text and "subjects overlap with an existing stream (err_code 10065)" in text
    assert f"stream '{stream_name}' captures '{stream_name}.>'" in text, text[-2000:]
    assert "Write to that stream (option 'stream')" in text
    assert "error" in nats_client.api(f"STREAM.INFO.{stream_name}B")  # not created


@pytest.mark.parametrize("cause", ["client-side", "server-side"])
def test_dead_letters_never_exceed_max_payload(spark, nats_server, nats_client, stream_name, cause):
    """A row just over max_payload (refused before sending) or one the server refuses within a few
    bytes of it: its dead letter, with the error headers, would not fit. It is cut to fit and says
    so; the rows around it are stored, and the connection (shared by the task) stays up."""
    max_payload = nats_client.nc.max_payload
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    nats_client.add_stream(stream_name + "B", [f"{stream_name}B.>"])
    nats_client.add_stream(stream_name + "DLQ", [f"{stream_name}dlq"])
    if cause == "client-side":
        big, subject = b"B" * (max_payload + 1), f"{stream_name}.a"
    else:  # fits, but lands in the wrong stream: the server refuses it (10060)
        big, subject = b"B" * (max_payload - 200), f"{stream_name}B.a"
    rows = [(f"{stream_name}.a", b"good1"), (subject, big), (f"{stream_name}.a", b"good2")]
    df = spark.createDataFrame(rows, "subject string, data binary").coalesce(1)
    write(df, nats_server, stream=stream_name, deadLetterSubject=f"{stream_name}dlq")
    assert nats_client.stream_state(stream_name + "B")["messages"] == 0
    assert [m.data for m in nats_client.messages(stream_name)] == [b"good1", b"good2"]
    [dead] = nats_client.messages(stream_name + "DLQ")
    assert dead.headers["Spark-JetStream-Truncated"] == ["true"]
    assert dead.headers["Spark-JetStream-Original-Size"] == [str(len(big))]
    assert dead.headers["Spark-JetStream-Row"] == ["0:1"] and big.startswith(dead.data) and len(dead.data) > 0


def test_dead_letter_subject_must_be_stored(spark, nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    df = spark.createDataFrame([("a",)], "data string")
    with pytest.raises(Exception, match="No stream captures the dead-letter subject"):
        write(df, nats_server, stream=stream_name, subject=f"{stream_name}.x", deadLetterSubject="nowhere.dlq")


def test_header_round_trip_including_multi_valued(spark, nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    headers = {"X-Multi": ["a", "b", "c"], "X-Colon": ["k: v"], "X-Unicode": ["héllo"], "x-lower": ["1"]}
    df = spark.createDataFrame([(b"p", headers)], "data binary, headers map<string,array<string>>")
    write(df, nats_server, stream=stream_name, subject=f"{stream_name}.h")
    (m,) = nats_client.messages(stream_name)
    for key, values in headers.items():
        assert m.headers[key] == values


def test_idempotent_ids_deduplicate_a_rerun_of_the_same_rows(spark, nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    df = spark.createDataFrame([(f"m{i}", str(i)) for i in range(5)], "msg_id string, data string")
    write(df, nats_server, stream=stream_name, subject=f"{stream_name}.x")
    write(df, nats_server, stream=stream_name, subject=f"{stream_name}.x")
    stored = nats_client.messages(stream_name)
    assert sorted((m.headers["Nats-Msg-Id"][0], m.data) for m in stored) == [(f"m{i}", str(i).encode()) for i in range(5)]


@pytest.mark.parametrize("window", ["1", "2", "3"])
def test_tiny_ack_windows_make_progress(spark, nats_server, nats_client, stream_name, window):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    df = spark.createDataFrame([(str(i),) for i in range(50)], "data string")
    write(df, nats_server, stream=stream_name, subject=f"{stream_name}.x", maxPendingAcks=window)
    assert sorted(int(m.data) for m in nats_client.messages(stream_name)) == list(range(50))


def test_task_commit_message_counts_published_duplicates_dead_letters_expired(spark, nats_server, nats_client, stream_name):
    """write_partition (what each Spark task runs) against the real server, outside Spark."""
    import pyarrow as pa

    from pyspark_jetstream.sink.plan.sink_plan import plan_sink
    from pyspark_jetstream.sink.task.commit import log_totals
    from pyspark_jetstream.sink.task.write import write_partition

    nats_client.add_stream(stream_name, [f"{stream_name}.>"], allow_msg_ttl=True)
    nats_client.add_stream(stream_name + "DLQ", [f"{stream_name}dlq"])
    now = dt.datetime.now(dt.timezone.utc)
    rows = [("m1", "a", now + dt.timedelta(hours=1)), ("m2", "b", now + dt.timedelta(hours=1)),
            ("m3", "c", now - dt.timedelta(seconds=5)), ("m4", "d", None)]
    schema = "msg_id string, data string, expires_at timestamp, ttl string"
    df = spark.createDataFrame([(*r, "500ms" if r[0] == "m4" else None) for r in rows], schema)
    options = {"servers": nats_server.url, "stream": stream_name, "subject": f"{stream_name}.x",
               "preserveExpiry": "true", "deadLetterSubject": f"{stream_name}dlq"}
    plan = plan_sink(options, df.schema, overwrite=False, streaming=False)
    batch = pa.RecordBatch.from_pylist(
        [{"msg_id": r[0], "data": r[1], "expires_at": r[2], "ttl": "500ms" if r[0] == "m4" else None} for r in rows],
        schema=pa.schema([("msg_id", pa.string()), ("data", pa.string()), ("expires_at", pa.timestamp("us", tz="UTC")),
                          ("ttl", pa.string())]),
    )
    first = write_partition(plan, [batch])
    second = write_partition(plan, [batch])
    assert (first.published, first.duplicates, first.dead_lettered, first.expired) == (2, 0, 1, 1)
    assert (second.published, second.duplicates, second.dead_lettered, second.expired) == (0, 2, 1, 1)
    assert log_totals([first, second]) == {"published": 2, "duplicates": 2, "dead_lettered": 2, "expired": 2,
                                           "markers_skipped": 0, "already_stored": 0, "older_in_write": 0,
                                           "older_than_stored": 0, "out_of_order": 0, "reordered": 0, "left_out_of_order": 0, "shared_subjects": 0,
                                           "unpositioned": 8, "batches": 0}  # 4 rows a write, without 'seq': as they came
    assert nats_client.stream_state(stream_name)["messages"] == 2
    # The dead letter carries a deterministic id too, so the second one was a duplicate in the DLQ stream.
    assert nats_client.stream_state(stream_name + "DLQ")["messages"] == 1


def test_hostile_rows_go_to_dead_letters_and_good_rows_are_unaffected(spark, nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    nats_client.add_stream(stream_name + "DLQ", [f"{stream_name}dlq"])
    s = stream_name
    rows = [
        (f"{s}.ok", "good1", {"X-Fine": "1"}),
        ("", "empty-subject", None),
        (f"{s}.>", "wildcard", None),
        (f"{s}. x", "whitespace", None),
        (f"{s}.ok", "crlf-value", {"X-A": "v\r\nNats-Msg-Id: forged"}),
        (f"{s}.ok", "colon-name", {"X:A": "v"}),
        (f"{s}.ok", "reserved", {"Nats-Expected-Last-Sequence": "1"}),
        (f"{s}.ok", "marker", {"Nats-Marker-Reason": "MaxAge"}),
        (f"{s}.ok", "rollup", {"Nats-Rollup": "all"}),
        (f"{s}.ok", "good2", None),
    ]
    df = spark.createDataFrame(rows, "subject string, data string, headers map<string,string>").coalesce(1)
    write(df, nats_server, stream=s, deadLetterSubject=f"{s}dlq")
    stored = nats_client.messages(s)
    assert [m.data for m in stored] == [b"good1", b"good2"]
    assert stored[0].headers["X-Fine"] == ["1"]
    dead = {m.data: m.headers for m in nats_client.messages(s + "DLQ")}
    assert set(dead) == {b"empty-subject", b"wildcard", b"whitespace", b"crlf-value", b"colon-name", b"reserved",
                         b"marker", b"rollup"}
    assert all(h["Spark-JetStream-Err-Code"] == ["client"] for h in dead.values())
    assert "X-A" not in dead[b"crlf-value"] and "forged" not in str(dead[b"crlf-value"].get("Nats-Msg-Id"))
    assert dead[b"reserved"]["Spark-JetStream-Row"] == ["0:6"]


def test_a_batch_larger_than_half_the_window_is_published_in_slices_with_every_row_its_own_id(
        nats_server, nats_client, stream_name):
    """write_partition outside Spark: 5,000 rows in one Arrow batch, window 64, so encoded and published
    in slices of 1,024 rows. Every row keeps the position-derived id it would have had in one piece:
    5,000 distinct ids, and the same batch written again is 5,000 duplicates."""
    import pyarrow as pa
    from pyspark.sql.types import StringType, StructField, StructType

    from pyspark_jetstream.sink.plan.sink_plan import plan_sink
    from pyspark_jetstream.sink.task.write import write_partition

    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    options = {"servers": nats_server.url, "stream": stream_name, "subject": f"{stream_name}.x",
               "maxPendingAcks": "64"}
    plan = plan_sink(options, StructType([StructField("data", StringType())]), overwrite=False, streaming=False)
    batch = pa.RecordBatch.from_pydict({"data": pa.array([str(i) for i in range(5000)])})
    first = write_partition(plan, [batch])
    again = write_partition(plan, [batch])
    assert (first.published, first.duplicates, again.published, again.duplicates) == (5000, 0, 0, 5000)
    stored = nats_client.messages(stream_name)
    assert sorted(int(m.data) for m in stored) == list(range(5000))
    assert sorted(int(m.headers["Nats-Msg-Id"][0].rsplit(":", 1)[1]) for m in stored) == list(range(5000))
    assert all(m.headers["Nats-Msg-Id"][0].rsplit(":", 1)[1] == m.data.decode() for m in stored)


@pytest.mark.parametrize("dead_letters", [False, True], ids=["no-dlq", "dlq"])
def test_streams_named_error_and_duplicate_store_every_row_once(spark, nats_server, nats_client, stream_name,
                                                               dead_letters):
    """Issue #23: a PubAck names its stream, so acks from streams named 'error' and 'duplicate' hold those
    words in quotes. Each row is stored once, nothing is dead-lettered, and the counts are right; a
    replay of the same task (same ids) counts every row as a duplicate."""
    import pyarrow as pa

    from pyspark_jetstream.sink.plan.sink_plan import plan_sink
    from pyspark_jetstream.sink.task.write import write_partition

    names = ("error", "duplicate")
    for name in names:  # the names are fixed, so a stream left by an earlier run is removed first
        nats_client.api(f"STREAM.DELETE.{name}")
        nats_client.add_stream(name, [f"{stream_name}.{name}.>"])
    dlq = stream_name + "DLQ"
    nats_client.add_stream(dlq, [f"{stream_name}dlq"])
    options = {"servers": nats_server.url}
    if dead_letters:
        options["deadLetterSubject"] = f"{stream_name}dlq"
    try:
        rows = [(f"{stream_name}.{names[i % 2]}.s{i}", f"d{i}") for i in range(20)]
        df = spark.createDataFrame(rows[:10], "subject string, data string")
        write(df, nats_server, **options)  # through Spark
        plan = plan_sink(options, df.schema, overwrite=False, streaming=False)
        batch = pa.RecordBatch.from_pylist([{"subject": s, "data": d} for s, d in rows[10:]],
                                           schema=pa.schema([("subject", pa.string()), ("data", pa.string())]))
        first = write_partition(plan, [batch])
        replay = write_partition(plan, [batch])  # the same run and task: the same ids
        assert (first.published, first.duplicates, first.dead_lettered) == (10, 0, 0)
        assert (replay.published, replay.duplicates, replay.dead_lettered) == (0, 10, 0)
        for k, name in enumerate(names):
            stored = [(m.subject, m.data) for m in nats_client.messages(name)]
            assert sorted(stored) == sorted((s, d.encode()) for s, d in rows[k::2])
        assert nats_client.stream_state(dlq)["messages"] == 0
    finally:
        for name in names:
            nats_client.api(f"STREAM.DELETE.{name}")
