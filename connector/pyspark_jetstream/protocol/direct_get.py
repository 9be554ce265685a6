"""Batched direct gets (ADR-31, ``$JS.API.DIRECT.GET.<stream>``) as a reader sees them, free of I/O.

A direct-get reply is the stored message with headers the server appends to its header block
(``server/stream.go`` ``genHeader``: the block without its final CRLF, then ``Name: value`` lines,
then CRLF): ``Nats-Stream``, ``Nats-Subject``, ``Nats-Sequence``, ``Nats-Time-Stamp`` (RFC 3339 with
nanoseconds), and in a batch ``Nats-Num-Pending`` and ``Nats-Last-Sequence``. A message stored
without headers gets a block of those lines alone. :func:`stored_block` cuts them off, so a message
read this way has the header block a consumer delivers (the ``headers`` column is the same).
A batch ends with a status ``204 EOB`` carrying ``Nats-Num-Pending`` and, for ``multi_last``,
``Nats-UpTo-Sequence`` (the sequence the batch was taken at: the request's ``up_to_seq`` echoed, or
the answering store's last sequence). ``Nats-Num-Pending`` is not a count to continue by: nats-server
2.11 reports one message fewer than are left when ``max_bytes`` cuts a ``multi_last`` batch (0 while
one is left; fixed in 2.12), so a batch is continued by the subjects still missing (:func:`still_missing`).
"""

from __future__ import annotations

import base64
import datetime as dt
import enum
from dataclasses import dataclass
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
    the ``appended`` lines in order.

    The appended lines are cut from the end (``rsplit``): the stored lines before them are kept as one
    piece, not split and joined again (a lookup or a ``keys`` read parses one block per key)."""
    if not block.startswith(NATS_HDR_LINE) or not block.endswith(b"\r\n\r\n"):
        raise BadReply(f"not a header block ending in an empty line: {block[:80]!r}")
    body = block[len(NATS_HDR_LINE):-4] if len(block) > len(NATS_HDR_LINE) + 2 else b""
    count = len(appended)
    parts = body.rsplit(b"\r\n", count) if body else []
    if len(parts) < count:
        raise BadReply(f"fewer header lines than the server appends: {block[:200]!r}")
    meta: dict[str, str] = {}
    for name, line in zip(appended, parts[-count:], strict=True):
        key, sep, value = line.partition(b":")
        if not sep or key.strip() != name.encode():
            raise BadReply(f"expected the line {name!r}, found {line[:100]!r}")
        meta[name] = value.strip().decode("utf-8", "replace")
    if len(parts) == count or not parts[0].strip():
        return None, meta
    return NATS_HDR_LINE + parts[0] + b"\r\n\r\n", meta


_SECONDS: dict[str, int] = {}
"""Whole seconds since the epoch of the times' ``YYYY-MM-DDTHH:MM:SS`` part with its zone, as parsed (a batch's
messages share a few): bounded, cleared when full."""


def time_ns(text: str) -> int:
    """Nanoseconds since the epoch of an RFC 3339 time with up to nine fraction digits
    (``2026-11-26T18:52:56.37811454Z``, Go's ``time.RFC3339Nano``)."""
    text = text.strip()
    zone_at = max(text.rfind("Z"), text.rfind("+"), text.rfind("-", 19))
    head, zone = (text[:zone_at], text[zone_at:]) if zone_at >= 19 else (text, "Z")
    whole, _, fraction = head.partition(".")
    if not fraction.isdigit() and fraction:
        raise ValueError(text)
    stamp = whole + ("+00:00" if zone in ("Z", "z") else zone)
    seconds = _SECONDS.get(stamp)
    if seconds is None:
        if len(_SECONDS) >= 4096:
            _SECONDS.clear()
        seconds = _SECONDS[stamp] = int(dt.datetime.fromisoformat(stamp).timestamp())
    return seconds * 1_000_000_000 + int((fraction or "0")[:9].ljust(9, "0"))


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


class Outcome(enum.Enum):
    """What the status that ends a ``multi_last`` batch means to a reader."""

    END = "end"  # 204 EOB: the batch is over; what was asked and not answered may be in the next one
    NONE = "none"  # 404 No Results: none of the subjects asked has a message (as the answering store sees it)
    RETRY = "retry"  # 404 Message Not Found: a message the server resolved was gone when loaded; ask again
    UNANSWERED = "unanswered"  # 503 no responders: no store answers direct gets of the stream just now
    FAIL = "fail"  # anything else (413 Too Many Results, 408 Bad Request, ...)


@dataclass(frozen=True)
class BatchEnd:
    """The status that ended a batch: its code and description, and ``Nats-UpTo-Sequence`` (None when absent)."""

    code: int
    description: str
    up_to: int | None = None

    @property
    def outcome(self) -> Outcome:
        """Why 404 is split by its description: ``getDirectMulti`` answers ``No Results`` when no
        subject matched, and ``Message Not Found`` when a sequence it had resolved could not be loaded
        (expired or replaced between lookup and load): the second is a race, not an answer.

        503 (no responders) is asked again too: a reader asks direct gets only of a stream whose
        config allows them, and its replicas answer them only while current (a follower catching up,
        a stream whose leader is being placed answers nothing for a moment)."""
        if self.code == 204:
            return Outcome.END
        if self.code == 404:
            return Outcome.RETRY if "not found" in self.description.lower() else Outcome.NONE
        if self.code == 503:
            return Outcome.UNANSWERED
        return Outcome.FAIL

    def of_view(self, up_to: int | None) -> bool:
        """Whether an EOB answers the view asked for: a request with ``up_to_seq`` gets it echoed in
        ``Nats-UpTo-Sequence`` (2.11 to 2.15); a reply without it, or with another, was not taken at
        that sequence (a server that ignored the field) and is not of the read's point in time."""
        return up_to is None or self.up_to == up_to


def still_missing(asked: list[str], answered: set[bytes]) -> list[str]:
    """The subjects of ``asked`` with no answer yet, in order: what the next request of a batch asks."""
    return [s for s in asked if s.encode() not in answered]


def stored_message(reply: dict) -> DirectMessage:
    """A ``STREAM.MSG.GET`` reply's message (``{"message": {subject, seq, hdrs, data, time}}``, the
    header block and payload base64) as a direct get gives it: an empty header block is None."""
    m = reply["message"]
    block = base64.b64decode(m.get("hdrs") or "")
    headers = block if block.strip() and block.strip() != NATS_HDR_LINE.strip() else None
    return DirectMessage(m["subject"].encode(), base64.b64decode(m.get("data") or ""), headers, int(m["seq"]),
                         time_ns(m["time"]))
