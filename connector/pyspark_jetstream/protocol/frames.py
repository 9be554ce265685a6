"""NATS client protocol frames the connector writes itself: ``PUB`` and ``HPUB``, free of I/O.

The sink's rows and the source's pull requests go to nats-py's write buffer as
ready frames (see :mod:`pyspark_jetstream.client.nats_internals`), so these are
the only places that know the frame layout:
``HPUB <subject> <reply> <header bytes> <total bytes>\\r\\n<headers><payload>\\r\\n``.
"""

from __future__ import annotations


def pub_frame(subject: str, reply: str, payload: bytes) -> bytes:
    """A ``PUB`` frame: ``payload`` to ``subject``, answers to ``reply``."""
    return b"".join((f"PUB {subject} {reply} {len(payload)}\r\n".encode(), payload, b"\r\n"))


def hpub_frame(subject: str, reply: str, header_block: bytes, payload: bytes) -> bytes:
    """An ``HPUB`` frame: ``header_block`` (a whole ``NATS/1.0`` block) and ``payload`` to ``subject``."""
    hlen = len(header_block)
    return b"".join(
        (f"HPUB {subject} {reply} {hlen} {hlen + len(payload)}\r\n".encode(), header_block, payload, b"\r\n")
    )


def parse_hpub_frame(frame: bytes) -> tuple[str, bytes, bytes]:
    """(subject, header block, payload) of a frame made by :func:`hpub_frame` (error paths only)."""
    line, _, rest = frame.partition(b"\r\n")
    parts = line.decode().split(" ")
    subject, hlen, tlen = parts[1], int(parts[3]), int(parts[4])
    return subject, rest[:hlen], rest[hlen:tlen]


def hpub_around_reply(subject: str, header_block: bytes, payload_len: int) -> tuple[bytes, bytes]:
    """An ``HPUB`` frame cut around its reply subject: ``before + reply + after + payload + b"\\r\\n"``
    is :func:`hpub_frame` byte for byte. For a sender that writes one message under many reply
    subjects (a fast-ingest batch names each message's batch and sequence there, and a resend goes
    under a new batch): the rest of the frame is made once."""
    hlen = len(header_block)
    return f"HPUB {subject} ".encode(), b"".join((f" {hlen} {hlen + payload_len}\r\n".encode(), header_block))
