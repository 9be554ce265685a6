"""A minimal fast-ingest publisher (ADR-50, ``fail`` mode) over a nats-py connection (issue #48).

:meth:`FastPublisher.publish` stores a list of ``(subject, headers, payload, msg_id)`` in order, once
each, in one fast-ingest batch (or several, see below), and returns what the final PubAcks said.
What a batch is and what each answer means lives in :mod:`pyspark_jetstream.protocol.fast_ingest`;
this module moves bytes and waits:

- frames are made once per message, cut around the reply subject (a resend goes under a new batch),
  joined per chunk and written through nats-py's buffer (:func:`~.nats_internals.send_raw`), as the
  sink writes its rows; answers come on one raw subscription ``<inbox>.>``, straight from nats-py's
  parser, and only those of the batch under way count;
- message 1 goes alone; then at most ``outstanding`` flow intervals run ahead of the last flow ack;
- every wait has a deadline: silence for ``ping_after`` sends a ping (the server answers with its last
  flow ack, or with the gap that ends the batch), silence for ``ack_timeout`` fails the publish.

Where a batch ends early the publisher starts another from where the end says: after a gap (messages
lost on the way, a new stream leader) from the PubAck's count + 1; after 10208 "unknown batch" (idle
10 s, an R1 restart) from the last flow ack + 1, the same ``Nats-Msg-Id`` s making the server drop
what it had stored already; after 429/10211 (too many open batches) the same batch again, backing
off until ``busy_for`` has passed. A message the server refuses ends the publish: the result names
its position and the server's error, and nothing after it is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import AckTimeoutError, JetStreamConnectorError
from ..protocol import fast_ingest as fi
from ..protocol.frames import hpub_around_reply, pub_frame
from ..protocol.headers import MSG_ID
from .nats_internals import events_of, is_clustered, raw_subscribe, raw_unsubscribe, send_raw

Headers = Mapping[str, str] | Iterable[tuple[str, str]] | None
Message = tuple[str, Headers, bytes, "str | None"]
"""(subject, headers, payload, Nats-Msg-Id or None)."""

MIN_SERVER = (2, 14, 3)
"""The first nats-server whose fast-ingest commits are right after a gap (NATS-FACTS l)."""
CRLF = b"\r\n"


class FastIngestUnavailable(JetStreamConnectorError):
    """The stream or the server cannot take fast-ingest batches (checked before anything is sent)."""


@dataclass(frozen=True)
class Refusal:
    """The message the server refused: its 0-based ``position`` in the list, and the server's error."""

    position: int
    subject: str
    code: int
    err_code: int | None
    description: str


@dataclass(frozen=True)
class FastIngestResult:
    """Messages ``0..stored-1`` are stored (a duplicate the server dropped by its ``Nats-Msg-Id`` counts
    as stored); ``last_seq`` is the stream sequence of the last one, as the last PubAck said (0 when
    that batch held only duplicates). Per-message stream sequences do not come back in a fast batch."""

    stored: int
    last_seq: int
    batches: int
    resent: int
    refused: Refusal | None = None
    duplicates: int = 0
    """Of ``stored``, the messages known to be duplicates: those of batches whose final PubAck says
    nothing new was stored (``seq`` 0, or a one-message batch's ``duplicate``). A batch that stored some
    and dropped others says only its count: its duplicates are counted as stored."""


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


def _server_version(nc: Any) -> tuple[int, int, int]:
    version = nc.connected_server_version
    return version.major, version.minor, version.patch


def server_version(nc: Any) -> tuple[int, int, int]:
    """The connected server's version (major, minor, patch)."""
    return _server_version(nc)


async def check_stream(nc: Any, stream: str, *, api_prefix: str = "$JS.API", timeout: float = 5.0) -> dict:
    """The stream's config, once it is known to take fast-ingest batches: ``allow_batched`` set, not a
    mirror, a server of 2.14.3 or later. Raises :class:`FastIngestUnavailable` otherwise, before a
    message is sent (the server would refuse message 1 with 10205, the check the publisher keeps)."""
    version = _server_version(nc)
    if version < MIN_SERVER:
        raise FastIngestUnavailable(f"nats-server {'.'.join(map(str, version))} cannot take fast-ingest batches "
                                    f"(2.14.3 or later)")
    reply = await nc.request(f"{api_prefix}.STREAM.INFO.{stream}", b"", timeout=timeout)
    info = json.loads(reply.data)
    if "error" in info:
        error = info["error"]
        raise FastIngestUnavailable(f"stream {stream!r}: {error.get('description')} ({error.get('err_code')})")
    config = info.get("config") or {}
    if config.get("mirror"):
        raise FastIngestUnavailable(f"stream {stream!r} is a mirror: it takes no batches")
    if config.get("allow_batched") is not True:
        raise FastIngestUnavailable(f"stream {stream!r} does not allow fast-ingest batches (allow_batched)")
    return config


class FastPublisher:
    """Publishes lists of messages in fast-ingest batches (module docstring). ``flow``: the largest
    ack interval asked for (the server answers min(500, flow), less when the stream has other fast
    publishers); ``max_batch``: messages per batch (0: the whole list)."""

    def __init__(self, nc: Any, *, flow: int = 500, outstanding: int = fi.OUTSTANDING, ack_timeout: float = 10.0,
                 ping_after: float = 1.0, busy_for: float = 30.0, chunk: int = 256, max_batch: int = 0) -> None:
        self._nc = nc
        self.flow, self.outstanding, self.chunk, self.max_batch = flow, outstanding, chunk, max_batch
        self.ack_timeout, self.ping_after, self.busy_for = ack_timeout, ping_after, busy_for
        self._inbox = ""
        self._sub = None
        self._batch_id = ""
        self._batches = 0
        self.window = fi.FlowWindow(0)
        self._changed = asyncio.Event()
        self._last_progress = 0.0
        self._closed: str | None = None

    async def start(self) -> FastPublisher:
        events_of(self._nc).listeners.add(self)
        self._inbox = self._nc.new_inbox()
        self._sub = await raw_subscribe(self._nc, self._inbox + ".>", self._on_answer, self._on_answers)
        return self

    async def close(self) -> None:
        events_of(self._nc).listeners.discard(self)
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await raw_unsubscribe(self._nc, self._sub)
            self._sub = None

    def on_closed(self, cause: str) -> None:
        self._closed = cause
        self._changed.set()

    def _on_answers(self, frames: list) -> None:
        for frame in frames:
            self._on_answer(*frame)

    def _on_answer(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        """Runs on nats-py's read loop: answers are few (one per flow interval), each is parsed in full."""
        where = fi.split_reply_subject(subject.decode(errors="replace"), self._inbox)
        if where is None or where[0] != self._batch_id:
            return  # a batch that is over: its in-flight messages' 10208s, a late ack
        before = self.window
        self.window = after = before.on_reply(fi.parse_reply(data, headers, where[1]))
        if after.acked > before.acked or after.every != before.every or after.stopped != before.stopped:
            # Progress, not mere words: a ping's answer repeats the last ack and must not keep a stuck
            # batch alive past ack_timeout.
            self._last_progress = time.monotonic()
        self._changed.set()

    async def publish(self, messages: Sequence[Message]) -> FastIngestResult:
        return await self.publish_prepared(prepare(messages), [m[0] for m in messages], [m[3] for m in messages])

    async def publish_prepared(self, prepared: Sequence[tuple[bytes, bytes, bytes]], subjects: Sequence[str],
                               msg_ids: Sequence[str | None]) -> FastIngestResult:
        """:meth:`publish` of frames already cut around their reply subject (:func:`prepare`'s layout),
        with each message's subject and ``Nats-Msg-Id`` beside them."""
        total, done, last_seq, resent, duplicates = len(prepared), 0, 0, 0, 0
        first_batch = self._batches
        busy_since: float | None = None
        retries = 0
        progress_at = time.monotonic()
        while done < total:
            size = total - done if self.max_batch <= 0 else min(self.max_batch, total - done)
            end = await self._batch(prepared, done, size)
            final = self.window.final
            if (end.kind == fi.RESUME and isinstance(final, fi.BatchError) and final.no_responders
                    and not is_clustered(self._nc)):
                # One server: no stream captures message ``at``'s subject (no leader to wait for); it is
                # refused, as a plain publish would be, and nothing after it was stored.
                end = dataclasses.replace(end, kind=fi.REFUSED, refused=final.at)
            if isinstance(final, fi.BatchAck) and (final.seq == 0 or final.duplicate):
                duplicates += end.stored  # the batch stored nothing new: all it counted were duplicates
            if end.stored or end.kind == fi.DONE:
                progress_at = time.monotonic()
                last_seq = end.stream_seq or last_seq
            if end.kind == fi.DONE:
                done += size
                busy_since = None
                continue
            if end.kind == fi.REFUSED:
                position = done + end.refused - 1
                error = end.error
                refusal = Refusal(position, subjects[position], error.code, error.err_code, error.description)
                return FastIngestResult(done + end.stored, last_seq, self._batches - first_batch, resent, refusal,
                                        duplicates)
            if end.kind == fi.FATAL or (end.kind == fi.RETRY and end.error.no_responders
                                        and not is_clustered(self._nc)):
                raise FastIngestUnavailable(f"the stream refused the batch: {end.error}")
            self._check_resend(msg_ids, done + end.stored, end.in_doubt)
            resent += end.in_doubt
            done += end.resume_from - 1
            now = time.monotonic()
            if end.kind == fi.RETRY:
                busy_since, retries = busy_since or now, retries + 1
                if now - busy_since > self.busy_for:
                    raise AckTimeoutError(f"The stream still had too many open batches after {self.busy_for:g}s: "
                                          f"{end.error}")
                await asyncio.sleep(min(1.0, 0.05 * 2 ** min(5, retries)))  # backoff
            elif now - progress_at > self.ack_timeout:
                raise AckTimeoutError(f"Batches kept ending without storing anything for {self.ack_timeout:g}s "
                                      f"(at message {done}): {end.error or 'a gap'}")
        return FastIngestResult(total, last_seq, self._batches - first_batch, resent, duplicates=duplicates)

    @staticmethod
    def _check_resend(msg_ids: Sequence[str | None], first: int, in_doubt: int) -> None:
        """Messages sent without a word back are resent: exactly-once only with their message id."""
        missing = [p for p in range(first, first + in_doubt) if not msg_ids[p]]
        if missing:
            raise JetStreamConnectorError(
                f"The batch ended with {in_doubt} messages in doubt (from {first}), and message {missing[0]} has "
                "no Nats-Msg-Id: resending it could store it twice.")

    async def _batch(self, prepared: Sequence[tuple[bytes, bytes, bytes]], base: int, size: int) -> fi.BatchEnd:
        """One batch of ``prepared[base:base + size]``, sent and waited on until its end."""
        self._batches += 1
        self._batch_id = f"{secrets.token_hex(8)}{self._batches}"
        replies = fi.BatchReplies(self._inbox, self._batch_id, self.flow)
        self.window = fi.FlowWindow(size, self.outstanding)
        self._last_progress = pinged = time.monotonic()
        while self.window.final is None:
            if self._closed is not None or self._nc.is_closed:
                raise JetStreamConnectorError(f"The NATS connection was closed during a fast-ingest batch: "
                                              f"{self._closed or 'closed'}")
            window = self.window
            limit = window.limit()
            if window.sent < limit:
                upto = min(limit, window.sent + self.chunk)
                self.window = window.sending(upto)  # before the await: answers may come during it
                self._changed.clear()
                await self._send(self._frames(prepared, base, replies.head.encode(), window.sent + 1, upto, size))
                continue
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self.ping_after)
            now = time.monotonic()
            if self.window.final is None and now - self._last_progress >= self.ping_after:
                if now - self._last_progress >= self.ack_timeout:
                    raise AckTimeoutError(
                        f"No progress in a fast-ingest batch for {self.ack_timeout:g}s ({self.window.sent} of {size} "
                        f"sent, {self.window.acked} acked, from message {base}). The server may be down or overloaded.")
                if now - pinged >= self.ping_after and self.window.sent:
                    pinged = now
                    subject = prepared[base + self.window.sent - 1][0][5:-1].decode()
                    await self._send(pub_frame(subject, replies.ping(self.window.sent), b""))
        return self.window.end()

    @staticmethod
    def _frames(prepared: Sequence[tuple[bytes, bytes, bytes]], base: int, head: bytes, first: int, last: int,
                size: int) -> bytes:
        """Messages ``first..last`` (batch sequences) as one buffer of HPUB frames."""
        parts: list[bytes] = []
        append = b".1.$FI"
        for k in range(first, last + 1):
            before, after, payload = prepared[base + k - 1]
            op = append if 1 < k < size else b".%d.$FI" % fi.op_for(k, size)
            parts += (before, head, b"%d" % k, op, after, payload, CRLF)
        return b"".join(parts)

    async def _send(self, buffer: bytes) -> None:
        await send_raw(self._nc, buffer)
