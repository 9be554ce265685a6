"""Dead letters: a refused row published to option ``deadLetterSubject`` with why, or the task failed naming it.

A row the encoder refused, or the server refused (:mod:`.refusals`), goes to the dead-letter subject
with headers naming the error: why it was rejected and where it was going, and, when the row did not
fit the server's max_payload beside them, that its payload was cut and how long it was. Without a
dead-letter subject the task fails, naming the first row refused (a
:class:`~pyspark_jetstream.errors.PublishError`: column, value and what to fix).
"""

from __future__ import annotations

from typing import Any

from ...errors import PublishError
from ...protocol import headers as hdrs
from ...protocol.frames import hpub_frame
from ...protocol.headers import (
    DLQ_ERR_CODE,
    DLQ_ERROR,
    DLQ_ORIGINAL_SIZE,
    DLQ_ROW,
    DLQ_SUBJECT,
    DLQ_TRUNCATED,
    DLQ_TTL,
)
from ..encode.rows import RowRejection

_DLQ_VALUE_MAX = 1024
"""Longest value of a dead-letter header the connector writes (a subject can be long)."""


def _escape(value: Any) -> str:
    text = str(value).replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= _DLQ_VALUE_MAX else text[:_DLQ_VALUE_MAX] + "..."


def dead_letter_frame(rejection: RowRejection, dlq_subject: str, reply: str, partition: int,
                      idempotent: bool, max_payload: int, original_headers: bytes = b"") -> bytes:
    """A dead-letter message: the row's data, its valid headers (none of NATS's ``Nats-*``), and headers
    naming the error: the reason with the column and value the connector refused (as PublishError
    names them), and the row's TTL as sent, or as given when it was the TTL that was refused.

    Its ``Nats-Msg-Id`` is the row's own id with ``:dlq`` appended, so a replay
    dead-letters a row once. It never exceeds ``max_payload`` (a larger frame makes
    nats-server close the connection): when it would, the row's own headers are
    left out first, then the payload is cut, and ``Spark-JetStream-Truncated`` /
    ``Spark-JetStream-Original-Size`` say so.
    """
    own: list[tuple[str, str]] = []
    if original_headers:
        parsed = hdrs.parse_headers(original_headers)
        for name, values in parsed.items():
            # Every Nats-* header steers the server (TTL, id, expected stream or last subject sequence,
            # roll-up): on the dead-letter subject it would be refused or purge other dead letters.
            if not name.lower().startswith(hdrs.RESERVED_PREFIX):
                own.extend((name, v) for v in values)
    ours: list[tuple[str, str]] = []
    if idempotent and rejection.msg_id is not None:
        ours.append((hdrs.MSG_ID, _escape(f"{rejection.msg_id}:dlq")))
    error = rejection.reason
    if rejection.column is not None:  # as PublishError names them: what the user must fix
        error += f"; column '{rejection.column}' value {rejection.value!r}"
    ours += [
        (DLQ_ERROR, _escape(error)),
        (DLQ_ERR_CODE, str(rejection.err_code) if rejection.err_code is not None
         else f"status {rejection.status}" if rejection.status is not None else "client"),
        (DLQ_SUBJECT, _escape(rejection.subject)),
        (DLQ_ROW, f"{partition}:{rejection.position}"),
    ]
    if rejection.ttl is not None:
        ours.append((DLQ_TTL, _escape(rejection.ttl)))
    payload = rejection.payload
    block = hdrs.encode_block(own + ours)
    if len(block) + len(payload) > max_payload:
        cut = ours + [(DLQ_TRUNCATED, "true"), (DLQ_ORIGINAL_SIZE, str(len(payload)))]
        block = hdrs.encode_block(own + cut)
        if len(block) > max_payload // 2:  # the row's own headers are what is too large
            block = hdrs.encode_block(cut)
        if len(block) > max_payload:  # a tiny max_payload: keep only what locates the row
            block = hdrs.encode_block([p for p in cut if p[0] in (DLQ_ERR_CODE, DLQ_ROW, DLQ_TRUNCATED,
                                                                  DLQ_ORIGINAL_SIZE)])
        if len(block) > max_payload:
            raise PublishError(subject=rejection.subject, position=rejection.position, partition=partition,
                               reason=f"{rejection.reason}; its dead letter cannot fit the server's max_payload of "
                               f"{max_payload} bytes", err_code=rejection.err_code)
        payload = payload[:max_payload - len(block)]
    return hpub_frame(dlq_subject, reply, block, payload)



def first_refusal(rejections: list[RowRejection], partition: int) -> PublishError:
    """The failure of a task without a dead-letter subject: the first row refused, as the user must fix it."""
    first = min(rejections, key=lambda r: r.position)
    return PublishError(subject=first.subject, position=first.position, partition=partition,
                        reason=first.reason, err_code=first.err_code, value=first.value, column=first.column)


def dead_letters(rejections: list[RowRejection], dlq_subject: str, reply_prefix: str, partition: int,
                 idempotent: bool, max_payload: int, originals: dict[int, bytes] | None = None) -> list[tuple]:
    """The dead-letter frames of ``rejections`` (``originals``: the header blocks they were sent with), in the
    :class:`~pyspark_jetstream.sink.encode.frames.OutFrame` layout the publisher takes (replies ``d<position>``)."""
    return [
        (r.position, dead_letter_frame(r, dlq_subject, f"{reply_prefix}d{r.position}", partition, idempotent,
                                       max_payload, (originals or {}).get(r.position, b"")),
         dlq_subject, None, None, 0, 0)  # OutFrame layout; no settling reads the rest
        for r in rejections
    ]
