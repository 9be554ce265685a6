"""Row -> HPUB frame encoding: precedence, validation, msg ids, sizes."""

import datetime as dt
import re

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pyspark_jetstream.errors import SchemaError
from pyspark_jetstream.protocol.frames import parse_hpub_frame
from pyspark_jetstream.protocol.headers import parse_headers
from pyspark_jetstream.sink.encode.encoder import BatchEncoder
from pyspark_jetstream.sink.encode.frames import OutFrame
from pyspark_jetstream.sink.encode.layout import EncoderConfig, InputLayout, layout_from_schema
from pyspark_jetstream.sink.encode.msg_ids import MsgIds

UTC = dt.timezone.utc


def config(**kw):
    base = dict(default_subject=None, default_ttl=None, preserve_expiry=False, expected_stream=None,
                allow_rollup=False, max_payload=1024 * 1024)
    base.update(kw)
    return EncoderConfig(**base)


def decode(frame):
    subject, block, payload = parse_hpub_frame(frame)
    return subject, parse_headers(block), payload


def schema(*fields):
    return StructType([StructField(n, t) for n, t in fields])


def test_layout_accepts_every_column_type_and_ignores_source_columns():
    s = schema(("SUBJECT", StringType()), ("data", BinaryType()), ("headers", MapType(StringType(), ArrayType(StringType()))),
               ("ttl", LongType()), ("expires_at", TimestampType()), ("msg_id", StringType()), ("seq", LongType()),
               ("stream", StringType()), ("timestamp", TimestampType()), ("marker_reason", StringType()))
    lay = layout_from_schema(s, has_default_subject=False)
    assert lay.subject == "SUBJECT" and lay.headers_multi and lay.ttl == "ttl" and lay.data_is_binary


@pytest.mark.parametrize(
    "fields, match",
    [
        ([("data", StringType()), ("color", StringType())], "Unknown column.*'color'.*Accepted columns"),
        ([("subject", StringType())], "needs a 'data' column"),
        ([("data", IntegerType()), ("subject", StringType())], "'data'.*binary or string"),
        ([("data", StringType())], "add a 'subject' column"),
        ([("data", StringType()), ("subject", StringType()), ("ttl", DoubleType())], "'ttl'.*string or integer"),
        ([("data", StringType()), ("subject", StringType()), ("headers", MapType(StringType(), IntegerType()))], "'headers'"),
        ([("data", StringType()), ("subject", StringType()), ("expires_at", StringType())], "'expires_at'.*timestamp"),
        ([("data", StringType()), ("subject", StringType()), ("Data", StringType())], "differ only in case"),
    ],
)
def test_layout_rejects(fields, match):
    with pytest.raises(SchemaError, match=match):
        layout_from_schema(schema(*fields), has_default_subject=False)


def encode(rows, layout, cfg=None, ids=None, names=None, types=None, now=None):
    batch = pa.RecordBatch.from_pylist(rows, schema=pa.schema(types)) if types else pa.RecordBatch.from_pylist(rows)
    return BatchEncoder(layout, cfg or config(), ids).encode(batch, 100, "_INBOX.x.", now=now)


def test_basic_frames_carry_reply_position_ttl_and_msg_id():
    out = encode([{"subject": "a.b", "data": b"x", "ttl": "1h"}, {"subject": "a.c", "data": None, "ttl": None}],
                 InputLayout(subject="subject", ttl="ttl"), config(default_ttl="30", expected_stream="S"), ids=MsgIds("q:1", 0))
    assert [p for p, *_ in out.frames] == [100, 101]
    first = out.frames[0][1]
    assert first.startswith(b"HPUB a.b _INBOX.x.100 ")
    subject, headers, payload = decode(first)
    assert headers == {"Nats-Msg-Id": ["q:1:0:100"], "Nats-TTL": ["1h"], "Nats-Expected-Stream": ["S"]}
    assert payload == b"x"
    assert decode(out.frames[1][1])[1]["Nats-TTL"] == ["30"]  # null ttl -> defaultTtl
    assert decode(out.frames[1][1])[2] == b""


def test_zero_ttl_sends_no_header_and_does_not_fall_back_to_default():
    out = encode([{"subject": "a", "data": b"", "ttl": 0}], InputLayout(subject="subject", ttl="ttl"), config(default_ttl="60"))
    assert "Nats-TTL" not in decode(out.frames[0][1])[1]


def test_headers_map_single_and_multi_valued_with_ttl_and_msgid_entries():
    rows = [{"subject": "a", "data": b"1", "headers": [("X-A", ["1", "2"]), ("nats-ttl", ["5s"]), ("Nats-Msg-Id", ["mine"])]}]
    types = [("subject", pa.string()), ("data", pa.binary()), ("headers", pa.map_(pa.string(), pa.list_(pa.string())))]
    out = encode(rows, InputLayout(subject="subject", headers="headers", headers_multi=True), ids=MsgIds("p", 0), types=types)
    headers = decode(out.frames[0][1])[1]
    assert headers == {"Nats-Msg-Id": ["mine"], "Nats-TTL": ["5s"], "X-A": ["1", "2"]}


def test_ttl_column_wins_over_header_entry():
    rows = [{"subject": "a", "data": b"1", "ttl": "9s", "headers": [("Nats-TTL", "5s")]}]
    types = [("subject", pa.string()), ("data", pa.binary()), ("ttl", pa.string()), ("headers", pa.map_(pa.string(), pa.string()))]
    out = encode(rows, InputLayout(subject="subject", ttl="ttl", headers="headers"), types=types)
    assert decode(out.frames[0][1])[1]["Nats-TTL"] == ["9s"]


@pytest.mark.parametrize(
    "row, column, reason",
    [
        ({"subject": None, "data": b"x"}, "subject", "no subject"),
        ({"subject": "a.*", "data": b"x"}, "subject", "not a valid publish subject"),
        ({"subject": "a b", "data": b"x"}, "subject", "not a valid publish subject"),
        ({"subject": "a", "data": b"x", "ttl": "500ms"}, "ttl", "below the 1 second minimum"),
        ({"subject": "a", "data": b"x", "ttl": "soon"}, "ttl", "not a number"),
        ({"subject": "a", "data": b"x", "msg_id": "a\r\nb"}, "msg_id", "CR or LF"),
    ],
)
def test_bad_rows_are_rejected_with_position_and_column(row, column, reason):
    row = {"ttl": None, "msg_id": None, **row}
    types = [("subject", pa.string()), ("data", pa.binary()), ("ttl", pa.string()), ("msg_id", pa.string())]
    good = {"subject": "ok", "data": b"g", "ttl": None, "msg_id": None}
    out = encode([good, row, good], InputLayout(subject="subject", ttl="ttl", msg_id="msg_id"), types=types)
    assert [p for p, *_ in out.frames] == [100, 102]
    (rej,) = out.rejected
    assert rej.position == 101 and rej.column == column and reason in rej.reason and rej.payload == b"x"


@pytest.mark.parametrize(
    "headers",
    [[("Bad Name", "1")], [("X", "a\r\nNats-TTL: 1")], [("Nats-Expected-Stream", "OTHER")], [("Nats-Rollup", "all")],
     [("Nats-TTL", "1h"), ("nats-ttl", "2h")]],
)
def test_bad_headers_are_rejected(headers):
    types = [("subject", pa.string()), ("data", pa.binary()), ("headers", pa.map_(pa.string(), pa.string()))]
    out = encode([{"subject": "a", "data": b"", "headers": headers}], InputLayout(subject="subject", headers="headers"), types=types)
    assert not out.frames and out.rejected[0].column == "headers"


def test_preserve_expiry_uses_remaining_lifetime_and_counts_expired():
    now = dt.datetime(2026, 1, 1, 12, tzinfo=UTC)
    rows = [
        {"subject": "a", "data": b"1", "expires_at": now + dt.timedelta(seconds=90, milliseconds=1), "ttl": "5s"},
        {"subject": "a", "data": b"2", "expires_at": now - dt.timedelta(seconds=1), "ttl": None},
        {"subject": "a", "data": b"3", "expires_at": None, "ttl": "never"},
    ]
    types = [("subject", pa.string()), ("data", pa.binary()), ("expires_at", pa.timestamp("us", tz="UTC")), ("ttl", pa.string())]
    out = encode(rows, InputLayout(subject="subject", ttl="ttl", expires_at="expires_at"), config(preserve_expiry=True),
                 types=types, now=now)
    assert out.expired == 1
    assert [decode(f)[1]["Nats-TTL"] for _, f, *_ in out.frames] == [["91"], ["never"]]


def test_expires_at_is_ignored_without_preserve_expiry():
    now = dt.datetime(2026, 1, 1, tzinfo=UTC)
    types = [("subject", pa.string()), ("data", pa.binary()), ("expires_at", pa.timestamp("us", tz="UTC"))]
    out = encode([{"subject": "a", "data": b"1", "expires_at": now}], InputLayout(subject="subject", expires_at="expires_at"), types=types)
    assert out.expired == 0 and "Nats-TTL" not in decode(out.frames[0][1])[1]


def test_string_data_and_default_subject():
    out = encode([{"data": "héllo"}], InputLayout(data_is_binary=False), config(default_subject="d.s"))
    assert decode(out.frames[0][1])[0] == "d.s" and decode(out.frames[0][1])[2] == "héllo".encode()


def test_integer_ttl_column():
    types = [("subject", pa.string()), ("data", pa.binary()), ("ttl", pa.int32())]
    out = encode([{"subject": "a", "data": b"", "ttl": 60}, {"subject": "a", "data": b"", "ttl": -3}],
                 InputLayout(subject="subject", ttl="ttl"), types=types)
    assert decode(out.frames[0][1])[1]["Nats-TTL"] == ["60"] and out.rejected[0].value == -3


def test_oversized_message_is_rejected_not_sent():
    out = encode([{"subject": "a", "data": b"x" * 200}], InputLayout(subject="subject"), config(max_payload=100))
    assert not out.frames and "max_payload of 100" in out.rejected[0].reason


def test_no_msg_id_when_not_idempotent():
    out = encode([{"subject": "a", "data": b""}], InputLayout(subject="subject"), ids=None)
    assert "Nats-Msg-Id" not in decode(out.frames[0][1])[1]


SOURCE_TYPES = [("subject", pa.string()), ("data", pa.binary()), ("stream", pa.string()), ("seq", pa.int64())]
SOURCE_LAYOUT = InputLayout(subject="subject", source_stream="stream", source_seq="seq")


def _ids(out):
    return [decode(frame)[1]["Nats-Msg-Id"][0] for _, frame, *_ in out.frames]


CONTENT_ID = re.compile(r"(?P<run>.+):(?P<stream>[^.:]+)\.(?P<seq>\d+):(?P<digest>[0-9a-f]{16})(?:\.(?P<k>\d+))?")


def _content(msg_id: str) -> tuple:
    m = CONTENT_ID.fullmatch(msg_id)
    assert m, msg_id
    return m["run"], m["stream"], int(m["seq"]), m["digest"], int(m["k"] or 0)


def test_rows_with_a_source_position_get_content_addressed_ids():
    rows = [{"subject": "a", "data": b"x", "stream": "SRC", "seq": s} for s in (7, 8, 8, 8, 9)]
    ids = [_content(i) for i in _ids(encode(rows, SOURCE_LAYOUT, ids=MsgIds("q:3", 0), types=SOURCE_TYPES))]
    assert [(run, stream, seq, k) for run, stream, seq, _, k in ids] == [
        ("q:3", "SRC", 7, 0), ("q:3", "SRC", 8, 0), ("q:3", "SRC", 8, 1), ("q:3", "SRC", 8, 2), ("q:3", "SRC", 9, 0)]
    assert ids[1][3] == ids[2][3] == ids[3][3]  # identical rows: one digest, told apart by their count


def test_rows_of_one_message_that_differ_get_different_ids_in_any_task():
    """Issue #23: a union (a. and b. subjects), a join fan-out (other data, other headers), two servers'
    streams of one name (other timestamps): each row's id depends on what it publishes, not on where
    it lands, so rows split over tasks never collide and a replay gives each its id again."""
    types = SOURCE_TYPES + [("headers", pa.map_(pa.string(), pa.string())), ("timestamp", pa.timestamp("us", tz="UTC"))]
    layout = InputLayout(subject="subject", headers="headers", source_stream="stream", source_seq="seq",
                         source_timestamp="timestamp")
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)

    def row(subject="a.x", data=b"x", headers=None, ts=t0):
        return {"subject": subject, "data": data, "stream": "ORDERS", "seq": 1, "headers": headers, "timestamp": ts}

    variants = [row(), row(subject="b.x"), row(data=b"y"), row(headers=[("X-Region", "eu")]),
                row(headers=[("X-Region", "us")]), row(headers=[("X-Region", "eu"), ("X-B", "")]),
                row(ts=t0 + dt.timedelta(microseconds=1)), row(data=b""), row(subject="a.x\x00", data=b"x")]
    one_task = _ids(encode(variants, layout, ids=MsgIds("q:3", 0), types=types))
    each_alone = [_ids(encode([v], layout, ids=MsgIds("q:3", p), types=types))[0] for p, v in enumerate(variants)]
    assert one_task == each_alone  # where a row lands does not change its id
    assert len(set(each_alone)) == len(variants)  # and no two distinct rows share one
    assert all(_content(i)[4] == 0 for i in one_task)
    # Identical rows in one task, far apart, are counted; in two tasks they share an id (the log shows them).
    spread = [row(), row(subject="b.x"), row(), row(data=b"y"), row()]
    ids = [_content(i) for i in _ids(encode(spread, layout, ids=MsgIds("q:3", 0), types=types))]
    assert [k for *_, k in ids] == [0, 0, 1, 0, 2] and ids[0][3] == ids[2][3] == ids[4][3]
    # ... also when the repeat comes in a later batch (slice) of the task, alone.
    task = MsgIds("q:3", 0)
    earlier = _ids(encode([row(), row(subject="b.x")], layout, ids=task, types=types))
    later = _ids(encode([row(data=b"z"), row(subject="b.x")], layout, ids=task, types=types))
    assert [_content(i)[4] for i in earlier + later] == [0, 0, 0, 1]
    assert later[1] == earlier[1] + ".1"


def test_content_ids_do_not_depend_on_the_split_or_on_missing_rows():
    """What a replay may change: the task a row lands in, its position, rows that expired meanwhile."""
    rows = [{"subject": "a", "data": str(s).encode(), "stream": "SRC", "seq": s} for s in range(1, 21)]
    whole = dict(zip(range(1, 21), _ids(encode(rows, SOURCE_LAYOUT, ids=MsgIds("q:3", 0), types=SOURCE_TYPES)), strict=True))
    replay = {}
    for part, chunk in enumerate([rows[1:7], rows[7:13], rows[13:]]):  # seq 1 expired; three tasks, not one
        out = encode(chunk, SOURCE_LAYOUT, ids=MsgIds("q:3", part), types=SOURCE_TYPES)
        replay.update(zip([r["seq"] for r in chunk], _ids(out), strict=True))
    assert replay == {seq: whole[seq] for seq in range(2, 21)}
    assert len(set(whole.values())) == 20


def test_rows_without_a_full_source_position_get_positional_ids():
    rows = [{"subject": "a", "data": b"x", "stream": None, "seq": 5}, {"subject": "a", "data": b"x", "stream": "S",
                                                                       "seq": 6}]
    positional, content = _ids(encode(rows, SOURCE_LAYOUT, ids=MsgIds("w1", 4), types=SOURCE_TYPES))
    assert positional == "w1:4:100" and _content(content)[:3] == ("w1", "S", 6)


def test_layout_takes_the_source_position_only_with_the_right_types():
    base = [("data", BinaryType()), ("subject", StringType())]
    lay = layout_from_schema(schema(*base, ("stream", StringType()), ("seq", LongType())), has_default_subject=False)
    assert (lay.source_stream, lay.source_seq) == ("stream", "seq")
    for extra in ([("stream", StringType())], [("seq", LongType())], [("stream", StringType()), ("seq", StringType())]):
        lay = layout_from_schema(schema(*base, *extra), has_default_subject=False)
        assert lay.source_stream is None and lay.source_seq is None


READ_TYPES = [("subject", pa.string()), ("data", pa.binary()), ("stream", pa.string()), ("seq", pa.int64()),
              ("headers", pa.map_(pa.string(), pa.list_(pa.string()))), ("ttl", pa.string()),
              ("marker_reason", pa.string())]
READ_LAYOUT = InputLayout(subject="subject", headers="headers", headers_multi=True, ttl="ttl", source_stream="stream",
                          source_seq="seq", marker_reason="marker_reason")
STORED = [("Nats-Expected-Stream", ["SRC"]), ("Nats-Msg-Id", ["orig-1"]), ("Nats-TTL", ["1h"]),
          ("X-Tag", ["a", "b"]), ("Nats-Expected-Last-Subject-Sequence", ["0"]), ("KV-Operation", ["DEL"]),
          ("Nats-Rollup", ["sub"]), ("Nats-Counter-Incr", ["+1"]), ("nats-lowercase", ["x"])]


def test_rows_as_read_leave_out_every_nats_header_and_keep_the_users():
    row = {"subject": "t.a", "data": b"x", "stream": "SRC", "seq": 7, "headers": STORED, "ttl": "1h",
           "marker_reason": None}
    out = encode([row], READ_LAYOUT, ids=MsgIds("q:1", 0), types=READ_TYPES)
    assert not out.rejected
    headers = decode(out.frames[0][1])[1]
    assert _content(headers.pop("Nats-Msg-Id")[0])[:3] == ("q:1", "SRC", 7)
    assert headers == {"Nats-TTL": ["1h"], "X-Tag": ["a", "b"], "KV-Operation": ["DEL"]}


def test_rows_as_read_keep_a_rollup_only_with_allow_rollup():
    row = {"subject": "t.a", "data": b"", "stream": "SRC", "seq": 7, "headers": STORED, "ttl": None,
           "marker_reason": None}
    out = encode([row], READ_LAYOUT, config(allow_rollup=True), ids=MsgIds("q:1", 0), types=READ_TYPES)
    assert decode(out.frames[0][1])[1]["Nats-Rollup"] == ["sub"]


def test_delete_markers_are_skipped_and_counted():
    rows = [{"subject": "t.a", "data": b"", "stream": "SRC", "seq": s, "headers": None, "ttl": None,
             "marker_reason": m} for s, m in ((1, None), (2, "MaxAge"), (3, None))]
    out = encode(rows, READ_LAYOUT, ids=MsgIds("q:1", 0), types=READ_TYPES)
    assert [p for p, *_ in out.frames] == [100, 102] and out.markers_skipped == 1 and not out.rejected


def test_the_users_own_rows_still_refuse_reserved_headers():
    rows = [{"subject": "a", "data": b"1", "headers": [("Nats-Expected-Stream", ["X"])]}]
    types = [("subject", pa.string()), ("data", pa.binary()), ("headers", pa.map_(pa.string(), pa.list_(pa.string())))]
    out = encode(rows, InputLayout(subject="subject", headers="headers", headers_multi=True), types=types)
    assert not out.frames and "reserved" in out.rejected[0].reason


def test_rows_as_read_leave_out_the_sequence_header_in_any_case():
    """The option sequenceBy owns it: a copy never carries the source's order into the target (issue #33)."""
    stored = [("Spark-JetStream-Sequence", ["int:100"]), ("spark-jetstream-SEQUENCE", ["int:7"]), ("X-Tag", ["a"])]
    row = {"subject": "t.a", "data": b"x", "stream": "SRC", "seq": 7, "headers": stored, "ttl": None,
           "marker_reason": None}
    out = encode([row], READ_LAYOUT, types=READ_TYPES)
    assert not out.rejected
    assert decode(out.frames[0][1])[1] == {"X-Tag": ["a"]}


@pytest.mark.parametrize("name", ["Spark-JetStream-Sequence", "spark-jetstream-sequence", "SPARK-JETSTREAM-SEQUENCE"])
def test_the_users_own_rows_cannot_set_the_sequence_header(name):
    rows = [{"subject": "a", "data": b"1", "headers": [("X", ["1"])]},
            {"subject": "a", "data": b"2", "headers": [("X", ["2"]), (name, ["int:9223372036854775807"])]}]
    types = [("subject", pa.string()), ("data", pa.binary()), ("headers", pa.map_(pa.string(), pa.list_(pa.string())))]
    out = encode(rows, InputLayout(subject="subject", headers="headers", headers_multi=True), types=types)
    assert [p for p, *_ in out.frames] == [100]
    (rej,) = out.rejected
    assert (rej.position, rej.column, rej.payload) == (101, "headers", b"2")
    assert f"header {name!r} is set by the option 'sequenceBy'" in rej.reason
    assert "int:9223372036854775807" in repr(rej.value)


def test_each_frame_carries_its_subject_ttl_and_id_and_slices_back_to_its_block_and_payload():
    rows = [{"subject": "a.b", "data": b"x\r\ny", "ttl": "1h", "headers": [("X-A", ["1", "2"])]},
            {"subject": None, "data": b"", "ttl": None, "headers": None}]
    types = [("subject", pa.string()), ("data", pa.binary()), ("ttl", pa.string()),
             ("headers", pa.map_(pa.string(), pa.list_(pa.string())))]
    out = encode(rows, InputLayout(subject="subject", ttl="ttl", headers="headers", headers_multi=True),
                 config(default_subject="d.s", default_ttl="30", expected_stream="S"), ids=MsgIds("q:1", 0), types=types)
    assert len(out.frames) == 2
    for raw in out.frames:
        sent = OutFrame._make(raw)
        subject, block, payload = parse_hpub_frame(sent.frame)
        headers = parse_headers(block)
        assert (sent.subject, sent.header_block, sent.payload) == (subject, block, payload)
        assert [sent.ttl] == headers["Nats-TTL"] and [sent.msg_id] == headers["Nats-Msg-Id"]
    assert [OutFrame._make(f).subject for f in out.frames] == ["a.b", "d.s"]


def test_refused_rows_are_reported_in_row_order_whichever_step_refused_them():
    rows = [{"subject": "a", "data": b"0", "ttl": "-5", "msg_id": None},  # refused by the TTL step
            {"subject": "bad subject", "data": b"1", "ttl": None, "msg_id": None},  # refused by the subject step
            {"subject": "a", "data": b"2", "ttl": None, "msg_id": "x\ny"},  # refused by the msg-id step
            {"subject": None, "data": b"3", "ttl": None, "msg_id": None}]  # no subject
    out = encode(rows, InputLayout(subject="subject", ttl="ttl", msg_id="msg_id"))
    assert [(r.position, r.column) for r in out.rejected] == [(100, "ttl"), (101, "subject"), (102, "msg_id"),
                                                              (103, "subject")]
    assert out.frames == []
