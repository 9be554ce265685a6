"""Message metadata from a JetStream ack reply subject (ADR-15 "JSAck"), free of I/O.

Every message a consumer delivers carries ``$JS.ACK...`` as its reply subject,
even with AckNone, and its tokens name the stream sequence, the stream's
timestamp and the consumer's pending count: everything the source needs,
without parsing headers. Two layouts exist (nats.go ``internal/parser``):

* v1, exactly 9 tokens: ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>``
* v2, 11 or more: ``$JS.ACK.<domain>.<acc hash>.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>[...]``
"""

from __future__ import annotations

from typing import NamedTuple


class AckMetadata(NamedTuple):
    stream: str
    consumer: str
    delivered: int
    stream_seq: int
    consumer_seq: int
    timestamp_ns: int
    pending: int
    domain: str | None = None


class NotAnAckSubject(ValueError):
    """The reply subject is not a JetStream ack subject."""


def parse_ack_subject(reply: str) -> AckMetadata:
    tokens = reply.split(".")
    n = len(tokens)
    if n < 9 or tokens[0] != "$JS" or tokens[1] != "ACK" or n == 10:
        raise NotAnAckSubject(reply)
    try:
        if n == 9:
            return AckMetadata(tokens[2], tokens[3], int(tokens[4]), int(tokens[5]), int(tokens[6]),
                               int(tokens[7]), int(tokens[8]))
        domain = None if tokens[2] == "_" else tokens[2]
        return AckMetadata(tokens[4], tokens[5], int(tokens[6]), int(tokens[7]), int(tokens[8]),
                           int(tokens[9]), int(tokens[10]), domain)
    except ValueError:
        raise NotAnAckSubject(reply) from None


def fast_fields(reply: bytes) -> tuple[int, int, int, int]:
    """(stream_seq, consumer_seq, timestamp_ns, pending) from the raw reply bytes, for the hot path.

    Counting from the end works for both layouts as long as v2 has no extra
    trailing tokens; anything else goes through :func:`parse_ack_subject`.
    """
    parts = reply.rsplit(b".", 5)
    if len(parts) == 6 and reply.count(b".") in (8, 10):
        return int(parts[2]), int(parts[3]), int(parts[4]), int(parts[5])
    meta = parse_ack_subject(reply.decode())
    return meta.stream_seq, meta.consumer_seq, meta.timestamp_ns, meta.pending
