"""A batch's rows as the encoder sees them, and what it says of them.

:class:`Columns` materialises each input column a step needs once per batch (never per row);
:class:`EncodedBatch` is what encoding a batch gives: frames, refused rows (:class:`RowRejection`,
with what a dead letter needs), and counts. :class:`RowChoice` is how a caller that picked the rows
(option ``sequenceBy``) tells the encoder which to publish.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .layout import InputLayout

_MAX_SHOWN = 120


@dataclass(frozen=True)
class RowRejection:
    """A row the connector refused before publishing (or the server refused)."""

    position: int
    subject: str | None
    reason: str
    column: str | None = None
    value: Any = None
    err_code: int | None = None
    payload: bytes = b""
    ttl: str | None = None
    status: int | None = None  # a status-only refusal (503 no stream, 403 permissions), no err_code
    msg_id: str | None = None  # the id the row was (or would have been) published with


@dataclass(frozen=True)
class RowChoice:
    """Which rows of a batch :meth:`BatchEncoder.encode` publishes, for a caller that picked them
    (option ``sequenceBy``, sink/reduce/sequencer.py): ``publish`` maps a row index to header lines added to
    its block (``"Name: value\r\n"`` each, already checked); ``refuse`` maps a row index to a refusal
    the caller made (subject, reason, column). Every other row is left out, after the ids are
    generated, so the ids and positions of the rows published are those of the whole batch."""

    publish: dict[int, str]
    refuse: dict[int, tuple[str | None, str, str | None]] = field(default_factory=dict)


@dataclass
class EncodedBatch:
    frames: list[tuple] = field(default_factory=list)  # OutFrame layout
    rejected: list[RowRejection] = field(default_factory=list)
    expired: int = 0
    markers_skipped: int = 0


def shown(value: Any) -> Any:
    """A value as it may appear in an error message: bounded in length."""
    text = repr(value)
    return value if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + "...'"


class Columns:
    """A batch's columns as Python lists, each materialised once, on first use (the column-wise lane,
    :mod:`.column_lane`, uses none of them)."""

    def __init__(self, lay: InputLayout, batch: Any, n: int) -> None:
        self.batch, self.n = batch, n
        self._lay = lay
        self._data_name = lay.data
        self._datas: list[Any] | None = None  # made on first use: the column-wise frames do not need it
        self._arrow: dict[str, Any] = {}  # name -> the column in its small form (cast once a batch)
        self._binary = lay.data_is_binary

    @cached_property
    def subjects(self) -> list[Any]:
        """The subject column as a list (the subject step fills in option ``subject`` in place)."""
        return self.column(self._lay.subject)

    @cached_property
    def markers(self) -> list[Any]:
        return self.column(self._lay.marker_reason)

    @cached_property
    def headers(self) -> list[Any]:
        return self.column(self._lay.headers)

    def column(self, name: str | None) -> list[Any]:
        if name is None:
            return [None] * self.n
        return self.arrow(name).to_pylist()

    def arrow(self, name: str) -> Any:
        """A column as Arrow; text, bytes and lists always in their small forms (``string``, ``binary``,
        ``list``), also where Spark sends the large ones (``spark.sql.execution.arrow.useLargeVarTypes``),
        at any depth: Arrow's string kernels take no mix of the two, and a batch is far below 2 GiB."""
        column = self._arrow.get(name)
        if column is None:
            column = self.batch.column(self.batch.schema.get_field_index(name))
            small = small_type(column.type)
            column = self._arrow[name] = column if small == column.type else column.cast(small)
        return column

    def payload(self, i: int) -> bytes:
        if self._datas is None:
            self._datas = self.column(self._data_name)
        data = self._datas[i]
        return b"" if data is None else (data if self._binary else data.encode())

    def payloads(self, live: list[int]) -> Any:
        """The payloads of rows ``live`` as an Arrow large_binary array (a null is empty)."""
        import pyarrow as pa

        column = self.arrow(self._data_name)
        if len(live) < self.n:
            column = column.take(pa.array(live, pa.int64()))
        return column.cast(pa.large_binary()).fill_null(b"")


@functools.lru_cache(maxsize=64)
def small_type(kind: Any) -> Any:
    """``kind`` with every large string, binary and list type in it made small; ``kind`` itself when it
    has none."""
    import pyarrow as pa

    t = pa.types
    if t.is_large_string(kind):
        return pa.string()
    if t.is_large_binary(kind):
        return pa.binary()
    if t.is_map(kind):
        key, item = small_type(kind.key_type), small_type(kind.item_type)
        small = pa.map_(key, item)
        return kind if small == kind else small
    if t.is_large_list(kind) or t.is_list(kind):
        value = small_type(kind.value_type)
        small = pa.list_(value)
        return kind if small == kind else small
    if t.is_struct(kind):
        fields = [kind.field(i) for i in range(kind.num_fields)]
        small = [f.with_type(small_type(f.type)) for f in fields]
        return kind if all(a.type == b.type for a, b in zip(small, fields, strict=True)) else pa.struct(small)
    return kind
