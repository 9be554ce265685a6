"""A minimal fast-ingest publisher (ADR-50, ``fail`` mode) over a nats-py connection (issue #48).

:meth:`FastPublisher.publish` stores a list of ``(subject, headers, payload, msg_id)`` in order, once
each, in one fast-ingest batch (or several, see below), and returns what the final PubAcks said.
:meth:`FastPublisher.publish_feed` does the same for a :class:`Feed` its caller adds messages to over
time (the sink: a task's slices): the batch grows with the feed and commits when the feed closes, with
its last message or, when that went out before the feed closed, with an end-of-batch (stores nothing).
What a batch is and what each answer means lives in :mod:`pyspark_jetstream.protocol.fast_ingest`;
this module moves bytes and waits:

- frames are made once per message, cut around the reply subject (a resend goes under a new batch),
  joined per chunk and written through nats-py's buffer (:func:`~.nats_internals.send_raw`), as the
  sink writes its rows; answers come on one raw subscription ``<inbox>.>``, straight from nats-py's
  parser, and only those of the batch under way count;
- message 1 goes alone; then at most ``outstanding`` flow intervals run ahead of the last flow ack;
- every wait on the server has a deadline: silence for ``ping_after`` sends a ping (the server answers
  with its last flow ack, or with the gap that ends the batch), silence for ``ack_timeout`` fails the
  publish. A batch that has sent all its feed holds waits for the feed, not the server (which acks only
  whole flow intervals before the commit): it pings every ``ping_after``, which keeps it alive on the
  server past its 10 s idle limit and finds any message lost on the way.

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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import AckTimeoutError, JetStreamConnectorError
from ..protocol import fast_ingest as fi
from ..protocol.batch_frames import Message, batch_frames, prepare
from ..protocol.frames import pub_frame
from .jsapi import server_version
from .transport import NatsTransport, Transport

KEEPALIVE = 5.0
"""Seconds between the pings of an open batch waiting for its feed: half the server's idle limit (10 s,
``jetstream.limits.batch.timeout``). Few, because each is an empty message on a row's subject."""

MIN_SERVER = (2, 14, 3)
"""The first nats-server whose fast-ingest commits are right after a gap (NATS-FACTS l)."""
_PING = b".%d.%s" % (fi.OP_PING, fi.SUFFIX.encode())


class FastIngestUnavailable(JetStreamConnectorError):
    """The stream or the server cannot take fast-ingest batches (checked before anything is sent)."""


class TooManyBatches(FastIngestUnavailable):
    """The stream or the server has as many open batches as it allows (429/10211) and the publisher was
    told to give way: message ``position`` of the feed and those after it were not taken (message 1 of a
    batch goes alone), so they may go another way (the sink: a PubAck per row)."""

    def __init__(self, message: str, position: int, stored: int = 0, duplicates: int = 0) -> None:
        super().__init__(message)
        self.position = position
        self.stored, self.duplicates = stored, duplicates  # of this publish, before the batch that found no room


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


class Feed:
    """Messages handed to a publisher over time: ``prepared`` frames (:func:`prepare`'s layout) with
    each one's subject, ``Nats-Msg-Id`` and a tag the caller gets back with a refusal. Positions are
    absolute (the first message added is 0) and stay so when stored messages are forgotten.

    A closed feed takes no more: the batch under way commits with its last message. An open one keeps
    its batch open (pings keep it alive on the server) until more messages come or it closes."""

    FORGET_EVERY = 4096

    def __init__(self) -> None:
        self.prepared: list[tuple[bytes, bytes, bytes]] = []
        self.subjects: list[str] = []
        self.ids: list[str | None] = []
        self.tags: list[Any] = []
        self.offset = 0  # the position of prepared[0]
        self.closed = False
        self.on_change: Any = None

    @property
    def end(self) -> int:
        """The position after the last message added."""
        return self.offset + len(self.prepared)

    def add(self, prepared: Sequence[tuple[bytes, bytes, bytes]], subjects: Sequence[str],
            ids: Sequence[str | None], tags: Sequence[Any] | None = None) -> None:
        if self.closed:
            raise ValueError("a closed feed takes no more messages")
        self.prepared += prepared
        self.subjects += subjects
        self.ids += ids
        self.tags += tags if tags is not None else [None] * len(prepared)
        self._changed()

    def close(self) -> None:
        self.closed = True
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def subject(self, position: int) -> str:
        return self.subjects[position - self.offset]

    def msg_id(self, position: int) -> str | None:
        return self.ids[position - self.offset]

    def forget_before(self, position: int) -> None:
        """Messages before ``position`` are stored: they are never sent again (a few thousand at once)."""
        drop = position - self.offset
        if drop >= self.FORGET_EVERY:
            for values in (self.prepared, self.subjects, self.ids, self.tags):
                del values[:drop]
            self.offset = position

    def remove(self, position: int) -> Any:
        """Take the message at ``position`` out (the server refused it); the ones after it move up one.
        Returns its tag."""
        k = position - self.offset
        del self.prepared[k], self.subjects[k], self.ids[k]
        return self.tags.pop(k)


async def check_stream(nc: Any, stream: str, *, api_prefix: str = "$JS.API", timeout: float = 5.0) -> dict:
    """The stream's config, once it is known to take fast-ingest batches: ``allow_batched`` set, not a
    mirror, a server of 2.14.3 or later. Raises :class:`FastIngestUnavailable` otherwise, before a
    message is sent (the server would refuse message 1 with 10205, the check the publisher keeps)."""
    version = server_version(nc) or (0, 0, 0)
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


def check_resend(feed: Feed, first: int, in_doubt: int) -> None:
    """Messages sent without a word back are resent: exactly-once only with their message id."""
    missing = [p for p in range(first, first + in_doubt) if not feed.msg_id(p)]
    if missing:
        raise JetStreamConnectorError(
            f"The batch ended with {in_doubt} messages in doubt (from {first}), and message {missing[0]} has "
            "no Nats-Msg-Id: resending it could store it twice, so nothing more is sent. Rows carry an id "
            "unless option 'idempotent' is false.")


def end_of_batch(feed: Feed, feed_base: int, replies: fi.BatchReplies, last: int) -> bytes:
    """The commit of a batch whose last message went out as an append (a batch cut at ``max_batch``): an
    end-of-batch (stores nothing) on the last message's subject, the stream's."""
    return pub_frame(feed.subject(feed_base + last - 1), replies.subject(last + 1, fi.OP_COMMIT_EOB), b"")


class FastPublisher:
    """Publishes lists of messages in fast-ingest batches (module docstring). ``flow``: the largest
    ack interval asked for (the server answers min(500, flow), less when the stream has other fast
    publishers); ``max_batch``: messages per batch (0: the whole list)."""

    def __init__(self, nc: Any, *, flow: int = 500, outstanding: int = fi.OUTSTANDING, ack_timeout: float = 10.0,
                 ping_after: float = 1.0, busy_for: float = 30.0, chunk: int = 256, max_batch: int = 0,
                 keepalive: float = KEEPALIVE,
                 give_way: bool = False, transport: Transport | None = None) -> None:
        self._net = transport if transport is not None else NatsTransport(nc)
        self.give_way = give_way  # too many open batches: raise TooManyBatches at once instead of waiting
        self.flow, self.outstanding, self.chunk, self.max_batch = flow, outstanding, chunk, max_batch
        self.ack_timeout, self.ping_after, self.busy_for = ack_timeout, ping_after, busy_for
        self.keepalive = keepalive  # an open batch waiting for its feed pings this often (server: 10 s idle limit)
        self._inbox = ""
        self._sub = None
        self._batch_id = ""
        self._reserved = ""  # the id the next batch from position 0 takes (frames made for it, see head_for_frames)
        self._batches = 0
        self._base = 0  # the feed position of the batch's message 1
        self.window = fi.FlowWindow(0)
        self._changed = asyncio.Event()
        self.progress = asyncio.Event()
        """Set when the last flow ack moves or a batch ends (for a caller waiting for room)."""
        self._last_progress = 0.0
        self._closed: str | None = None

    async def start(self) -> FastPublisher:
        self._net.watch(self)
        self._inbox = self._net.new_inbox()
        self._sub = await self._net.subscribe(self._inbox + ".>", self._on_answer, self._on_answers)
        return self

    async def abort(self) -> None:
        """Close after a failure: frames nats-py still holds (the connection is down) are dropped, so
        that nothing is published after the reconnect, behind the failed write's back."""
        self._net.take_back()
        await self.close()

    async def close(self) -> None:
        self._net.unwatch(self)
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._net.unsubscribe(self._sub)
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
        self.window = after = before.on_reply(fi.parse_reply(data, headers, where[1], subject.endswith(_PING)))
        if after.acked > before.acked or after.every != before.every or after.stopped != before.stopped:
            # Progress, not mere words: a ping's answer repeats the last ack and must not keep a stuck
            # batch alive past ack_timeout.
            self._last_progress = self._net.now()
            self.progress.set()
        self._changed.set()

    async def publish(self, messages: Sequence[Message]) -> FastIngestResult:
        return await self.publish_prepared(prepare(messages), [m[0] for m in messages], [m[3] for m in messages])

    async def publish_prepared(self, prepared: Sequence[tuple[bytes, bytes, bytes]], subjects: Sequence[str],
                               msg_ids: Sequence[str | None]) -> FastIngestResult:
        """:meth:`publish` of frames already cut around their reply subject (:func:`prepare`'s layout),
        with each message's subject and ``Nats-Msg-Id`` beside them."""
        feed = Feed()
        feed.add(prepared, subjects, msg_ids)
        feed.close()
        return await self.publish_feed(feed)

    def head_for_frames(self) -> str:
        """The reply subject's head (``<inbox>.<batch id>.<flow>.fail.``) of the next batch that starts at
        a feed's position 0, reserved now: a caller may make its frames whole for that batch beforehand
        (:class:`Feed`, whole frames), which then go out as they are. Message 1 and the commit are cut and
        made again (their operations differ), as is every frame of any other batch."""
        if not self._reserved:
            self._reserved = f"{secrets.token_hex(8)}r"
        return fi.BatchReplies(self._inbox, self._reserved, self.flow).head

    @property
    def stored_upto(self) -> int:
        """The feed position before which every message is known stored (the last flow ack)."""
        return self._base + self.window.acked

    async def publish_feed(self, feed: Feed, start: int = 0) -> FastIngestResult:
        """Publish ``feed`` from position ``start`` until it is closed and every message is stored, or
        the server refuses one (the result's ``refused`` names its position; nothing after it is
        stored). ``stored`` counts from ``start``."""
        feed.on_change = self._changed.set
        done, last_seq, resent, duplicates = start, 0, 0, 0
        first_batch = self._batches
        busy_since: float | None = None
        retries = 0
        progress_at = self._net.now()
        while True:
            if done >= feed.end:
                if feed.closed:
                    break
                self._changed.clear()
                await self._changed.wait()  # nothing to send and no batch open: no deadline to keep
                progress_at = self._net.now()
                continue
            end = await self._batch(feed, done)
            final = self.window.final
            if (end.kind == fi.RESUME and isinstance(final, fi.BatchError) and final.no_responders
                    and not self._net.clustered):
                # One server: no stream captures message ``at``'s subject (no leader to wait for); it is
                # refused, as a plain publish would be, and nothing after it was stored.
                end = dataclasses.replace(end, kind=fi.REFUSED, refused=final.at)
            if isinstance(final, fi.BatchAck) and (final.seq == 0 or final.duplicate):
                duplicates += end.stored  # the batch stored nothing new: all it counted were duplicates
            if end.stored or end.kind == fi.DONE:
                progress_at = self._net.now()
                last_seq = end.stream_seq or last_seq
            if end.kind == fi.DONE:
                done += self.window.total
                busy_since = None
                continue
            if end.kind == fi.REFUSED:
                # The caller resends the rows in doubt before the refused one (no final PubAck told their
                # fate): only those with an id may go again.
                check_resend(feed, done + end.stored, end.in_doubt)
                position = done + end.refused - 1
                error = end.error
                refusal = Refusal(position, feed.subject(position), error.code, error.err_code, error.description)
                return FastIngestResult(done + end.stored - start, last_seq, self._batches - first_batch, resent,
                                        refusal, duplicates)
            if end.kind == fi.FATAL or (end.kind == fi.RETRY and end.error.no_responders
                                        and not self._net.clustered):
                raise FastIngestUnavailable(f"the stream refused the batch: {end.error}")
            if self.give_way and isinstance(final, fi.BatchError) and final.too_many:
                raise TooManyBatches(f"the stream has as many open batches as it allows: {end.error}", done,
                                     done - start, duplicates)
            check_resend(feed, done + end.stored, end.in_doubt)
            resent += end.in_doubt
            done += end.resume_from - 1
            now = self._net.now()
            if end.kind == fi.RETRY:
                busy_since, retries = busy_since or now, retries + 1
                if now - busy_since > self.busy_for:
                    raise AckTimeoutError(f"The stream still had too many open batches after {self.busy_for:g}s: "
                                          f"{end.error}")
                await asyncio.sleep(min(1.0, 0.05 * 2 ** min(5, retries)))  # backoff
            elif now - progress_at > self.ack_timeout:
                raise AckTimeoutError(f"Batches kept ending without storing anything for {self.ack_timeout:g}s "
                                      f"(at message {done}): {end.error or 'a gap'}")
        return FastIngestResult(done - start, last_seq, self._batches - first_batch, resent, duplicates=duplicates)

    def _last_message(self, feed: Feed) -> int:
        """The batch sequence that commits, once known: the feed's last message when it is closed, or the
        batch's size limit; 0 while more may come."""
        available = feed.end - self._base
        if self.max_batch > 0 and available >= self.max_batch:
            return self.max_batch
        return available if feed.closed else 0

    async def _batch(self, feed: Feed, base: int) -> fi.BatchEnd:
        """One batch of the feed from position ``base``, sent and waited on until its end. It grows while
        the feed does; it commits with the feed's last message: while the feed is open its newest message
        waits, so that no end-of-batch (an empty message on a row's subject, which the stream's core
        subscribers receive) is needed when it closes (issue #56)."""
        self._batches += 1
        self._base = base
        whole = base == 0 and bool(self._reserved)
        if whole:
            self._batch_id, self._reserved = self._reserved, ""
        else:
            self._batch_id = f"{secrets.token_hex(8)}{self._batches}"
        replies = fi.BatchReplies(self._inbox, self._batch_id, self.flow)
        head = replies.head.encode()
        self.window = fi.FlowWindow(feed.end - base, self.outstanding)
        self._last_progress = pinged = self._net.now()
        committed = eob = False
        while self.window.final is None:
            if self._closed is not None or self._net.closed:
                raise JetStreamConnectorError(f"The NATS connection was closed during a fast-ingest batch: "
                                              f"{self._closed or 'closed'}")
            window = self.window
            if not committed:
                last = self._last_message(feed)
                total = last or feed.end - base
                if total != window.total and not window.stopped:
                    self.window = window = dataclasses.replace(window, total=total)
                limit = window.limit()
                if not last:  # open: the newest message waits, to commit with it should the feed close now
                    limit = min(limit, max(window.sent, feed.end - base - 1))
                if window.sent < limit:
                    upto = min(limit, window.sent + self.chunk)
                    self.window = window.sending(upto)  # before the await: answers may come during it
                    self._changed.clear()
                    committed = upto == last
                    await self._send(self._frames(feed.prepared, base - feed.offset, head, window.sent + 1, upto,
                                                  last, whole))
                    continue
                if last and window.sent == last and window.every and not window.stopped:
                    committed = eob = True
                    self._changed.clear()
                    await self._send(end_of_batch(feed, base, replies, last))
                    continue
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self.ping_after)
            now = self._net.now()
            window = self.window
            if window.acked > 0:
                feed.forget_before(base + window.acked - 1)  # the last acked one names the ping's subject
            if window.final is not None:
                continue
            held = 0 if committed or self._last_message(feed) else 1
            idle = (not committed and window.every and window.sent >= feed.end - base - held
                    and window.sent - window.acked < window.every and not window.stopped)
            if idle:
                # All there is was sent (but the newest, held back): the batch waits for the feed, not for the
                # server (which acks only whole flow intervals until the commit). A ping now and then keeps
                # it alive on the server; each is an empty message its subject's subscribers receive.
                self._last_progress = now
            if now - self._last_progress >= self.ack_timeout:
                raise AckTimeoutError(
                    f"No progress in a fast-ingest batch for {self.ack_timeout:g}s ({window.sent} sent, "
                    f"{window.acked} acked, from message {base}). The server may be down or overloaded.")
            # An answer is due: message 1's, a flow ack, the final one (after the commit, a gap or a refusal).
            due = window.every == 0 or committed or window.stopped or window.sent - window.acked >= window.every
            stalled = window.sent and due and now - self._last_progress >= self.ping_after
            if (stalled and now - pinged >= self.ping_after) or (idle and now - pinged >= self.keepalive):
                pinged = now  # a ping also keeps an idle batch alive on the server (its 10 s limit)
                if eob and not window.stopped:
                    # A lost end-of-batch leaves no gap for a ping to find: it is sent again (a second
                    # one is ignored while the commit runs, or answered 10208 once the batch is over).
                    await self._send(end_of_batch(feed, base, replies, window.sent))
                    continue
                subject = feed.subject(base + window.sent - 1)
                await self._send(pub_frame(subject, replies.ping(window.sent), b""))
        return self.window.end()

    _frames = staticmethod(batch_frames)  # a seam: a test's publisher sends its commit as an append

    async def _send(self, buffer: bytes) -> None:
        await self._net.send(buffer)
