"""Fast-ingest batch frames (ADR-50), made free of I/O: a message's frame cut around its reply subject
once, and a run of a batch's messages joined under the batch's head with each one's operation.

:class:`~pyspark_jetstream.client.fast_publisher.FastPublisher` sends what these make; a sink task's
frames made whole for its first batch go out as they are (sink/publish/batched.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from . import fast_ingest as fi
from .frames import hpub_around_reply
from .headers import MSG_ID

Headers = Mapping[str, str] | Iterable[tuple[str, str]] | None
Message = tuple[str, Headers, bytes, "str | None"]
"""(subject, headers, payload, Nats-Msg-Id or None)."""

CRLF = b"\r\n"


def header_block(headers: Headers, msg_id: str | None) -> bytes:
    lines = ["NATS/1.0\r\n"]
    if msg_id:
        lines.append(f"{MSG_ID}: {msg_id}\r\n")
    pairs = headers.items() if isinstance(headers, Mapping) else (headers or ())
    lines += [f"{name}: {value}\r\n" for name, value in pairs]
    lines.append("\r\n")
    return "".join(lines).encode()


def prepare(messages: Sequence[Message]) -> list[tuple[bytes, bytes, bytes]]:
    """Each message's frame around its reply subject, made once: ``(before, after, payload)``."""
    return [(*hpub_around_reply(subject, header_block(headers, msg_id), len(payload)), payload)
            for subject, headers, payload, msg_id in messages]


def cut_frame(frame: bytes) -> tuple[bytes, bytes, bytes]:
    """A whole ``HPUB <subject> <reply> <hlen> <total>\\r\\n...\\r\\n`` frame as :func:`prepare`'s
    ``(before the reply, after it, b"")``: a subject and a reply hold no space, so two searches find it."""
    start = frame.index(b" ", 5) + 1
    end = frame.index(b" ", start)
    return frame[:start], frame[end:-2], b""


def batch_frames(prepared: Sequence[tuple[bytes, bytes, bytes] | bytes], base: int, head: bytes, first: int,
                 last: int, commit: int, whole: bool = False) -> bytes:
    """Messages ``first..last`` of a batch (batch sequences; message k is ``prepared[base + k - 1]``, a
    :func:`prepare` triple or a whole frame) as one buffer of HPUB frames under the batch's ``head``;
    message ``commit`` commits (0: none of them). ``whole``: this is the batch whole frames were made
    for (:meth:`~pyspark_jetstream.client.fast_publisher.FastPublisher.head_for_frames`), so an append's
    goes as it is (a run of them joined in one call, until a cut one is met); any other is cut and made
    again."""
    parts: list[bytes] = []
    append = b".1.$FI"
    joined = whole
    k = first
    while k <= last:
        if joined and 1 < k != commit:
            stop = commit - 1 if k < commit <= last else last
            try:
                parts.append(b"".join(prepared[base + k - 1:base + stop]))
                k = stop + 1
                continue
            except TypeError:  # a cut frame among them: one at a time from here
                joined = False
        seq, entry = k, prepared[base + k - 1]
        k += 1
        if type(entry) is bytes:
            if whole and 1 < seq != commit:
                parts.append(entry)
                continue
            entry = cut_frame(entry)
        before, after, payload = entry
        op = append if 1 < seq != commit else b".%d.$FI" % fi.op_for(seq, commit)
        parts += (before, head, b"%d" % seq, op, after, payload, CRLF)
    return b"".join(parts)
