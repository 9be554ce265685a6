"""The checks each row passes before it is encoded, a step at a time over the rows still in play.

Each step looks at one thing (delete markers, the caller's choice, the subject or KV key, the KV
operation, the TTL by precedence, the message id) and refuses a row with a
:class:`~.rows.RowRejection` naming the column and value; a row refused by a step is out of the
later ones, so each row reports the first problem in the encoder's order (:mod:`.encoder`). The
user's own headers have a room of their own (:mod:`.headers`).
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from ...protocol import headers as hdrs
from ...protocol import kv
from ...protocol.subjects import is_receivable_subject
from ...protocol.ttl import InvalidTtl, TtlResolver, remaining_ttl_seconds
from .rows import RowChoice, RowRejection, shown

if TYPE_CHECKING:
    from .layout import EncoderConfig, InputLayout
    from .rows import Columns, EncodedBatch


class RowChecks:
    """The per-row checks of one task's rows (module docstring); remembers the subjects it validated."""

    def __init__(self, layout: InputLayout, config: EncoderConfig) -> None:
        self.layout = layout
        self.config = config
        self._valid_subjects: dict[str, bool] = {}
        self.resolve_ttl = TtlResolver()
        """A TTL's header value (None: no header), each distinct value parsed once; raises ``InvalidTtl``."""

    def subject_ok(self, subject: str) -> bool:
        """Whether ``subject`` is a valid publish subject, each distinct one checked once."""
        ok = self._valid_subjects.get(subject)
        if ok is None:
            ok = is_receivable_subject(subject)
            if len(self._valid_subjects) < 100_000:
                self._valid_subjects[subject] = ok
        return ok

    @staticmethod
    def without_markers(rows: Columns, out: EncodedBatch) -> list[int]:
        """Delete markers the server placed are not data to copy: skipped and counted."""
        markers = rows.markers
        live = [i for i in range(rows.n) if markers[i] is None]
        out.markers_skipped += rows.n - len(live)
        return live

    @staticmethod
    def chosen(rows: Columns, live: list[int], first: int, generated: list[str | None], choice: RowChoice,
               out: EncodedBatch) -> list[int]:
        """The rows the caller chose (:class:`RowChoice`); its refusals reported as the encoder's own."""
        for i in live:
            if i in choice.refuse:
                subject, reason, column = choice.refuse[i]
                out.rejected.append(RowRejection(first + i, subject, reason, column, None, payload=rows.payload(i),
                                                 msg_id=generated[i]))
        return [i for i in live if i in choice.publish]

    def subjects(self, rows: Columns, live: list[int], first: int, generated: list[str | None],
                 out: EncodedBatch) -> list[int]:
        """Each row's subject (its own, else option ``subject``), a valid publish subject; for a KV
        write, ``$KV.<bucket>.<key>`` of a valid key."""
        if self.config.bucket is not None:
            return self._kv_subjects(rows, live, first, generated, out)
        subjects, default = rows.subjects, self.config.default_subject
        kept = []
        for i in live:
            subject = subjects[i] or default
            if subject is None:
                out.rejected.append(RowRejection(
                    first + i, None, "the row has no subject and the option 'subject' is not set", "subject", None,
                    payload=rows.payload(i), msg_id=generated[i]))
            elif not self.subject_ok(subject):
                out.rejected.append(RowRejection(
                    first + i, subject, "not a valid publish subject (empty, an ASCII space, tab, CR, LF, FF or VT, a "
                    "wildcard or an empty token)",
                    "subject", shown(subject), payload=rows.payload(i), msg_id=generated[i]))
            else:
                subjects[i] = subject
                kept.append(i)
        return kept

    def _kv_subjects(self, rows: Columns, live: list[int], first: int, generated: list[str | None],
                     out: EncodedBatch) -> list[int]:
        keys, subjects = rows.column(self.layout.key), rows.subjects
        prefix = kv.subject_prefix(self.config.bucket)
        kept = []
        for i in live:
            key = keys[i]
            if key is None or not kv.is_valid_key(key):
                out.rejected.append(RowRejection(
                    first + i, None if key is None else f"{prefix}{key}",
                    "not a valid KV key (letters, digits and '-/_=.', not starting or ending with '.')"
                    if key is not None else "the row has no key", "key", shown(key), payload=rows.payload(i),
                    msg_id=generated[i]))
                continue
            subjects[i] = f"{prefix}{key}"
            kept.append(i)
        return kept

    def operations(self, rows: Columns, live: list[int], first: int, generated: list[str | None],
                   out: EncodedBatch) -> tuple[list[Any] | None, list[int]]:
        """A KV write's operation per row (``PUT`` when null) and its compare-and-set revision, as the
        header lines they add (``kv.OPERATION_HEADERS``); None for a stream write."""
        if self.config.bucket is None:
            return None, live
        given, revisions = rows.column(self.layout.operation), rows.column(self.layout.expected_revision)
        ops: list[Any] = [None] * rows.n
        kept = []
        for i in live:
            op = kv.parse_operation(given[i])
            if op is None:
                out.rejected.append(RowRejection(
                    first + i, rows.subjects[i], "unknown KV operation; expected PUT (or null), DEL or PURGE",
                    "operation", shown(given[i]), payload=rows.payload(i), msg_id=generated[i]))
                continue
            revision = revisions[i]
            if revision is not None and revision < 0:
                out.rejected.append(RowRejection(
                    first + i, rows.subjects[i], "expected_revision must be >= 0 (0: only if the key does not exist)",
                    "expected_revision", revision, payload=rows.payload(i), msg_id=generated[i]))
                continue
            ops[i] = (op, None if revision is None else f"{hdrs.EXPECTED_LAST_SUBJECT_SEQUENCE}: {revision}\r\n")
            kept.append(i)
        return ops, kept

    def ttls(self, rows: Columns, live: list[int], first: int, generated: list[str | None],
             header_ttls: dict[int, Any], now: dt.datetime | None, out: EncodedBatch,
             ops: list[Any] | None = None) -> tuple[list[Any], list[int]]:
        """Each row's ``Nats-TTL`` value by precedence (module docstring); expired rows counted, not sent.
        KV writes: ``defaultTtl`` is for PUT rows; a PURGE tombstone expires only by its own TTL; a DEL
        row takes none (a TTL given on one is refused: use PURGE, as nats-py says)."""
        cfg = self.config
        ttl_headers: list[Any] = [cfg.default_ttl] * rows.n
        if ops is not None and cfg.default_ttl is not None:
            for i in live:
                if ops[i][0] != kv.PUT:
                    ttl_headers[i] = None
        ttls = rows.column(self.layout.ttl)
        expires = rows.column(self.layout.expires_at) if cfg.preserve_expiry else None
        if expires is not None and now is None:
            now = dt.datetime.now(dt.timezone.utc)
        if expires is None and self.layout.ttl is None and not header_ttls:
            return ttl_headers, live  # every row takes the default
        kept = []
        for i in live:
            if ops is not None and ops[i][0] == kv.DEL:
                own = ttls[i] if ttls[i] is not None else header_ttls.get(i)
                try:
                    resolved = None if own is None else self.resolve_ttl(own)
                except InvalidTtl:
                    resolved = own
                if resolved is not None:
                    out.rejected.append(RowRejection(
                        first + i, rows.subjects[i], "a DEL row cannot carry a TTL (nats-py ignores one); to make a "
                        "key's tombstone expire, write operation PURGE with that ttl",
                        self.layout.ttl if ttls[i] is not None else self.layout.headers, shown(own),
                        payload=rows.payload(i), ttl=str(own), msg_id=generated[i]))
                    continue
                kept.append(i)
                continue
            expiry = expires[i] if expires is not None else None
            if expiry is not None:
                if expiry.tzinfo is None:
                    expiry = expiry.replace(tzinfo=dt.timezone.utc)
                left = remaining_ttl_seconds(expiry, now)
                if left <= 0:
                    out.expired += 1
                    continue
                ttl_headers[i] = str(left)
                kept.append(i)
                continue
            value, column = ttls[i], self.layout.ttl
            if value is None and i in header_ttls:
                value, column = header_ttls[i], self.layout.headers
            if value is not None:
                try:
                    ttl_headers[i] = self.resolve_ttl(value)
                except InvalidTtl as exc:
                    # The refused value travels as the dead letter's Spark-JetStream-Original-TTL too.
                    out.rejected.append(RowRejection(
                        first + i, rows.subjects[i], f"{exc.reason}. Allowed: whole seconds, a Go duration of at "
                        "least 1s ('90s', '1h30m'), 'never', or 0 for none", column, shown(value),
                        payload=rows.payload(i), ttl=str(value), msg_id=generated[i]))
                    continue
            kept.append(i)
        return ttl_headers, kept

    def msg_ids(self, rows: Columns, live: list[int], first: int, generated: list[str | None],
                header_ids: dict[int, Any], out: EncodedBatch) -> tuple[list[str | None], list[int]]:
        """Each row's ``Nats-Msg-Id``: the ``msg_id`` column, else a header, else the generated one."""
        if self.layout.msg_id is None and not header_ids:
            return generated, live
        own = rows.column(self.layout.msg_id)
        msg_ids = list(generated)
        kept = []
        for i in live:
            msg_id = own[i] or header_ids.get(i) or None  # an empty id is no id: the generated one stands
            if msg_id is not None:
                if "\r" in msg_id or "\n" in msg_id:
                    out.rejected.append(RowRejection(first + i, rows.subjects[i], "msg_id contains CR or LF",
                                                     "msg_id", shown(msg_id), payload=rows.payload(i),
                                                     msg_id=generated[i]))
                    continue
                msg_ids[i] = msg_id
            kept.append(i)
        return msg_ids, kept
