"""Keeping each key's newest row in a KV bucket (option ``sequenceBy``), free of I/O.

A streaming aggregation emits several rows per key per micro-batch, and parallel tasks
publish them in no particular order, so without help an older row can land last. With
``sequenceBy`` a column orders the rows of one key, and the bucket keeps, per key, the
row with the greatest value:

* **within a task**, :class:`Reduction` keeps the newest row per key of the task's
  Arrow batches, column-wise (sort by key, sequence value, position; the last row of
  each key's run wins, so equal values are broken by the later position); a task that holds
  more than :data:`MAX_KEYS` keys or :data:`MAX_ROWS` rows publishes them and starts over, and a
  later row tied with one published before then loses to it, as to any stored value;
* **across tasks, micro-batches, jobs and writers**, the stored value carries its
  sequence value in the header :data:`~pyspark_jetstream.protocol.headers.SEQUENCE`
  (:func:`encode_value`), each kept row is compared with it (:func:`is_newer`) and
  published with ``Nats-Expected-Last-Subject-Sequence`` set to the stored revision,
  so a writer that lost a race is refused (err_code 10071), looks the key up again
  and compares again (sink/reduce/sequenced_write.py).

The header's value is type-tagged: ``int:<n>`` (byte, short, int, long), ``ts:<microseconds
since the epoch>`` (timestamp; a timestamp_ntz is read as UTC), ``date:<days since the epoch>``,
``str:<text>`` (percent-escaped: ``%``, spaces, controls and non-ASCII). Values compare as what they
encode (numbers as numbers, text by code point, which is Spark's and Arrow's UTF-8 byte order).
A stored value without the header is older than any row; a header of another type is an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

INT, TS, DATE, STR = "int", "ts", "date", "str"
TAG_NAMES = {INT: "integer", TS: "timestamp", DATE: "date", STR: "string"}
"""Each tag as an error message names its type."""


def _article(noun: str) -> str:
    return f"an {noun}" if noun[0] in "aeiou" else f"a {noun}"

SUPPORTED_TYPES = "byte, short, int, long, timestamp, timestamp_ntz, date or string"

MAX_KEYS = 100_000
"""Keys a task's running reduction holds before it is published (each flush costs one lookup per key)."""

MAX_ROWS = 1_000_000
"""Input rows a task keeps for a flush (the batches its newest rows are in) before it publishes them."""

_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")


@dataclass(frozen=True)
class SequencePlan:
    """What a task needs for ``sequenceBy``, decided on the driver."""

    column: str  # the column's name in the DataFrame
    tag: str  # INT, TS, DATE or STR
    direct: bool  # the bucket allows direct gets (lookups answered by any replica)


def sequence_column(schema: Any, name: str) -> tuple[str, str, Any]:
    """(the column's name as the DataFrame spells it, its tag, the schema the sink's layout checks):
    the column matched case-insensitively; unless the sink reads it anyway (a KV column such as a bucket
    read's ``seq`` or ``timestamp``) it is left out of the layout's schema. ValueError saying what is wrong."""
    from pyspark.sql.types import StructType

    from ..encode.layout import KV_IGNORED_COLUMNS, KV_INPUT_COLUMNS

    found = [f for f in schema.fields if f.name.lower() == name.lower()]
    if not found:
        raise ValueError(f"There is no column '{name}'; the columns are {', '.join(f.name for f in schema.fields)}.")
    fld = found[0]
    tag = spark_tag(fld.dataType)
    if tag is None:
        raise ValueError(f"Column '{fld.name}' has type {fld.dataType.simpleString()}; it must be {SUPPORTED_TYPES} "
                         "(cast it, e.g. to a long or a timestamp).")
    if fld.name.lower() in KV_INPUT_COLUMNS + KV_IGNORED_COLUMNS:
        return fld.name, tag, schema
    return fld.name, tag, StructType([f for f in schema.fields if f is not fld])


class SequenceMismatch(ValueError):
    """A stored value's sequence header is of another type than the row's, or unreadable."""


def spark_tag(data_type: Any) -> str | None:
    """The tag of a Spark SQL type (``pyspark.sql.types``), None when ``sequenceBy`` cannot use it."""
    from pyspark.sql.types import (
        ByteType,
        DateType,
        IntegerType,
        LongType,
        ShortType,
        StringType,
        TimestampNTZType,
        TimestampType,
    )

    if isinstance(data_type, (ByteType, ShortType, IntegerType, LongType)):
        return INT
    if isinstance(data_type, (TimestampType, TimestampNTZType)):
        return TS
    if isinstance(data_type, DateType):
        return DATE
    if isinstance(data_type, StringType):
        return STR
    return None


def encode_value(tag: str, value: Any) -> str:
    """The header value for ``value`` (an int for ``int``/``ts``/``date``, a str for ``str``)."""
    if tag == STR:
        return f"{STR}:{quote(value, safe=_SAFE)}"
    return f"{tag}:{int(value)}"


def parse_value(text: str) -> tuple[str, Any]:
    """(tag, value) of a header value written by :func:`encode_value`; :class:`SequenceMismatch` when unreadable."""
    tag, sep, rest = text.strip().partition(":")
    if not sep or tag not in TAG_NAMES:
        raise SequenceMismatch(f"unreadable sequence value {text!r}")
    if tag == STR:
        return tag, unquote(rest)
    try:
        return tag, int(rest)
    except ValueError:
        raise SequenceMismatch(f"unreadable sequence value {text!r}") from None


def is_newer(tag: str, value: Any, stored: str | None) -> bool:
    """Whether a row with sequence value ``value`` (of ``tag``) replaces a stored value whose header is
    ``stored`` (None: no header, older than any row). Equal is not newer: the stored row stays."""
    if stored is None:
        return True
    stored_tag, stored_value = parse_value(stored)
    if stored_tag != tag:
        raise SequenceMismatch(f"the stored value is sequenced by {_article(TAG_NAMES[stored_tag])} ({stored!r}), "
                               f"the row by {_article(TAG_NAMES[tag])}")
    return value > stored_value


def header_values(tag: str, column: Any) -> list[Any]:
    """The Python values a column of sequence values compares and encodes as (see :func:`encode_value`)."""
    import pyarrow as pa

    if tag == TS:
        column = column.cast(pa.timestamp("us", tz=column.type.tz)).cast(pa.int64())
    elif tag == DATE:
        column = column.cast(pa.int32())
    return column.to_pylist()


def newest_per_key(keys: Any, values: Any, positions: Any) -> Any:
    """Indices (an Arrow int64 array) of the newest row of each key among ``keys``, ``values`` and
    ``positions`` (equal-length Arrow arrays without nulls): the greatest value, on a tie the greatest
    position. They come in key order."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = pa.table({"k": keys, "s": values, "p": positions})
    order = pc.sort_indices(table, sort_keys=[("k", "ascending"), ("s", "ascending"), ("p", "ascending")])
    n = len(order)
    if n < 2:
        return order
    ordered = table.column("k").take(order).combine_chunks()
    run_ends = pc.not_equal(ordered.slice(0, n - 1), ordered.slice(1))
    last = pa.concat_arrays([run_ends, pa.array([True])])
    return order.filter(last)


@dataclass
class Kept:
    """One retained batch of a task: where it starts in the task, and its rows to hand to the encoder."""

    first: int
    batch: Any
    newest: list[int] = field(default_factory=list)  # row indices: the newest row of their key
    passthrough: list[int] = field(default_factory=list)  # no key or a delete marker: the encoder decides
    null_sequence: list[int] = field(default_factory=list)  # refused: no sequence value


class Reduction:
    """The newest row per key of one task's Arrow batches so far, kept column-wise.

    :meth:`add` takes each batch with its first position; the batches that hold a newest
    row stay referenced (so the encoder later sees each row in its own batch, at its own
    position, and generated message ids are those of a write without the option). :meth:`take`
    hands them out and starts over; :attr:`full` says when to do so (:data:`MAX_KEYS` keys or
    :data:`MAX_ROWS` retained rows)."""

    def __init__(self, key: str, sequence: str, marker: str | None = None, *, max_keys: int = MAX_KEYS,
                 max_rows: int = MAX_ROWS) -> None:
        self.key, self.sequence, self.marker = key, sequence, marker
        self.max_keys, self.max_rows = max_keys, max_rows
        self._start()

    def _start(self) -> None:
        self._state: Any = None  # table k, s, p, b (key, value, position, batch number) of the newest rows
        self._pending: list[Any] = []
        self._pending_rows = 0
        self._batches: dict[int, Kept] = {}
        self._next = 0
        self.candidates = 0  # rows with a key and a value, before reduction

    @property
    def keys(self) -> int:
        return 0 if self._state is None else self._state.num_rows

    @property
    def retained_rows(self) -> int:
        return sum(k.batch.num_rows for k in self._batches.values())

    @property
    def full(self) -> bool:
        if self.keys + self._pending_rows <= self.max_keys and self.retained_rows <= self.max_rows:
            return False  # not even before reducing what is pending
        self._reduce()
        return self.keys > self.max_keys or self.retained_rows > self.max_rows

    def reduce(self, batch: Any, first: int) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        n = batch.num_rows
        if n == 0:
            return
        number = self._next
        self._next += 1
        keys = batch.column(batch.schema.get_field_index(self.key))
        values = batch.column(batch.schema.get_field_index(self.sequence))
        has_key = pc.is_valid(keys)
        if self.marker is not None:
            has_key = pc.and_(has_key, pc.is_null(batch.column(batch.schema.get_field_index(self.marker))))
        valid = pc.and_(has_key, pc.is_valid(values))
        kept = Kept(first, batch)
        if not pc.all(valid).as_py():
            kept.passthrough = pc.indices_nonzero(pc.invert(has_key)).to_pylist()
            kept.null_sequence = pc.indices_nonzero(pc.and_(has_key, pc.is_null(values))).to_pylist()
        rows = pc.indices_nonzero(valid)
        if len(rows):
            self._pending.append(pa.table({
                "k": keys.take(rows), "s": values.take(rows), "p": pc.add(rows.cast(pa.int64()), first),
                "b": pa.array([number] * len(rows), pa.int32())}))
            self._pending_rows += len(rows)
            self.candidates += len(rows)
        self._batches[number] = kept
        if self._pending_rows >= max(self.keys, 65_536):
            self._reduce()

    def _reduce(self) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        if not self._pending:
            return
        parts = ([self._state] if self._state is not None else []) + self._pending
        table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        self._pending, self._pending_rows = [], 0
        self._state = table.take(newest_per_key(table.column("k"), table.column("s"), table.column("p")))
        live = set(pc.unique(self._state.column("b")).to_pylist())
        for number in [b for b, k in self._batches.items()
                       if b not in live and not k.passthrough and not k.null_sequence]:
            del self._batches[number]

    def take(self) -> tuple[list[Kept], list[tuple[int, str, Any]], int]:
        """The retained batches (in order, each with its newest rows), the newest rows as
        (position, key, value as :func:`header_values` gives it) in key order, and how many rows
        were left out for a newer row of their key; then starts over."""
        self._reduce()
        superseded = self.candidates - self.keys
        newest: list[tuple[int, str, Any]] = []
        if self._state is not None:
            state = self._state
            numbers = state.column("b").to_pylist()
            positions = state.column("p").to_pylist()
            keys = state.column("k").to_pylist()
            values = header_values(self.tag_of(state.column("s").type), state.column("s").combine_chunks())
            for number, position, key, value in zip(numbers, positions, keys, values, strict=True):
                kept = self._batches[number]
                kept.newest.append(position - kept.first)
                newest.append((position, key, value))
        batches = [self._batches[b] for b in sorted(self._batches)]
        for kept in batches:
            kept.newest.sort()
        self._start()
        return batches, newest, superseded

    @staticmethod
    def tag_of(arrow_type: Any) -> str:
        """The tag of an Arrow type of a sequence column (as Spark sends the supported types)."""
        import pyarrow as pa

        if pa.types.is_integer(arrow_type):
            return INT
        if pa.types.is_timestamp(arrow_type):
            return TS
        if pa.types.is_date(arrow_type):
            return DATE
        if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
            return STR
        raise TypeError(f"sequenceBy cannot order by {arrow_type}")
