"""The header-derived columns of a batch, decoded column-wise with pyarrow, free of I/O.

Almost every message a real stream holds carries headers (``Nats-Msg-Id`` and ``Nats-TTL``
on anything an idempotent producer wrote), and decoding them row by row in Python was the
largest per-message cost of a read. :func:`columnar` decodes a whole batch's blocks with
pyarrow compute, by one of two paths:

* :func:`_uniform`, for a batch whose blocks all have the same lines in the same order, each
  line the same name (what one producer writes: this connector's sink, nats-py, nats.go):
  each line position is one column, checked to start with its name and sliced after the
  ``:``; the map is those columns interleaved. No hashing, about a fifth of the general path's
  time.
* :func:`_general`, for any other batch: split into lines, drop each block's status line,
  split name from value at the first ``:``, trim, group repeated names in order (one hash
  group-by), and take the values the source derives columns from (``Nats-TTL``,
  ``Nats-Marker-Reason``, ``KV-Operation``) as vectorised look-ups.

Both return ``None`` for a batch with a block outside the common shape: bytes that are not
UTF-8, or any that are not ASCII (where pyarrow's and Python's notions of white space could
differ; for ASCII both trim exactly ``str.isspace`` characters). :func:`per_row` then decodes that batch
exactly as before, with :func:`~pyspark_jetstream.protocol.headers.parse_headers`.

A read without the ``headers`` column (``includeHeaders=false``, or a schema without it) needs no map,
only the first value of a few names: :func:`searched` finds each name's line in every block (one
scan a name), whatever the batch's shape, and hands over to the paths above when a name also
occurs elsewhere. A differential test (``tests/unit/test_header_columns.py``) holds all of them to
the same columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...protocol.headers import parse_headers

_PY_ASCII_WHITESPACE = " \t\n\x0b\x0c\r\x1c\x1d\x1e\x1f"
"""What ``str.strip()`` removes from ASCII text (``str.isspace``), so that both paths trim alike."""
_NO_END = 1 << 30
"""``binary_slice``'s stop for "to the end" (it takes no open stop)."""


@dataclass
class HeaderColumns:
    """``headers`` (map<string, list<string>>, null for a message without header lines) and, for
    each name asked for, the first value per row (string, null when the name is absent)."""

    headers: Any
    first: dict[str, Any]


def columnar(blocks: list[bytes | None], map_type: Any, names: tuple[str, ...],
             want_map: bool = True) -> HeaderColumns | None:
    """The batch decoded column-wise, or ``None`` when it is outside the common shape."""
    text = _ascii_text(blocks)
    if text is None:
        return None
    return _uniform(text, map_type, names, want_map) or _general(text, map_type, names)


def _ascii_text(blocks: list[bytes | None]) -> Any:
    """The blocks as a string array, or ``None`` when one is not ASCII (or not UTF-8 at all)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        text = pa.array(blocks, pa.binary()).cast(pa.string())
    except (pa.ArrowInvalid, UnicodeDecodeError):
        return None  # not UTF-8 somewhere: the per-row path replaces what it cannot decode
    if not pc.all(pc.string_is_ascii(text)).as_py():
        return None  # Unicode white space is Python's to trim
    return text


def _uniform(text: Any, map_type: Any, names: tuple[str, ...], want_map: bool = True) -> HeaderColumns | None:
    """Blocks with the same lines in the same order, every line at a position the same name (or,
    at that position, no line a header): ``None`` for any other batch."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(text)
    if n == 0 or text.null_count:
        return None
    lines = pc.split_pattern(text, "\r\n")
    widths = pc.min_max(pc.list_value_length(lines))
    width = widths["max"].as_py()
    if widths["min"].as_py() != width:
        return None
    columns: dict[str, list[Any]] = {}  # name -> its value columns, in order of first appearance
    for j, line in enumerate(lines[0].as_py()[1:], start=1):  # row 0's lines; the status line is not a header
        column = pc.list_element(lines, j)
        raw, colon, _ = line.partition(":")
        if not colon:  # not a header in row 0 (the blank lines at the end): then in no row
            if pc.any(pc.match_substring(column, ":")).as_py():
                return None
            continue
        prefix = raw + ":"  # its only ':' is the last: every line that starts so splits there too
        if not pc.all(pc.starts_with(column, prefix)).as_py():
            return None
        name = raw.strip(_PY_ASCII_WHITESPACE)
        if not want_map and name not in names:  # no map to build: only the names asked for need values
            columns.setdefault(name, []).append(None)
            continue
        # The text is ASCII: a byte slice is a code-unit slice, at a tenth of utf8_slice_codeunits' cost.
        after = pc.binary_slice(column.cast(pa.binary()), len(prefix), _NO_END).cast(pa.string())
        values = pc.ascii_trim(after, _PY_ASCII_WHITESPACE)
        columns.setdefault(name, []).append(values)
    if not columns:  # no header line in any block
        return HeaderColumns(pa.nulls(n, map_type), {name: pa.nulls(n, pa.string()) for name in names})
    if not want_map:  # the map is most of the cost: a read without the headers column skips it
        return HeaderColumns(None, {name: columns[name][0] if name in columns else pa.nulls(n, pa.string())
                                    for name in names})
    # Row r's values, name by name: value slot s of every row comes from the same column, so the
    # row-major order is a take of the columns laid end to end at column(s) * n + r.
    ordered = [values for group in columns.values() for values in group]
    per_row = len(ordered)
    slot_column = _tile(_counting(per_row), n)
    row_of_slot = pc.divide(_counting(n * per_row), per_row)
    values = pc.take(pa.concat_arrays(ordered), pc.add(pc.multiply(slot_column, n), row_of_slot))
    lengths = [len(group) for group in columns.values()]
    if per_row == len(lengths):  # no name repeated: one value per entry
        item_offsets = _counting(n * per_row + 1).cast(pa.int32())
    else:
        item_offsets = pa.concat_arrays([pa.array([0], pa.int64()),
                                         pc.cumulative_sum(_tile(pa.array(lengths, pa.int64()), n))]).cast(pa.int32())
    items = pa.ListArray.from_arrays(item_offsets, values)
    keys = _tile(pa.array(list(columns), pa.string()), n)
    offsets = pc.multiply(_counting(n + 1), len(lengths)).cast(pa.int32())
    headers = pa.MapArray.from_arrays(offsets, keys, items, type=map_type)
    first = {name: columns[name][0] if name in columns else pa.nulls(n, pa.string()) for name in names}
    return HeaderColumns(headers, first)


def _general(text: Any, map_type: Any, names: tuple[str, ...]) -> HeaderColumns:
    """Any batch of ASCII blocks (or none)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(text)
    lines_per_row = pc.list_slice(pc.split_pattern(text, "\r\n"), 1)  # the status line is not a header
    lines = pc.list_flatten(lines_per_row)
    rows = pc.list_parent_indices(lines_per_row)
    parts = pc.split_pattern(lines, ":", max_splits=1)
    is_header = pc.equal(pc.list_value_length(parts), 2)  # a line without ':' is not a header
    parts, rows = parts.filter(is_header), rows.filter(is_header)
    line_names = pc.ascii_trim(pc.list_element(parts, 0), _PY_ASCII_WHITESPACE)
    values = pc.ascii_trim(pc.list_element(parts, 1), _PY_ASCII_WHITESPACE)
    m = len(line_names)
    positions = _counting(m)  # lines are in row order, then in order within the row
    # A map's entries: one per (row, name), in order of first appearance, its values in order.
    # Hash group-bys promise no output order, so the order is made explicit: each line gets the
    # position of its name's first line in its row, and the lines are sorted by (that, position).
    # The row's digits, a separator, the name: the first '\n' splits a key one way only.
    key = pc.binary_join_element_wise(pc.cast(rows, pa.string()), line_names, "\n")
    firsts = pa.table({"key": key, "pos": positions}).group_by("key").aggregate([("pos", "min")])
    if len(firsts) == m:  # no name repeated within a row (the common case): the lines are the entries
        group_rows, keys = rows, line_names
        items = pa.ListArray.from_arrays(_counting(m + 1).cast(pa.int32()), values)
    else:
        first_pos = pc.take(firsts.column("pos_min").combine_chunks(),
                            pc.index_in(key, value_set=firsts.column("key").combine_chunks()))
        order = pc.sort_indices(pa.table({"first": first_pos, "pos": positions}),
                                sort_keys=[("first", "ascending"), ("pos", "ascending")])
        first_pos, rows, line_names, values = (pc.take(a, order) for a in (first_pos, rows, line_names, values))
        entry = pc.indices_nonzero(_starts(first_pos))  # where each (row, name) entry begins
        group_rows, keys = pc.take(rows, entry), pc.take(line_names, entry)
        items = pa.ListArray.from_arrays(pa.concat_arrays([entry.cast(pa.int32()), pa.array([m], pa.int32())]),
                                         values)
    all_rows = _counting(n)
    # The entries are in row order: a row's map starts at its first entry; a row with none is null.
    starts = pc.indices_nonzero(_starts(group_rows))
    row_start = pc.take(starts, pc.index_in(all_rows, value_set=pc.take(group_rows, starts)))
    offsets = pa.concat_arrays([row_start.cast(pa.int32()), pa.array([len(group_rows)], pa.int32())])
    headers = pa.MapArray.from_arrays(offsets, keys, items, type=map_type)
    first: dict[str, Any] = {}
    for name in names:
        named = pc.equal(keys, name)
        where = pc.index_in(all_rows, value_set=group_rows.filter(named))
        first[name] = pc.take(pc.list_element(items.filter(named), 0), where)
    return HeaderColumns(headers, first)


_COUNTING: Any = None


def _counting(n: int) -> Any:
    """0, 1, ..., n-1 as an int64 array: a slice of one kept array, grown by doubling."""
    import pyarrow as pa
    import pyarrow.compute as pc

    global _COUNTING
    have = _COUNTING
    if have is None or len(have) < n:
        size = max(n, 2 * len(have) if have is not None else 1 << 16)
        have = _COUNTING = pc.subtract(pc.cumulative_sum(pa.nulls(size, pa.int64()).fill_null(1)), 1)
    return have.slice(0, n)


def _tile(values: Any, times: int) -> Any:
    """``values`` repeated ``times`` times, end to end."""
    import pyarrow as pa

    want = len(values) * times
    out = values
    while len(out) < want:
        out = pa.concat_arrays([out, out])
    return out.slice(0, want)


def _starts(sorted_values: Any) -> Any:
    """True where a value differs from the one before it (and at the first)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    m = len(sorted_values)
    if m == 0:
        return pa.array([], pa.bool_())
    return pa.concat_arrays([pa.array([True]), pc.not_equal(sorted_values.slice(1), sorted_values.slice(0, m - 1))])


def searched(blocks: list[bytes | None], names: tuple[str, ...]) -> dict[str, Any] | None:
    """For a read without the ``headers`` column: each name's first value per row, found by searching
    each block for the line that starts ``\\r\\n<name>:`` (one scan a name, no split into lines, no map),
    so a batch that mixes shapes (a TTL on some messages only) costs what a uniform one does.

    It agrees with :func:`~pyspark_jetstream.protocol.headers.parse_headers` when, across the batch,
    the name occurs exactly as often as there are rows with such a line: each such row then holds the
    name once, as that line's name, and no other line trims to it. ``None`` otherwise, or when a value
    is not ASCII (Python trims Unicode white space too): another path decides. The names (the
    protocol's constants) have no border, so a non-overlapping count counts them all. An ASCII
    byte never belongs to a byte sequence that is not UTF-8, so the raw bytes' lines are the decoded
    text's."""
    import pyarrow as pa
    import pyarrow.compute as pc

    raw_blocks = pa.array(blocks, pa.binary())
    n = len(raw_blocks)
    _, offsets, data = raw_blocks.buffers()
    end = pa.Array.from_buffers(pa.int32(), n + 1, [None, offsets])[n].as_py()  # a new array starts at 0
    text = data.slice(0, end).to_pybytes() if data is not None else b""
    first: dict[str, Any] = {}
    for name in names:
        key = name.encode()
        seen = text.count(key)
        if not seen:
            first[name] = pa.nulls(n, pa.string())
            continue
        parts = pc.split_pattern(raw_blocks, b"\r\n" + key + b":", max_splits=1)
        found = pc.fill_null(pc.equal(pc.list_value_length(parts), 2), False)  # a null block: no line
        if pc.sum(found).as_py() != seen:
            return None
        after = pc.list_element(parts, 1) if seen == n else pc.list_flatten(pc.list_slice(parts, 1, 2))
        line = pc.list_element(pc.split_pattern(after, b"\r\n", max_splits=1), 0)
        try:
            values = line.cast(pa.string())
        except (pa.ArrowInvalid, UnicodeDecodeError):
            return None
        if not pc.all(pc.string_is_ascii(values)).as_py():
            return None
        values = pc.ascii_trim(values, _PY_ASCII_WHITESPACE)
        if seen != n:  # the found rows' values, in row order: back to their rows, null elsewhere
            at = pc.subtract(pc.cumulative_sum(found.cast(pa.int64())), 1)
            values = pc.take(values, pc.if_else(found, at, pa.scalar(None, pa.int64())))
        first[name] = values
    return first


def per_row(blocks: list[bytes | None], map_type: Any, names: tuple[str, ...]) -> HeaderColumns:
    """Any batch, one block at a time with the protocol's header parser (bytes that are not UTF-8
    become U+FFFD)."""
    import pyarrow as pa

    n = len(blocks)
    headers: list[Any] = [None] * n
    first: dict[str, list[str | None]] = {name: [None] * n for name in names}
    for i, block in enumerate(blocks):
        if block is None:
            continue
        parsed = parse_headers(block)
        if not parsed:
            continue
        headers[i] = list(parsed.items())
        for name in names:
            values = parsed.get(name)
            if values:
                first[name][i] = values[0]
    return HeaderColumns(pa.array(headers, map_type), {k: pa.array(v, pa.string()) for k, v in first.items()})


def decode(blocks: list[bytes | None], map_type: Any, names: tuple[str, ...], *,
           want_map: bool = True) -> HeaderColumns:
    """Column-wise when the batch has the common shape, else row by row: the same columns either way.
    ``want_map=False`` (a read without the ``headers`` column): only the first values of ``names``;
    ``headers`` is then None."""
    if all(block is None for block in blocks):
        return per_row(blocks, map_type, names)
    if not want_map:
        first = searched(blocks, names)
        if first is not None:
            return HeaderColumns(None, first)
    return columnar(blocks, map_type, names, want_map) or per_row(blocks, map_type, names)

