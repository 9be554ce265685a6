"""KV writes (option ``bucket``) without a server: what each operation puts on the wire (as nats-py's
``KeyValue`` sends it), row refusals naming the key, and what ``ensureBucket`` creates or refuses."""

import datetime as dt
import re

import pyarrow as pa
import pytest
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType, TimestampType

from pyspark_jetstream.errors import OptionError, SchemaError
from pyspark_jetstream.options import parse_sink_options
from pyspark_jetstream.protocol import kv
from pyspark_jetstream.protocol.frames import parse_hpub_frame
from pyspark_jetstream.protocol.headers import parse_headers
from pyspark_jetstream.protocol.stream_rules import StreamRuleError
from pyspark_jetstream.sink.encode.encoder import BatchEncoder
from pyspark_jetstream.sink.encode.layout import EncoderConfig, layout_from_schema
from pyspark_jetstream.sink.encode.msg_ids import MsgIds

UTC = dt.timezone.utc


def encoder(default_ttl=None, preserve_expiry=False, columns=("key", "data", "operation", "ttl", "expected_revision")):
    types = {"key": StringType(), "data": BinaryType(), "operation": StringType(), "ttl": StringType(),
             "expected_revision": LongType(), "expires_at": TimestampType(), "subject": StringType(),
             "stream": StringType(), "seq": LongType()}
    layout = layout_from_schema(StructType([StructField(c, types[c]) for c in columns]), has_default_subject=False,
                                bucket=True)
    cfg = EncoderConfig(default_subject=None, default_ttl=default_ttl, preserve_expiry=preserve_expiry,
                        expected_stream=None, allow_rollup=False, max_payload=1 << 20, bucket="B")
    return BatchEncoder(layout, cfg, MsgIds("run", 0))


def batch(**cols):
    return pa.RecordBatch.from_pydict(cols)


def sent(frame_tuple):
    subject, block, payload = parse_hpub_frame(frame_tuple[1])
    return subject, {k: v for k, v in parse_headers(block).items() if k != "Nats-Msg-Id"}, payload


def test_put_del_and_purge_go_on_the_wire_as_nats_py_sends_them():
    enc = encoder(default_ttl="30")
    out = enc.encode(batch(key=["a", "b.c", "d", "e"], data=[b"v1", b"ignored", b"ignored", b"v4"],
                           operation=[None, "DEL", "PURGE", "PUT"], ttl=[None, None, "1h", "never"],
                           expected_revision=[None, None, None, 0]), 0, "_INBOX.x.")
    assert out.rejected == []
    assert [sent(f) for f in out.frames] == [
        ("$KV.B.a", {"Nats-TTL": ["30"]}, b"v1"),  # defaultTtl applies to PUT rows
        ("$KV.B.b.c", {"KV-Operation": ["DEL"]}, b""),  # a delete carries no value and no TTL
        ("$KV.B.d", {"KV-Operation": ["PURGE"], "Nats-Rollup": ["sub"], "Nats-TTL": ["1h"]}, b""),
        ("$KV.B.e", {"Nats-Expected-Last-Subject-Sequence": ["0"], "Nats-TTL": ["never"]}, b"v4"),
    ]
    # A tombstone expires only by its own TTL, never by defaultTtl.
    [purge] = encoder(default_ttl="30").encode(batch(key=["k"], data=[None], operation=["PURGE"], ttl=[None],
                                                     expected_revision=[None]), 0, "r.").frames
    assert sent(purge)[1] == {"KV-Operation": ["PURGE"], "Nats-Rollup": ["sub"]}


def test_bad_keys_unknown_operations_and_a_ttl_on_del_are_row_refusals_naming_the_key():
    out = encoder().encode(batch(key=["ok", ".bad", "sp ace", None, "k2", "k3", "k4", "k5"],
                                 data=[b"x"] * 8, operation=[None, None, None, None, "UPSERT", "DEL", None, "del"],
                                 ttl=[None, None, None, None, None, "5s", None, None],
                                 expected_revision=[None, None, None, None, None, None, -1, None]), 10, "r.")
    assert [sent(f)[0] for f in out.frames] == ["$KV.B.ok"]
    got = [(r.position, r.column, r.value, r.subject) for r in out.rejected]
    assert got == [(11, "key", ".bad", "$KV.B..bad"), (12, "key", "sp ace", "$KV.B.sp ace"), (13, "key", None, None),
                   (14, "operation", "UPSERT", "$KV.B.k2"), (15, "ttl", "5s", "$KV.B.k3"),
                   (16, "expected_revision", -1, "$KV.B.k4"), (17, "operation", "del", "$KV.B.k5")]
    assert "cannot carry a TTL" in out.rejected[4].reason and "operation PURGE" in out.rejected[4].reason
    # A DEL with a zero or null TTL is a plain delete.
    fine = encoder().encode(batch(key=["k"], data=[b""], operation=["DEL"], ttl=["0"], expected_revision=[None]), 0, "r.")
    assert fine.rejected == [] and sent(fine.frames[0])[1] == {"KV-Operation": ["DEL"]}


def test_rows_read_from_a_bucket_write_back_as_key_operations():
    enc = encoder(preserve_expiry=True, columns=("key", "data", "operation", "subject", "stream", "seq", "expires_at"))
    now = dt.datetime(2026, 1, 1, tzinfo=UTC)
    out = enc.encode(batch(key=["a", "a", "b"], data=[b"1", b"", b"2"], operation=["PUT", "DEL", "PURGE"],
                           subject=["$KV.SRC.a", "$KV.SRC.a", "$KV.SRC.b"], stream=["KV_SRC"] * 3, seq=[1, 2, 3],
                           expires_at=[now + dt.timedelta(seconds=90), None, now + dt.timedelta(seconds=10)]),
                     0, "r.", now=now)
    frames = [parse_hpub_frame(f[1]) for f in out.frames]
    assert [f[0] for f in frames] == ["$KV.B.a", "$KV.B.a", "$KV.B.b"]
    headers = [parse_headers(f[1]) for f in frames]
    assert [h.get("Nats-TTL") for h in headers] == [["90"], None, ["10"]]
    assert [re.fullmatch(r"run:KV_SRC\.(\d):[0-9a-f]{16}", h["Nats-Msg-Id"][0])[1] for h in headers] == ["1", "2", "3"]


def test_the_layout_of_a_kv_write():
    with pytest.raises(SchemaError, match="needs a 'key' column"):
        layout_from_schema(StructType([StructField("data", StringType())]), has_default_subject=False, bucket=True)
    with pytest.raises(SchemaError, match="'expected_revision'.*long"):
        layout_from_schema(StructType([StructField("key", StringType()), StructField("data", StringType()),
                                       StructField("expected_revision", StringType())]),
                           has_default_subject=False, bucket=True)
    with pytest.raises(SchemaError, match="Unknown column.*'value'.*a KV bucket"):
        layout_from_schema(StructType([StructField("key", StringType()), StructField("value", StringType())]),
                           has_default_subject=False, bucket=True)
    # A subject column: a bucket read's own (with its stream and seq) is ignored; any other is refused.
    kv_columns = [StructField("key", StringType()), StructField("data", StringType()),
                  StructField("subject", StringType())]
    read = StructType(kv_columns + [StructField("stream", StringType()), StructField("seq", LongType())])
    assert layout_from_schema(read, has_default_subject=False, bucket=True).subject is None
    for extra in ([], [StructField("stream", StringType())]):
        with pytest.raises(SchemaError, match="'subject' is not used by a KV write.*'key' column decides"):
            layout_from_schema(StructType(kv_columns + extra), has_default_subject=False, bucket=True)
    # A stream write ignores a bucket read's operation column, and has no compare-and-set column.
    with pytest.raises(SchemaError, match="Unknown column.*'expected_revision' for the JetStream sink"):
        layout_from_schema(StructType([StructField("subject", StringType()), StructField("data", StringType()),
                                       StructField("operation", StringType()), StructField("expected_revision",
                                                                                          LongType())]),
                           has_default_subject=False)


def test_kv_options():
    opts = parse_sink_options({"bucket": "B", "ensureBucket": "create", "bucket.history": "5", "bucket.ttl": "1h",
                               "bucket.limitMarkerTtl": "10s"})
    assert (opts.bucket, opts.ensure_bucket, opts.stream) == ("B", "create", None)
    assert opts.bucket_settings == kv.BucketSettings(history=5, ttl=3600.0, limit_marker_ttl=10.0)
    for raw, option in (({"bucket": "B", "stream": "S"}, "stream"), ({"bucket": "B", "subject": "a"}, "subject"),
                        ({"bucket": "B", "stream.maxAge": "1h"}, "stream.maxAge"),
                        ({"bucket.history": "3"}, "bucket.history"), ({"ensureBucket": "create"}, "ensureBucket"),
                        ({"bucket": "a.b"}, "bucket"), ({"bucket": "B", "bucket.history": "65"}, "bucket.history")):
        with pytest.raises(OptionError) as info:
            parse_sink_options(raw)
        assert info.value.option == option, (raw, info.value)


def test_a_created_bucket_is_what_nats_py_create_key_value_makes():
    plan = kv.plan_bucket(None, "B", kv.BucketSettings(history=3, ttl=60, max_value_size=1024, storage="memory",
                                                       limit_marker_ttl=5), "create", needs_ttl=True, may_purge=True)
    assert plan.action == "create"
    assert plan.config == {
        "name": "KV_B", "subjects": ["$KV.B.>"], "retention": "limits", "storage": "memory", "num_replicas": 1,
        "max_age": 60_000_000_000, "max_bytes": -1, "max_msgs": -1, "max_consumers": -1, "max_msg_size": 1024,
        "max_msgs_per_subject": 3, "duplicate_window": 60_000_000_000, "discard": "new", "allow_direct": True,
        "allow_rollup_hdrs": True, "deny_delete": True, "allow_msg_ttl": True, "subject_delete_marker_ttl": 5_000_000_000}
    assert kv.new_bucket_config("B", kv.BucketSettings())["duplicate_window"] == 120_000_000_000
    assert kv.short_duplicate_window(plan.config) == 60.0
    assert kv.short_duplicate_window(kv.new_bucket_config("B", kv.BucketSettings())) is None


def test_validate_refuses_a_bucket_that_cannot_take_the_rows_and_update_fixes_it():
    with pytest.raises(StreamRuleError, match="does not exist.*nats kv add B.*ensureBucket"):
        kv.plan_bucket(None, "B", kv.BucketSettings(), "validate", needs_ttl=False, may_purge=False)
    old = {"name": "KV_B", "subjects": ["$KV.B.>"], "allow_rollup_hdrs": False, "allow_msg_ttl": False}
    with pytest.raises(StreamRuleError, match="AllowMsgTTL false.*ensureBucket='update'"):
        kv.plan_bucket(old, "B", kv.BucketSettings(), "validate", needs_ttl=True, may_purge=False)
    with pytest.raises(StreamRuleError, match="AllowRollup false.*PURGE"):
        kv.plan_bucket(old, "B", kv.BucketSettings(), "validate", needs_ttl=False, may_purge=True)
    assert kv.plan_bucket(old, "B", kv.BucketSettings(), "validate", needs_ttl=False, may_purge=False).action == "none"
    plan = kv.plan_bucket(old, "B", kv.BucketSettings(), "update", needs_ttl=True, may_purge=True)
    assert plan.action == "update" and plan.config["allow_msg_ttl"] and plan.config["allow_rollup_hdrs"]
    with pytest.raises(StreamRuleError, match="mirror"):
        kv.plan_bucket({**old, "mirror": {"name": "KV_A"}}, "B", kv.BucketSettings(), "update", needs_ttl=False,
                       may_purge=False)


@pytest.mark.parametrize("key, ok", [("a", True), ("a/b=c_d-e.f", True), (".a", False), ("a.", False), ("", False),
                                     ("a b", False), ("a*", False), ("a>", False), ("é", False)])
def test_key_rule_matches_nats_py(key, ok):
    from nats.js.kv import _is_key_valid

    assert kv.is_valid_key(key) is ok is _is_key_valid(key)


def test_a_kafka_style_key_column_on_a_stream_write_says_what_to_do():
    with pytest.raises(SchemaError, match="subject does the job of Kafka's key.*option 'bucket'"):
        layout_from_schema(StructType([StructField("key", StringType()), StructField("data", StringType())]),
                           has_default_subject=False)
    with pytest.raises(SchemaError) as info:  # a bucket read (key and operation) without a subject: no Kafka hint
        layout_from_schema(StructType([StructField("key", StringType()), StructField("operation", StringType()),
                                       StructField("data", StringType())]), has_default_subject=False)
    assert "Kafka" not in str(info.value)


# ---- create after a delete or purge, as nats-py's kv.create (issue #23)

CREATE = b"NATS/1.0\r\nNats-Expected-Last-Subject-Sequence: 0\r\nNats-Msg-Id: q:1:0:5\r\n\r\n"


@pytest.mark.parametrize(("block", "expected"), [
    (CREATE, True),
    (b"NATS/1.0\r\nNats-Expected-Last-Subject-Sequence: 3\r\n\r\n", False),  # an update
    (b"NATS/1.0\r\nNats-Expected-Last-Subject-Sequence: 0\r\n\r\n", True),
    (b"NATS/1.0\r\nNats-Expected-Last-Subject-Sequence: 00\r\n\r\n", False),
    (b"NATS/1.0\r\nNats-Expected-Last-Subject-Sequence: 10\r\n\r\n", False),
    (b"NATS/1.0\r\nKV-Operation: DEL\r\nNats-Expected-Last-Subject-Sequence: 0\r\n\r\n", False),  # not a put
    (b"NATS/1.0\r\nNats-Msg-Id: x\r\n\r\n", False),
])
def test_a_create_is_a_put_expecting_no_last_sequence(block, expected):
    assert kv.is_create(block) is expected


@pytest.mark.parametrize(("block", "revision"), [
    (b"NATS/1.0\r\nKV-Operation: DEL\r\n\r\n", 7),
    (b"NATS/1.0\r\nKV-Operation: PURGE\r\nNats-Rollup: sub\r\n\r\n", 7),
    (b"NATS/1.0\r\nKV-Operation:  PURGE \r\nNats-TTL: 60\r\n\r\n", 7),
    (b"NATS/1.0\r\nNats-Msg-Id: x\r\n\r\n", None),  # a live value
    (b"", None),
    (b"NATS/1.0\r\nKV-Operation: PUT\r\n\r\n", None),
])
def test_only_a_del_or_purge_tombstone_lets_a_create_through(block, revision):
    assert kv.tombstone_revision(7, block) == revision


def test_the_create_put_again_expects_the_tombstones_revision_and_keeps_the_rest():
    again = kv.recreate_block(CREATE, 42)
    assert again == b"NATS/1.0\r\nNats-Expected-Last-Subject-Sequence: 42\r\nNats-Msg-Id: q:1:0:5\r\n\r\n"
    assert parse_headers(again)["Nats-Expected-Last-Subject-Sequence"] == ["42"]


def test_the_duplicate_window_probe_asks_for_an_id_no_message_carries():
    assert kv.duplicate_probe_headers("q:1:0:5", "never-1") == {"Nats-Msg-Id": "q:1:0:5",
                                                                 "Nats-Expected-Last-Msg-Id": "never-1"}


@pytest.mark.parametrize(("ack", "answer"), [
    (b'{"stream":"KV_b","seq":4,"duplicate":true}', True),  # the window holds the id
    (b'{"error":{"code":400,"err_code":10070,"description":"wrong last msg ID: x"},"stream":"KV_b","seq":0}', False),
    (b'{"stream":"KV_b","seq":9}', None),  # stored: never for a probe; says nothing of the id
    (b'{"error":{"code":503,"err_code":10008,"description":"jetstream not enabled"}}', None),
    (b"", None),
])
def test_what_the_probe_answered(ack, answer):
    from pyspark_jetstream.protocol.puback import parse_puback

    parsed = parse_puback(ack)
    assert kv.probe_answer(parsed.outcome, parsed.err_code) is answer


@pytest.mark.parametrize(("block", "msg_id"), [
    (CREATE, "q:1:0:5"),
    (b"NATS/1.0\r\nKV-Operation: DEL\r\n\r\n", None),
    (b"", None),
])
def test_the_id_of_a_stored_message(block, msg_id):
    assert kv.msg_id_of(block) == msg_id


@pytest.mark.parametrize(("block", "revision"), [
    (CREATE, 0),
    (b"NATS/1.0\r\nNats-Expected-Last-Subject-Sequence: 42\r\nNats-Msg-Id: x\r\n\r\n", 42),
    (b"NATS/1.0\r\nNats-Msg-Id: x\r\n\r\n", 0),
    (b"", 0),
])
def test_the_revision_a_compare_and_set_row_expected(block, revision):
    assert kv.expected_revision_of(block) == revision
