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


def parse_block(block: bytes) -> tuple[str | None, dict[str, list[str]]]:
    """Status line (``'503'`` etc., or ``None``) and headers of a ``NATS/1.0`` block.

    Used on error paths (dead letters, tests), not per row.
    """
    lines = block.decode("utf-8", "replace").split("\r\n")
    first = lines[0]
    status = first[len("NATS/1.0") :].strip().split(" ", 1)[0] or None
    headers: dict[str, list[str]] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, _, value = line.partition(":")
        headers.setdefault(name.strip(), []).append(value.strip())
    return status, headers
