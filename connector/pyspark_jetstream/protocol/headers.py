"""NATS message headers: names, reserved keys and the ``NATS/1.0`` block, free of I/O.

The sink writes header blocks itself instead of going through nats-py's
``publish(headers=dict)``, which cannot carry a key twice (multi-valued headers)
and strips values. Every check here exists to keep one row from corrupting the
protocol stream for the rows after it (CR/LF injection) or from steering the
server in ways the user did not ask for (``Nats-Expected-*``, ``Nats-Rollup``).
"""

from __future__ import annotations

import re

NATS_HDR_LINE = b"NATS/1.0\r\n"
"""First line of every header block (NATS client protocol, HPUB)."""

MSG_ID = "Nats-Msg-Id"
"""JetStream de-duplication key, honoured inside the stream's duplicate window."""

EXPECTED_STREAM = "Nats-Expected-Stream"
"""Makes the server reject a publish that would land in another stream (err_code 10060)."""

MARKER_REASON = "Nats-Marker-Reason"
"""ADR-43: set by the server on the delete markers it writes (MaxAge, Remove, Purge)."""

ROLLUP = "Nats-Rollup"
"""Purges earlier messages of the subject (sub) or stream (all) when stored."""

TTL = "Nats-TTL"
"""ADR-43 per-message TTL; matched byte-exactly by the server."""

KV_OPERATION = "KV-Operation"
"""ADR-8: ``DEL`` or ``PURGE`` on a KV bucket's delete and purge messages (absent on a put)."""

EXPECTED_LAST_SUBJECT_SEQUENCE = "Nats-Expected-Last-Subject-Sequence"
"""Compare-and-set: the server stores the message only when the subject's last sequence is this
(0: only when the subject has no message), else refuses it (err_code 10071). KV ``create``/``update``."""

EXPECTED_LAST_MSG_ID = "Nats-Expected-Last-Msg-Id"
"""The server stores the message only when the stream's last message carries this ``Nats-Msg-Id``,
else refuses it (err_code 10070); checked after de-duplication (sink/records/cas_replay.py's probe)."""

PENDING_MESSAGES = "Nats-Pending-Messages"
PENDING_BYTES = "Nats-Pending-Bytes"
"""ADR-37: on a pull request's terminal status, what the request still had outstanding."""

SEQUENCE = "Spark-JetStream-Sequence"
"""The connector's own: a KV value's position in the order of option ``sequenceBy``, type-tagged
(``int:42``, ``ts:<microseconds>``, ``date:<days>``, ``str:<text>``; sink/reduce/sequencer.py), so that any
later writer with the option can tell whether its row is newer than the stored one."""

# The connector's own headers on a dead letter (option deadLetterSubject).
DLQ_ERROR = "Spark-JetStream-Error"
DLQ_ERR_CODE = "Spark-JetStream-Err-Code"
DLQ_SUBJECT = "Spark-JetStream-Original-Subject"
DLQ_ROW = "Spark-JetStream-Row"
DLQ_TTL = "Spark-JetStream-Original-TTL"
DLQ_TRUNCATED = "Spark-JetStream-Truncated"
DLQ_ORIGINAL_SIZE = "Spark-JetStream-Original-Size"

RESERVED_PREFIX = "nats-"
"""Header names NATS reserves (lower-cased): headers the server acts on or writes."""

_NAME_RE = re.compile(r"[!-9;-~]+")  # visible ASCII except ':'

_RESERVED_PREFIXES = ("nats-expected-",)
_RESERVED_NAMES = {MARKER_REASON.lower()}


class InvalidHeader(ValueError):
    """A header name or value the sink refuses to send."""


def check_header_name(name: object, *, allow_rollup: bool) -> str:
    if not isinstance(name, str):
        raise InvalidHeader(f"header name {name!r} is not a string")
    if not _NAME_RE.fullmatch(name):
        raise InvalidHeader(
            f"header name {name!r} must be non-empty visible ASCII without ':' or whitespace"
        )
    lowered = name.lower()
    if lowered in _RESERVED_NAMES or lowered.startswith(_RESERVED_PREFIXES):
        raise InvalidHeader(
            f"header {name!r} is reserved: the server sets it, or the connector does "
            "(Nats-Expected-Stream comes from the 'stream' option)"
        )
    if lowered == ROLLUP.lower() and not allow_rollup:
        raise InvalidHeader(
            f"header {name!r} would purge other messages; set the option 'allowRollup' to true to send it"
        )
    return name


def check_header_value(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidHeader(f"value of header {name!r} is {type(value).__name__}, not a string")
    if "\r" in value or "\n" in value:
        raise InvalidHeader(f"value of header {name!r} contains CR or LF")
    return value


def encode_block(pairs: list[tuple[str, str]]) -> bytes:
    """The header block for already-checked (name, value) pairs, in order."""
    parts = [NATS_HDR_LINE]
    for name, value in pairs:
        parts.append(f"{name}: {value}\r\n".encode())
    parts.append(b"\r\n")
    return b"".join(parts)


def parse_headers(block: bytes) -> dict[str, list[str]]:
    """The headers of a ``NATS/1.0`` block, repeated keys kept in order; values trimmed, as
    nats-py, nats.go and nats.js read them; lines without a ``:`` are not headers and skipped."""
    out: dict[str, list[str]] = {}
    for line in block.decode("utf-8", "replace").split("\r\n")[1:]:
        name, sep, value = line.partition(":")
        if sep:
            out.setdefault(name.strip(), []).append(value.strip())
    return out


def parse_status(block: bytes) -> tuple[int, str]:
    """The status of a ``NATS/1.0 <code> <description>`` block: ``(0, "")`` for a plain message."""
    first = block.split(b"\r\n", 1)[0].decode("utf-8", "replace")[len("NATS/1.0"):].strip()
    code, _, description = first.partition(" ")
    return (int(code) if code.isdigit() else 0), description.strip()
