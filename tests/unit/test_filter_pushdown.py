"""Spark's pushed filters turned into the read's narrowing (source/plan/filter_pushdown.py), and the
direct-get replies a bucket's latest view of keys is read from (protocol/direct_get.py).

One row per filter kind: what the read is narrowed to, and whether Spark keeps the filter. A filter
the connector applies exactly is not returned; everything it cannot (wildcard characters, U+FFFD,
prefixes off a token boundary, NOT, a snapshot's sequence and time filters) is returned untouched."""

from __future__ import annotations

import datetime as dt

import pytest

from pyspark_jetstream.spark_api import PUSHDOWN

if not PUSHDOWN:  # PySpark 4.0: no filter classes, no pushdown
    pytest.skip("this PySpark has no filter pushdown for Python sources", allow_module_level=True)

from pyspark.sql.datasource import (  # noqa: E402
    EqualNullSafe,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringContains,
    StringEndsWith,
    StringStartsWith,
)

from pyspark_jetstream.protocol.direct_get import BadReply, start_time, stored_block, time_ns  # noqa: E402
from pyspark_jetstream.source.plan.filter_pushdown import (  # noqa: E402
    Pushed,
    is_literal,
    narrow_subjects,
    translate,
)

T = dt.datetime(2026, 1, 31, 12, 0, tzinfo=dt.timezone.utc)
US = dt.timedelta(microseconds=1)
S, K, Q, TS = ("subject",), ("key",), ("seq",), ("timestamp",)


def run(filters, *, bucket=None, snapshot=False, open_end_last=None):
    return translate(filters, bucket=bucket, snapshot=snapshot, open_end_last=open_end_last)


@pytest.mark.parametrize(("flt", "bucket", "pushed", "kept"), [
    (EqualTo(S, "a.b"), None, Pushed(subjects=("a.b",)), False),
    (EqualNullSafe(S, "a.b"), None, Pushed(subjects=("a.b",)), False),
    (In(S, ["b", "a", None]), None, Pushed(subjects=("a", "b")), False),
    (In(S, [None]), None, Pushed(subjects=()), False),  # x IN (NULL) keeps nothing
    (EqualTo(S, "a b"), None, Pushed(subjects=()), False),  # no message has it: nothing, exactly
    (EqualTo(S, "a..b"), None, Pushed(subjects=()), False),
    (EqualTo(S, "a.*"), None, Pushed(), True),  # a wildcard token
    (EqualTo(S, "a*b"), None, Pushed(), True),  # unsure how a server reads it: Spark's
    (EqualTo(S, "a.>"), None, Pushed(), True),
    (EqualTo(S, "a.\ufffd"), None, Pushed(), True),  # bytes that were not UTF-8
    (In(S, ["a", "b.*"]), None, Pushed(), True),
    (In(S, ["a", 1]), None, Pushed(), True),
    (StringStartsWith(S, "a.b."), None, Pushed(subjects=("a.b.>",)), False),
    (StringStartsWith(S, "a.b"), None, Pushed(), True),  # 'a.bc' too: off a token boundary
    (StringStartsWith(S, "a.*."), None, Pushed(), True),
    (StringStartsWith(S, "."), None, Pushed(), True),
    (StringEndsWith(S, ".x"), None, Pushed(), True),
    (StringContains(S, "x"), None, Pushed(), True),
    (Not(EqualTo(S, "a")), None, Pushed(), True),
    (IsNotNull(S), None, Pushed(), False),  # never null
    (IsNull(S), None, Pushed(), True),
    (EqualTo(K, "a.x"), "B", Pushed(subjects=("$KV.B.a.x",)), False),
    (In(K, ["x", "y.z"]), "B", Pushed(subjects=("$KV.B.x", "$KV.B.y.z")), False),
    (StringStartsWith(K, "dev."), "B", Pushed(subjects=("$KV.B.dev.>",)), False),
    (StringStartsWith(K, "dev"), "B", Pushed(), True),
    (EqualTo(K, "a.x"), None, Pushed(), True),  # a stream has no key column
    (IsNotNull(K), "B", Pushed(), False),
    (EqualTo(("headers",), "x"), None, Pushed(), True),
])
def test_subject_filters(flt, bucket, pushed, kept):
    result = run([flt], bucket=bucket)
    assert result.pushed == pushed
    assert (flt in result.returned) is kept
    assert all(any(r is f for f in [flt]) for r in result.returned)  # Spark's own objects come back


@pytest.mark.parametrize(("filters", "subjects"), [
    ([EqualTo(S, "a.b"), StringStartsWith(S, "a.")], ("a.b",)),
    ([EqualTo(S, "a.b"), StringStartsWith(S, "c.")], ()),
    ([In(S, ["a.b", "c.d"]), In(S, ["c.d", "e"])], ("c.d",)),
    ([EqualTo(K, "x.y"), EqualTo(S, "$KV.B.x.y")], ("$KV.B.x.y",)),
    ([StringStartsWith(S, "a."), StringStartsWith(S, "a.b.")], ("a.b.>",)),
])
def test_subject_filters_together_keep_what_all_keep(filters, subjects):
    result = run(filters, bucket="B")
    assert result.pushed.subjects == subjects and not result.returned
    assert result.pushed.nothing == (subjects == ())


@pytest.mark.parametrize(("flt", "first", "last", "kept"), [
    (GreaterThan(Q, 5), 6, None, False),
    (GreaterThanOrEqual(Q, 5), 5, None, False),
    (LessThan(Q, 5), None, 4, False),
    (LessThanOrEqual(Q, 5), None, 5, False),
    (EqualTo(Q, 5), 5, 5, False),
    (In(Q, [9, 3, None]), 3, 9, True),  # narrowing: Spark drops 4..8
    (GreaterThan(Q, 0), 1, None, False),  # every sequence
    (GreaterThan(Q, True), None, None, True),
    (LessThan(Q, -3), None, -4, False),  # nothing (below)
    (Not(EqualTo(Q, 5)), None, None, True),
])
def test_sequence_filters(flt, first, last, kept):
    result = run([flt])
    assert (result.pushed.first_seq, result.pushed.last_seq) == (first, last)
    assert (flt in result.returned) is kept


def test_an_upper_sequence_bound_past_an_open_end_is_left_to_spark():
    """Without an explicit end the read runs to the stream's end when it runs: a bound at or past
    the last sequence now cannot fix it (messages stored later would be read); below it, it can."""
    result = run([LessThanOrEqual(Q, 100), GreaterThan(Q, 3)], open_end_last=100)
    assert (result.pushed.first_seq, result.pushed.last_seq) == (4, None)
    assert [type(f).__name__ for f in result.returned] == ["LessThanOrEqual"]
    result = run([EqualTo(Q, 120)], open_end_last=100)
    assert (result.pushed.first_seq, result.pushed.last_seq) == (120, None) and len(result.returned) == 1
    result = run([LessThanOrEqual(Q, 99)], open_end_last=100)
    assert result.pushed.last_seq == 99 and not result.returned
    result = run([In(Q, [3, 150])], open_end_last=100)  # narrowing from 3 only; the end stays open
    assert (result.pushed.first_seq, result.pushed.last_seq) == (3, None) and len(result.returned) == 1


@pytest.mark.parametrize(("filters", "nothing"), [
    ([GreaterThan(Q, 9), LessThan(Q, 5)], True),
    ([LessThan(Q, 1)], True),
    ([In(Q, [])], True),
    ([GreaterThanOrEqual(TS, T + US), LessThanOrEqual(TS, T)], True),
    ([GreaterThanOrEqual(Q, 5), LessThanOrEqual(Q, 5)], False),
])
def test_ranges_that_keep_nothing(filters, nothing):
    assert run(filters).pushed.nothing is nothing


@pytest.mark.parametrize(("flt", "since", "until"), [
    (GreaterThanOrEqual(TS, T), T, None),
    (GreaterThan(TS, T), T + US, None),
    (LessThanOrEqual(TS, T), None, T),
    (LessThan(TS, T), None, T - US),
    (EqualTo(TS, T), T, T),
    (GreaterThan(TS, T.astimezone(dt.timezone(dt.timedelta(hours=2)))), T + US, None),
    (GreaterThan(TS, T.replace(tzinfo=None)), None, None),  # no zone: not guessed
    (Not(EqualTo(TS, T)), None, None),
])
def test_time_filters_narrow_and_are_returned(flt, since, until):
    result = run([flt])
    assert (result.pushed.since, result.pushed.until) == (since, until)
    assert flt in result.returned


@pytest.mark.parametrize("flt", [GreaterThan(Q, 5), EqualTo(Q, 5), GreaterThan(TS, T), LessThan(TS, T)])
def test_a_snapshot_returns_sequence_and_time_filters_untouched(flt):
    """The last message per key of a range is not the range of the last messages per key."""
    result = run([flt, EqualTo(K, "a")], bucket="B", snapshot=True)
    assert result.pushed == Pushed(subjects=("$KV.B.a",))
    assert list(result.returned) == [flt]


def test_without_subjects_returns_the_subject_filters():
    flt = In(S, ["a", "b"])
    result = run([flt, GreaterThan(Q, 3)]).without_subjects()
    assert result.pushed == Pushed(first_seq=4) and list(result.returned) == [flt]


@pytest.mark.parametrize(("base", "pushed", "narrowed"), [
    ((), ("a.b",), ("a.b",)),
    (("$KV.B.>",), ("$KV.B.x",), ("$KV.B.x",)),
    (("a.*", "b.>"), ("a.>", "b.c"), ("a.*", "b.c")),
    (("a.>",), ("b.c",), ()),  # the option 'subjects' keeps none of them: read nothing
    ((), ("z.x",), ("z.x",)),  # whatever the stream's configured subjects: it may hold others
])
def test_narrowed_filter_subjects(base, pushed, narrowed):
    assert narrow_subjects(base, pushed) == narrowed


def test_literal_sets():
    assert is_literal(("a.b", "$KV.B.x")) and not is_literal(("a.>",)) and not is_literal(("a.*.c",))


# ------------------------------------------------------------------ direct-get replies (ADR-31)

APPENDED = (b"Nats-Stream: KV_B\r\nNats-Subject: $KV.B.h\r\nNats-Sequence: 6\r\n"
            b"Nats-Time-Stamp: 2026-11-26T18:52:56.45630331Z\r\nNats-Num-Pending: 0\r\nNats-Last-Sequence: 4\r\n")


@pytest.mark.parametrize(("block", "stored"), [
    (b"NATS/1.0\r\n" + APPENDED + b"\r\n", None),
    (b"NATS/1.0\r\nX-One: 1\r\n" + APPENDED + b"\r\n", b"NATS/1.0\r\nX-One: 1\r\n\r\n"),
    # the stored message's own Nats-Stream is kept: only the appended lines are cut
    (b"NATS/1.0\r\nNats-Stream: fake\r\nA:  b \r\n" + APPENDED + b"\r\n", b"NATS/1.0\r\nNats-Stream: fake\r\nA:  b \r\n\r\n"),
])
def test_the_stored_header_block_is_what_a_consumer_delivers(block, stored):
    kept, meta = stored_block(block)
    assert kept == stored and meta["Nats-Sequence"] == "6" and meta["Nats-Subject"] == "$KV.B.h"


@pytest.mark.parametrize("block", [
    b"NATS/1.0\r\nX: 1\r\n\r\n",
    b"NATS/1.0\r\n" + APPENDED.replace(b"Nats-Sequence", b"Nats-Seq") + b"\r\n",
    b"garbage",
])
def test_a_reply_without_the_appended_lines_is_refused(block):
    with pytest.raises(BadReply):
        stored_block(block)


@pytest.mark.parametrize(("text", "ns"), [
    ("2026-11-26T18:52:56.45630331Z", 1_795_719_176_456_303_310),
    ("2026-11-26T18:52:56Z", 1_795_719_176_000_000_000),
    ("2026-11-26T18:52:56.000000001Z", 1_795_719_176_000_000_001),
    ("2026-11-26T20:52:56.5+02:00", 1_795_719_176_500_000_000),
])
def test_direct_get_times_to_nanoseconds(text, ns):
    assert time_ns(text) == ns


UTC = dt.timezone.utc


@pytest.mark.parametrize(("when", "text"), [
    (dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC), "2026-01-02T03:04:05.000006Z"),
    (dt.datetime(2026, 1, 2, 5, 4, 5, tzinfo=dt.timezone(dt.timedelta(hours=2))), "2026-01-02T03:04:05.000000Z"),
    (dt.datetime(1677, 9, 22, tzinfo=UTC), "1677-09-22T00:00:00.000000Z"),
    # before int64 nanoseconds begin: the first time they hold (the server wraps earlier ones)
    (dt.datetime(1500, 1, 1, tzinfo=UTC), "1677-09-21T00:12:43.145225Z"),
    (dt.datetime(999, 1, 1, tzinfo=UTC), "1677-09-21T00:12:43.145225Z"),
    (dt.datetime(1, 1, 1, tzinfo=UTC), "1677-09-21T00:12:43.145225Z"),
])
def test_start_times_are_sent_as_the_server_parses_them(when, text):
    assert start_time(when) == text
    assert time_ns(text) >= -(2 ** 63)


@pytest.mark.parametrize("flt", [
    LessThan(TS, dt.datetime(1, 1, 1, tzinfo=UTC)),
    GreaterThan(TS, dt.datetime.max.replace(tzinfo=UTC)),
    LessThanOrEqual(TS, dt.datetime.max.replace(tzinfo=UTC)),
    GreaterThanOrEqual(TS, dt.datetime(1, 1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=2)))),
])
def test_times_at_the_ends_of_the_calendar_are_not_narrowed_and_never_fail(flt):
    result = run([flt])
    assert result.pushed == Pushed() and list(result.returned) == [flt]
