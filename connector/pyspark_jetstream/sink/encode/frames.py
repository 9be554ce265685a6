"""``HPUB`` frames: each row that passed the checks, ready to send, within the server's max_payload.

A frame travels with what settling a refusal needs beside it (:class:`OutFrame`), so that nothing is
parsed back out of it. :class:`Frames` builds them row by row, or, for a batch whose header blocks
are only ``Nats-Msg-Id``, ``Nats-TTL`` and the expected stream (the common case), column-wise with
Arrow in one pass per part: byte for byte the same frames (tests/unit/test_sink_frames.py). A frame
larger than max_payload would make nats-server close the connection: the row is refused instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from ...protocol import headers as hdrs
from ...protocol import kv
from ...protocol.frames import hpub_frame
from ...protocol.headers import MSG_ID, TTL
from .rows import RowRejection

if TYPE_CHECKING:
    from .rows import Columns, EncodedBatch

class OutFrame(NamedTuple):
    """One encoded row on its way out, with what settling a refusal needs beside the frame
    (so that nothing is parsed back out of it). The encoder builds plain tuples of this layout
    (a NamedTuple costs about 0.5 us more per row); refusal paths view them through this class."""

    position: int
    frame: bytes
    subject: str
    ttl: str | None
    msg_id: str | None
    header_len: int
    payload_len: int

    @property
    def header_block(self) -> bytes:
        end = len(self.frame) - 2 - self.payload_len
        return self.frame[end - self.header_len:end]

    @property
    def payload(self) -> bytes:
        return self.frame[len(self.frame) - 2 - self.payload_len:len(self.frame) - 2]


class ReplyForm(NamedTuple):
    """The reply subject a frame is made with: ``<prefix><position + offset><suffix>`` for the row at task
    position ``position``. The per-row publisher's is ``<inbox>.<position>``; a fast-ingest batch's is
    its batch sequence with the append operation (``<head><position + 1>.1.$FI``), so that its frames go
    out as they are (publish/batched.py)."""

    prefix: str
    suffix: str = ""
    offset: int = 0

    def of(self, position: int) -> str:
        return f"{self.prefix}{position + self.offset}{self.suffix}"


def too_large(position: int, subject: str, total: int, max_payload: int, payload: bytes,
              msg_id: str | None) -> RowRejection:
    return RowRejection(position, subject, f"the message is {total} bytes (headers and data), more than the "
                        f"server's max_payload of {max_payload}", "data", f"<{len(payload)} bytes>",
                        payload=payload, msg_id=msg_id)


class Frames:
    """The frames of a task's rows: its expected stream's header line and the server's max_payload fixed."""

    def __init__(self, expected_stream: str | None, max_payload: int) -> None:
        self._tail = f"{hdrs.EXPECTED_STREAM}: {expected_stream}\r\n\r\n" if expected_stream else "\r\n"
        self.max_payload = max_payload

    def per_row(self, rows: Columns, live: list[int], first: int, reply: ReplyForm,
                pairs: dict[int, list[tuple[str, str]]], ttl_headers: list[Any], msg_ids: list[str | None],
                out: EncodedBatch, ops: list[Any] | None = None, extra: dict[int, str] | None = None) -> None:
        """The header block and the ``HPUB`` frame of each row left, within the server's max_payload.
        A KV DEL or PURGE is an empty message with its operation's headers, as nats-py sends it.
        ``extra``: header lines a caller adds per row (:class:`RowChoice`)."""
        tail, max_payload = self._tail, self.max_payload
        subjects, frames = rows.subjects, out.frames
        for i in live:
            payload = rows.payload(i)
            msg_id, ttl = msg_ids[i], ttl_headers[i]
            head = "NATS/1.0\r\n"
            if ops is not None:
                op, expected = ops[i]
                if op != kv.PUT:
                    payload = b""
                    head += kv.OPERATION_HEADERS[op]
                if expected is not None:
                    head += expected
            if extra is not None:
                head += extra.get(i, "")
            if msg_id:
                head += f"{MSG_ID}: {msg_id}\r\n"
            if ttl is not None:
                head += f"{TTL}: {ttl}\r\n"
            for name, value in pairs.get(i, ()):
                head += f"{name}: {value}\r\n"
            block = (head + tail).encode()
            total = len(block) + len(payload)
            pos = first + i
            if total > max_payload:
                out.rejected.append(too_large(pos, subjects[i], total, max_payload, payload, msg_id))
                continue
            # OutFrame's layout, as a plain tuple (the hot path; see OutFrame).
            frames.append((pos, hpub_frame(subjects[i], reply.of(pos), block, payload), subjects[i], ttl,
                           msg_id, len(block), len(payload)))

    def common(self, rows: Columns, live: list[int], first: int, reply: ReplyForm,
               ttl_headers: list[Any], msg_ids: list[str | None], out: EncodedBatch) -> None:
        """:meth:`per_row` for a batch whose header blocks are only ``Nats-Msg-Id``, ``Nats-TTL`` and
        the expected stream, its rows checked row by row: :meth:`columns` over the rows left."""
        import pyarrow as pa

        if not live:
            return
        ids = pa.array([msg_ids[i] or None for i in live], pa.string())  # an empty id: no line
        ttls = pa.array([ttl_headers[i] for i in live], pa.string())
        subjects = pa.array([rows.subjects[i] for i in live], pa.string())
        self.columns(live, first, reply, subjects, ttls, ids, rows.payloads(live), out)

    def columns(self, live: list[int] | range, first: int, reply: ReplyForm, subjects: Any, ttls: Any, ids: Any,
                payload: Any, out: EncodedBatch, lines: tuple[Any, ...] = ()) -> None:
        """The frames of rows ``live`` from Arrow columns of those rows (``subjects``; ``ttls`` and ``ids``
        as header values, null for no line, either may be a scalar for every row; ``payload`` as
        large_binary; ``lines``: header lines that come first, such as a KV operation's): every frame
        joined by Arrow in one pass per part instead of a few string operations per row in Python.
        Byte for byte :meth:`per_row`'s frames (the differential test in tests/unit/test_sink_frames.py)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        binary = pa.large_binary()
        join = pc.binary_join_element_wise
        max_payload = self.max_payload

        def lit(value: bytes) -> Any:
            return pa.scalar(value, binary)

        crlf, space, empty = lit(b"\r\n"), lit(b" "), lit(b"")
        id_line = join(lit(b"Nats-Msg-Id: "), ids.cast(binary), crlf, empty)  # null: no line
        ttl_line = join(lit(b"Nats-TTL: "), ttls.cast(binary), crlf, empty)
        block = join(lit(b"NATS/1.0\r\n"), *(line.cast(binary) for line in lines), id_line, ttl_line,
                     lit(self._tail.encode()), empty, null_handling="replace", null_replacement="")
        if isinstance(block, pa.Scalar):  # every part a scalar: the same block for every row
            block = pa.array([block.as_py()] * len(live), binary)
        hlen = pc.binary_length(block)
        plen = pc.binary_length(payload)
        total = pc.add(hlen, plen)
        if isinstance(live, range):
            numbers = counting(live.start + first + reply.offset, len(live))
        else:
            numbers = pc.add(pa.array(live, pa.int64()), first + reply.offset)
        line = join(lit(b"HPUB "), subjects.cast(binary), lit(f" {reply.prefix}".encode()),
                    numbers.cast(pa.string()).cast(binary), lit(f"{reply.suffix} ".encode()),
                    hlen.cast(pa.string()).cast(binary), space, total.cast(pa.string()).cast(binary), crlf, empty)
        frames = join(line, block, payload, crlf, empty).to_pylist()
        hlens, plens = hlen.to_pylist(), plen.to_pylist()
        positions = range(live.start + first, live.stop + first) if isinstance(live, range) else \
            [first + i for i in live]
        subject_list, ttl_list, id_list = (_values(a, len(live)) for a in (subjects, ttls, ids))
        if pc.any(pc.greater(total, max_payload)).as_py():
            totals = total.to_pylist()
            for k in [k for k, t in enumerate(totals) if t > max_payload]:
                out.rejected.append(too_large(positions[k], subject_list[k], totals[k], max_payload,
                                              payload[k].as_py(), id_list[k]))
            kept = [k for k, t in enumerate(totals) if t <= max_payload]
            out.frames.extend((positions[k], frames[k], subject_list[k], ttl_list[k], id_list[k], hlens[k], plens[k])
                              for k in kept)
            return
        # OutFrame's layout, as plain tuples.
        out.frames.extend(zip(positions, frames, subject_list, ttl_list, id_list, hlens, plens, strict=True))


_COUNT: list[Any] = []


def counting(start: int, n: int) -> Any:
    """``start, start + 1, ...`` (``n`` numbers) as an Arrow int64 array: a slice of one array made once,
    plus ``start`` (``pa.array(range(...))`` walks a Python range, 0.06 us a number)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not _COUNT or len(_COUNT[0]) < n:
        _COUNT[:] = [pa.array(range(max(n, 1 << 16)), pa.int64())]
    base = _COUNT[0].slice(0, n)
    return pc.add(base, start) if start else base


def _values(column: Any, n: int) -> list[Any]:
    """A column's values as a list (a scalar: ``n`` times)."""
    import pyarrow as pa

    if isinstance(column, pa.Scalar):
        return [column.as_py()] * n
    return column.to_pylist()
