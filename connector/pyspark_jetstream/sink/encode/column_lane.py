"""The encoder's column-wise lane: a batch of the common shape checked and framed without a step per row.

Most writes are plain stream rows: a subject (or option ``subject``), data, perhaps a ``ttl`` and a
``msg_id``; no user headers, KV operations, delete markers or expiry to preserve. Whether such a row
passes depends only on each distinct value (a subject's validity, a TTL's header value), and subjects
and TTLs repeat, so this lane checks each distinct value of the batch once and builds every column of
the frames with Arrow: about 0.4 us a row less than the per-row steps (docs/architecture.md, "A
write's CPU per row").

The lane never refuses a row: a batch in which any row would be refused (or with another shape) is
left to the per-row steps (:mod:`.checks`), which name the row and its problem. It decides before
anything is generated, because content-addressed ids count repeats across the task's rows
(:mod:`.msg_ids`). Byte for byte the per-row steps' frames (tests/unit/test_sink_frames.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...protocol.ttl import InvalidTtl
from .frames import counting
from .msg_ids import generated_ids

if TYPE_CHECKING:
    from .checks import RowChecks
    from .frames import Frames, ReplyForm
    from .layout import EncoderConfig, InputLayout
    from .msg_ids import MsgIds
    from .rows import Columns, EncodedBatch


class ColumnLane:
    """The column-wise lane of one task's encoder (module docstring)."""

    def __init__(self, layout: InputLayout, config: EncoderConfig, checks: RowChecks, frames: Frames,
                 msg_ids: MsgIds | None) -> None:
        self.layout, self.config = layout, config
        self.checks, self.frames, self.msg_ids = checks, frames, msg_ids
        # The shapes the lane never takes, whatever the rows hold.
        self.open = config.bucket is None

    def encode(self, rows: Columns, first: int, reply: ReplyForm, out: EncodedBatch) -> bool:
        """``rows`` framed into ``out``, or False (``out`` untouched) when a row may be refused or the batch
        has another shape: the per-row steps take it."""
        import pyarrow as pa
        import pyarrow.compute as pc

        lay, n = self.layout, rows.n
        if not self.open or n == 0 or not self._plain(rows):
            return False
        subjects = self._subjects(rows)
        if subjects is None:
            return False
        ttls = self._ttls(rows)
        if ttls is None:
            return False
        own = None
        if lay.msg_id is not None:
            own = rows.arrow(lay.msg_id)
            if pc.any(pc.match_substring_regex(own, "[\r\n]")).as_py():
                return False  # the per-row step refuses it
            own = pc.if_else(pc.fill_null(pc.not_equal(own, ""), False), own, pa.scalar(None, pa.string()))
        ids = self._generated(rows, first)
        if own is not None:
            ids = pc.coalesce(own, ids)
        self.frames.columns(rows, range(n), first, reply, subjects, ttls, ids, out)
        return True

    def _plain(self, rows: Columns) -> bool:
        """No delete marker, no user header, no expiry to preserve: nothing the per-row steps act on."""
        lay = self.layout
        if lay.marker_reason is not None and rows.arrow(lay.marker_reason).null_count < rows.n:
            return False
        if lay.headers is not None:
            offsets = rows.arrow(lay.headers).offsets  # null or empty maps only: no entry at all
            if offsets[len(offsets) - 1].as_py() != offsets[0].as_py():
                return False
        return not (self.config.preserve_expiry and lay.expires_at is not None
                    and rows.arrow(lay.expires_at).null_count < rows.n)

    def _subjects(self, rows: Columns) -> Any:
        """Each row's subject (its own unless null or empty, else option ``subject``), or None when one is
        missing or invalid."""
        import pyarrow as pa
        import pyarrow.compute as pc

        default, ok = self.config.default_subject, self.checks.subject_ok
        if self.layout.subject is None:
            return None if default is None or not ok(default) else pa.scalar(default, pa.string())
        column = rows.arrow(self.layout.subject)
        distinct = pc.unique(column).to_pylist()
        if None in distinct or "" in distinct:
            if default is None:
                return None
            column = pc.if_else(pc.fill_null(pc.not_equal(column, ""), False), column, pa.scalar(default))
            distinct = [s for s in distinct if s] + [default]
        return column if all(map(ok, distinct)) else None

    def _ttls(self, rows: Columns) -> Any:
        """Each row's ``Nats-TTL`` value (null: no header): its ``ttl`` resolved, or ``defaultTtl`` when
        null; None when one is invalid."""
        import pyarrow as pa

        default = self.config.default_ttl
        if self.layout.ttl is None:
            return pa.scalar(default, pa.string())
        codes = rows.arrow(self.layout.ttl).dictionary_encode(null_encoding="encode")
        try:
            values = [default if v is None else self.checks.resolve_ttl(v) for v in codes.dictionary.to_pylist()]
        except InvalidTtl:
            return None
        if len(values) == 1:  # one TTL for the whole batch (the usual case)
            return pa.scalar(values[0], pa.string())
        return pa.array(values, pa.string()).take(codes.indices)

    def _generated(self, rows: Columns, first: int) -> Any:
        """The deterministic ids (option ``idempotent``): positional ones made by Arrow, content ones as
        :func:`~.msg_ids.generated_ids` makes them; nulls without the option."""
        import pyarrow as pa
        import pyarrow.compute as pc

        ids = self.msg_ids
        if ids is None:
            return pa.scalar(None, pa.string())
        if self.layout.source_stream is None:
            numbers = counting(first, rows.n).cast(pa.string())
            return pc.binary_join_element_wise(ids.positional_prefix(), numbers, "")
        return pa.array(generated_ids(ids, self.layout, rows, range(rows.n), first), pa.string())
