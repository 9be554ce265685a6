"""The encoder's column-wise lane: a batch of the common shape checked and framed without a step per row.

Most writes are plain rows: a subject (or option ``subject``) or a KV key and operation, data, perhaps
a ``ttl``, a ``msg_id`` and a compare-and-set revision; no user headers, delete markers or expiry to
preserve. Whether such a row passes depends only on each distinct value (a subject's validity, a TTL's
header value) or on a rule Arrow applies to a whole column (a key's characters, a revision's sign), so
this lane checks each distinct value of the batch once and builds every column of the frames with
Arrow: about 0.5 us a row less than the per-row steps (docs/architecture.md, "A write's CPU per row").

The lane never refuses a row: a batch in which any row would be refused (or with another shape) is
left to the per-row steps (:mod:`.checks`), which name the row and its problem. It decides before
anything is generated, because content-addressed ids count repeats across the task's rows
(:mod:`.msg_ids`). Byte for byte the per-row steps' frames (tests/unit/test_sink_frames.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...protocol import headers as hdrs
from ...protocol import kv
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
        self.kv = KvColumns(layout, config, checks) if config.bucket is not None else None

    def encode(self, rows: Columns, first: int, reply: ReplyForm, out: EncodedBatch) -> bool:
        """``rows`` framed into ``out``, or False (``out`` untouched) when a row may be refused or the batch
        has another shape: the per-row steps take it."""
        import pyarrow as pa
        import pyarrow.compute as pc

        lay, n = self.layout, rows.n
        if n == 0 or not self._plain(rows):
            return False
        if self.kv is not None:
            keyed = self.kv.check(rows)
            if keyed is None:
                return False
            subjects, ttls, lines, payload = keyed
        else:
            subjects, ttls, lines, payload = self._subjects(rows), self._ttls(rows), (), None
            if subjects is None or ttls is None:
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
        if payload is None:
            payload = rows.payloads(range(n))
        self.frames.columns(range(n), first, reply, subjects, ttls, ids, payload, out, lines)
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
        return resolved_ttls(rows.arrow(self.layout.ttl), self.checks, default)

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


def resolved_ttls(column: Any, checks: RowChecks, default: Any) -> Any:
    """A ``ttl`` column's header values (null: no header; a null TTL is ``default``), each distinct value
    resolved once; a scalar when the batch has one. None when one is invalid."""
    import pyarrow as pa

    codes = column.dictionary_encode(null_encoding="encode")
    try:
        values = [default if v is None else checks.resolve_ttl(v) for v in codes.dictionary.to_pylist()]
    except InvalidTtl:
        return None
    if len(values) == 1:  # one TTL for the whole batch (the usual case)
        return pa.scalar(values[0], pa.string())
    return pa.array(values, pa.string()).take(codes.indices)


_KEY = "^[-/_=a-zA-Z0-9]([-/_=.a-zA-Z0-9]*[-/_=a-zA-Z0-9])?$"
"""nats-py's key rule (``protocol.kv.is_valid_key``) as one regular expression, for Arrow."""


class KvColumns:
    """A KV write's columns in the lane: ``$KV.<bucket>.<key>`` of valid keys, each operation's header
    lines and payload (a DEL or PURGE is empty, as nats-py sends it), the compare-and-set revision, and
    the TTL by operation (``defaultTtl`` for PUT rows; a PURGE only by its own; a DEL none)."""

    def __init__(self, layout: InputLayout, config: EncoderConfig, checks: RowChecks) -> None:
        self.layout, self.config, self.checks = layout, config, checks
        self.prefix = kv.subject_prefix(config.bucket or "")

    def check(self, rows: Columns) -> tuple[Any, Any, tuple[Any, ...], Any] | None:
        """Subjects, TTL values, the header lines before the id, payloads; None when a row may be refused."""
        import pyarrow as pa
        import pyarrow.compute as pc

        lay = self.layout
        keys = rows.arrow(lay.key)
        if keys.null_count or not pc.all(pc.match_substring_regex(keys, _KEY)).as_py():
            return None
        subjects = pc.binary_join_element_wise(self.prefix, keys, "")
        if lay.operation is None:
            ops = pa.scalar(kv.PUT, pa.string())
        else:
            ops = pc.fill_null(rows.arrow(lay.operation), kv.PUT)
            if not set(pc.unique(ops).to_pylist()) <= set(kv.OPERATIONS):
                return None
        put = pc.equal(ops, kv.PUT)
        op_lines = pa.array([kv.OPERATION_HEADERS[op] for op in kv.OPERATIONS], pa.string()).take(
            pc.index_in(ops, pa.array(kv.OPERATIONS))) if lay.operation is not None else pa.scalar("", pa.string())
        lines = (op_lines,)
        if lay.expected_revision is not None:
            revisions = rows.arrow(lay.expected_revision)
            if pc.any(pc.less(revisions, 0)).as_py():
                return None
            lines += (pc.binary_join_element_wise(f"{hdrs.EXPECTED_LAST_SUBJECT_SEQUENCE}: ",
                                                  revisions.cast(pa.string()), "\r\n", ""),)
        ttls = self._ttls(rows, ops, put)
        if ttls is None:
            return None
        payload = rows.payloads(range(rows.n))
        if lay.operation is not None:
            payload = pc.if_else(put, payload, pa.scalar(b"", payload.type))
        return subjects, ttls, lines, payload

    def _ttls(self, rows: Columns, ops: Any, put: Any) -> Any:
        """Each row's TTL value by its operation (class docstring); None when one may be refused. ``own``
        may be a scalar (one TTL in the batch): Arrow's kernels take it beside the columns."""
        import pyarrow as pa
        import pyarrow.compute as pc

        default = self.config.default_ttl
        if self.layout.ttl is None:
            if self.layout.operation is None:
                return pa.scalar(default, pa.string())
            return pc.if_else(put, pa.scalar(default, pa.string()), pa.scalar(None, pa.string()))
        column = rows.arrow(self.layout.ttl)
        own = resolved_ttls(column, self.checks, None)  # each row's own TTL, null for none
        if own is None:
            return None
        if self.layout.operation is None:
            return pc.if_else(pc.is_valid(column), own, pa.scalar(default, pa.string()))
        if pc.any(pc.and_(pc.equal(ops, kv.DEL), pc.is_valid(own))).as_py():
            return None  # a DEL row with a TTL: the per-row step refuses it
        return pc.if_else(pc.and_(put, pc.is_null(column)), pa.scalar(default, pa.string()), own)
