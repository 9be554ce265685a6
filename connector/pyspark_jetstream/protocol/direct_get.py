"""Batched direct gets (ADR-31, ``$JS.API.DIRECT.GET.<stream>``) as a reader sees them, free of I/O.

A direct-get reply is the stored message with headers the server appends to its header block
(``server/stream.go`` ``genHeader``: the block without its final CRLF, then ``Name: value`` lines,
then CRLF): ``Nats-Stream``, ``Nats-Subject``, ``Nats-Sequence``, ``Nats-Time-Stamp`` (RFC 3339 with
nanoseconds), and in a batch ``Nats-Num-Pending`` and ``Nats-Last-Sequence``. A message stored
without headers gets a block of those lines alone. :func:`stored_block` cuts them off, so a message
read this way has the header block a consumer delivers (the ``headers`` column is the same).
A batch ends with a status ``204 EOB`` carrying ``Nats-Num-Pending`` (matching messages left, when
``max_bytes`` cut it short) and, for ``multi_last``, ``Nats-UpTo-Sequence`` (the sequence the batch
was taken at: asking again with it as ``up_to_seq`` continues the same view).
"""

from __future__ import annotations

import datetime as dt
from typing import NamedTuple

from .headers import NATS_HDR_LINE

STREAM, SUBJECT, SEQUENCE, TIME_STAMP = "Nats-Stream", "Nats-Subject", "Nats-Sequence", "Nats-Time-Stamp"
NUM_PENDING, LAST_SEQUENCE, UP_TO_SEQUENCE = "Nats-Num-Pending", "Nats-Last-Sequence", "Nats-UpTo-Sequence"
APPENDED = (STREAM, SUBJECT, SEQUENCE, TIME_STAMP)
"""The lines the server appends to every direct-get reply, in order (ADR-31)."""
APPENDED_IN_BATCH = APPENDED + (NUM_PENDING, LAST_SEQUENCE)
"""The lines appended to each message of a batch (``batch`` or ``multi_last`` requests)."""
MULTI_LAST_MAX = 1024
"""Most subjects a ``multi_last`` request may match (more: ``413 Too Many Results``)."""


class DirectMessage(NamedTuple):
    subject: bytes
    data: bytes
    headers: bytes | None  # the header block as stored (None: stored without headers)
    seq: int
    ts_ns: int


class BadReply(ValueError):
    """A direct-get reply without the lines the server appends."""


def stored_block(block: bytes, appended: tuple[str, ...] = APPENDED_IN_BATCH) -> tuple[bytes | None, dict[str, str]]:
    """The stored header block of a direct-get reply (None when the message had none, or an empty
    one) and the appended headers by name. Raises :class:`BadReply` when the block does not end with
    the ``appended`` lines in order."""
    if not block.startswith(NATS_HDR_LINE) or not block.endswith(b"\r\n\r\n"):
        raise BadReply(f"not a header block ending in an empty line: {block[:80]!r}")
    lines = block[len(NATS_HDR_LINE):-4].split(b"\r\n") if len(block) > len(NATS_HDR_LINE) + 2 else []
    if len(lines) < len(appended):
        raise BadReply(f"fewer header lines than the server appends: {block[:200]!r}")
    cut = len(lines) - len(appended)
    meta: dict[str, str] = {}
    for name, line in zip(appended, lines[cut:], strict=True):
        key, sep, value = line.decode("utf-8", "replace").partition(":")
        if not sep or key.strip() != name:
            raise BadReply(f"expected the line {name!r}, found {line[:100]!r}")
        meta[name] = value.strip()
    kept = lines[:cut]
    if not kept:
        return None, meta
    return NATS_HDR_LINE + b"".join(line + b"\r\n" for line in kept) + b"\r\n", meta


def time_ns(text: str) -> int:
    """Nanoseconds since the epoch of an RFC 3339 time with up to nine fraction digits
    (``2026-11-26T18:52:56.37811454Z``, Go's ``time.RFC3339Nano``)."""
    text = text.strip()
    zone_at = max(text.rfind("Z"), text.rfind("+"), text.rfind("-", 19))
    head, zone = (text[:zone_at], text[zone_at:]) if zone_at >= 19 else (text, "Z")
    whole, _, fraction = head.partition(".")
    if not fraction.isdigit() and fraction:
        raise ValueError(text)
    base = dt.datetime.fromisoformat(whole + ("+00:00" if zone in ("Z", "z") else zone))
    return int(base.timestamp()) * 1_000_000_000 + int((fraction or "0")[:9].ljust(9, "0"))


FIRST_NANOSECOND_TIME = dt.datetime(1677, 9, 21, 0, 12, 43, 145225, tzinfo=dt.timezone.utc)
"""The first whole microsecond int64 nanoseconds since the epoch can hold (-2**63 ns is 43.145224192 s).
nats-server turns a ``start_time`` into nanoseconds (Go's ``UnixNano``, undefined before it): on 2.15.1
``1500-01-01`` and ``0999-01-01`` are answered "no message found", as if they were in the future."""


def start_time(when: dt.datetime) -> str:
    """``when`` (aware) as the RFC 3339 text a ``start_time`` request carries, asking for the same first
    message: a time before :data:`FIRST_NANOSECOND_TIME` is sent as it (no message is stored earlier:
    the server stamps int64 nanoseconds), and the year always has four digits (``strftime("%Y")`` writes
    ``999``, which the server's parser refuses: 10025 ``cannot parse "999-01-01..." as "2006"``)."""
    when = max(when.astimezone(dt.timezone.utc), FIRST_NANOSECOND_TIME)
    return f"{when.year:04d}-{when:%m-%dT%H:%M:%S.%f}Z"


def message(subject: bytes, data: bytes, block: bytes) -> DirectMessage:
    """One message of a direct-get batch (its reply subject is the inbox: the stored subject is in
    ``Nats-Subject``)."""
    headers, meta = stored_block(block)
    try:
        return DirectMessage(meta[SUBJECT].encode(), data, headers, int(meta[SEQUENCE]), time_ns(meta[TIME_STAMP]))
    except ValueError as exc:
        raise BadReply(f"{SEQUENCE} or {TIME_STAMP} does not parse: {exc}") from None
