"""What a JetStream PubAck says, decided on its parsed JSON keys (issue #23).

A PubAck is ``{"stream": ..., "seq": ..., "duplicate": true?, "domain": ...?}`` or
``{"error": {"code": ..., "err_code": ..., "description": ...}}``. The stream and
domain names inside it are free text: a stream named ``error`` or ``duplicate``
puts those words, quoted, into every ack of a message it stored. So nothing here
decides on substrings; :func:`may_be_plain` is only a cheap pre-check that never
answers "plain" for an error or a duplicate (a false "maybe not" just sends the
ack to :func:`parse_puback`).
"""

from __future__ import annotations

import json
from typing import NamedTuple

STORED, DUPLICATE, ERROR = "stored", "duplicate", "error"


class PubAck(NamedTuple):
    """A parsed PubAck: ``outcome`` is :data:`STORED`, :data:`DUPLICATE` or :data:`ERROR`
    (then ``code``, ``err_code`` and ``description`` are the server's)."""

    outcome: str
    code: int = 0
    err_code: int | None = None
    description: str = ""


def may_be_plain(data: bytes) -> bool:
    """False when ``data`` may be an error or a duplicate ack; True only for a plain "stored" ack.

    Every error ack carries the key ``"error"`` and every duplicate ack the key
    ``"duplicate"``, so an ack holding neither string is neither (a stream named
    ``error`` makes this answer False: the ack then takes :func:`parse_puback`). ``find``, not
    ``in``: on bytes it is about three times faster here (measured on CPython 3.11)."""
    return data.find(b'"error"') < 0 and data.find(b'"duplicate"') < 0


def all_plain(bodies: list[bytes]) -> bool:
    """:func:`may_be_plain` of every body at once, and none empty (an empty reply is a status): for
    the run of PubAcks one socket read brought. The bodies are joined with a NUL, which neither
    key holds, so a match lies within one body: the answer is exactly ``all(b and may_be_plain(b))``,
    in two C searches instead of a Python call per ack."""
    return all(bodies) and may_be_plain(b"\0".join(bodies))


def parse_puback(data: bytes) -> PubAck:
    """The outcome of one PubAck body, decided on its keys: an ``error`` object, else
    ``duplicate: true``, else a stored message (``stream`` and ``seq``). Anything else is
    an error (code 0) naming what arrived, never a silent success."""
    try:
        reply = json.loads(data)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        return PubAck(ERROR, 0, None, f"not a PubAck: {data[:200]!r}")
    error = reply.get("error")
    if error is not None:
        if not isinstance(error, dict):
            return PubAck(ERROR, 0, None, f"error: {str(error)[:200]}")
        err_code = error.get("err_code")
        try:
            code = int(error.get("code") or 0)
        except (TypeError, ValueError):
            code = 0
        return PubAck(ERROR, code, err_code if isinstance(err_code, int) else None,
                      str(error.get("description") or ""))
    if "stream" not in reply or "seq" not in reply:
        return PubAck(ERROR, 0, None, f"not a PubAck: {data[:200]!r}")
    return PubAck(DUPLICATE if reply.get("duplicate") is True else STORED)


STREAM_TOO_MANY_REQUESTS = 10167
"""``too many requests`` (429): the stream's ingest queue was full and the server dropped the message
before storing it (nats-server's ``max_buffered_msgs``: 10,000 by default on 2.11, 100,000 on 2.12+).
Back-pressure, not a verdict on the row."""

ID_IN_PROCESS = 10158
"""``duplicate message id is in process`` (409): a clustered leader still proposes an earlier copy with the
same ``Nats-Msg-Id`` (a resend, or a retried task's copy, that came before the first one was applied). It
is no decision about the message: asked again later, the server answers "duplicate" once that copy is
stored, or stores this one if the proposal was dropped (nats.go's publishers retry it after a backoff)."""


def id_in_process(data: bytes) -> bool:
    """Whether the PubAck body ``data`` is the transient :data:`ID_IN_PROCESS` refusal."""
    return b"10158" in data and parse_puback(data).err_code == ID_IN_PROCESS
