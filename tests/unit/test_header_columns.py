"""The column-wise header decoding against the per-row one it replaces on the hot path: random header
blocks (repeated names, empty values, colons in values, tabs, status lines, lines without a colon,
non-ASCII and non-UTF-8 bytes) give identical columns, and the common shapes do take the fast path.
Batches of one producer's shape (every block the same names in the same order) are decoded by a path
of their own, held to the per-row decoding by a differential test of its own, perturbed rows included."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_jetstream.source.columns import header_columns
from pyspark_jetstream.source.columns.rows import BatchBuilder, arrow_schema

MAP = arrow_schema(True).field("headers").type
NAMES = ("Nats-TTL", "Nats-Marker-Reason", "KV-Operation")

name = st.sampled_from(["Nats-TTL", "Nats-Msg-Id", "Nats-Marker-Reason", "KV-Operation", "X-Rep", "x-rep",
                        "X-Nats-Marker-Reason", " Padded ", "\tTabbed\x0c", "", "Ünïcode"]) | st.text(min_size=0, max_size=6) \
    | st.text(alphabet=st.characters(max_codepoint=127), max_size=6)
value = st.sampled_from(["1h", "never", "9999999999999", "0", "", "abc", "5s", "  spaced  ", "a:b:c", "\tTab\t",
                         "MaxAge", "Purge", "Remove", "DEL", "PURGE", "é", "\x1c", "x\ny"]) | st.text(max_size=8) \
    | st.text(alphabet=st.characters(max_codepoint=127), max_size=8)
line = st.one_of(st.builds(lambda n, v: f"{n}:{v}", name, value),
                 st.builds(lambda n, v: f"{n}: {v}", name, value),
                 st.text(max_size=8), st.text(alphabet=st.characters(max_codepoint=127), max_size=8))
status = st.sampled_from(["NATS/1.0", "NATS/1.0 100 Idle Heartbeat", "NATS/1.0 408 Request: Timeout"])
block = st.one_of(
    st.none(),
    st.builds(lambda s, ls: (s + "\r\n" + "".join(f"{x}\r\n" for x in ls) + "\r\n").encode(), status,
              st.lists(line, max_size=6)),
    st.binary(max_size=40),  # anything the server could hold, UTF-8 or not
)


def same(a: header_columns.HeaderColumns, b: header_columns.HeaderColumns) -> None:
    a.headers.validate(full=True)  # what Spark's JVM reads is the buffers, not to_pylist(): offsets must hold
    assert a.headers.to_pylist() == b.headers.to_pylist()
    assert a.headers.type == b.headers.type
    for key in NAMES:
        assert a.first[key].to_pylist() == b.first[key].to_pylist(), key


def same_firsts(a, b):
    """A read without the ``headers`` column: the same derived values (the map may be left out)."""
    for key in NAMES:
        assert a.first[key].to_pylist() == b.first[key].to_pylist(), key


@settings(max_examples=200, deadline=None)
@given(st.lists(block, max_size=12) | st.lists(block, min_size=100, max_size=400))
def test_columnar_and_per_row_decode_every_batch_the_same(blocks):
    fast = header_columns.columnar(blocks, MAP, NAMES)
    slow = header_columns.per_row(blocks, MAP, NAMES)
    if fast is not None:
        same(fast, slow)
    same(header_columns.decode(blocks, MAP, NAMES), slow)
    same_firsts(header_columns.decode(blocks, MAP, NAMES, want_map=False), slow)


def test_the_common_shapes_take_the_column_wise_path():
    sink = b"NATS/1.0\r\nNats-Msg-Id: q:1:SRC.9\r\nNats-TTL: 3600\r\n\r\n"
    rich = b"NATS/1.0\r\nNats-Msg-Id: a\r\nNats-TTL: 1h\r\nX-A: 1\r\nX-Rep: 1\r\nX-Rep: 2\r\nX-B: \t b \r\n\r\n"
    marker = b"NATS/1.0\r\nNats-Marker-Reason: MaxAge\r\nNats-TTL: 1m0s\r\n\r\n"
    fast = header_columns.columnar([sink, None, rich, marker, b"NATS/1.0\r\n\r\n"], MAP, NAMES)
    assert fast is not None
    assert fast.headers.to_pylist() == [
        [("Nats-Msg-Id", ["q:1:SRC.9"]), ("Nats-TTL", ["3600"])], None,
        [("Nats-Msg-Id", ["a"]), ("Nats-TTL", ["1h"]), ("X-A", ["1"]), ("X-Rep", ["1", "2"]), ("X-B", ["b"])],
        [("Nats-Marker-Reason", ["MaxAge"]), ("Nats-TTL", ["1m0s"])], None]
    assert fast.first["Nats-TTL"].to_pylist() == ["3600", None, "1h", "1m0s", None]
    assert fast.first["Nats-Marker-Reason"].to_pylist() == [None, None, None, "MaxAge", None]
    # Outside the common shape: the per-row path decides.
    assert header_columns.columnar([b"NATS/1.0\r\nX: \xff\r\n\r\n"], MAP, NAMES) is None
    assert header_columns.columnar([b"NATS/1.0\r\nX: \xc3\xa9\r\n\r\n"], MAP, NAMES) is None  # not ASCII
    odd = [b"NATS/1.0\r\nX: \x1c v\x1f\r\n\tY\x0b:\ta\nb \r\nno colon\r\n:\r\n\r\n"]  # ASCII white space
    assert header_columns.columnar(odd, MAP, NAMES).headers.to_pylist() == [[("X", ["v"]), ("Y", ["a\nb"]), ("", [""])]]
    same(header_columns.columnar(odd, MAP, NAMES), header_columns.per_row(odd, MAP, NAMES))


def test_a_read_without_the_map_searches_each_names_line():
    sink = [b"NATS/1.0\r\nNats-Msg-Id: w:%d\r\nNats-TTL: 1h\r\nNats-Expected-Stream: S\r\n\r\n" % i for i in range(4)]
    mixed = sink[:2] + [b"NATS/1.0\r\nNats-Msg-Id: z\r\n\r\n", None, b"NATS/1.0\r\nNats-TTL:\t5s \r\n\r\n",
                        b"NATS/1.0\r\nNats-Marker-Reason: MaxAge\r\nNats-TTL: 1m0s"]  # the last line unended
    for batch in (sink, mixed):
        first = header_columns.searched(batch, NAMES)
        assert first is not None  # one scan a name, whatever the batch's shape
        same_firsts(header_columns.HeaderColumns(None, first), header_columns.per_row(batch, MAP, NAMES))
    first = header_columns.searched(mixed, NAMES)
    assert first["Nats-TTL"].to_pylist() == ["1h", "1h", None, None, "5s", "1m0s"]
    assert first["Nats-Marker-Reason"].to_pylist() == [None] * 5 + ["MaxAge"]
    assert first["KV-Operation"].null_count == 6
    # The name anywhere but as one line's name (a value, a padded or repeated name, the status line), or a
    # value not ASCII: another path decides, and decides as the per-row parser does.
    for odd in ([b"NATS/1.0\r\nX: Nats-TTL\r\nNats-TTL: 1h\r\n\r\n"],
                [b"NATS/1.0\r\n Nats-TTL : 1h\r\nNats-TTL: 2h\r\n\r\n"],
                [b"NATS/1.0\r\nNats-TTL: 1h\r\nNats-TTL: 2h\r\n\r\n", None],
                [b"NATS/1.0 Nats-TTL\r\nNats-TTL: 1h\r\n\r\n"],
                [b"NATS/1.0\r\nNats-TTL: 1h\xc2\xa0\r\n\r\n"], [b"NATS/1.0\r\nNats-TTL: \xff\r\n\r\n"]):
        assert header_columns.searched(odd, NAMES) is None, odd
        same_firsts(header_columns.decode(odd, MAP, NAMES, want_map=False), header_columns.per_row(odd, MAP, NAMES))


template_name = st.sampled_from(["Nats-Msg-Id", "Nats-TTL", "Nats-Expected-Stream", "Nats-Marker-Reason",
                                 "KV-Operation", "X-Tag", "x-tag", " X-Tag ", "\tX-Tag", "", "A:B"]) \
    | st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=5)
ascii_value = st.text(alphabet=st.characters(max_codepoint=127, blacklist_characters="\r\n"), max_size=8) \
    | st.sampled_from(["1h", "", " ", "a:b", "\t x \x0c", "w3f2:0:17"])


@st.composite
def one_producer(draw):
    """Blocks of one shape: the same lines in the same order (names repeated, lines without a colon and
    blank lines among them), each row its own values; sometimes one row perturbed."""
    slots = draw(st.lists(st.one_of(template_name.map(lambda n: ("header", n)),
                                    st.sampled_from([("plain", "no colon"), ("plain", ""), ("plain", " \t")])),
                          max_size=6))
    status = draw(st.sampled_from(["NATS/1.0", "NATS/1.0 100 Idle Heartbeat"]))
    sep = draw(st.sampled_from([":", ": ", " : ", ":\t"]))
    rows = draw(st.integers(1, 60))
    blocks = []
    for _ in range(rows):
        lines = [f"{n}{sep}{draw(ascii_value)}" if kind == "header" else n for kind, n in slots]
        blocks.append((status + "\r\n" + "".join(f"{x}\r\n" for x in lines) + "\r\n").encode())
    perturbed = draw(st.sampled_from([None, "name", "extra line", "missing line", "colon", "no headers", "none"]))
    if perturbed:
        i = draw(st.integers(0, rows - 1))
        text = blocks[i].decode()
        if perturbed == "name":
            text = text.replace(sep, "x" + sep, 1)
        elif perturbed == "extra line":
            text = text.replace("\r\n", "\r\nX-Extra: 1\r\n", 1)
        elif perturbed == "missing line":
            parts = text.split("\r\n", 2)  # the status line, the first line, the rest
            text = parts[0] + "\r\n" + (parts[2] if len(parts) > 2 else "")
        elif perturbed == "colon":
            text = text.replace("no colon", "no: colon")
        elif perturbed == "no headers":
            text = status + "\r\n\r\n"
        blocks[i] = None if perturbed == "none" else text.encode()
    return blocks, perturbed


@settings(max_examples=200, deadline=None)
@given(one_producer())
def test_batches_of_one_producers_shape_decode_the_same_on_their_own_path(drawn):
    blocks, perturbed = drawn
    slow = header_columns.per_row(blocks, MAP, NAMES)
    text = header_columns._ascii_text(blocks)
    uniform = header_columns._uniform(text, MAP, NAMES) if text is not None else None
    if perturbed is None:
        assert uniform is not None  # the shape this path is for takes it
    if uniform is not None:
        same(uniform, slow)
    same(header_columns.decode(blocks, MAP, NAMES), slow)
    same_firsts(header_columns.decode(blocks, MAP, NAMES, want_map=False), slow)  # includeHeaders=false


def test_one_producers_shapes_take_their_own_path():
    def blocks(*lines_of_rows):
        return [("NATS/1.0\r\n" + "".join(f"{x}\r\n" for x in lines) + "\r\n").encode() for lines in lines_of_rows]

    sink = blocks(*[[f"Nats-Msg-Id: w1:0:{i}", "Nats-TTL: 1h", "Nats-Expected-Stream: S"] for i in range(5)])
    rich = blocks(*[["Nats-Msg-Id: m", f"X-Tag:{i}", " Nats-TTL : 5s ", "X-Tag: \tb", "no colon"] for i in range(3)])
    for batch in (sink, rich):
        fast = header_columns._uniform(header_columns._ascii_text(batch), MAP, NAMES)
        assert fast is not None
        same(fast, header_columns.per_row(batch, MAP, NAMES))
    fast = header_columns._uniform(header_columns._ascii_text(rich), MAP, NAMES)
    assert fast.headers.to_pylist()[2] == [("Nats-Msg-Id", ["m"]), ("X-Tag", ["2", "b"]), ("Nats-TTL", ["5s"])]
    assert fast.first["Nats-TTL"].to_pylist() == ["5s"] * 3
    assert fast.first["KV-Operation"].null_count == 3
    # Not one shape: another path decides (and decides the same).
    for batch in (sink + rich, sink[:2] + blocks(["Nats-Msg-Id: x", "Nats-TTL 1h", "Nats-Expected-Stream: S"]),
                  blocks(["A: 1", "no colon"], ["A: 2", "b: colon"]), sink + [None]):
        assert header_columns._uniform(header_columns._ascii_text(batch), MAP, NAMES) is None
        same(header_columns.decode(batch, MAP, NAMES), header_columns.per_row(batch, MAP, NAMES))
    empty = blocks([], [])
    assert header_columns._uniform(header_columns._ascii_text(empty), MAP, NAMES).headers.null_count == 2


ttl_value = st.sampled_from(["1h", "never", "NEVER", "9999999999999", "18446744073709551615", "0", "", " 5", "abc",
                             "500ms", "1s", "2m30s", "60", "1", "-1"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), ttl_value), st.sampled_from([None, "MaxAge", "Remove", "Odd"]),
                          st.sampled_from([None, "DEL", "PURGE", ""])), max_size=10),
       st.sampled_from([0.0, 3.0, 86400.0]), st.booleans())
def test_batches_built_either_way_are_identical(monkeypatch_free_rows, max_age, include_markers):
    """The whole RecordBatch (ttl, expires_at, marker_reason, KV operation, markers filtered or not)."""
    def batch(force_per_row: bool):
        builder = BatchBuilder("KV_B", include_markers=include_markers, kv_bucket="B", max_age=max_age)
        for i, (ttl, marker, op) in enumerate(monkeypatch_free_rows):
            lines = [f"Nats-TTL: {ttl}"] if ttl is not None else []
            lines += [f"Nats-Marker-Reason: {marker}"] if marker else []
            lines += [f"KV-Operation: {op}"] if op is not None else []
            block = ("NATS/1.0\r\n" + "".join(f"{x}\r\n" for x in lines) + "\r\n").encode() if lines else None
            builder.add(f"$KV.B.k{i}".encode(), b"v", block, i + 1, 1_700_000_000_000_000_000 + i)
        original = header_columns.columnar
        if force_per_row:
            header_columns.columnar = lambda *a: None
        try:
            return builder.build()
        finally:
            header_columns.columnar = original

    fast, slow = batch(False), batch(True)
    fast.validate(full=True)
    assert fast.schema == slow.schema and fast.to_pylist() == slow.to_pylist()
    # And both equal the row-by-row rules the column-wise ones replaced.
    assert fast.to_pylist() == reference_rows(monkeypatch_free_rows, max_age, include_markers)


def reference_rows(rows, max_age: float, include_markers: bool) -> list[dict]:
    """The per-row derivation of ttl, expires_at, marker_reason and the KV operation, as the source
    built them before the column-wise path (kept here as the reference)."""
    import datetime as dt

    from pyspark_jetstream.protocol.headers import parse_headers
    from pyspark_jetstream.protocol.ttl import InvalidTtl, server_ttl_seconds
    from pyspark_jetstream.source.columns.rows import KV_OPERATION_OF_MARKER, MAX_TIMESTAMP_US

    out = []
    for i, (ttl, marker, op) in enumerate(rows):
        lines = [f"Nats-TTL: {ttl}"] if ttl is not None else []
        lines += [f"Nats-Marker-Reason: {marker}"] if marker else []
        lines += [f"KV-Operation: {op}"] if op is not None else []
        parsed = parse_headers(("NATS/1.0\r\n" + "".join(f"{x}\r\n" for x in lines) + "\r\n").encode())
        t_us = (1_700_000_000_000_000_000 + i) // 1000
        expires = t_us + int(max_age * 1_000_000) if max_age else None
        ttl_col = marker_col = None
        operation = "PUT"
        if parsed.get("Nats-TTL"):
            ttl_col = parsed["Nats-TTL"][0]
            try:
                seconds = server_ttl_seconds(ttl_col)
            except InvalidTtl:
                seconds = None
            if seconds == -1:
                expires = None
            elif seconds and seconds > 0:
                by_ttl = t_us + seconds * 1_000_000
                expires = by_ttl if expires is None else min(expires, by_ttl)
        if parsed.get("Nats-Marker-Reason"):
            marker_col = parsed["Nats-Marker-Reason"][0]
        if parsed.get("KV-Operation"):
            operation = parsed["KV-Operation"][0]
        elif marker_col is not None:
            operation = KV_OPERATION_OF_MARKER.get(marker_col)
        if expires is not None and expires > MAX_TIMESTAMP_US:
            expires = None
        if marker_col is not None and not include_markers:
            continue
        out.append({
            "subject": f"$KV.B.k{i}", "data": b"v", "headers": list(parsed.items()) or None, "stream": "KV_B",
            "seq": i + 1, "timestamp": dt.datetime.fromtimestamp(t_us / 1e6, dt.timezone.utc).replace(
                microsecond=t_us % 1_000_000),
            "ttl": ttl_col, "marker_reason": marker_col, "key": f"k{i}", "operation": operation,
            "expires_at": None if expires is None else dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
            + dt.timedelta(microseconds=expires),
        })
    return out


@pytest.mark.parametrize("rows", [8, 100, 1500, 20_000])
def test_large_batches_mixing_rows_without_headers_and_repeated_names_build_valid_arrays(rows):
    """Hash group-bys promise no output order: past a few dozen rows an order taken for granted broke
    the map's offsets (non-monotonic), which pyarrow's to_pylist() did not notice and Spark did."""
    shapes = [None, b"NATS/1.0\r\nNats-TTL: 1h\r\n\r\n",
              b"NATS/1.0\r\nX-Tag: a\r\nNats-Msg-Id: m\r\nX-Tag: b\r\nX-Other: o\r\n\r\n"]
    blocks = [shapes[i % 3] if i % 7 else shapes[i % 2] for i in range(rows)]
    fast = header_columns.columnar(blocks, MAP, NAMES)
    assert fast is not None
    same(fast, header_columns.per_row(blocks, MAP, NAMES))
    builder = BatchBuilder("S")
    for i, block in enumerate(blocks):
        builder.add(b"o.new", b"{}", block, i + 1, 1_700_000_000_000_000_000)
    builder.build().validate(full=True)


def test_an_empty_batch_and_a_batch_without_headers():
    for blocks in ([], [None, None]):
        same(header_columns.decode(blocks, MAP, NAMES), header_columns.per_row(blocks, MAP, NAMES))
    assert isinstance(header_columns.decode([], MAP, NAMES).headers, pa.Array)
