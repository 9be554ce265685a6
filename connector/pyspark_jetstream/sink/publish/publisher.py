"""Pipelined JetStream publishing with every PubAck awaited.

One wildcard subscription ``<inbox>.*`` receives the PubAcks; each frame's reply
subject is ``<inbox>.<position>``, so an ack names the row it answers without
any per-message future. At most ``max_pending`` frames are unacknowledged at
once (the window); frames go into nats-py's write buffer in chunks, which is
what makes this about twice as fast as ``js.publish_async`` (issue #2's probe).

Frames go out through :func:`pyspark_jetstream.client.nats_internals.send_raw` (nats-py's write
buffer, no ``Msg`` per frame): the public ``publish`` cannot send multi-valued
headers and costs a coroutine call per message.

Model: Spark's ``KafkaWriteTask``: bounded in-flight sends, keep the first
failure, flush and re-check at the end, always close.

Clustered JetStream adds two transient failures, both handled by sending the
same frame again (the server drops a copy that was stored after all, by its
``Nats-Msg-Id``):

- a ``503`` (no responders) while a stream is between leaders: no server took
  the message, so a resend is always safe; it is retried every
  ``RETRY_503_INTERVAL`` until ``ackTimeout`` has passed since the first 503.
  On a single server a 503 means no stream captures the subject, so it fails
  at once.
- silence: frames sent to a node that dies, or to a leader that steps down
  before it replicated them, get no reply at all. With idempotent publishing,
  in-flight frames are resent on every reconnect and, in a cluster, after
  ``RESEND_AFTER_SILENCE`` without any PubAck. Without message ids a resend
  could store a copy, so those frames are left to ``ackTimeout``.

With ``ordered`` (``order=subject`` in a cluster) a resend could land behind later frames of its
subject: such trouble runs a recovery instead (:mod:`.recovery`).

The publisher owns the window (the frames in flight, its events, sends and resends, the waits) and
holds three parts, each owning its state: ``acks``, an :class:`~.acks.AckTracker` (what each reply
means; the counters and the failures), ``recovery``, an :class:`~.recovery.OrderedRecovery` (the
ordered publisher's send numbers, the stored frames that may still move, the repair rounds), and
``mover``, a :class:`~.moves.Mover` (renaming frames, deleting stored copies; ``move_base``). The
parts work on the window through the publisher; the counters the task reads are properties here.
"""

from __future__ import annotations

import asyncio
import contextlib
from operator import itemgetter

from ...client.transport import NatsTransport, Transport
from ...errors import AckTimeoutError, JetStreamConnectorError
from ..encode.frames import ReplyForm
from .acks import DEAD_LETTER_TAG, AckTracker
from .moves import Mover
from .recovery import OrderedRecovery
from .row_publisher import RowPublisher
from .window import Window, clock

_POSITION, _FRAME = itemgetter(0), itemgetter(1)  # of the OutFrame layout

RETRY_503_INTERVAL = 0.25
"""Seconds between resends of frames answered by 503 in a cluster (nats.go's publish retry wait)."""

RESEND_AFTER_SILENCE = 2.0
"""Seconds without any PubAck after which a clustered, idempotent publisher resends what is in flight."""


class Publisher(RowPublisher):
    """Publishes a task's frames through a window of unacknowledged ones (module docstring)."""

    def __init__(self, nc, *, max_pending: int, ack_timeout: float, idempotent: bool = False,
                 ordered_stream: str | None = None, api_prefix: str = "$JS.API", bucket: bool = False,
                 move_base: int = 0, after_retry: bool = False,
                 target: str = "the target stream", transport: Transport | None = None) -> None:
        self._net = transport if transport is not None else NatsTransport(nc)  # frames out, PubAcks in
        self._idempotent = idempotent
        self.window = Window(max_pending, ack_timeout, self._net.clustered)
        self.target = target  # named in the logs of an outage
        self.low_water = self.window.low_water
        self.acks = AckTracker(self)
        # Ordered recovery (recovery's docstring): every frame to one stream, ids to resend safely, a cluster; or
        # a retried attempt without replay records, on any server (recovery.OrderBook.stored_behind).
        ordered = ordered_stream is not None and idempotent and (self.window.retry_503 or after_retry)
        self.recovery = OrderedRecovery(self, nc, ordered_stream, api_prefix, ordered, after_retry)
        self.mover = Mover(nc, ordered_stream, api_prefix, bucket, ack_timeout, move_base)
        self._retry_due: set[str] = set()
        self._retry_task: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()  # background resends (see track)
        self._last_resend = 0.0
        self.resent = 0
        self._sub = None
        self.reply_prefix = ""
        self._closed: str | None = None  # why the connection closed for good, once it has

    async def start(self) -> Publisher:
        self._net.watch(self)
        inbox = self._net.new_inbox()
        self.reply_prefix = inbox + "."
        self.window.prefix_len = len(self.reply_prefix)
        # PubAcks arrive as raw frames, straight from nats-py's parser: no Msg, queue or task per ack.
        self._sub = await self._net.subscribe(inbox + ".*", self.acks.on_frame, self.acks.on_frames)
        return self

    # The counters the task reads, each owned by the part that counts it (the task takes the failures it settles).
    failures = property(lambda self: self.acks.failures,
                        lambda self, failures: setattr(self.acks, "failures", failures))
    stored = property(lambda self: self.acks.stored)
    duplicates = property(lambda self: self.acks.duplicates)
    dead_lettered = property(lambda self: self.acks.dead_lettered)
    reordered = property(lambda self: self.mover.reordered)
    left_out_of_order = property(lambda self: self.mover.left_out_of_order)
    moves_finished = property(lambda self: self.mover.moves_finished)
    found_after_loss = property(lambda self: self.recovery.found_after_loss)
    restored = property(lambda self: self.recovery.restored)
    batches = property(lambda self: 0)  # a PubAck per row

    def moved_copy(self, sent: tuple) -> tuple:
        """``sent`` (OutFrame layout) under this attempt's own moved id (``:o<move_base>``): a retried attempt
        publishes it behind a row its predecessor left missing, then deletes the copy stored ahead
        (:meth:`delete_stored`, :mod:`.retry_order`)."""
        return self.mover.renamed(sent, self.reply_prefix)

    async def delete_stored(self, seqs: list[int]) -> int:
        """Delete the messages at ``seqs`` of the target (no erase); how many it would not delete."""
        return await self.mover.delete_stored(seqs)

    def on_permission_error(self, violation) -> None:
        """The server refused a publish (async -ERR): :meth:`.acks.AckTracker.on_permission_error`."""
        self.acks.on_permission_error(violation)

    def schedule_retry(self, token: str) -> bool:
        """Queue ``token`` for a resend unless its 503s have lasted ``ackTimeout``."""
        now = clock()
        first = self.window.first_503.setdefault(token, now)
        if now - first >= self.window.ack_timeout:
            return False
        self._retry_due.add(token)
        self.window.quiet("503 no responders: a stream leader being elected", self.target)
        if self._retry_task is None or self._retry_task.done():
            self._retry_task = self.track(self._resend_later())
        return True

    async def _resend_later(self) -> None:
        await asyncio.sleep(RETRY_503_INTERVAL)
        due, self._retry_due = self._retry_due, set()
        await self._resend([token for token in due if token in self.window.inflight])

    async def send(self, buffer: bytes) -> None:
        """Hand ``buffer`` to the connection, remembering it until nats-py has written it (see :meth:`abort`)."""
        await self._net.send(buffer)

    async def _resend(self, tokens: list[str]) -> None:
        if not tokens or self._net.closed:
            return
        self.resent += len(tokens)
        await self.send(b"".join(self.window.inflight[token][1] for token in tokens))

    def on_reconnected(self) -> None:
        if self.recovery.ordered and self.recovery.book.pending:
            self.recovery.trouble()
        elif self._idempotent and self.window.inflight:
            self.track(self._resend(list(self.window.inflight)))

    def on_closed(self, cause: str) -> None:
        """The connection is gone for good: no PubAck can arrive; wake every waiter now."""
        self._closed = cause
        self.window.room.set()
        self.window.done.set()

    def _closed_error(self) -> JetStreamConnectorError:
        return JetStreamConnectorError(
            f"The NATS connection was closed while {len(self.window.inflight)} publishes awaited their PubAck: "
            f"{self._closed}. The task fails so that Spark retries it on a new connection."
        )

    def track(self, coro) -> asyncio.Task:
        """Run a background send, keeping it referenced; a failure is raised by the next wait."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)

        def done(t: asyncio.Task) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None and self.window.send_error is None:
                self.window.send_error = t.exception()
                self.window.room.set()
                self.window.done.set()

        task.add_done_callback(done)
        return task

    async def _wait(self, event: asyncio.Event, what: str) -> None:
        while not event.is_set() or self._closed is not None or self.window.send_error is not None:
            self.window.check_answers(self.target)
            if self._closed is not None:
                raise self._closed_error()
            if self.window.send_error is not None:
                raise JetStreamConnectorError(
                    f"Publishing failed in the background ({type(self.window.send_error).__name__}: {self.window.send_error}) "
                    f"while {len(self.window.inflight)} publishes awaited their PubAck; the task fails so that Spark "
                    "retries it.")
            try:
                await asyncio.wait_for(event.wait(), timeout=1.0)
            except asyncio.TimeoutError:
                now = clock()
                idle = now - self.window.last_progress
                if (self._idempotent and self.window.retry_503 and idle >= RESEND_AFTER_SILENCE
                        and now - self._last_resend >= RESEND_AFTER_SILENCE):
                    self._last_resend = now
                    self.window.quiet(f"no PubAck for {idle:.0f}s", self.target)
                    if self.recovery.ordered:
                        self.recovery.trouble()
                    else:
                        await self._resend([token for token in self.window.inflight if token not in self._retry_due])
                if idle >= self.window.ack_timeout and not event.is_set():
                    first = min(self.window.inflight, key=lambda t: int(t.lstrip(DEAD_LETTER_TAG)), default="?")
                    raise AckTimeoutError(
                        f"No PubAck for {idle:.0f}s while {len(self.window.inflight)} publishes awaited one ({what}); "
                        f"the first is row {first.lstrip(DEAD_LETTER_TAG)}. The server may be down or overloaded; "
                        "raise the option 'ackTimeout' if it is only slow."
                    ) from None
        self.window.check_answers(self.target)

    @property
    def reply_form(self) -> ReplyForm:  # the encoder's replies: <inbox>.<position>
        return ReplyForm(self.reply_prefix)

    async def publish(self, frames: list[tuple], *, dead_letter: bool = False) -> None:
        """Hand ``frames`` (each in the :class:`~pyspark_jetstream.sink.encode.frames.OutFrame` layout:
        position, frame, subject, ...) to the connection, never exceeding the window of pending acks."""
        if self._net.closed or self._closed is not None:
            self._closed = self._closed or "the connection was closed"
            raise self._closed_error()
        tag = DEAD_LETTER_TAG if dead_letter else ""
        inflight = self.window.inflight
        recovery = self.recovery
        may_send = recovery.may_send
        i, total = 0, len(frames)
        while i < total:
            if not may_send.is_set():  # an ordered recovery is under way: nothing new goes out
                self.window.last_progress = clock()
                await self._wait(may_send, "recovering the order after a leader change")
                continue
            room = self.window.max_pending - len(inflight)
            if room <= 0:
                self.window.room.clear()
                self.window.last_progress = clock()
                await self._wait(self.window.room, "window full")
                continue
            chunk = frames[i : i + room]
            i += len(chunk)
            if recovery.ordered and not dead_letter:  # dead letters go to another stream: their acks keep no order
                recovery.book.note_sends(chunk, inflight)
            else:  # a row's reply token is its position (a dead letter's after its tag), keyed in C-level passes
                tokens = map(str, map(_POSITION, chunk))
                inflight.update(zip(map(tag.__add__, tokens) if tag else tokens, chunk, strict=True))
            self.window.done.clear()
            await self.send(b"".join(map(_FRAME, chunk)))

    async def drain(self) -> None:
        """Wait until every published frame has its PubAck (or ``ackTimeout`` passes without progress),
        and an ordered recovery under way has ended: the PubAck that empties the window can come before
        its order check, which may move frames yet."""
        self.window.last_progress = clock()
        while True:
            if self.window.inflight:
                self.window.done.clear()
                await self._wait(self.window.done, "end of partition")
            elif not self.recovery.may_send.is_set():
                await self._wait(self.recovery.may_send, "recovering the order after a leader change")
            else:
                self.window.check_answers(self.target)
                return

    async def abort(self) -> None:
        """Close after the task failed: frames nats-py still holds (the connection is down) are
        dropped, so that they are not published after the reconnect, behind the task's back."""
        self._net.take_back()
        await self.close()

    async def close(self) -> None:
        self._net.unwatch(self)
        for task in list(self._tasks):
            task.cancel()
        if self._sub is not None:
            # The connection may already be gone; then there is nothing left to release.
            with contextlib.suppress(Exception):
                await self._net.unsubscribe(self._sub)
            self._sub = None
