"""Turning the sink's input rows into NATS ``HPUB`` frames, free of I/O: the encoding stage of a task.

:func:`~.layout.layout_from_schema` checks the DataFrame's columns once on the driver;
:class:`BatchEncoder` then turns each Arrow ``RecordBatch`` into ready-to-send
frames, one per row, plus the rows it refused and the rows already expired, in
named steps: the row checks (:mod:`.checks`, :mod:`.headers`), the message ids
(:mod:`.msg_ids`) and the frames (:mod:`.frames`).
Per-row work is kept to string building: columns are materialised once per
batch and validated subjects are cached, because subjects repeat.

Header precedence per row (each is validated like the column it stands for):

* TTL: ``expires_at`` (with ``preserveExpiry``) > ``ttl`` column > a ``Nats-TTL``
  entry in ``headers`` > option ``defaultTtl``. A zero TTL means no header.
* Msg id: ``msg_id`` column > a ``Nats-Msg-Id`` entry in ``headers`` > the
  deterministic id (option ``idempotent``), see :class:`MsgIds`. An empty id is
  no id (it falls through, as a null does).

**Rows as read.** A DataFrame that carries the source's ``stream`` and ``seq``
columns holds rows as this connector read them, and its ``headers`` are what the
server stored, including headers the server or the original publisher's client
owns. From such rows the sink leaves out every header named ``Nats-*`` (NATS
reserves the prefix for headers the server acts on or writes: expected-stream and
expected-sequence checks, markers, roll-ups, message ids, TTLs, counters, batches,
schedules), because re-sending them would be refused or would change what the
server does; their effect travels in the ``ttl`` and ``msg_id`` columns. With
``allowRollup`` a ``Nats-Rollup`` is kept (a copy that re-applies roll-ups, such
as KV purges). Delete markers (``marker_reason`` set) are skipped and counted:
null the column to write them as ordinary rows. Rows without the source's
columns are the user's own and their headers are checked as such.

**The sequence header is the option's.** ``Spark-JetStream-Sequence``
(:data:`~pyspark_jetstream.protocol.headers.SEQUENCE`) holds a KV value's order for
option ``sequenceBy`` (sink/reduce/sequencer.py), and only the option writes it. From rows
as read it is left out, like the ``Nats-*`` headers: a copy of a bucket written with
the option would otherwise carry the source's values into the target, after the
option's own line, and a look-up keeps the last; the target would compare with the
source's order (older rows win, newer ones are skipped, another type fails). In the
user's own rows it is refused, in any case (``int:9223372036854775807`` would pin a
key against every writer with the option). Both hold with or without the option on
this write: a target written without it may be written with it later.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from .checks import RowChecks
from .column_lane import ColumnLane
from .frames import Frames, ReplyForm
from .headers import UserHeaders
from .layout import EncoderConfig, InputLayout
from .msg_ids import MsgIds, generated_ids
from .rows import Columns, EncodedBatch, RowChoice


class BatchEncoder:
    """Encodes the rows of one Spark partition, batch after batch."""

    def __init__(self, layout: InputLayout, config: EncoderConfig, msg_ids: MsgIds | None) -> None:
        self.layout = layout
        self.config = config
        self.msg_ids = msg_ids
        self.checks = RowChecks(layout, config)
        self.headers = UserHeaders(layout, config)
        self.frames = Frames(config.expected_stream, config.max_payload)
        self.columnar = True  # frames of batches without user headers or KV operations built column-wise
        self.lane = ColumnLane(layout, config, self.checks, self.frames, msg_ids)

    def encode(self, batch: Any, first_position: int, reply: str | ReplyForm, now: dt.datetime | None = None,
               choice: RowChoice | None = None) -> EncodedBatch:
        """The batch's frames, refused rows (in row order) and counts.

        Named steps, each over the rows still in play (``live``, row indices): delete
        markers out, ids generated, subjects, headers, TTLs, message ids, frames. A row
        refused by a step is out of the later ones, so each row reports the first
        problem in that order.
        """
        if isinstance(reply, str):
            reply = ReplyForm(reply)
        n = batch.num_rows
        out = EncodedBatch()
        rows = Columns(self.layout, batch, n)
        if self.columnar and choice is None and self.lane.encode(rows, first_position, reply, out):
            return out  # nothing refused but rows over max_payload, in row order already
        checks = self.checks
        live = checks.without_markers(rows, out)
        generated = generated_ids(self.msg_ids, self.layout, rows, live, first_position)
        if choice is not None:
            live = checks.chosen(rows, live, first_position, generated, choice, out)
        live = checks.subjects(rows, live, first_position, generated, out)
        ops, live = checks.operations(rows, live, first_position, generated, out)
        pairs, header_ttls, header_ids, live = self.headers.check(rows, live, first_position, generated, out)
        ttl_headers, live = checks.ttls(rows, live, first_position, generated, header_ttls, now, out, ops)
        msg_ids, live = checks.msg_ids(rows, live, first_position, generated, header_ids, out)
        if ops is None and not pairs and self.columnar and choice is None:
            self.frames.common(rows, live, first_position, reply, ttl_headers, msg_ids, out)
        else:
            self.frames.per_row(rows, live, first_position, reply, pairs, ttl_headers, msg_ids, out, ops,
                                choice.publish if choice is not None else None)
        if len(out.rejected) > 1:
            out.rejected.sort(key=lambda r: r.position)
        return out
